// The control plane: requests, the trajectory task graph of each (encode -> migrate/free -> denoise steps ->
// decode), completion aggregation over members, holders and layouts, dispatch-ahead, cancellation, task
// deadlines, recovery after a worker death and pruning of finished requests. It talks to the world through
// a Clock and an Executor, so the same code serves requests on worker processes (EngineLoop) and on a
// simulated cluster (Simulator), and a C++ program can drive it with its own executor and policy.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "gfdit/cost.h"
#include "gfdit/layout.h"
#include "gfdit/runtime.h"

namespace gfdit {
namespace runtime {

// ---- time and execution ----

/// Where the control plane reads the time. Nothing inside it calls a system clock directly.
class Clock {
 public:
  virtual ~Clock() = default;
  /// Nanoseconds on this clock's time line.
  virtual int64_t nowNs() const = 0;
};

/// The machine's monotonic clock.
class RealClock : public Clock {
 public:
  int64_t nowNs() const override { return runtime::nowNs(); }
};

/// A clock that moves only when told (the simulator, tests).
class VirtualClock : public Clock {
 public:
  int64_t nowNs() const override { return now_ns_; }
  /// Moves the clock to `t_ns` (never backwards).
  void set(int64_t t_ns) { now_ns_ = t_ns > now_ns_ ? t_ns : now_ns_; }

 private:
  int64_t now_ns_ = 0;
};

/// Runs tasks on workers. The control plane calls it from its one thread, in its one total order
/// (NOTE [dispatch order]); completions come back through ControlPlane::onCompletion.
class Executor {
 public:
  virtual ~Executor() = default;
  /// Queues `task` (with `payload`) on each worker in `workers`, in FIFO order per worker. Never waits for
  /// a worker to run it.
  virtual void dispatch(const TaskDescriptor& task, const std::vector<int>& workers, const std::string& payload) = 0;
  /// Releases collectives blocked on a dead or wedged worker (recovery starts).
  virtual void abortCollectives() {}
  /// Stops a worker that missed a task deadline; its death is then reported through onWorkerDeath.
  virtual void killWorker(int worker) {}
  /// An output nobody will read (its request was cancelled or pruned).
  virtual void discardOutput(const OutputRef& ref) {}
};

// ---- requests ----

/// Where a request is. DENOISING carries the step in RequestRecord::step.
enum class RequestState : int32_t { kQueued, kEncoding, kDenoising, kDecoding, kDone, kFailed, kCancelled };

/// Name of a state ("QUEUED", ...).
const char* requestStateName(RequestState s);
/// Whether a state is final.
inline bool isFinished(RequestState s) {
  return s == RequestState::kDone || s == RequestState::kFailed || s == RequestState::kCancelled;
}

/// One time-stamped transition.
struct Transition {
  RequestState state;
  int32_t step;
  int64_t t_ns;
};

/// One task of a request as it ran: what, where, with which layout, when.
struct StageRecord {
  TaskKind kind = TaskKind::kEncode;
  std::vector<int> ranks;
  Layout layout;
  int32_t step_begin = 0;
  int32_t num_steps = 0;
  int64_t dispatch_ns = 0;
  int64_t start_ns = 0;  ///< earliest start over the members
  int64_t end_ns = 0;    ///< latest end over the members
  TaskError error = TaskError::kOk;
};

/// What a caller submits.
struct RequestSpec {
  uint64_t id = 0;                 ///< 0: the control plane assigns one (a caller that needs ids first assigns its own)
  RequestShape shape;              ///< num_steps >= 1; tokens filled in by checkRequest
  int64_t arrival_ns = 0;          ///< 0: now
  int64_t deadline_ns = 0;         ///< absolute, on the control plane's clock; 0: none
  int32_t priority = 0;            ///< larger is more urgent
  int32_t max_degree = kMaxRanks;  ///< largest group the request may get (the engine: its world size)
  int32_t num_heads = 0;           ///< the model's attention heads (layouts without a cost model); 0: unknown
  std::string payload;             ///< opaque to the control plane: what encode tasks carry to the worker
};

/// Which layouts a policy considers for a group (DESIGN.md, Policies).
enum class LayoutFamily : int32_t {
  kAuto = 0,   ///< whatever the cost model predicts fastest: Ulysses, Ring, USP in either placement, Torus
  kUsp = 1,    ///< xDiT's USP: Ulysses inside a node, Ring across nodes
  kSwift = 2,  ///< SwiftFusion's placement: Ring inside a node, Ulysses across nodes
  kTorus = 3,  ///< Torus (overlapped Ulysses x Ring)
};

/// Name of a layout family ("auto", "usp", "swift", "torus").
const char* layoutFamilyName(LayoutFamily f);

/// The cost model's predictions for one request, for every group degree 1 .. kMaxRanks, filled in by the
/// control plane at submit when it has a cost model. Groups are assumed placed as compactly as the topology
/// allows (ceil(degree / ranks per node) nodes).
struct RequestCost {
  bool known = false;       ///< false: no cost model; policies fall back to shape-only rules
  double encode_s = 0;      ///< text encoder, once, on the first group
  double decode_s = 0;      ///< VAE decode, on one rank
  double migrate_s = 0;     ///< state hand-off to one new member
  int32_t max_ulysses = 1;  ///< the largest Ulysses degree: the model's heads (at most kMaxRanks)
  /// step_s[d]: one denoising step on d ranks with layout[d]; infinity where the degree was not predicted
  /// (past the request's or the world's largest degree) or no layout of it can run ([0] is unused).
  std::array<double, kMaxRanks + 1> step_s{};
  std::array<Layout, kMaxRanks + 1> layout{};

