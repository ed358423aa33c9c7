// The control plane: requests, the trajectory task graph, completions, recovery (see control.h).
//
// NOTE [dispatch order]
// Every task leaves the control plane from its one thread, so all tasks form one total order, and each
// worker runs its ring in FIFO order. Hence every pair of workers meets the collectives of their shared
// tasks in the same order, which is what the group-free collectives need to be deadlock-free (NOTE
// [group-free collectives] in include/gfdit/world.h). A task may be queued behind a busy holder (a
// migration from a rank that still runs another request): it simply runs when that rank gets to it.
//
// NOTE [holders]
// After a task completes on every member, every member holds the request's whole denoise state at the
// same step (NOTE [portable denoise state] in python/gfdit/models/staged.py). RequestRecord::ranks are the
// ranks known to hold it at RequestRecord::step. A decision on ranks the holders include moves nothing
// (stale holders get a FREE); new members get a MIGRATE from a holder first. Each completion also says at
// which step the worker's copy is (step_end), so after a failure the request resumes from the most
// advanced copy that survived, whatever was in flight.
//
// NOTE [regroups]
// A request is regrouped when a denoise task of it runs on another set of ranks than its previous denoise
// task did; the order of the ranks within the group does not count (the same ranks in another order move no
// state and show as the same rows of a timeline). The control plane decides it once, when it dispatches the
// task, marks the task's stage (StageRecord::regroup) and counts it (ControlStats::regroups); the live page
// and the metrics read that mark rather than deciding again.
//
// NOTE [lookahead]
// A policy decides `num_steps` steps at a time, often one. To keep workers busy across decisions, when a
// decision's last step has been dispatched but not completed, the control plane asks the policy what it would
// decide for this request once that step is done (a view where the request is ready at its next step and its
// own ranks are free). If the answer keeps the same ranks and layout, the next steps are dispatched at once
// (dispatch-ahead); otherwise the request waits for its boundary and the real decision. Policies are pure, so
// asking early is safe; the answer for other requests is ignored. At most max_inflight_steps steps of a
// request are in flight, or more when steps are short: enough to hold min_queued_s of measured step time of
// this request's shape and layout (at most kMaxStepsAhead), so that a worker with tiny steps always has work
// queued (NOTE [quiet completions] in rings.cpp) while long steps stay responsive to the policy. A step
// predicted to take long_step_s or more goes alone: nothing is dispatched ahead of it, so a preemption waits
// for one step only.
//
// NOTE [ready order]
// A scheduling round must cost what the cluster can run, not what waits: under overload thousands of requests
// wait while a cluster of 8 or 64 ranks starts a few of them. So a policy may keep the waiting requests in its
// own order between rounds (Policy::makeReadyOrder; every built-in one does), which the control plane owns and
// keeps current: track() inserts a request when it starts waiting for a decision (submitted, its decision
// ended, recovered) and erases it when it stops (a decision started, it finished), and erases and inserts it
// again whenever its record changes while it waits. track() is called wherever a request's state, step,
// holders or `busy` change. The view then carries the order instead of a list of every waiting request, and the
// policy plans the head of it (the requests that can get ranks this round); its `ready` holds only what the
// order does not (the lookahead's request as it will be at its boundary), and `running` comes from the
// running list (a few). A policy without an order, every Python policy among them, still gets every waiting
// request in `ready`, for a list built per round. An order must lead to the decisions a full sort of the
// list would: the tests run each built-in policy both ways and compare.
//
// NOTE [expected completions]
// The control plane predicts when each task in flight ends, from how long such tasks take (the moving average
// of its kind, shape and layout, else the cost model's prediction, else the last task of its kind: NOTE [task
// durations] in task_durations.h) and from when its workers get to it: a task starts once every member
// finished what was queued before it. When a worker reports a task, the oldest task still queued on it starts
// now; when one member of a collective task reports, the others are due at once. The engine loop spins rather
// than sleeps only when a completion is due within a few tens of microseconds (NOTE [control thread]).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <sstream>
#include <tuple>

#include "gfdit/control.h"
#include "gfdit/error.h"
#include "gfdit/planning.h"
#include "task_durations.h"

