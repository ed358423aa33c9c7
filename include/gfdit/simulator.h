// The simulator: the control plane and a policy on a simulated cluster, on a virtual clock. Tasks take the
// time the cost model predicts; each worker runs its queue in FIFO order; a task starts when all its members
// reach it (collectives are synchronous); ranks that share cores (a CPU cluster) share them fairly.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "gfdit/control.h"
#include "gfdit/cost.h"
#include "gfdit/messages.h"
#include "gfdit/policy.h"
#include "gfdit/request.h"

namespace gfdit {
namespace runtime {

/// One request of a trace.
struct SimRequest {
  uint64_t id = 0;
  double arrival_s = 0;
  RequestShape shape;  ///< num_steps >= 1; tokens are filled in from the cost model's model
  double deadline_s = std::numeric_limits<double>::quiet_NaN();  ///< after the trace's start; NaN: none
  int32_t priority = 0;
};

/// Settings of a simulation.
struct SimOptions {
  int max_inflight_steps = 2;
  bool lookahead = true;
  bool record_intervals = false;  ///< keep per-rank intervals (for a Gantt chart)
  double dispatch_s = 0;          ///< control plane -> worker start
  double completion_s = 0;        ///< worker end -> control plane
  double regroup_s = -1;          ///< cost of forming a group (<0: the cluster's hardware value)
  /// false: a rank set pays regroup_s on its first use (cached communicators); true: each rank keeps only its
  /// current group, so a task pays whenever a member's group changed since its last collective task.
  bool regroup_every_change = false;
  int num_cores = -1;  ///< cores the ranks share (<0: the cluster's; 0: one device per rank)
  /// Share of its fair share of the cores a task of two or more members gets done while ranks outnumber
  /// the cores: its collectives wait for members that are not running (measured by `gfdit profile`).
  double collective_efficiency = 1.0;
  /// Seeds the draws of which steps reuse a step cache (NOTE [simulated execution] in simulator.cpp).
  uint64_t cache_seed = 0;
};

/// How one request ended.
struct SimOutcome {
  uint64_t id = 0;
  double arrival_s = 0;
  double finish_s = 0;
  double deadline_s = std::numeric_limits<double>::quiet_NaN();
  RequestState state = RequestState::kQueued;
  int32_t priority = 0;
  double first_start_s = 0;  ///< when its encode was dispatched
};

/// One task on one rank.
struct SimInterval {
  int32_t rank = 0;
  uint64_t request_id = 0;
  TaskKind kind = TaskKind::kDenoise;
  double start_s = 0;
  double end_s = 0;
};

/// What a simulation reports.
struct SimResult {
  std::vector<SimOutcome> requests;    ///< in trace order
  std::vector<SimInterval> intervals;  ///< with record_intervals
  double busy_rank_s = 0;              ///< rank-seconds spent running tasks
  int32_t num_ranks = 0;
  double makespan_s = 0;  ///< last finish
  uint64_t num_tasks = 0;
  double wall_s = 0;  ///< real time the run took
  /// Passes of the steps of requests with a step cache, and those of them that reused it (drawn).
  uint64_t cache_passes = 0;
  uint64_t cached_passes = 0;
  ControlStats stats;
};

/// Runs traces through the control plane on a simulated cluster.
class Simulator {
 public:
  Simulator(std::shared_ptr<const cost::CostModel> cost, cost::Cluster cluster, std::shared_ptr<Policy> policy,
            SimOptions options = SimOptions());
  ~Simulator();
  /// Replays `requests` (sorted by arrival) to the end.
  SimResult run(const std::vector<SimRequest>& requests);

 private:
  std::shared_ptr<const cost::CostModel> cost_;
  cost::Cluster cluster_;
  std::shared_ptr<Policy> policy_;
  SimOptions options_;
};

}  // namespace runtime
}  // namespace gfdit
