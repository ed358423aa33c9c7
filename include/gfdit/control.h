// The control plane: requests, the trajectory task graph of each (encode -> migrate/free -> denoise steps ->
// decode), completion aggregation over members, holders and layouts, dispatch-ahead, cancellation, task
// deadlines, recovery after a worker death and pruning of finished requests. It talks to the world through
// a Clock and an Executor, so the same code serves requests on worker processes (EngineLoop) and on a
// simulated cluster (Simulator), and a C++ program can drive it with its own executor and policy.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "gfdit/clock.h"
#include "gfdit/cost.h"
#include "gfdit/executor.h"
#include "gfdit/layout.h"
#include "gfdit/messages.h"
#include "gfdit/policy.h"
#include "gfdit/request.h"

namespace gfdit {
namespace runtime {

class TaskDurations;  // src/runtime/task_durations.h

/// Counters for benchmarks and metrics.
struct ControlStats {
  uint64_t submitted = 0;
  uint64_t finished = 0;
  uint64_t tasks_dispatched = 0;
  uint64_t tasks_completed = 0;
  uint64_t policy_calls = 0;
  uint64_t lookahead_hits = 0;  ///< steps dispatched ahead across decisions (NOTE [lookahead])
  uint64_t regroups = 0;  ///< denoise tasks on another set of ranks than their request's previous one (NOTE [regroups])
  uint64_t migrations = 0;
  uint64_t recoveries = 0;  ///< worlds re-created after a failure (the epoch)
  uint64_t task_timeouts = 0;
  uint64_t refused_decisions = 0;  ///< a policy's decisions dropped as invalid (NOTE [refused decisions])
  uint64_t batched_steps = 0;      ///< denoise tasks that stepped two or more requests together (NOTE [batches])
  uint64_t worker_deaths = 0;      ///< workers found dead (killed, crashed, or stopped for a missed deadline)
  uint64_t replacements = 0;       ///< replacement workers that joined the world (NOTE [replacements])
  uint64_t cache_gathers = 0;  ///< GATHER tasks before a regroup of a request with a step cache (NOTE [cache gathers])
  int64_t policy_ns = 0;       ///< real time spent in the policy (also when the clock is virtual)
};

/// Settings of a control plane (NOTE [lookahead] and NOTE [expected completions] are in
/// src/runtime/control.cpp).
struct ControlConfig {
  int world_size = 1;
  int max_inflight_steps = 2;  ///< steps of one request dispatched ahead of completions (at least)
  double min_queued_s = 0.02;  ///< more steps go ahead when steps are short: at least this much work (NOTE [lookahead])
  double long_step_s = 0.1;    ///< a step predicted this long or longer is not dispatched ahead (NOTE [lookahead])
  double task_timeout_s = 0;   ///< a task not done this long after dispatch (plus its prediction) fails: 0 off
  int max_attempts = 3;        ///< recoveries a request may go through before it fails
  bool record_stages = true;   ///< keep each request's timeline (the simulator may turn it off)
  bool lookahead = true;       ///< NOTE [lookahead]
  std::vector<int> node_of;    ///< node of each rank (empty: one node)
};

/// The control plane. Single-threaded: one thread (the engine loop, the simulator) calls everything.
class ControlPlane {
 public:
  ControlPlane(ControlConfig config, Clock& clock, Executor& executor, std::shared_ptr<Policy> policy,
               std::shared_ptr<const cost::CostModel> cost = nullptr);
  ~ControlPlane();

  /// Queues a request (QUEUED); returns its id. The shape must have passed checkRequest.
  uint64_t submit(RequestSpec spec);
  /// Cancels a request: at once when nothing of it runs, else after its in-flight tasks.
  void cancel(uint64_t id);
  /// A worker finished (or failed) one task; `message` is the completion's failure text (its payload).
  void onCompletion(const Completion& c, const std::string& message = std::string());
  /// A worker is gone: tasks pending on it fail, recovery starts.
  void onWorkerDeath(int worker);
  /// Whether dead workers may be replaced (NOTE [replacements]): then the death of the last worker leaves the
  /// requests waiting for a replacement instead of failing them. Turning it off with no worker alive fails them
  /// with `reason`.
  void setReplacing(bool on, const std::string& reason = std::string());
  /// A replacement for dead `worker` said hello: it joins the world at the next step boundary, when the tasks in
  /// flight are done (NOTE [replacements]).
  void onWorkerJoin(int worker);
  /// Whether `worker` is a replacement waiting to join.
  bool joining(int worker) const { return joining_[worker]; }
  /// Checks task deadlines and runs the policy when something changed; returns the time (ns) of the next
  /// deadline, or INT64_MAX.
  int64_t poll();
  /// Ends every request (CANCELLED, or FAILED when `failed`) with `reason`.
  void finishAll(const std::string& reason, bool failed = false);
  /// Dispatches an empty task to `worker`; its completion goes to the probe callback.
  void probe(int worker);

  /// Called once per request when it ends (after which it is pruned).
  void setFinishedCallback(std::function<void(RequestResult&&)> fn) { on_finished_ = std::move(fn); }
  /// Called for each completed probe.
  void setProbeCallback(std::function<void(const Completion&, int64_t seen_ns)> fn) { on_probe_ = std::move(fn); }
  /// Called whenever a request's state, step or ranks change (EngineLoop pushes it to its caller).
  void setProgressCallback(std::function<void(const RequestProgress&)> fn) { on_progress_ = std::move(fn); }

