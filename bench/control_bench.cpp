// One scheduling round of the control plane with many waiting requests (view, policy, checks, decisions),
// for each built-in policy, with the analytic cost model of Qwen-Image on 8 x H20 (so the dynamic policies
// read predictions), mixed image sizes, deadlines and two priority classes. Target: at most 20 us with
// 10,000 waiting requests. The baseline, in the same run: each policy without its ready order, so that every
// view lists every waiting request and the policy sorts them all (as before ready orders, and as a Python
// policy is served: NOTE [ready order] in src/runtime/control.cpp); a table of both and their ratio follows.
//
//     build/cpp/bench/control_bench [--benchmark_out=control.json --benchmark_out_format=json]
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
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

// The policy without its ready order (it makes none): the baseline.
class FullList : public Policy {
 public:
  explicit FullList(std::unique_ptr<Policy> p) : p_(std::move(p)) {}
  std::string name() const override { return p_->name(); }
  LayoutFamily layouts() const override { return p_->layouts(); }
  std::vector<Decision> schedule(const SchedulerView& view) override { return p_->schedule(view); }

 private:
  std::unique_ptr<Policy> p_;
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

void round(benchmark::State& state, const std::string& policy, bool full_list) {
  const int waiting = static_cast<int>(state.range(0));
  VirtualClock clock;
  NullExecutor exec;
  ControlConfig cfg;
  cfg.world_size = 8;
  auto cluster = cost::cluster("h20x8");
  auto cm = cost::makeAnalyticCostModel(cost::modelArch("qwen-image"), cluster);
  std::shared_ptr<Policy> p = makePolicy(policy);
  if (full_list) p = std::make_shared<FullList>(makePolicy(policy));
  ControlPlane cp(cfg, clock, exec, p, cm);
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

void scheduleRound(benchmark::State& state, const std::string& policy) { round(state, policy, false); }
void scheduleRoundFullList(benchmark::State& state, const std::string& policy) { round(state, policy, true); }

// The console's table, then each policy with its order against the full list (the median over
// --benchmark_repetitions when there are some).
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  explicit RatioReporter(OutputOptions opts) : ConsoleReporter(opts) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      const bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.error_occurred || (r.run_type != Run::RT_Iteration && !median)) continue;
      (median ? medians_ : last_)[r.run_name.function_name + "/" + r.run_name.args] = r.GetAdjustedRealTime();
    }
  }
  void Finalize() override {
    const std::string with = "scheduleRound/", without = "scheduleRoundFullList/";
    std::printf("\n%-22s %14s %14s %8s\n", "policy/waiting", "full list us", "ready order us", "ratio");
    std::set<std::string> names;
    for (const auto* m : {&last_, &medians_}) {
      for (const auto& kv : *m) {
        if (kv.first.rfind(with, 0) == 0) names.insert(kv.first.substr(with.size()));
      }
    }
    for (const std::string& name : names) {
      const double order = us(with + name), full = us(without + name);
      if (order > 0 && full > 0) std::printf("%-22s %14.2f %14.2f %7.1fx\n", name.c_str(), full, order, full / order);
    }
  }

 private:
  double us(const std::string& name) const {
    auto m = medians_.find(name);
    if (m != medians_.end()) return m->second;
    auto l = last_.find(name);
    return l != last_.end() ? l->second : 0;
  }
  std::map<std::string, double> last_, medians_;  // real time per round by benchmark name
};

}  // namespace

#define GFDIT_ROUND(name, policy)                                                                                    \
  BENCHMARK_CAPTURE(scheduleRound, name, std::string(policy))->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond); \
  BENCHMARK_CAPTURE(scheduleRoundFullList, name, std::string(policy))                                                \
      ->Arg(1000)                                                                                                    \
      ->Arg(10000)                                                                                                   \
      ->Unit(benchmark::kMicrosecond)

GFDIT_ROUND(fcfs, "fcfs");
GFDIT_ROUND(srtf, "srtf");
GFDIT_ROUND(edf, "edf");
GFDIT_ROUND(priority, "priority");
GFDIT_ROUND(static_1, "static:1");
GFDIT_ROUND(static_2, "static:2");
GFDIT_ROUND(static_8, "static:8");

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter(isatty(fileno(stdout)) ? benchmark::ConsoleReporter::OO_Defaults
                                                : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