  /// Seconds of one step on a group of `degree` ranks (any degree); infinity where not predicted.
  double stepSeconds(int degree) const;
  /// The layout predictions assume for `degree` ranks.
  const Layout& layoutFor(int degree) const;
};

/// The layout a policy uses for `degree` ranks without a cost model: Ulysses over gcd(degree, num_heads) ranks
/// (the heads split evenly; the whole degree when num_heads is 0) and Ring over the rest, one pass at a time.
Layout plainLayout(int degree, int num_heads);

/// The fastest layout of `family` for one step of `shape` on `degree` ranks spread over `num_nodes` nodes:
/// every Ulysses x Ring factorisation of the degree with Ulysses at most `max_ulysses` (the heads; Ulysses
/// need not divide them), and with guidance and an even degree also CFG-parallel ones (cfg = 2, ulysses x
/// ring = degree / 2; the family restricts the per-pass layout). Its predicted seconds go to `step_s`
/// (infinity when the cost model prices none of them).
Layout bestLayout(const cost::CostModel& cost, const RequestShape& shape, int degree, int num_nodes, int max_ulysses,
                  LayoutFamily family, double* step_s);

/// Predictions for a request of `shape` on groups of 1 .. `max_degree` ranks, `ranks_per_node` to a node.
RequestCost predictCosts(const cost::CostModel& cost, const RequestShape& shape, int max_degree, int ranks_per_node,
                         LayoutFamily family);

/// What the control plane knows of a request; what policies see.
struct RequestRecord {
  uint64_t id = 0;
  RequestState state = RequestState::kQueued;
  int32_t step = 0;       ///< denoising steps completed
  int32_t num_steps = 0;  ///< total denoising steps
  int64_t arrival_ns = 0;
  int64_t deadline_ns = 0;  ///< 0: none
  int32_t priority = 0;
  RequestShape shape;
  int32_t max_degree = kMaxRanks;
  int32_t num_heads = 0;   ///< the model's attention heads, when the submitter said (0: unknown)
  std::vector<int> ranks;  ///< the ranks holding the request's state after its last completed step
  Layout layout;           ///< the layout of its current or last decision
  bool busy = false;       ///< a decision of it is running (its group's ranks are occupied)
  int32_t steps_in_flight = 0;
  int32_t attempts = 0;         ///< recoveries it went through
  int64_t decision_end_ns = 0;  ///< busy: predicted end of its running decision (0: unknown)
  RequestCost cost;             ///< predictions (cost.known is false without a cost model)
  std::string reason;           ///< FAILED / CANCELLED
  std::vector<Transition> transitions;