  RequestStatus status(uint64_t id) const;
  /// Requests not yet pruned (queued, running, or finished with tasks still in flight).
  size_t numRequests() const { return requests_.size(); }
  /// Tasks dispatched and not yet completed.
  size_t numTasksInFlight() const { return tasks_.size(); }
  bool recovering() const { return recovering_; }
  bool alive(int worker) const { return alive_[worker]; }
  const ControlStats& stats() const { return stats_; }
  /// Why the latest refused decision was refused ("" if none was; NOTE [refused decisions] in control.cpp).
  const std::string& lastRefusal() const { return last_refusal_; }
  const ControlConfig& config() const { return config_; }
  Policy& policy() { return *policy_; }
  /// The earliest time an in-flight task is expected to complete (from measured durations; NOTE [expected
  /// completions] in src/runtime/control.cpp), or INT64_MAX.
  int64_t expectedCompletionNs() const;

 private:
  struct Task;
  struct Request;

  Request& req(uint64_t id);
  void transition(Request& r, RequestState s, int32_t step = -1, const std::string& reason = "");
  void notify(Request& r);
  uint64_t dispatch(Request* r, TaskKind kind, const std::vector<int>& ranks, const Layout& layout, int32_t step_begin,
                    int32_t num_steps, int src = -1, const std::string* payload = nullptr, int32_t batch = 1);
  void schedule();
  void track(Request& r);
  void buildView(SchedulerView& view, const Request* lookahead);
  void validate(const Decision& d, const SchedulerView& view, const Request* lookahead, const std::vector<bool>& taken,
                const std::vector<uint64_t>& seen, std::vector<Request*>& members) const;
  void startDecision(const std::vector<Request*>& members, const Decision& d);
  void place(Request& r);
  double stepSeconds(const Request& r, const Layout& layout, int32_t batch) const;
  bool decisionDone(const Request& head) const;
  void dispatchStep(Request& r);
  void pump(Request& r);
  bool lookahead(Request& r);
  void leaveBatch(Request& r);
  void applyTo(Task& t, Request& r, size_t member, int32_t step_begin, bool& go_on);
  void gatherCache(Request& r, const Layout& next);
  void continueBatch(Task& t);
  void drainDecodes();
  void taskDone(Task& t);
  void applyDone(Task& t);
  void dropCopy(Request& r, int worker);
  void endDecision(Request& r);
  void dispatchDecode(Request& r);
  void decodeOnGroup(Request& r);
  void finish(Request& r, RequestState state, const std::string& reason = "");
  void maybePrune(Request& r);
  void occupy(const std::vector<int>& ranks);
  void release(const std::vector<int>& ranks);
  void startRecovery();
  bool paused() const { return recovering_ || rejoin_; }
  void tryReinit();
  void reinitDone(const std::vector<int>& members);
  void checkDeadlines(int64_t now);
  void expectNext(int worker, int64_t now);
  int inflightLimit(const Request& r) const;
  int64_t estimateNs(const Task& t) const;

  ControlConfig config_;
  Clock& clock_;
  Executor& executor_;
  std::shared_ptr<Policy> policy_;
  std::shared_ptr<const cost::CostModel> cost_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::vector<Request*> order_;  ///< unpruned requests in arrival order (the view's order)
  /// Unfinished requests with a decision running, by (arrival, id): the keys beside the pointer, so that keeping
  /// the order reads no request.
  std::vector<std::tuple<int64_t, uint64_t, Request*>> running_;
  std::unique_ptr<ReadyOrder> ready_order_;  ///< the policy's order of the waiting requests (NOTE [ready order])
  std::unordered_map<uint64_t, std::unique_ptr<Task>> tasks_;
  std::vector<bool> rank_busy_;
  std::vector<bool> alive_;
  std::vector<bool> joining_;  ///< replacements that said hello and wait for the next world (NOTE [replacements])
  std::vector<int64_t> worker_free_at_;       ///< expected end of each worker's queued work
  std::vector<uint64_t> decode_waiting_;      ///< requests waiting for a free holder to decode on (NOTE [batches])
  std::string last_refusal_;                  ///< why the policy's last refused decision was refused
  std::unique_ptr<TaskDurations> durations_;  ///< measured task durations by kind, shape and layout
  int ranks_per_node_ = 0;                    ///< ranks on node 0 (nodes are assumed equal)
  uint64_t next_request_id_ = 1;
  uint64_t next_task_id_ = 1;
  bool dirty_ = false;
  bool refused_waiting_ = false;  ///< the last round refused a decision while tasks were in flight
  bool recovering_ = false;
  bool rejoin_ = false;      ///< a replacement waits: nothing new goes out until the world is re-created with it
  bool replacing_ = false;   ///< setReplacing
  int reinit_failures_ = 0;  ///< re-creations of the world that failed in a row
  uint64_t epoch_ = 0;
  ControlStats stats_;
  std::function<void(RequestResult&&)> on_finished_;
  std::function<void(const Completion&, int64_t)> on_probe_;
  std::function<void(const RequestProgress&)> on_progress_;
};

}  // namespace runtime
}  // namespace gfdit
