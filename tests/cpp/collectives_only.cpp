// The collectives alone: this program includes only the collectives' public headers and links only
// gfdit::collectives (with gfdit::core below it), so a user of the collectives never links the scheduler.
// It forms a world of one rank through a FileStore, describes a group, and runs collectives on it.
#include <gfdit/error.h>
#include <gfdit/group.h>
#include <gfdit/store.h>
#include <gfdit/types.h>
#include <gfdit/world.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

int main() {
  char tmpl[] = "/tmp/gfdit-collectives-only-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) return 2;
  int rc = 0;
  try {
    gfdit::FileStore store(dir);
    auto world = gfdit::World::create(0, 1, store);
    const int ranks[] = {0};
    gfdit::Group group = world->newGroup(ranks, 1);
    std::vector<float> in(1000), out(1000, 0.0f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.5f;
    world->allGather(group, in.data(), out.data(), in.size() * sizeof(float));
    world->allReduce(group, out.data(), out.size(), gfdit::DType::kFloat32, gfdit::ReduceOp::kSum);
    for (size_t i = 0; i < in.size(); ++i) {
      if (out[i] != in[i]) rc = 1;
    }
    world->barrier(world->worldGroup());
    if (group.size() != 1 || world->size() != 1) rc = 1;
  } catch (const gfdit::Error& e) {
    std::fprintf(stderr, "collectives_only: %s\n", e.what());
    rc = 1;
  }
  std::string cmd = std::string("rm -rf ") + dir;
  if (std::system(cmd.c_str()) != 0 && rc == 0) rc = 3;
  std::printf(
      "collectives_only: a world of one rank, a group and collectives through gfdit::collectives alone: %s "
      "(gfdit %s)\n",
      rc == 0 ? "OK" : "FAILED", gfdit::version());
  return rc;
}
