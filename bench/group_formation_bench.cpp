// Group formation cost: gfdit::Group::create over rank lists of 2, 4, 8 and 64 members of a 64-rank world.
//
// Group::create is pure (validation and a copy into a fixed array, no communication, no allocation), so no
// World is needed. Each size runs as several repetitions; the table printed at the end shows the median
// over repetitions next to the target (median <= 1 us). Google Benchmark's own flags work as usual, e.g.
//   group_formation_bench --benchmark_out=group_formation.json --benchmark_out_format=json
// writes its JSON report (aggregates mean/median/stddev per size).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gfdit/group.h"
#include "gfdit/types.h"

namespace {

constexpr int kWorldSize = 64;
constexpr double kTargetNs = 1000.0;

// Members spread over the world (0, 64/k, 2*64/k, ...), listed in descending order so that the group
// order differs from rank order; self is the last member, the worst case for locating self.
std::vector<int> spreadRanks(int num_members) {
  std::vector<int> ranks;
  const int step = kWorldSize / num_members;
  for (int i = num_members - 1; i >= 0; --i) ranks.push_back(i * step);
  return ranks;
}

void BM_GroupCreate(benchmark::State& state) {
  const int num_members = static_cast<int>(state.range(0));
  const std::vector<int> ranks = spreadRanks(num_members);
  const int self_rank = ranks.back();
  for (auto _ : state) {
    gfdit::Group group = gfdit::Group::create(ranks.data(), num_members, kWorldSize, self_rank);
    benchmark::DoNotOptimize(group);
    benchmark::ClobberMemory();
  }
  state.counters["members"] = num_members;
}
BENCHMARK(BM_GroupCreate)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(64)
    ->Unit(benchmark::kNanosecond)
    ->MinTime(0.05)
    ->Repetitions(15)
    ->ReportAggregatesOnly(true);

// The whole world (Group::whole), for reference: no validation of a list.
void BM_GroupWhole(benchmark::State& state) {
  for (auto _ : state) {
    gfdit::Group group = gfdit::Group::whole(kWorldSize, kWorldSize - 1);
    benchmark::DoNotOptimize(group);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_GroupWhole)->Unit(benchmark::kNanosecond)->MinTime(0.05)->Repetitions(15)->ReportAggregatesOnly(true);

// Console output as usual, plus the median of every benchmark kept for the summary table.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  explicit SummaryReporter(OutputOptions opts) : benchmark::ConsoleReporter(opts) {}

  void ReportRuns(const std::vector<Run>& reports) override {
    benchmark::ConsoleReporter::ReportRuns(reports);
    for (const Run& run : reports) {
      if (run.error_occurred) {
        errors_[run.run_name.function_name + "/" + run.run_name.args] = run.error_message;
        continue;
      }
      const bool is_median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      const bool single = run.run_type == Run::RT_Iteration && run.repetitions <= 1;
      if (!is_median && !single) continue;
      rows_.push_back({run.run_name.function_name, run.run_name.args, toNs(run)});
    }
  }

  struct Row {
    std::string function;
    std::string args;
    double median_ns;
  };
  const std::vector<Row>& rows() const { return rows_; }
  const std::map<std::string, std::string>& errors() const { return errors_; }

 private:
  static double toNs(const Run& run) {
    const double t = run.GetAdjustedRealTime();
    switch (run.time_unit) {
      case benchmark::kNanosecond: return t;
      case benchmark::kMicrosecond: return t * 1e3;
      case benchmark::kMillisecond: return t * 1e6;
      case benchmark::kSecond: return t * 1e9;
    }
    return t;
  }

  std::vector<Row> rows_;
  std::map<std::string, std::string> errors_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  SummaryReporter reporter(benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);  // --benchmark_out adds the library's file reporter
  benchmark::Shutdown();

  std::printf("\nGroup formation (gfdit::Group::create, world of %d, self a member; median over repetitions)\n",
              kWorldSize);
  std::printf("%-16s %8s %14s %12s %8s\n", "benchmark", "members", "median [ns]", "target [ns]", "meets");
  std::printf("%-16s %8s %14s %12s %8s\n", "----------------", "--------", "--------------", "------------",
              "--------");
  bool all_ok = true;
  for (const auto& row : reporter.rows()) {
    const bool ok = row.median_ns <= kTargetNs;
    all_ok = all_ok && ok;
    std::printf("%-16s %8s %14.1f %12.0f %8s\n", row.function.c_str(), row.args.empty() ? "64" : row.args.c_str(),
                row.median_ns, kTargetNs, ok ? "yes" : "NO");
  }
  for (const auto& error : reporter.errors()) {
    all_ok = false;
    std::printf("%-16s error: %s\n", error.first.c_str(), error.second.c_str());
  }
  std::printf("target: median <= %.0f ns for every size: %s\n", kTargetNs, all_ok ? "met" : "NOT met");
  return 0;
}