  int32_t stepsLeft() const { return num_steps - step; }
  /// Predicted seconds from now to its end on `degree` ranks: encode when it has not started, the steps left,
  /// decode (0 without a cost model).
  double remainingSeconds(int degree) const;
};

/// A policy's answer for one ready request: run it on `ranks` (in order) with `layout` for `num_steps`
/// steps before the next decision. layout.degree() must equal the number of ranks; layout.cfg = 2 only for a
/// request with guidance (the first half of `ranks` runs the conditional pass, the second the unconditional).
struct Decision {
  uint64_t request_id = 0;
  std::vector<int> ranks;
  Layout layout;
  int32_t num_steps = 1;
  /// Whether steps may be dispatched ahead of completions (NOTE [lookahead]). A policy that lends a request
  /// ranks others may soon need turns it off, so the ranks come back after one step, not two.
  bool dispatch_ahead = true;
};

/// What a policy sees at a scheduling point. Pointers are valid during the call only.
struct SchedulerView {
  int64_t now_ns = 0;
  int world_size = 0;
  std::vector<int> free_ranks;                ///< alive ranks with no decision running
  std::vector<const RequestRecord*> ready;    ///< waiting for a decision, in arrival order
  std::vector<const RequestRecord*> running;  ///< a decision of theirs is running
  std::vector<int> node_of;                   ///< node of each rank (topology)
  const cost::CostModel* cost = nullptr;      ///< predictions, when the control plane has a model
  double long_step_s = 0.1;                   ///< ControlConfig::long_step_s: such steps are not dispatched ahead
};

/// Decides, at each scheduling point, which ready requests run next and where. Pure: reads the view,
/// returns decisions; the control plane validates and applies them.
class Policy {
 public:
  virtual ~Policy() = default;
  /// Name as the engine accepts it ("fcfs", "static:2").
  virtual std::string name() const = 0;
  /// Decisions for some ready requests; each uses distinct ranks from view.free_ranks.
  virtual std::vector<Decision> schedule(const SchedulerView& view) = 0;
  /// The layouts it chooses from: RequestRecord::cost is predicted for these.
  virtual LayoutFamily layouts() const { return LayoutFamily::kAuto; }
};

/// How a built-in dynamic policy orders requests.
enum class PolicyOrder : int32_t {
  kArrival = 0,    ///< fcfs
  kRemaining = 1,  ///< srtf: shortest remaining trajectory time first, with aging
  kDeadline = 2,   ///< edf: earliest deadline first; requests that cannot make theirs last
  kPriority = 3,   ///< priority: strict classes (larger first), EDF inside a class
};

/// Options of the built-in dynamic policies (fcfs, srtf, edf, priority).
struct PolicyOptions {
  PolicyOrder order = PolicyOrder::kArrival;
  LayoutFamily layouts = LayoutFamily::kAuto;
  int32_t steps_per_decision = 2;  ///< steps before the next decision (NOTE [lookahead] asks again before they end)
  /// Spare ranks grow a group of d ranks to d' only when its step gets at least this much faster per doubling:
  /// step(d') <= step(d) x (1 - min_gain)^log2(d' / d) (NOTE [planning]).
  double min_gain = 0.1;
  /// srtf: a request waiting this many times its remaining time alone goes first (no starvation).
  double aging = 4.0;
  /// edf, priority: the degree a deadline needs is the smallest whose predicted remaining time, times this,
  /// fits before the deadline (predictions miss queueing and later preemption).
  double deadline_margin = 1.5;
};

/// "static:D": ranks split into fixed groups of D (0..D-1, D..2D-1, ...); a request keeps the group it
/// got first for its whole life; the baseline of fixed-degree serving systems.
std::unique_ptr<Policy> makeStaticPolicy(int degree);
/// The built-in dynamic policies (NOTE [planning] in policies.cpp): at every step boundary, requests in the
/// policy's order get a degree from the cost model and the load, the ranks that hold their state where
/// possible, and a layout for the topology; requests that do not fit wait (paused on their holders).
std::unique_ptr<Policy> makePlanningPolicy(const PolicyOptions& options);
/// "fcfs": the planning policy in arrival order.
std::unique_ptr<Policy> makeFcfsPolicy(int steps_per_decision = 2);
/// Parses a policy name: "fcfs", "srtf", "edf", "priority", "static:D", the dynamic ones optionally with
/// ":layout=auto|usp|swift|torus"; unknown names list the built-in ones.
std::unique_ptr<Policy> makePolicy(const std::string& spec);
/// Names of the built-in policies ("static:D" stands for any degree).
std::vector<std::string> policyNames();

/// The largest Ulysses degree a model of `heads` attention heads allows: the heads (an uneven split gives each
/// member floor or ceil of heads / ulysses), at least 1 and at most kMaxRanks.
int maxUlyssesDegree(int heads);

/// What a request is checked against at submit: the model's strides and the serving limits.
struct RequestLimits {
  int32_t vae_stride_s = 8;     ///< spatial VAE compression
  int32_t patch_s = 2;          ///< spatial patch: height and width are multiples of vae_stride_s * patch_s
  int32_t temporal_stride = 4;  ///< video: num_frames = stride * k + 1
  int32_t patch_t = 1;
  bool is_video = false;  ///< image models take num_frames == 1 only
  int32_t max_steps = 1000;
  int64_t max_pixels = 2048 * 2048;
  int32_t max_frames = 1;
  int64_t max_tokens = 1 << 20;  ///< image/video tokens the transformer sees
  size_t max_payload_bytes = kMaxPayloadBytes;
  /// Limits of a known model (its registry entry).
  static RequestLimits of(const cost::ModelArch& arch);
  /// Image/video tokens of a request of this size.
  int64_t tokens(int32_t height, int32_t width, int32_t num_frames) const;
};

/// Checks a request's shape against `limits` and fills shape.tokens; throws InvalidUsage naming the field
/// ("height", "num_frames", "num_inference_steps", "guidance_scale", ...).
void checkRequest(RequestShape& shape, const RequestLimits& limits);

// ---- the control plane ----

/// The result of a finished request, handed to the finished-callback once, when it ends.
struct RequestResult {
  uint64_t id = 0;
  RequestState state = RequestState::kQueued;
  std::string reason;
  std::vector<StageRecord> stages;
  std::vector<Transition> transitions;
  OutputRef output;  ///< DONE: where the worker left the output
  int64_t arrival_ns = 0;
  int64_t deadline_ns = 0;
  int32_t priority = 0;
};

/// A request's progress, for status queries.
struct RequestStatus {
  bool known = false;
  RequestState state = RequestState::kQueued;
  int32_t step = 0;
  int32_t num_steps = 0;
  std::vector<int> ranks;
};

/// Counters for benchmarks and metrics.
struct ControlStats {
  uint64_t submitted = 0;
  uint64_t finished = 0;
  uint64_t tasks_dispatched = 0;
  uint64_t tasks_completed = 0;
  uint64_t policy_calls = 0;
  uint64_t lookahead_hits = 0;  ///< steps dispatched ahead across decisions (NOTE [lookahead])
  uint64_t regroups = 0;        ///< decisions that changed a request's group
  uint64_t migrations = 0;
  uint64_t recoveries = 0;  ///< worlds re-created after a failure (the epoch)
  uint64_t task_timeouts = 0;
  int64_t policy_ns = 0;  ///< real time spent in the policy (also when the clock is virtual)
};

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
  /// A worker finished (or failed) one task.
  void onCompletion(const Completion& c);
  /// A worker is gone: tasks pending on it fail, recovery starts.
  void onWorkerDeath(int worker);
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

