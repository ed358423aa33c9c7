// Uses only the installed public headers: two forked ranks all-gather through a FileStore; then the control
// plane runs requests with this program's own executor (tasks "run" in-process, a queue per worker) and its
// own policy (every request alone on all ranks, two steps per decision).
#include <gfdit/clock.h>
#include <gfdit/control.h>
#include <gfdit/error.h>
#include <gfdit/executor.h>
#include <gfdit/messages.h>
#include <gfdit/policy.h>
#include <gfdit/request.h>
#include <gfdit/store.h>
#include <gfdit/world.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

namespace rt = gfdit::runtime;

class InlineExecutor : public rt::Executor {
 public:
  void dispatch(const rt::TaskDescriptor& t, const std::vector<int>& workers, const std::string&) override {
    for (int w : workers) queue.push_back({t, w});
  }
  std::deque<std::pair<rt::TaskDescriptor, int>> queue;
};

class AllRanks : public rt::Policy {
 public:
  std::string name() const override { return "all-ranks"; }
  std::vector<rt::Decision> schedule(const rt::SchedulerView& v) override {
    if (v.ready.empty() || static_cast<int>(v.free_ranks.size()) < v.world_size) return {};
    rt::Decision d;
    d.request_id = v.ready.front()->id;
    d.ranks = v.free_ranks;
    d.layout.ulysses = static_cast<int>(v.free_ranks.size());
    d.num_steps = 2;
    return {d};
  }
};

int runControlPlane() {
  rt::VirtualClock clock;
  InlineExecutor exec;
  rt::ControlConfig cfg;
  cfg.world_size = 2;
  rt::ControlPlane cp(cfg, clock, exec, std::make_shared<AllRanks>());
  int done = 0;
  cp.setFinishedCallback([&](rt::RequestResult&& r) { done += r.state == rt::RequestState::kDone; });
  for (int i = 0; i < 3; ++i) {
    rt::RequestSpec s;
    s.shape.height = s.shape.width = 64;
    s.shape.num_steps = 5;
    s.shape.tokens = 16;
    cp.submit(s);
  }
  cp.poll();
  for (int n = 0; n < 10000 && !exec.queue.empty(); ++n) {
    auto [t, w] = exec.queue.front();
    exec.queue.pop_front();
    clock.set(clock.nowNs() + 1000);
    rt::Completion c;
    c.task_id = t.task_id;
    c.request_id = t.request_id;
    c.kind = t.kind;
    c.rank = w;
    c.step_end = t.step_begin + t.num_steps;
    cp.onCompletion(c);
    cp.poll();
  }
  return done == 3 && cp.numRequests() == 0 ? 0 : 1;
}

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
  if (runControlPlane() != 0) {
    std::printf("consumer: control plane FAILED\n");
    return 1;
  }
  std::printf(
      "consumer: all_gather and a control plane with its own executor and policy through find_package(gfdit) "
      "OK (gfdit %s)\n",
      gfdit::version());
  return 0;
}