namespace gfdit {
namespace runtime {

namespace {

bool needsRecovery(TaskError e) {
  return e == TaskError::kCommError || e == TaskError::kWorkerDied || e == TaskError::kTimeout ||
         e == TaskError::kStateLost;
}

// Which transitions the state machine allows.
bool allowed(RequestState from, RequestState to) {
  if (isFinished(from)) return false;
  if (to == RequestState::kFailed || to == RequestState::kCancelled) return true;
  switch (from) {
    case RequestState::kQueued: return to == RequestState::kEncoding;
    case RequestState::kEncoding:
      // a request whose encode was lost with a worker starts over
      return to == RequestState::kDenoising || to == RequestState::kQueued;
    case RequestState::kDenoising:
      return to == RequestState::kDenoising || to == RequestState::kDecoding || to == RequestState::kQueued;
    case RequestState::kDecoding:
      // a decode lost with its worker runs again on another holder, or waits for its policy to place it again
      return to == RequestState::kDone || to == RequestState::kQueued || to == RequestState::kDecoding ||
             to == RequestState::kDenoising;
    default: return false;
  }
}

// The order of order_, running_ and the view's lists: arrival, then id.
bool arrivesBefore(const RequestRecord& a, const RequestRecord& b) {
  return a.arrival_ns != b.arrival_ns ? a.arrival_ns < b.arrival_ns : a.id < b.id;
}

std::string ranksText(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

constexpr int64_t kSecond = 1000000000;
constexpr int64_t kKillGraceNs = 2 * kSecond;  // after an abort, how long a wedged task gets before a kill
constexpr int kMaxReinitFailures = 3;          // re-creations of the world that may fail in a row (NOTE [replacements])
// However short its steps, at most this many steps of a request go ahead of completions (NOTE [lookahead]):
// enough to hide the round trip of a completion, few enough that a decision changes course soon.
constexpr int kMaxStepsAhead = 8;

}  // namespace

struct ControlPlane::Task {
  uint64_t id = 0;
  uint64_t request_id = 0;
  TaskKind kind = TaskKind::kFree;
  std::vector<int> ranks;    // the group, in order
  std::vector<int> members;  // workers it was dispatched to
  uint64_t pending = 0;      // members that have not completed (bit per worker)
  Layout layout;
  int32_t step_begin = 0;
  int32_t num_steps = 0;
  int64_t dispatch_ns = 0;
  int64_t expected_end_ns = 0;
  int64_t deadline_ns = 0;  // 0: none
  TaskKey key;              // what its duration is measured for (NOTE [task durations])
  bool aborted = false;     // the deadline passed once: abort sent, a kill follows
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  TaskError error = TaskError::kOk;
  std::string message;
  OutputRef output;
  bool probe = false;
  bool regroup = false;  // a denoise task on another set of ranks than the request's previous one
  std::vector<std::pair<int, int32_t>> step_ends;    // (worker, step its copy is at) from each completion
  std::vector<std::pair<uint64_t, int32_t>> riders;  // a batched step: the other requests and their first steps
  // a denoise task: (cached steps, cached passes) of its requests, the first one's then the riders' (NOTE [step
  // caches]), from its first successful completion (the members agree: each pass's decision is one value)
  std::vector<std::pair<int32_t, int32_t>> cached;
};

struct ControlPlane::Request {
  RequestRecord rec;
  std::string payload;
  std::vector<StageRecord> stages;
  std::vector<int> group;  // the running decision's ranks
  Layout layout;
  int32_t todo = 0;           // steps of the decision not yet dispatched
  bool ahead = true;          // the decision allows dispatch-ahead (Decision::dispatch_ahead)
  int32_t decode_degree = 0;  // Decision::decode_degree of its latest decision
  int32_t next_step = 0;      // the step the next denoise task starts at
  int32_t inflight = 0;       // encode/denoise/migrate/decode tasks of it not yet completed
  bool hit = false;           // one of its tasks failed in the current recovery
  std::string last_error;
  OutputRef output;
  std::vector<std::pair<int, int32_t>> copies;  // (worker, step) of every copy of its state it knows of
  std::vector<int> denoised_on;                 // the ranks of its last denoise task, sorted (NOTE [regroups])
  std::vector<int> cached_on;                   // ... in their order, and its CFG split (NOTE [cache gathers])
  int32_t cached_cfg = 1;
  RequestProgress told;     // what the progress callback heard of it last
  bool in_order = false;    // in ready_order_ (NOTE [ready order]) ...
  size_t order_handle = 0;  // ... by this handle
  bool in_running = false;  // in running_
  // see NOTE [batches]: the head of a batch lists the others; each of those points at the head
  std::vector<Request*> riders;
  Request* head = nullptr;
  bool decode_wait = false;  // its steps are done and no free holder could decode it yet
};

ControlPlane::ControlPlane(ControlConfig config, Clock& clock, Executor& executor, std::shared_ptr<Policy> policy,
                           std::shared_ptr<const cost::CostModel> cost)
    : config_(std::move(config)),
      clock_(clock),
      executor_(executor),
      policy_(std::move(policy)),
      cost_(std::move(cost)),
      durations_(std::make_unique<TaskDurations>()) {
  GFDIT_CHECK(config_.world_size >= 1 && config_.world_size <= kMaxRanks).param("world_size")
      << "world_size " << config_.world_size << " is outside [1, " << kMaxRanks << "]";
  GFDIT_CHECK(config_.max_inflight_steps >= 1).param("max_inflight_steps") << "max_inflight_steps must be >= 1";
  GFDIT_CHECK(std::isfinite(config_.task_timeout_s) && config_.task_timeout_s >= 0).param("task_timeout_s")
      << "task_timeout_s must be a finite number >= 0 (0: no deadline), got " << config_.task_timeout_s;
  GFDIT_CHECK(policy_ != nullptr) << "a control plane needs a policy";
  if (config_.node_of.empty()) config_.node_of.assign(config_.world_size, 0);
  GFDIT_CHECK(static_cast<int>(config_.node_of.size()) == config_.world_size)
      << "node_of has " << config_.node_of.size() << " entries for " << config_.world_size << " ranks";
  rank_busy_.assign(config_.world_size, false);
  alive_.assign(config_.world_size, true);
  joining_.assign(config_.world_size, false);
  worker_free_at_.assign(config_.world_size, 0);
  for (int n : config_.node_of) ranks_per_node_ += n == config_.node_of[0];
  ready_order_ = policy_->makeReadyOrder();
}

ControlPlane::~ControlPlane() = default;

ControlPlane::Request& ControlPlane::req(uint64_t id) {
  auto it = requests_.find(id);
  GFDIT_CHECK_CODE(kInternal, it != requests_.end()) << "unknown request " << id;
  return *it->second;
}

void ControlPlane::transition(Request& r, RequestState s, int32_t step, const std::string& reason) {
  RequestRecord& rec = r.rec;
  GFDIT_CHECK_CODE(kInternal, allowed(rec.state, s)) << "request " << rec.id << ": " << requestStateName(rec.state)
                                                     << " -> " << requestStateName(s) << " is not a valid transition";
  rec.state = s;
  if (step >= 0) rec.step = step;
  if (!reason.empty()) rec.reason = reason;
  rec.transitions.push_back({s, rec.step, clock_.nowNs()});
  track(r);
  notify(r);
}

void ControlPlane::notify(Request& r) {
  if (!on_progress_) return;
  const RequestRecord& rec = r.rec;
  const std::vector<int>& ranks = rec.busy ? r.group : rec.ranks;
  RequestProgress& p = r.told;
  if (p.id == rec.id && p.state == rec.state && p.step == rec.step && p.running == rec.busy && p.ranks == ranks) return;
  p.id = rec.id;
  p.state = rec.state;
  p.step = rec.step;
  p.num_steps = rec.num_steps;
  p.running = rec.busy;
  p.ranks = ranks;
  p.t_ns = clock_.nowNs();
  on_progress_(p);
}

uint64_t ControlPlane::submit(RequestSpec spec) {
  GFDIT_CHECK(spec.shape.num_steps >= 1) << "a request needs at least one step";
  GFDIT_CHECK(spec.payload.size() <= kMaxPayloadBytes)
      << "the request payload is " << spec.payload.size() << " bytes; at most " << kMaxPayloadBytes;
  auto r = std::make_unique<Request>();
  uint64_t id = spec.id != 0 ? spec.id : next_request_id_;
  GFDIT_CHECK(requests_.count(id) == 0) << "request " << id << " exists";
  next_request_id_ = std::max(next_request_id_, id + 1);
  RequestRecord& rec = r->rec;
  rec.id = id;
  rec.num_steps = spec.shape.num_steps;
  rec.arrival_ns = spec.arrival_ns != 0 ? spec.arrival_ns : clock_.nowNs();
  rec.deadline_ns = spec.deadline_ns;
  rec.priority = spec.priority;
  rec.group = spec.group;
  rec.shape = spec.shape;
  if (rec.shape.latent_rows == 0 && cost_ != nullptr) {
    rec.shape.latent_rows = cost_->model().latentRows(rec.shape.height);
  }
  rec.max_degree = std::max(1, spec.max_degree);
  rec.num_heads = std::max(0, spec.num_heads);
  if (cost_ != nullptr) {
    rec.cost = predictCosts(*cost_, rec.shape, std::min(rec.max_degree, config_.world_size), ranks_per_node_,
                            policy_->layouts());
  }
  rec.transitions.push_back({RequestState::kQueued, 0, rec.arrival_ns});
  r->payload = std::move(spec.payload);
  Request* p = r.get();
  requests_.emplace(id, std::move(r));
  // arrival order; arrivals come in order almost always, so this is an append
  auto pos = std::upper_bound(order_.begin(), order_.end(), p,
                              [](const Request* a, const Request* b) { return arrivesBefore(a->rec, b->rec); });
  order_.insert(pos, p);
  track(*p);
  ++stats_.submitted;
  dirty_ = true;
  return id;
}

void ControlPlane::cancel(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  finish(r, RequestState::kCancelled, "cancelled by the caller");  // tasks in flight drain, then it is pruned
}

void ControlPlane::occupy(const std::vector<int>& ranks) {
  for (int r : ranks) rank_busy_[r] = true;
}

void ControlPlane::release(const std::vector<int>& ranks) {
  for (int r : ranks) {
    if (alive_[r]) rank_busy_[r] = false;  // a dead rank stays occupied for ever
  }
  dirty_ = true;
}

uint64_t ControlPlane::dispatch(Request* r, TaskKind kind, const std::vector<int>& ranks, const Layout& layout,
                                int32_t step_begin, int32_t num_steps, int src, const std::string* payload,
                                int32_t batch) {
  auto t = std::make_unique<Task>();
  t->id = next_task_id_++;
  t->request_id = r != nullptr ? r->rec.id : 0;
  t->kind = kind;
  t->ranks = ranks;
  t->layout = layout;
  t->step_begin = step_begin;
  t->num_steps = num_steps;
  t->dispatch_ns = clock_.nowNs();
  t->key = TaskDurations::key(kind, r != nullptr ? &r->rec.shape : nullptr, layout, batch);
  if (kind == TaskKind::kDenoise && r != nullptr) {  // see NOTE [regroups]
    std::vector<int> on = ranks;
    std::sort(on.begin(), on.end());
    t->regroup = !r->denoised_on.empty() && r->denoised_on != on;
    if (t->regroup) ++stats_.regroups;
    r->denoised_on = std::move(on);
    r->cached_on = ranks;
    r->cached_cfg = layout.cfg;
  }
  t->members = ranks;  // a migration's group starts with its source
  int64_t start = t->dispatch_ns;
  for (int w : t->members) {
    GFDIT_CHECK_CODE(kInternal,
                     w >= 0 && w < config_.world_size && (alive_[w] || (joining_[w] && kind == TaskKind::kReinit)))
        << "task for worker " << w << ", which is dead or out of range";
    GFDIT_CHECK_CODE(kInternal, (t->pending & (uint64_t{1} << w)) == 0) << "worker " << w << " twice in a task";
    t->pending |= uint64_t{1} << w;
    start = std::max(start, worker_free_at_[w]);
  }
  t->expected_end_ns = start + estimateNs(*t);
  for (int w : t->members) worker_free_at_[w] = t->expected_end_ns;
  if (config_.task_timeout_s > 0) {
    t->deadline_ns = t->expected_end_ns + static_cast<int64_t>(config_.task_timeout_s * kSecond);
  }
  TaskDescriptor d;
  d.task_id = t->id;
  d.request_id = t->request_id;
  d.kind = static_cast<uint32_t>(kind);
  d.step_begin = step_begin;
  d.num_steps = num_steps;
  d.num_ranks = static_cast<int32_t>(ranks.size());
  d.src_rank = src;
  d.layout = layout;
  d.batch = batch;
  for (size_t i = 0; i < ranks.size(); ++i) d.ranks[i] = static_cast<int16_t>(ranks[i]);
  d.dispatch_ns = t->dispatch_ns;
  static const std::string kEmpty;
  const std::string& pl = payload != nullptr ? *payload : kEmpty;
  d.payload_bytes = static_cast<uint32_t>(pl.size());
  uint64_t id = t->id;
  std::vector<int> members = t->members;
  tasks_.emplace(id, std::move(t));
  ++stats_.tasks_dispatched;
  if (r != nullptr && kind != TaskKind::kFree) ++r->inflight;
  executor_.dispatch(d, members, pl);
  return id;
}

void ControlPlane::probe(int worker) {
  GFDIT_CHECK(worker >= 0 && worker < config_.world_size && alive_[worker]) << "worker " << worker << " is not alive";
  uint64_t id = dispatch(nullptr, TaskKind::kFree, {worker}, Layout(), 0, 0);
  tasks_[id]->probe = true;
}

// ---- scheduling ----

// see NOTE [ready order]
void ControlPlane::track(Request& r) {
  const bool live = !isFinished(r.rec.state);
  const bool waiting = live && !r.rec.busy && !r.decode_wait;
  const bool running = live && r.rec.busy;
  if (ready_order_ != nullptr) {
    if (r.in_order) ready_order_->erase(r.order_handle);
    if (waiting) r.order_handle = ready_order_->insert(&r.rec);
    r.in_order = waiting;
  }
  if (running != r.in_running) {
    const auto key = std::make_tuple(r.rec.arrival_ns, r.rec.id, &r);
    auto pos = std::lower_bound(running_.begin(), running_.end(), key);
    if (running) {
      running_.insert(pos, key);
    } else {
      running_.erase(pos);
    }
    r.in_running = running;
  }
}

void ControlPlane::buildView(SchedulerView& view, const Request* la) {
  view.now_ns = clock_.nowNs();
  view.world_size = config_.world_size;
  view.node_of = config_.node_of;
  view.cost = cost_.get();
  view.long_step_s = config_.long_step_s;
  for (int w = 0; w < config_.world_size; ++w) {
    bool own = la != nullptr && std::find(la->group.begin(), la->group.end(), w) != la->group.end();
    if (alive_[w] && (!rank_busy_[w] || own)) view.free_ranks.push_back(w);
  }
  view.order = ready_order_.get();
  if (view.order == nullptr) {  // every waiting request in the list (NOTE [ready order])
    view.ready.reserve(order_.size());
    for (const Request* r : order_) {
      if (!isFinished(r->rec.state) && !r->rec.busy && !r->decode_wait) view.ready.push_back(&r->rec);
    }
  }
  view.running.reserve(running_.size());
  for (const auto& entry : running_) {
    const Request* r = std::get<2>(entry);
    // la and its batch: added to ready by the caller, as at its boundary
    if (la == nullptr || (r != la && r->head != la)) view.running.push_back(&r->rec);
  }
}

void ControlPlane::validate(const Decision& d, const SchedulerView& view, const Request* la,
                            const std::vector<bool>& taken, const std::vector<uint64_t>& seen,
                            std::vector<Request*>& members) const {
  members.clear();
  std::vector<bool> free(config_.world_size, false);
  for (int w : view.free_ranks) free[w] = true;
  const std::string pname = policy_->name();
  auto it = requests_.find(d.request_id);
  GFDIT_CHECK(it != requests_.end()) << "policy " << pname << " chose unknown request " << d.request_id;
  const Request& r = *it->second;
  GFDIT_CHECK(d.batch.size() + 1 <= static_cast<size_t>(kMaxBatch)).param("batch")
      << "policy " << pname << ": a batch of " << d.batch.size() + 1 << " requests; at most " << kMaxBatch;
  for (size_t i = 0; i <= d.batch.size(); ++i) {
    const uint64_t id = i == 0 ? d.request_id : d.batch[i - 1];
    auto m = requests_.find(id);
    GFDIT_CHECK(m != requests_.end()).param("batch") << "policy " << pname << " chose unknown request " << id;
    const Request& x = *m->second;
    GFDIT_CHECK(((&x == la || (la != nullptr && x.head == la)) || !x.rec.busy) && !isFinished(x.rec.state) &&
                !x.decode_wait)
        << "policy " << pname << " chose request " << id << ", which is not ready";
    GFDIT_CHECK(std::find(seen.begin(), seen.end(), id) == seen.end() &&
                std::find(members.begin(), members.end(), m->second.get()) == members.end())
        << "policy " << pname << " chose request " << id << " twice";
    const RequestShape& a = r.rec.shape;
    const RequestShape& b = x.rec.shape;
    GFDIT_CHECK(sameBatchShape(a, b)).param("batch")
        << "policy " << pname << ": request " << id << " (" << b.height << "x" << b.width << "x" << b.num_frames
        << ", guidance " << (b.guidance() ? "on" : "off") << ", cache " << cacheKindName(b.cache.kind)
        << ") cannot batch with request " << d.request_id << " (" << a.height << "x" << a.width << "x" << a.num_frames
        << ", guidance " << (a.guidance() ? "on" : "off") << ", cache " << cacheKindName(a.cache.kind)
        << "): the members of a batch share their shape, guidance and step cache kind";
    members.push_back(m->second.get());
  }
  GFDIT_CHECK(!d.ranks.empty() && static_cast<int>(d.ranks.size()) <= config_.world_size)
      << "policy " << pname << " gave request " << d.request_id << " " << d.ranks.size() << " ranks";
  // see NOTE [stages]
  const bool done = r.rec.step >= r.rec.num_steps;
  switch (d.stage) {
    case cost::Stage::kDenoise:
      GFDIT_CHECK(!done).param("stage") << "policy " << pname << ": steps for request " << d.request_id
                                        << ", whose steps are done (it waits for a decode: Stage.DECODE)";
      break;
    case cost::Stage::kEncode:
      GFDIT_CHECK(r.rec.state == RequestState::kQueued && d.batch.empty()).param("stage")
          << "policy " << pname << ": an encode for request " << d.request_id << ", which is "
          << requestStateName(r.rec.state) << (d.batch.empty() ? "" : ", with a batch (an encode takes none)");
      break;
    case cost::Stage::kDecode:
      GFDIT_CHECK(done && d.batch.empty()).param("stage")
          << "policy " << pname << ": a decode for request " << d.request_id << ", which has " << r.rec.stepsLeft()
          << " steps left" << (d.batch.empty() ? "" : " (and a decode takes no batch)");
      GFDIT_CHECK(static_cast<int>(d.ranks.size()) <= std::max(1, r.rec.shape.latent_rows)).param("ranks")
          << "policy " << pname << ": a decode of request " << d.request_id << " on " << d.ranks.size()
          << " ranks, but its latent has " << r.rec.shape.latent_rows << " rows (a decode member needs one at least)";
      break;
    default:
      GFDIT_THROW(kInvalidUsage).param("stage")
          << "policy " << pname << ": stage " << cost::stageName(d.stage) << " for request " << d.request_id
          << " (a decision runs steps, an encode or a decode)";
  }
  std::vector<int> mine;
  for (int w : d.ranks) {
    GFDIT_CHECK(w >= 0 && w < config_.world_size && free[w] && !taken[w] &&
                std::find(mine.begin(), mine.end(), w) == mine.end())
        << "policy " << pname << " gave request " << d.request_id << " rank " << w
        << ", which is busy, dead, taken twice or out of range";
    mine.push_back(w);
  }
  if (d.stage != cost::Stage::kDenoise) return;  // an encode or a decode: the plain layout of its degree
  GFDIT_CHECK(d.layout.cfg == 1 || d.layout.cfg == 2)
      << "policy " << pname << ": layout cfg " << d.layout.cfg << " for request " << d.request_id
      << " (1: the guidance passes in turn, 2: CFG-parallel)";
  GFDIT_CHECK(d.layout.ulysses >= 1 && d.layout.ring >= 1 && d.layout.degree() == static_cast<int>(d.ranks.size()))
      << "policy " << pname << ": layout " << d.layout.ulysses << "x" << d.layout.ring
      << (d.layout.cfg == 2 ? " x cfg 2" : "") << " does not fit " << d.ranks.size() << " ranks";
  GFDIT_CHECK(d.layout.cfg == 1 || r.rec.shape.guidance())
      << "policy " << pname << ": layout cfg 2 (CFG-parallel) for request " << d.request_id
      << ", which has no guidance (guidance_scale " << r.rec.shape.guidance_scale
      << " <= 1: one pass per step, nothing to run in parallel)";
  GFDIT_CHECK(d.layout.mode == LayoutMode::kUsp || d.layout.mode == LayoutMode::kTorus)
      << "policy " << pname << ": layout mode " << static_cast<int>(d.layout.mode);
  GFDIT_CHECK(d.num_steps >= 1) << "policy " << pname << ": num_steps " << d.num_steps;
  GFDIT_CHECK(d.decode_degree >= 0 && d.decode_degree <= std::max(1, r.rec.shape.latent_rows)).param("decode_degree")
      << "policy " << pname << ": decode_degree " << d.decode_degree << " for request " << d.request_id
      << ", whose latent has " << r.rec.shape.latent_rows << " rows (a decode member needs one at least)";
}

// NOTE [refused decisions]
// A policy's decisions are checked one by one (validate). One that is refused (an unknown or busy request, a
// rank that is busy or dead, a layout that does not fit, a decode group larger than the latent, a batch whose
// members differ in shape or guidance) is dropped with its reason (ControlStats::refused_decisions,
// lastRefusal()), and the others run: its requests lose nothing and wait for the next round, which the next
// completion of any task starts. Only when nothing at all is in flight, so that no completion will ever start
// another round, do the requests it named fail with the reason, rather than wait for ever. A policy that throws
// fails the requests it was asked about.
void ControlPlane::schedule() {
  dirty_ = false;
  if (paused()) return;
  if (!decode_waiting_.empty()) drainDecodes();  // before the policy: their holders are theirs
  bool any_free = false;
  for (int w = 0; w < config_.world_size && !any_free; ++w) any_free = alive_[w] && !rank_busy_[w];
  if (!any_free) return;
  SchedulerView view;
  buildView(view, nullptr);
  if (view.numReady() == 0) return;
  int64_t t0 = nowNs();  // the real clock: this is the policy's cost, also in a simulation
  std::vector<Decision> ds;
  try {
    ++stats_.policy_calls;
    ds = policy_->schedule(view);
  } catch (const std::exception& e) {
    // A broken policy must not leave requests waiting for ever: the ones it was asked about fail.
    std::string msg = std::string("policy ") + policy_->name() + " failed: " + e.what();
    std::vector<uint64_t> ids;
    for (const Request* r : order_) {
      if (!isFinished(r->rec.state) && !r->rec.busy) ids.push_back(r->rec.id);
    }
    for (uint64_t id : ids) {
      auto it = requests_.find(id);
      if (it != requests_.end()) finish(*it->second, RequestState::kFailed, msg);
    }
    return;
  }
  stats_.policy_ns += nowNs() - t0;
  // see NOTE [refused decisions]
  std::vector<bool> taken(config_.world_size, false);
  std::vector<uint64_t> seen;
  std::vector<std::vector<Request*>> chosen;  // the members of each accepted decision
  std::vector<const Decision*> accepted;
  std::vector<uint64_t> refused;
  std::string why;
  for (const Decision& d : ds) {
    std::vector<Request*> members;
    try {
      validate(d, view, nullptr, taken, seen, members);
    } catch (const Error& e) {
      ++stats_.refused_decisions;
      last_refusal_ = why = e.message();
      refused.push_back(d.request_id);
      continue;
    }
    for (int w : d.ranks) taken[w] = true;
    for (const Request* m : members) seen.push_back(m->rec.id);
    chosen.push_back(std::move(members));
    accepted.push_back(&d);
  }
  for (size_t i = 0; i < accepted.size(); ++i) startDecision(chosen[i], *accepted[i]);
  // refused with tasks in flight: the next completion, whatever it is, asks again (NOTE [refused decisions])
  refused_waiting_ = !refused.empty() && !tasks_.empty();
  if (!refused.empty() && tasks_.empty()) {
    for (uint64_t id : refused) {
      auto it = requests_.find(id);
      if (it != requests_.end() && !it->second->rec.busy) {
        finish(*it->second, RequestState::kFailed, "policy " + policy_->name() + ": " + why);
      }
    }
  }
}

// NOTE [stages]
// A decision names what it runs (Decision::stage). Steps (the default): a request that has not started encodes
// first, once, on the first rank of the group (the text encoder runs once per request, on one rank), and its state
// (the embeddings and the initial latent) migrates to the other members, before its steps; the group is the
// decision's from the start. An encode alone (kEncode), on the first of its ranks (copied to the others, if any):
// the request then waits at step 0, its state held there, for a decision of its steps on any ranks, which migrates
// it as any paused request's. A decode alone (kDecode), for a policy that places decodes (Policy::placesDecodes):
// a request whose steps are done then waits for its policy instead of decoding on its holders at once
// (dispatchDecode); the decode runs on the decision's ranks, the latent migrated there from a holder first, stale
// holders freed. A disaggregated placement (NOTE [planning], 6) keeps every encode and decode on auxiliary ranks
// this way. A decode lost in a recovery waits for its policy again.

// NOTE [batches]
// A decision may name other ready requests of the same shape and guidance (Decision::batch): they run its steps
// with it, one batched transformer forward per step on its ranks and layout (StagedModel.denoise_batch: each
// request keeps its own state, step, sampler, seed and guidance, and gets what it would alone). The first is the
// batch's head: it holds the group and the decision (todo, dispatch-ahead), the others (riders) point at it.
// Each member is placed as alone first (an encode, a migration from its holder, frees), so a batched step finds
// every member's state on every rank of the group; those tasks go out before the batched steps (NOTE [dispatch
// order]). A batched step is one DENOISE task of the head whose payload names the riders and the step each is at
// (BatchMembers); it runs all of them or none, and every member advances by its steps. The worker's completion
// says the step of the head's copy; a rider's copy is at the same offset from its own first step (or gone, when
// the head's is). The decision's steps are capped by the member with the fewest left, so at its end some members
// may be done: they decode, one after another on their holders as those come free (a member whose holders are
// all busy waits: decode_wait), and the others wait for the next decision, which may batch them again, with
// others, or not at all. A member that finishes early (cancelled, failed) leaves the batch at once; a head that
// leaves hands the batch to its first rider. Dispatch-ahead works as alone (NOTE [lookahead]): the policy is asked
// about the whole batch at its boundary, and only the same batch on the same ranks and layout goes on.
// NOTE [cache gathers]
// A request's step cache lives in its denoise state, sharded like the hidden states over the members of each
// transformer pass (NOTE [step caches] in gfdit/step_cache.h): member i of a pass holds the i-th piece of the
// tokens, so a shard means something only on the group, in the order and with the CFG split it was computed
// with. Shrinking a group moves nothing and a migration copies one holder's state, so neither can carry the
// other members' shards. Hence, before a decision runs a request's steps on another group than its last denoise
// task (other ranks, another order, another CFG split), the control plane sends its live holders a GATHER task:
// a collective among them that leaves every one of them the whole cache (gfdit.models: StagedModel.gather_cache).
// The migration to new members then carries it whole, and at its next step each member of the new group takes its
// own shards from it. The gather goes out before the migration and the frees (NOTE [dispatch order]); a holder
// that runs another request's steps first simply gets to it later. A holder lost in a recovery takes its shards
// with it: the survivors' gather finds a pass incomplete and drops that pass's cache alike on every member, so the
// request goes on with a full step there. A cache computed on one rank is whole already: no gather.
void ControlPlane::gatherCache(Request& r, const Layout& next) {
  const RequestRecord& rec = r.rec;
  if (!rec.shape.cache.on() || rec.step == 0 || r.cached_on.empty()) return;
  if (r.cached_on == r.group && r.cached_cfg == next.cfg) return;  // the same shards
  if (r.cached_on.size() == 1) return;                             // whole already
  std::vector<int> holders;
  for (int w : rec.ranks) {
    if (alive_[w]) holders.push_back(w);
  }
  if (holders.empty()) return;
  dispatch(&r, TaskKind::kGather, holders, Layout(), rec.step, 0);
  ++stats_.cache_gathers;
}

void ControlPlane::place(Request& r) {
  RequestRecord& rec = r.rec;
  if (rec.state == RequestState::kQueued) {  // once, on the first rank, then copied (NOTE [stages])
    transition(r, RequestState::kEncoding);
    dispatch(&r, TaskKind::kEncode, {r.group[0]}, Layout(), 0, 0, -1, &r.payload);
    if (r.group.size() > 1) {
      dispatch(&r, TaskKind::kMigrate, r.group, Layout(), 0, 0, r.group[0]);
      ++stats_.migrations;
    }
    return;
  }
  std::vector<int> fresh, stale;
  for (int w : r.group) {
    if (std::find(rec.ranks.begin(), rec.ranks.end(), w) == rec.ranks.end()) fresh.push_back(w);
  }
  for (int w : rec.ranks) {
    if (std::find(r.group.begin(), r.group.end(), w) == r.group.end()) stale.push_back(w);
  }
  if (!fresh.empty()) {
    GFDIT_CHECK_CODE(kInternal, !rec.ranks.empty()) << "request " << rec.id << " has no holder to migrate from";
    int src = rec.ranks[0];
    for (int w : r.group) {
      if (std::find(rec.ranks.begin(), rec.ranks.end(), w) != rec.ranks.end()) {
        src = w;
        break;
      }
    }
    std::vector<int> bgroup{src};
    bgroup.insert(bgroup.end(), fresh.begin(), fresh.end());
    dispatch(&r, TaskKind::kMigrate, bgroup, Layout(), rec.step, 0, src);
    ++stats_.migrations;
  }
  if (!stale.empty()) dispatch(&r, TaskKind::kFree, stale, Layout(), rec.step, 0);  // FIFO: after the migration
  rec.ranks = r.group;
}

double ControlPlane::stepSeconds(const Request& r, const Layout& layout, int32_t batch) const {
  const RequestCost& c = r.rec.cost;
  if (!c.known) return 0;
  const double alone = c.stepSeconds(layout.degree());
  if (batch <= 1 || cost_ == nullptr) return alone * std::max(1, batch);
  cost::StageQuery q;
  q.shape = r.rec.shape;
  q.degree = layout.degree();
  q.layout = layout;
  q.batch = batch;
  q.num_nodes = 1;
  for (size_t i = 1; i < r.group.size(); ++i) {
    q.num_nodes += config_.node_of[r.group[i]] != config_.node_of[r.group[i - 1]];
  }
  try {
    // a step cache leaves the same share of a batched step as of the head's alone (NOTE [step caches])
    const double full = c.full_step_s[std::min(std::max(1, layout.degree()), kMaxRanks)];
    const double share = std::isfinite(full) && full > 0 ? alone / full : 1.0;
    return cost_->seconds(cost::Stage::kDenoise, q) * share;
  } catch (const std::exception&) {
    return alone * batch;  // a batch the model does not price: no better than its members in turn
  }
}

void ControlPlane::startDecision(const std::vector<Request*>& members, const Decision& d) {
  Request& r = *members[0];
  RequestRecord& rec = r.rec;
  occupy(d.ranks);
  if (d.stage != cost::Stage::kDenoise) {  // an encode or a decode alone (NOTE [stages])
    rec.busy = true;
    rec.batch_leader = 0;
    rec.batch_size = 1;
    r.group = d.ranks;
    r.todo = 0;
    r.head = nullptr;
    r.riders.clear();
    rec.decision_end_ns = 0;
    track(r);
    place(r);  // the encode; or the latent to the decode's ranks from a holder, stale holders freed
    if (d.stage == cost::Stage::kDecode) decodeOnGroup(r);
    notify(r);
    return;
  }
  int32_t todo = d.num_steps;
  for (Request* m : members) todo = std::min(todo, m->rec.num_steps - m->rec.step);
  const int32_t n = static_cast<int32_t>(members.size());
  for (Request* m : members) {
    m->rec.busy = true;
    m->rec.batch_leader = n > 1 ? rec.id : 0;
    m->rec.batch_size = n;
    m->group = d.ranks;
    m->layout = d.layout;
    m->rec.layout = d.layout;
    m->todo = m == &r ? todo : 0;
    m->ahead = d.dispatch_ahead;
    m->decode_degree = d.decode_degree;
    m->next_step = m->rec.step;
    m->head = m == &r ? nullptr : &r;
    track(*m);
    gatherCache(*m, d.layout);
    place(*m);
  }
  r.riders.assign(members.begin() + 1, members.end());
  const double step_s = stepSeconds(r, d.layout, n);
  for (Request* m : members) {
    m->rec.decision_end_ns = 0;
    if (m->rec.cost.known) {
      double secs = todo * step_s;
      if (m->rec.state == RequestState::kEncoding) secs += m->rec.cost.encode_s;
      m->rec.decision_end_ns = clock_.nowNs() + static_cast<int64_t>(secs * kSecond);
    }
    notify(*m);
  }
  pump(r);
  if (decisionDone(r)) endDecision(r);
}

bool ControlPlane::decisionDone(const Request& head) const {
  if (head.todo != 0 || head.inflight != 0) return false;
  for (const Request* m : head.riders) {
    if (m->inflight != 0) return false;
  }
  return true;
}

void ControlPlane::dispatchStep(Request& r) {
  RequestRecord& rec = r.rec;
  if (r.riders.empty()) {
    dispatch(&r, TaskKind::kDenoise, r.group, r.layout, r.next_step, 1);
  } else {
    BatchMembers bm;
    for (const Request* m : r.riders) {
      bm.request_ids.push_back(m->rec.id);
      bm.step_begins.push_back(m->next_step);
    }
    const std::string payload = bm.encode();
    const int32_t n = static_cast<int32_t>(r.riders.size()) + 1;
    uint64_t id = dispatch(&r, TaskKind::kDenoise, r.group, r.layout, r.next_step, 1, -1, &payload, n);
    Task& t = *tasks_[id];
    for (Request* m : r.riders) {
      t.riders.emplace_back(m->rec.id, m->next_step);
      m->denoised_on = r.denoised_on;  // one group for all (NOTE [regroups] counts the head's)
      ++m->inflight;
      ++m->next_step;
      ++m->rec.steps_in_flight;
    }
  }
  --r.todo;
  ++r.next_step;
  ++rec.steps_in_flight;
}

void ControlPlane::pump(Request& r) {
  RequestRecord& rec = r.rec;
  while (true) {
    const int limit = inflightLimit(r);
    while (r.todo > 0 && rec.steps_in_flight < limit) dispatchStep(r);
    bool more = r.next_step < rec.num_steps;
    for (const Request* m : r.riders) more = more && m->next_step < m->rec.num_steps;
    if (r.todo == 0 && r.inflight > 0 && rec.steps_in_flight < limit && more && lookahead(r)) continue;
    return;
  }
}

int ControlPlane::inflightLimit(const Request& r) const {
  // A long step goes alone: the gap between two steps is tiny next to it, and a policy's next decision
  // (a preemption) then waits for one step, not two.
  if (!r.ahead) return 1;
  const int32_t batch = static_cast<int32_t>(r.riders.size()) + 1;
  if (r.rec.cost.known && stepSeconds(r, r.layout, batch) >= config_.long_step_s) return 1;
  // measured time only: a prediction that is too short must not commit the group to many steps (NOTE [task
  // durations])
  const double step_ns =
      durations_->measuredNs(TaskDurations::key(TaskKind::kDenoise, &r.rec.shape, r.layout, batch), 1);
  if (step_ns <= 0 || config_.min_queued_s <= 0) return config_.max_inflight_steps;
  int want = static_cast<int>(std::ceil(config_.min_queued_s * kSecond / step_ns));
  return std::max(config_.max_inflight_steps, std::min(kMaxStepsAhead, want));
}

bool ControlPlane::lookahead(Request& r) {
  if (!config_.lookahead || paused()) return false;
  SchedulerView view;
  buildView(view, &r);
  // the batch as it will be at its boundary: ready at its next steps on its group
  std::vector<RequestRecord> futures;
  futures.reserve(r.riders.size() + 1);
  for (size_t i = 0; i <= r.riders.size(); ++i) {
    const Request& m = i == 0 ? r : *r.riders[i - 1];
    RequestRecord future = m.rec;
    future.step = m.next_step;
    future.busy = false;
    future.steps_in_flight = 0;
    future.ranks = r.group;
    future.batch_leader = 0;
    future.batch_size = 1;
    futures.push_back(std::move(future));
  }
  for (const RequestRecord& future : futures) {  // keep arrival order
    auto pos = std::upper_bound(view.ready.begin(), view.ready.end(), &future,
                                [](const RequestRecord* a, const RequestRecord* b) { return arrivesBefore(*a, *b); });
    view.ready.insert(pos, &future);
  }
  int64_t t0 = nowNs();  // the real clock: this is the policy's cost, also in a simulation
  std::vector<Decision> ds;
  try {
    ++stats_.policy_calls;
    ds = policy_->schedule(view);
  } catch (const std::exception&) {
    return false;  // the real round reports a broken policy
  }
  stats_.policy_ns += nowNs() - t0;
  for (const Decision& d : ds) {
    if (d.request_id != r.rec.id) continue;
    if (d.ranks != r.group || d.layout != r.layout || d.num_steps < 1 || !d.dispatch_ahead) return false;
    if (d.batch.size() != r.riders.size()) return false;
    for (const Request* m : r.riders) {  // the same batch, in any order
      if (std::find(d.batch.begin(), d.batch.end(), m->rec.id) == d.batch.end()) return false;
    }
    int32_t todo = std::min(d.num_steps, r.rec.num_steps - r.next_step);
    for (const Request* m : r.riders) todo = std::min(todo, m->rec.num_steps - m->next_step);
    if (todo <= 0) return false;
    r.todo = todo;
    const double step_s = stepSeconds(r, d.layout, static_cast<int32_t>(r.riders.size()) + 1);
    for (size_t i = 0; i <= r.riders.size(); ++i) {
      RequestRecord& rec = i == 0 ? r.rec : r.riders[i - 1]->rec;
      if (rec.decision_end_ns != 0) rec.decision_end_ns += static_cast<int64_t>(todo * step_s * kSecond);
    }
    ++stats_.lookahead_hits;
    return true;
  }
  return false;
}

void ControlPlane::endDecision(Request& r) {
  release(r.group);
  std::vector<Request*> members{&r};
  members.insert(members.end(), r.riders.begin(), r.riders.end());
  r.riders.clear();
  for (Request* m : members) {
    m->rec.busy = false;
    m->head = nullptr;
    m->rec.batch_leader = 0;
    m->rec.batch_size = 1;
  }
  for (Request* m : members) {
    if (m->rec.step >= m->rec.num_steps && !policy_->placesDecodes()) {
      dispatchDecode(*m);
    } else {  // paused, or its steps done and its decode left to the policy (NOTE [stages])
      track(*m);
      notify(*m);  // paused on its holders
    }
  }
}

// A member that ends before its batch does (finish) leaves it at once (NOTE [batches]); its tasks in flight
// drain as any finished request's do. A head that leaves hands the group and the decision to its first rider.
void ControlPlane::leaveBatch(Request& r) {
  if (r.head != nullptr) {
    Request& head = *r.head;
    head.riders.erase(std::remove(head.riders.begin(), head.riders.end(), &r), head.riders.end());
    const int32_t n = static_cast<int32_t>(head.riders.size()) + 1;
    head.rec.batch_leader = n > 1 ? head.rec.id : 0;
    head.rec.batch_size = n;
    for (Request* m : head.riders) m->rec.batch_size = n;
    r.head = nullptr;
    r.group.clear();  // the head holds the group
  } else if (!r.riders.empty()) {
    Request& next = *r.riders[0];
    next.riders.assign(r.riders.begin() + 1, r.riders.end());
    for (Request* m : next.riders) m->head = &next;
    next.head = nullptr;
    next.todo = r.todo;
    next.ahead = r.ahead;
    next.group = r.group;
    r.riders.clear();
    r.group.clear();
    const int32_t n = static_cast<int32_t>(next.riders.size()) + 1;
    next.rec.batch_leader = n > 1 ? next.rec.id : 0;
    next.rec.batch_size = n;
    for (Request* m : next.riders) {
      m->rec.batch_leader = next.rec.id;
      m->rec.batch_size = n;
    }
  } else {
    return;
  }
  r.rec.batch_leader = 0;
  r.rec.batch_size = 1;
}

// NOTE [parallel decode]
// The VAE decode is a collective task (gfdit.models.patch_decode: each member decodes a band of the latent's
// rows, the bands exchange halos and are gathered on the first member, which returns the output). It runs on
// holders of the final state only, so no migration precedes it: the free, live holders in their order (the
// last denoise group), as many as the latest decision's decode_degree asks, or else as the cost model's
// fastest predicted decode on that many (RequestCost::decodeDegree; 1 without a model), and never more than
// the latent's rows. Its layout is plain Ulysses of that degree, which is only how the degree travels. The first member
// reports the output; one from another member is discarded.
void ControlPlane::dispatchDecode(Request& r) {
  RequestRecord& rec = r.rec;
  std::vector<int> group;
  for (int w : rec.ranks) {
    if (alive_[w] && !rank_busy_[w]) group.push_back(w);
  }
  if (group.empty()) {  // its holders decode another member of its batch first (NOTE [batches])
    bool live = false;
    for (int w : rec.ranks) live = live || alive_[w];
    GFDIT_CHECK_CODE(kInternal, live) << "request " << rec.id << " has no live holder to decode on";
    if (!r.decode_wait) decode_waiting_.push_back(rec.id);
    r.decode_wait = true;
    track(r);
    notify(r);
    return;
  }
  r.decode_wait = false;
  const int cap = std::min(static_cast<int>(group.size()), std::max(1, rec.shape.latent_rows));
  const int want = r.decode_degree > 0 ? r.decode_degree : rec.cost.known ? rec.cost.decodeDegree(cap) : 1;
  group.resize(std::max(1, std::min(want, cap)));
  r.group = group;
  occupy(r.group);
  rec.busy = true;
  track(r);
  decodeOnGroup(r);
}

void ControlPlane::decodeOnGroup(Request& r) {
  transition(r, RequestState::kDecoding, r.rec.step);
  Layout layout;  // plain Ulysses of the decode's degree: only how the degree travels
  layout.ulysses = static_cast<int32_t>(r.group.size());
  dispatch(&r, TaskKind::kDecode, r.group, layout, r.rec.step, 0);
}

// ---- completions ----

void ControlPlane::onCompletion(const Completion& c, const std::string& message) {
  auto it = tasks_.find(c.task_id);
  if (it == tasks_.end() || c.rank < 0 || c.rank >= config_.world_size) {
    if (c.output.name[0] != '\0') executor_.discardOutput(c.output);  // late, duplicate or unknown
    return;
  }
  Task& t = *it->second;
  uint64_t bit = uint64_t{1} << c.rank;
  if ((t.pending & bit) == 0) {
    if (c.output.name[0] != '\0') executor_.discardOutput(c.output);
    return;
  }
  t.pending &= ~bit;
  // see NOTE [expected completions]
  const int64_t now = clock_.nowNs();
  if (t.pending != 0) t.expected_end_ns = std::min(t.expected_end_ns, now);
  expectNext(c.rank, now);
  t.start_ns = t.start_ns == 0 ? c.start_ns : std::min(t.start_ns, c.start_ns);
  t.end_ns = std::max(t.end_ns, c.end_ns);
  if (c.output.name[0] != '\0') {  // a decode's output is its first member's (NOTE [parallel decode])
    if (t.output.name[0] == '\0' && !t.ranks.empty() && c.rank == t.ranks[0]) {
      t.output = c.output;
    } else {
      executor_.discardOutput(c.output);
    }
  }
  if (t.kind == TaskKind::kDenoise || t.kind == TaskKind::kMigrate || t.kind == TaskKind::kEncode) {
    t.step_ends.emplace_back(c.rank, c.step_end);
  }
  if (t.kind == TaskKind::kDenoise && c.ok() && t.cached.empty()) {
    t.cached.emplace_back(c.cached_steps, c.cached_passes);
    if (!t.riders.empty() && !message.empty()) {
      try {
        const BatchCacheCounts riders = BatchCacheCounts::decode(message);
        for (size_t i = 0; i < riders.cached_steps.size(); ++i) {
          t.cached.emplace_back(riders.cached_steps[i], riders.cached_passes[i]);
        }
      } catch (const Error&) {  // counts are for people: a malformed message loses them, nothing else
      }
    }
  }
  if (!c.ok() && t.error == TaskError::kOk) {
    t.error = static_cast<TaskError>(c.error);
    std::ostringstream os;
    os << "worker " << c.rank << ": " << message;
    t.message = os.str();
    // A member that fails a collective task leaves its peers blocked in the collective: release them now.
    if (t.pending != 0 && (t.kind == TaskKind::kDenoise || t.kind == TaskKind::kMigrate ||
                           t.kind == TaskKind::kDecode || t.kind == TaskKind::kGather)) {
      startRecovery();
    }
  }
  if (t.probe && on_probe_) on_probe_(c, clock_.nowNs());
  if (t.pending == 0) taskDone(t);
}

void ControlPlane::expectNext(int worker, int64_t now) {
  // The oldest task still queued on the worker starts now: it cannot end before now + its usual length.
  uint64_t bit = uint64_t{1} << worker;
  Task* next = nullptr;
  for (auto& kv : tasks_) {
    Task& t = *kv.second;
    if ((t.pending & bit) && (next == nullptr || t.id < next->id)) next = &t;
  }
  int64_t free_at = now;
  if (next != nullptr) {
    int64_t end = now + estimateNs(*next);
    if (next->expected_end_ns < end) next->expected_end_ns = end;
    for (auto& kv : tasks_) {
      if (kv.second->pending & bit) free_at = std::max(free_at, kv.second->expected_end_ns);
    }
  }
  worker_free_at_[worker] = free_at;
}

int64_t ControlPlane::estimateNs(const Task& t) const {
  double predicted = 0;
  auto it = requests_.find(t.request_id);
  if (it != requests_.end() && !t.probe) {
    if (t.kind == TaskKind::kDenoise && t.key.batch > 1) {
      predicted = stepSeconds(*it->second, t.layout, t.key.batch) * t.num_steps * kSecond;
    } else {
      predicted = TaskDurations::predictedNs(it->second->rec.cost, t.kind, t.layout.degree(), t.num_steps);
    }
  }
  return static_cast<int64_t>(durations_->estimateNs(t.key, t.num_steps, predicted));
}

void ControlPlane::taskDone(Task& done) {
  std::unique_ptr<Task> owned = std::move(tasks_[done.id]);
  tasks_.erase(done.id);
  ++stats_.tasks_completed;
  if (refused_waiting_) dirty_ = true;
  applyDone(*owned);
  tryReinit();  // recovering: a world can be re-created once the last task in flight is done
}

void ControlPlane::dropCopy(Request& r, int worker) {
  r.copies.erase(std::remove_if(r.copies.begin(), r.copies.end(), [&](const auto& cp) { return cp.first == worker; }),
                 r.copies.end());
}

void ControlPlane::applyDone(Task& t) {
  if (t.end_ns > t.start_ns && t.error == TaskError::kOk) {
    durations_->record(t.key, t.num_steps, static_cast<double>(t.end_ns - t.start_ns));
  }
  if (t.kind == TaskKind::kReinit) {
    if (t.error == TaskError::kOk) {
      reinit_failures_ = 0;
      reinitDone(t.members);
    } else if (t.error != TaskError::kWorkerDied && ++reinit_failures_ >= kMaxReinitFailures) {
      recovering_ = rejoin_ = false;
      finishAll("could not re-create the collectives world: " + t.message, true);
    } else {
      recovering_ = true;  // another death, or a member that left the rendezvous: taskDone tries again
    }
    return;
  }
  auto it = requests_.find(t.request_id);
  if (it == requests_.end() || t.probe) {
    if (t.output.name[0] != '\0') executor_.discardOutput(t.output);
    return;
  }
  if (!t.riders.empty()) ++stats_.batched_steps;
  bool go_on = false;
  applyTo(t, *it->second, 0, t.step_begin, go_on);
  for (size_t i = 0; i < t.riders.size(); ++i) {  // a batched step: every member (NOTE [batches])
    auto m = requests_.find(t.riders[i].first);
    if (m != requests_.end()) applyTo(t, *m->second, i + 1, t.riders[i].second, go_on);
  }
  if (go_on && !paused()) continueBatch(t);  // nothing new goes out before the world is re-created
}

void ControlPlane::applyTo(Task& t, Request& r, size_t member, int32_t step_begin, bool& go_on) {
  RequestRecord& rec = r.rec;
  for (const auto& se : t.step_ends) {  // a negative step: the worker holds no copy
    dropCopy(r, se.first);
    // a rider's copy is where the head's is, from its own first step (NOTE [batches])
    if (se.second >= 0) r.copies.emplace_back(se.first, se.second - t.step_begin + step_begin);
  }
  if (t.kind == TaskKind::kFree) {
    for (int w : t.members) dropCopy(r, w);
    return;
  }
  --r.inflight;
  if (t.kind == TaskKind::kDenoise) --rec.steps_in_flight;
  if (config_.record_stages) {
    StageRecord s;
    s.kind = t.kind;
    s.ranks = t.ranks;
    s.layout = t.layout;
    s.step_begin = step_begin;
    s.num_steps = t.num_steps;
    s.dispatch_ns = t.dispatch_ns;
    s.start_ns = t.start_ns;
    s.end_ns = t.end_ns;
    s.error = t.error;
    s.regroup = t.regroup;
    s.batch = static_cast<int32_t>(t.riders.size()) + 1;
    if (member < t.cached.size()) std::tie(s.cached_steps, s.cached_passes) = t.cached[member];
    r.stages.push_back(std::move(s));
  }
  if (isFinished(rec.state)) {
    if (t.output.name[0] != '\0' && rec.id == t.request_id) executor_.discardOutput(t.output);
    maybePrune(r);
    return;
  }
  if (t.error != TaskError::kOk) {
    // A bad request or a model error is the request's own, deterministic: it fails with that first cause, never
    // retried, whatever else is going on (a recovery its peers' blocked collectives started, a lost state
    // reported by a task queued behind it). Only a lost worker, a broken collective, a timeout or a lost state
    // (the abort's echo among them) is recovered from.
    bool own = t.error == TaskError::kInvalidRequest || t.error == TaskError::kModelError;
    if (!own && (needsRecovery(t.error) || recovering_)) {
      r.hit = true;
      r.last_error = t.message;
      startRecovery();
    } else {
      finish(r, RequestState::kFailed, t.riders.empty() ? t.message : "a batched step failed: " + t.message);
    }
    return;
  }
  switch (t.kind) {
    case TaskKind::kEncode:
      // the state is on the encode's rank, and on the rest of the decision's group once its copy lands
      rec.ranks = rec.busy && !r.group.empty() ? r.group : t.ranks;
      transition(r, RequestState::kDenoising, 0);
      break;
    case TaskKind::kDenoise: transition(r, RequestState::kDenoising, step_begin + t.num_steps); break;
    case TaskKind::kDecode:
      r.output = t.output;
      finish(r, RequestState::kDone);
      return;
    default: break;
  }
  go_on = true;
}

void ControlPlane::continueBatch(Task& t) {
  // the batch the task's members run in now (its head may have left it: NOTE [batches])
  Request* head = nullptr;
  for (size_t i = 0; i <= t.riders.size() && head == nullptr; ++i) {
    auto it = requests_.find(i == 0 ? t.request_id : t.riders[i - 1].first);
    if (it == requests_.end() || isFinished(it->second->rec.state)) continue;
    Request& m = *it->second;
    head = m.head != nullptr ? m.head : &m;
  }
  if (head == nullptr || !head->rec.busy) return;
  pump(*head);
  if (decisionDone(*head)) endDecision(*head);
}

void ControlPlane::drainDecodes() {
  std::vector<uint64_t> ids;
  ids.swap(decode_waiting_);
  for (uint64_t id : ids) {
    auto it = requests_.find(id);
    if (it == requests_.end() || isFinished(it->second->rec.state) || !it->second->decode_wait) continue;
    it->second->decode_wait = false;
    dispatchDecode(*it->second);  // waits again while its holders are busy
  }
}

void ControlPlane::finish(Request& r, RequestState state, const std::string& reason) {
  RequestRecord& rec = r.rec;
  if (isFinished(rec.state)) return;
  leaveBatch(r);
  transition(r, state, -1, reason);
  r.todo = 0;
  r.decode_wait = false;
  std::vector<int> live;
  for (const auto& cp : r.copies) {
    if (alive_[cp.first]) live.push_back(cp.first);
  }
  for (int w : rec.ranks) {
    if (alive_[w] && std::find(live.begin(), live.end(), w) == live.end()) live.push_back(w);
  }
  std::sort(live.begin(), live.end());
  if (!live.empty()) dispatch(&r, TaskKind::kFree, live, Layout(), rec.step, 0);
  rec.ranks.clear();
  r.copies.clear();
  ++stats_.finished;
  if (on_finished_) {
    RequestResult res;
    res.id = rec.id;
    res.state = rec.state;
    res.reason = rec.reason;
    res.stages = r.stages;  // a copy: tasks still in flight may add stages before the record is pruned
    res.transitions = rec.transitions;
    res.output = r.output;
    res.arrival_ns = rec.arrival_ns;
    res.deadline_ns = rec.deadline_ns;
    res.priority = rec.priority;
    on_finished_(std::move(res));
  }
  maybePrune(r);
}

void ControlPlane::maybePrune(Request& r) {
  if (!isFinished(r.rec.state) || r.inflight > 0) return;
  if (r.rec.busy) {
    release(r.group);
    r.rec.busy = false;
  }
  track(r);  // finished: in neither the ready order nor the running list
  uint64_t id = r.rec.id;
  Request* p = &r;
  auto pos = std::lower_bound(order_.begin(), order_.end(), p,
                              [](const Request* a, const Request* b) { return arrivesBefore(a->rec, b->rec); });
  if (pos != order_.end() && *pos == p) order_.erase(pos);
  requests_.erase(id);  // r is gone
  dirty_ = true;
}

void ControlPlane::finishAll(const std::string& reason, bool failed) {
  std::vector<uint64_t> ids;
  for (const Request* r : order_) ids.push_back(r->rec.id);
  for (uint64_t id : ids) {
    auto it = requests_.find(id);
    if (it != requests_.end()) finish(*it->second, failed ? RequestState::kFailed : RequestState::kCancelled, reason);
  }
}

// ---- failures ----

void ControlPlane::onWorkerDeath(int worker) {
  GFDIT_CHECK(worker >= 0 && worker < config_.world_size) << "worker " << worker;
  if (!alive_[worker] && !joining_[worker]) return;
  ++stats_.worker_deaths;
  const bool was_alive = alive_[worker];
  alive_[worker] = false;
  joining_[worker] = false;
  rank_busy_[worker] = true;  // not scheduled again unless a replacement joins (NOTE [replacements])
  for (Request* r : order_) dropCopy(*r, worker);  // its states died with it, whoever takes its place
  std::vector<uint64_t> hit;
  bool had_tasks = false;
  for (auto& kv : tasks_) {
    Task& t = *kv.second;
    uint64_t bit = uint64_t{1} << worker;
    if (t.pending & bit) {
      had_tasks = true;
      t.pending &= ~bit;
      if (t.error == TaskError::kOk) {
        t.error = TaskError::kWorkerDied;
        t.message = "worker " + std::to_string(worker) + " died";
      }
      if (t.pending == 0) hit.push_back(t.id);
    }
  }
  if (!was_alive && !had_tasks) {  // a joiner that died before its REINIT: nothing of the world was its
    rejoin_ = std::find(joining_.begin(), joining_.end(), true) != joining_.end();
    dirty_ = true;
    tryReinit();
    return;
  }
  startRecovery();
  for (uint64_t id : hit) {
    auto it = tasks_.find(id);
    if (it != tasks_.end()) taskDone(*it->second);
  }
  tryReinit();
}

void ControlPlane::startRecovery() {
  if (!recovering_) {
    recovering_ = true;
    // collectives blocked on a dead or broken peer fail within the period their waits check the abort word
    // and their peers (core::kPeerCheckPeriod, 100 ms)
    executor_.abortCollectives();
  }
}

// NOTE [replacements]
// An engine that replaces dead workers (setReplacing: gfdit.Engine does, NOTE [healing] in
// gfdit.serving.engine) starts a new process for a dead worker's id; its hello makes it a joiner (onWorkerJoin).
// A joiner is not scheduled: first nothing new goes out (paused()), the tasks in flight finish (a step
// boundary for every request), and then one REINIT re-creates the world among the survivors and the joiners,
// exactly as after a death. The joiners are alive from its completion on; the requests keep their states and
// their places, so a joining worker costs them the drain and the re-creation, and no step. With no worker left
// alive, a replacing plane keeps the requests (to start again from their beginning, as any request whose every
// copy died) and waits for a joiner, where a plane that does not replace fails them. A REINIT that fails
// (a joiner that died during the rendezvous leaves its peers to time out) is retried, kMaxReinitFailures times
// in a row at most. A joiner whose hello arrives while a REINIT is under way waits for the next one: only the
// REINIT's own members are in the world it made.
void ControlPlane::setReplacing(bool on, const std::string& reason) {
  replacing_ = on;
  if (on) return;
  bool any = false;
  for (int w = 0; w < config_.world_size; ++w) any = any || alive_[w];
  if (!any && tasks_.empty()) {
    recovering_ = rejoin_ = false;
    finishAll(reason.empty() ? std::string("every worker died") : reason, true);
  }
}

void ControlPlane::onWorkerJoin(int worker) {
  GFDIT_CHECK(worker >= 0 && worker < config_.world_size && !alive_[worker] && !joining_[worker])
      << "worker " << worker << " joins, but it is alive or already joining";
  joining_[worker] = true;
  rejoin_ = true;
  tryReinit();
}

void ControlPlane::tryReinit() {
  if (!paused()) return;
  for (const auto& kv : tasks_) {
    if (kv.second->kind != TaskKind::kReinit) return;  // survivors still finishing (or failing) tasks
  }
  if (!tasks_.empty()) return;  // a reinit is under way
  std::vector<int> members;
  bool any_alive = false;
  for (int w = 0; w < config_.world_size; ++w) {
    if (alive_[w] || joining_[w]) members.push_back(w);
    any_alive = any_alive || alive_[w];
  }
  if (members.empty()) {
    if (replacing_) return;  // the requests wait for a replacement (NOTE [replacements])
    recovering_ = rejoin_ = false;
    finishAll("every worker died", true);
    return;
  }
  ++epoch_;
  if (recovering_ || !any_alive) ++stats_.recoveries;
  ReinitPlan plan;
  plan.epoch = epoch_;
  plan.workers.assign(members.begin(), members.end());
  std::string payload = plan.encode();
  dispatch(nullptr, TaskKind::kReinit, members, Layout(), 0, 0, -1, &payload);
}

void ControlPlane::reinitDone(const std::vector<int>& members) {
  recovering_ = false;
  rejoin_ = false;
  for (int w = 0; w < config_.world_size; ++w) {
    if (!joining_[w]) continue;
    if (std::find(members.begin(), members.end(), w) == members.end()) {
      rejoin_ = true;  // it joined while this world was being made: the next REINIT takes it in
      continue;
    }
    joining_[w] = false;
    alive_[w] = true;
    rank_busy_[w] = false;
    worker_free_at_[w] = 0;
    ++stats_.replacements;
  }
  dirty_ = true;
  std::vector<Request*> reqs(order_.begin(), order_.end());
  for (Request* rp : reqs) {
    Request& r = *rp;
    RequestRecord& rec = r.rec;
    if (isFinished(rec.state)) continue;
    r.inflight = 0;
    r.todo = 0;
    rec.steps_in_flight = 0;
    r.riders.clear();  // batches part (NOTE [batches])
    r.head = nullptr;
    rec.batch_leader = 0;
    rec.batch_size = 1;
    r.decode_wait = false;
    if (rec.busy) {
      release(r.group);
      rec.busy = false;
      track(r);
    }
    if (r.hit) {
      r.hit = false;
      if (++rec.attempts >= config_.max_attempts) {
        finish(r, RequestState::kFailed, "failed " + std::to_string(rec.attempts) + " times; last: " + r.last_error);
        continue;
      }
    }
    // the most advanced copies of its state that survived
    int32_t best = -1;
    for (const auto& cp : r.copies) {
      if (alive_[cp.first]) best = std::max(best, cp.second);
    }
    std::vector<int> live, other;
    for (const auto& cp : r.copies) {
      if (!alive_[cp.first]) continue;
      (cp.second == best ? live : other).push_back(cp.first);
    }
    if (rec.state == RequestState::kQueued) continue;  // never started: the policy places it as usual
    if (rec.state == RequestState::kEncoding || live.empty()) {
      std::vector<int> all = live;
      all.insert(all.end(), other.begin(), other.end());
      if (!all.empty()) dispatch(&r, TaskKind::kFree, all, Layout(), 0, 0);
      r.copies.clear();
      rec.ranks.clear();
      transition(r, RequestState::kQueued, 0, "restarted: its workers died");
      rec.reason.clear();
      continue;
    }
    if (!other.empty()) dispatch(&r, TaskKind::kFree, other, Layout(), 0, 0);
    r.copies.clear();
    for (int w : live) r.copies.emplace_back(w, best);
    rec.ranks = live;
    if ((rec.state == RequestState::kDecoding || best >= rec.num_steps) && policy_->placesDecodes()) {
      transition(r, RequestState::kDenoising, best);  // its policy places the decode again (NOTE [stages])
    } else if (rec.state == RequestState::kDecoding || best >= rec.num_steps) {
      rec.step = best;
      dispatchDecode(r);
    } else if (best != rec.step) {
      transition(r, RequestState::kDenoising, best);
    } else {
      track(r);  // its holders changed
    }
  }
}

void ControlPlane::checkDeadlines(int64_t now) {
  std::vector<int> kill;
  for (auto& kv : tasks_) {
    Task& t = *kv.second;
    if (t.deadline_ns == 0 || now < t.deadline_ns) continue;
    if (!t.aborted) {
      // First an abort: a task blocked in a collective then fails by itself. Then a kill.
      t.aborted = true;
      t.deadline_ns = now + kKillGraceNs;
      ++stats_.task_timeouts;
      if (t.error == TaskError::kOk) {
        t.error = TaskError::kTimeout;
        std::ostringstream os;
        os << taskKindName(t.kind) << " task " << t.id << " on " << ranksText(t.ranks) << " missed its deadline";
        t.message = os.str();
      }
      startRecovery();
      continue;
    }
    t.deadline_ns = 0;
    for (int w = 0; w < config_.world_size; ++w) {
      if (t.pending & (uint64_t{1} << w)) kill.push_back(w);
    }
  }
  std::sort(kill.begin(), kill.end());
  kill.erase(std::unique(kill.begin(), kill.end()), kill.end());
  for (int w : kill) executor_.killWorker(w);  // its death comes back through onWorkerDeath
}

int64_t ControlPlane::poll() {
  int64_t now = clock_.nowNs();
  if (config_.task_timeout_s > 0) checkDeadlines(now);
  tryReinit();
  if (dirty_) schedule();
  int64_t next = INT64_MAX;
  for (const auto& kv : tasks_) {
    if (kv.second->deadline_ns != 0) next = std::min(next, kv.second->deadline_ns);
  }
  return next;
}

int64_t ControlPlane::expectedCompletionNs() const {
  int64_t next = INT64_MAX;
  for (const auto& kv : tasks_) next = std::min(next, kv.second->expected_end_ns);
  return next;
}

RequestStatus ControlPlane::status(uint64_t id) const {
  RequestStatus s;
  auto it = requests_.find(id);
  if (it == requests_.end()) return s;
  const RequestRecord& rec = it->second->rec;
  s.known = true;
  s.state = rec.state;
  s.step = rec.step;
  s.num_steps = rec.num_steps;
  s.ranks = rec.busy ? it->second->group : rec.ranks;
  return s;
}

}  // namespace runtime
}  // namespace gfdit