  RequestStatus status(uint64_t id) const;
  /// Requests not yet pruned (queued, running, or finished with tasks still in flight).
  size_t numRequests() const { return requests_.size(); }
  /// Tasks dispatched and not yet completed.
  size_t numTasksInFlight() const { return tasks_.size(); }
  bool recovering() const { return recovering_; }
  bool alive(int worker) const { return alive_[worker]; }
  const ControlStats& stats() const { return stats_; }
  const ControlConfig& config() const { return config_; }
  Policy& policy() { return *policy_; }
  /// The earliest time an in-flight task is expected to complete (from measured durations; NOTE [expected
  /// completions] in control.cpp), or INT64_MAX.
  int64_t expectedCompletionNs() const;

 private:
  struct Task;
  struct Request;

  Request& req(uint64_t id);
  void transition(Request& r, RequestState s, int32_t step = -1, const std::string& reason = "");
  uint64_t dispatch(Request* r, TaskKind kind, const std::vector<int>& ranks, const Layout& layout, int32_t step_begin,
                    int32_t num_steps, int src = -1, const std::string* payload = nullptr);
  void schedule();
  void buildView(SchedulerView& view, const Request* lookahead);
  void validate(const std::vector<Decision>& ds, const SchedulerView& view, const Request* lookahead) const;
  void startDecision(Request& r, const Decision& d);
  void pump(Request& r);
  bool lookahead(Request& r);
  void taskDone(Task& t);
  void applyDone(Task& t);
  void dropCopy(Request& r, int worker);
  void endDecision(Request& r);
  void dispatchDecode(Request& r);
  void finish(Request& r, RequestState state, const std::string& reason = "");
  void maybePrune(Request& r);
  void occupy(const std::vector<int>& ranks);
  void release(const std::vector<int>& ranks);
  void startRecovery();
  void tryReinit();
  void reinitDone();
  void checkDeadlines(int64_t now);
  void expectNext(int worker, int64_t now);
  int inflightLimit(const Request& r) const;

  ControlConfig config_;
  Clock& clock_;
  Executor& executor_;
  std::shared_ptr<Policy> policy_;
  std::shared_ptr<const cost::CostModel> cost_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::vector<Request*> order_;  ///< unpruned requests in arrival order (the view's order)
  std::unordered_map<uint64_t, std::unique_ptr<Task>> tasks_;
  std::vector<bool> rank_busy_;
  std::vector<bool> alive_;
  std::vector<int64_t> worker_free_at_;  ///< expected end of each worker's queued work
  double ewma_ns_[8] = {};               ///< measured task duration by kind
  int ranks_per_node_ = 0;               ///< ranks on node 0 (nodes are assumed equal)
  uint64_t next_request_id_ = 1;
  uint64_t next_task_id_ = 1;
  bool dirty_ = false;
  bool recovering_ = false;
  uint64_t epoch_ = 0;
  ControlStats stats_;
  std::function<void(RequestResult&&)> on_finished_;
  std::function<void(const Completion&, int64_t)> on_probe_;
};

}  // namespace runtime
}  // namespace gfdit
