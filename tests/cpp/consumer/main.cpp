// Uses only the installed public headers: two forked ranks all-gather through a FileStore.
#include <gfdit/error.h>
#include <gfdit/store.h>
#include <gfdit/world.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int runRank(int rank, const std::string& dir) {
  gfdit::FileStore store(dir);
  auto world = gfdit::World::create(rank, 2, store);
  std::vector<int> in(1000, rank + 1), out(2000, 0);
  world->allGather(world->worldGroup(), in.data(), out.data(), in.size() * sizeof(int));
  for (int i = 0; i < 2000; ++i) {
    if (out[i] != i / 1000 + 1) return 1;
  }
  return 0;
}

int main() {
  char tmpl[] = "/tmp/gfdit-consumer-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) return 2;
  pid_t child = fork();
  if (child == 0) _exit(runRank(1, dir));
  int rc = runRank(0, dir);
  int status = 0;
  waitpid(child, &status, 0);
  std::string cmd = std::string("rm -rf ") + dir;
  if (std::system(cmd.c_str()) != 0) return 3;
  if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("consumer: FAILED\n");
    return 1;
  }
  std::printf("consumer: all_gather through find_package(gfdit) OK (gfdit %s)\n", gfdit::version());
  return 0;
}
