// One scheduling round of the control plane with many waiting requests (view, policy, checks, decisions),
// for each built-in policy, with the analytic cost model of Qwen-Image on 8 x H20 (so the dynamic policies
// read predictions), mixed image sizes, deadlines and two priority classes. Target: at most 50 us with
// 1,000 waiting requests.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "gfdit/clock.h"
#include "gfdit/control.h"
#include "gfdit/cost.h"
#include "gfdit/executor.h"
#include "gfdit/messages.h"
#include "gfdit/policy.h"
#include "gfdit/request.h"

using namespace gfdit;
using namespace gfdit::runtime;

namespace {

// Keeps what was dispatched so the benchmark can complete it between rounds.
class NullExecutor : public Executor {
 public:
  void dispatch(const TaskDescriptor& t, const std::vector<int>& workers, const std::string&) override {
    for (int w : workers) sent.push_back({t.task_id, t.request_id, t.kind, w});
  }
  struct Sent {
    uint64_t task_id, request_id;
    uint32_t kind;
    int worker;
  };
  std::vector<Sent> sent;
};

RequestSpec imageSpec(uint64_t i, int64_t now_ns) {
  static const int kSides[] = {512, 768, 1024, 1024, 1280, 1536};
  RequestSpec s;
  s.shape.height = s.shape.width = kSides[i % 6];
  s.shape.num_steps = 20 + static_cast<int>(i * 7 % 31);
  s.shape.guidance_scale = 4.0;
  s.shape.tokens = (s.shape.height / 16) * (s.shape.width / 16);
  s.max_degree = 8;
  s.deadline_ns = now_ns + static_cast<int64_t>(30 + i * 13 % 300) * 1000000000;
  s.priority = i % 5 == 0;
  s.payload = "{}";
  return s;
}

void scheduleRound(benchmark::State& state, const std::string& policy) {
  const int waiting = static_cast<int>(state.range(0));
  VirtualClock clock;
  NullExecutor exec;
  ControlConfig cfg;
  cfg.world_size = 8;
  auto cluster = cost::cluster("h20x8");
  auto cm = cost::makeAnalyticCostModel(cost::modelArch("qwen-image"), cluster);
  ControlPlane cp(cfg, clock, exec, makePolicy(policy), cm);
  uint64_t n = 0;
  for (int i = 0; i < waiting; ++i) cp.submit(imageSpec(n++, clock.nowNs()));
  int64_t t = 1;
  for (auto _ : state) {
    state.PauseTiming();
    // Undo the last round: the requests it started are cancelled and their tasks completed (their ranks free
    // again), and as many new ones arrive, so `waiting` requests wait and all eight ranks are free.
    std::vector<NullExecutor::Sent> sent;
    sent.swap(exec.sent);
    std::vector<uint64_t> started;
    for (const auto& s : sent) {
      if (s.kind == static_cast<uint32_t>(TaskKind::kEncode) && (started.empty() || started.back() != s.request_id)) {
        started.push_back(s.request_id);
      }
    }
    for (uint64_t id : started) cp.cancel(id);
    for (const auto& s : sent) {
      Completion c;
      c.task_id = s.task_id;
      c.request_id = s.request_id;
      c.kind = s.kind;
      c.rank = s.worker;
      cp.onCompletion(c);
    }
    exec.sent.clear();  // the FREE tasks of the cancelled requests: nothing to wait for
    for (size_t i = 0; i < started.size(); ++i) cp.submit(imageSpec(n++, clock.nowNs()));
    clock.set(++t);
    state.ResumeTiming();
    cp.poll();
  }
  state.counters["waiting"] = waiting;
}

}  // namespace

BENCHMARK_CAPTURE(scheduleRound, fcfs, std::string("fcfs"))->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(scheduleRound, srtf, std::string("srtf"))->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(scheduleRound, edf, std::string("edf"))->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(scheduleRound, priority, std::string("priority"))->Arg(1000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(scheduleRound, static_1, std::string("static:1"))->Arg(1000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(scheduleRound, static_2, std::string("static:2"))->Arg(1000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(scheduleRound, static_8, std::string("static:8"))->Arg(1000)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
