// The simulator: the control plane on a simulated executor and a virtual clock (see simulator.h).
//
// NOTE [simulated execution]
// Each worker has a FIFO queue. A task becomes visible to its members `dispatch_s` after the control plane
// wrote it. A collective task (a step, a migration, a decode) starts when it heads the queue of every member
// and all of them are idle (a collective cannot start before its last member arrives), and it keeps all
// members until it ends; the other kinds (encode, free) run on each member on its own, as workers do. Its
// length is the cost model's time for the stage. When ranks share `num_cores` cores (the CPU cluster), the tasks
// running at once share them: while the busy members fit the cores every task progresses at 1, else at cores / busy
// members, times the collective efficiency for a task of two or more members (its collectives wait for members the OS
// is not running; `gfdit profile` measures the factor with two groups at once). A task's work is its time alone times
// the rate it had alone. Completions reach the control plane `completion_s` after the task ends. Everything is
// deterministic.
// A request with a step cache (NOTE [step caches] in gfdit/step_cache.h): each pass of each of its steps past the
// warm-up reuses the cache with the probability the cost model's skip curve gives at its threshold, drawn from a
// hash of (SimOptions::cache_seed, request, step, pass), at most max_skip in a row; a step then takes the full
// step's time less the share of its passes that reused the cache times (full - cached step). A batched step draws
// for its first request and prices the whole batch so. A GATHER is a collective of the cost model's time.
#include <algorithm>
#include <chrono>
#include <climits>
#include <deque>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "gfdit/clock.h"
#include "gfdit/error.h"
#include "gfdit/executor.h"
#include "gfdit/limits.h"
#include "gfdit/simulator.h"

namespace gfdit {
namespace runtime {
namespace {

constexpr double kNs = 1e9;

// A uniform number in [0, 1) from four integers (splitmix64's finaliser over their mix): the same on every
// platform, unlike the standard library's distributions.
double uniform(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
               (c + 1) * 0x94D049BB133111EBull ^ (d + 7) * 0xD6E8FEB86659FD93ull;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);
}

// A request's step cache as the simulator draws it: its skip probability and each pass's run of cached steps.
struct SimCache {
  double p = 0;
  int32_t run[2] = {0, 0};
};

struct SimTask {
  TaskDescriptor d;
  int32_t cached_steps = 0;
  int32_t cached_passes = 0;
  std::vector<int> members;
  int64_t ready_ns = 0;
  double work_ns = 0;  // left, at rate 1
  bool running = false;
  int64_t start_ns = 0;
};

struct Delivery {
  int64_t t_ns;
  uint64_t seq;
  std::vector<Completion> completions;
  bool operator>(const Delivery& o) const { return t_ns != o.t_ns ? t_ns > o.t_ns : seq > o.seq; }
};

class SimExecutor : public Executor {
 public:
  SimExecutor(const cost::CostModel& cost, const cost::Cluster& cluster, const SimOptions& opt, VirtualClock& clock)
      : cost_(cost),
        cluster_(cluster),
        opt_(opt),
        clock_(clock),
        queues_(cluster.num_ranks),
        busy_(cluster.num_ranks),
        current_group_(cluster.num_ranks, 0) {
    cores_ = opt.num_cores >= 0 ? opt.num_cores : cluster.hw.num_cores;
    regroup_ns_ = (opt.regroup_s >= 0 ? opt.regroup_s : cluster.hw.regroup_s) * kNs;
  }

  uint64_t cachedPasses() const { return cached_passes_; }
  uint64_t passes() const { return passes_; }

  void addRequest(uint64_t id, const RequestShape& shape) {
    shapes_[id] = shape;
    if (shape.cache.on()) caches_[id].p = cost_.skipRate(shape.cache.kind, shape.cache.threshold);
  }

  void dispatch(const TaskDescriptor& d, const std::vector<int>& workers, const std::string&) override {
    int32_t cached_steps = 0;
    int32_t cached_passes = 0;
    const double alone = duration(d, &cached_steps, &cached_passes) * kNs;
    const TaskKind kind = static_cast<TaskKind>(d.kind);
    if (kind == TaskKind::kDenoise || kind == TaskKind::kMigrate || kind == TaskKind::kReinit ||
        kind == TaskKind::kDecode || kind == TaskKind::kGather) {
      queue(d, workers, alone, cached_steps, cached_passes);  // collectives: every member at once
    } else {
      for (int w : workers) queue(d, {w}, alone);  // each member on its own (encode, free)
    }
  }

  void queue(const TaskDescriptor& d, const std::vector<int>& members, double alone_ns, int32_t cached_steps = 0,
             int32_t cached_passes = 0) {
    auto t = std::make_unique<SimTask>();
    t->d = d;
    t->cached_steps = cached_steps;
    t->cached_passes = cached_passes;
    t->members = members;
    t->ready_ns = clock_.nowNs() + static_cast<int64_t>(opt_.dispatch_s * kNs);
    t->work_ns = alone_ns * rateFor(static_cast<int>(members.size()), static_cast<double>(members.size()));
    SimTask* p = t.get();
    tasks_.emplace(p, std::move(t));
    for (int w : members) queues_[w].push_back(p);
    for (int w : members) dirty_.push_back(w);
    if (p->ready_ns > clock_.nowNs()) wakes_.push(p->ready_ns);
  }

  // Next time something happens inside the executor (a task ends, a queued task becomes visible, a completion
  // arrives), or INT64_MAX.
  int64_t nextEvent() const {
    int64_t t = INT64_MAX;
    if (!running_.empty()) {
      double demand = demand_();
      double least = 1e300;
      for (const SimTask* r : running_) {
        least = std::min(least, std::max(0.0, r->work_ns) / rateFor(static_cast<int>(r->members.size()), demand));
      }
      t = std::min(t, last_ns_ + static_cast<int64_t>(std::ceil(least)));
    }
    if (!deliveries_.empty()) t = std::min(t, deliveries_.top().t_ns);
    if (!wakes_.empty()) t = std::min(t, wakes_.top());
    return t;
  }

  // Advances running work to now, ends finished tasks, starts what can start.
  void advance(int64_t now) {
    double demand = demand_();
    double dt = static_cast<double>(now - last_ns_);
    if (dt > 0) {
      for (SimTask* r : running_) r->work_ns -= dt * rateFor(static_cast<int>(r->members.size()), demand);
    }
    last_ns_ = now;
    while (!wakes_.empty() && wakes_.top() <= now) {
      wakes_.pop();
      for (int w = 0; w < static_cast<int>(queues_.size()); ++w) dirty_.push_back(w);  // a queued task is visible
    }
    while (true) {
      bool changed = false;
      for (size_t i = 0; i < running_.size();) {
        SimTask* r = running_[i];
        if (r->work_ns <= 0.5) {  // half a nanosecond of rounding
          running_[i] = running_.back();
          running_.pop_back();
          end(r, now);
          changed = true;
        } else {
          ++i;
        }
      }
      changed |= startReady(now);
      if (!changed) break;
    }
  }

  // Completions due by now, in order.
  bool popDelivery(int64_t now, std::vector<Completion>& out) {
    if (deliveries_.empty() || deliveries_.top().t_ns > now) return false;
    out = deliveries_.top().completions;
    deliveries_.pop();
    return true;
  }

  double busyRankNs() const { return busy_rank_ns_; }
  std::vector<SimInterval>& intervals() { return intervals_; }
  uint64_t numTasks() const { return num_tasks_; }

 private:
  // The rate of a task of `members` while `demand` members are busy (NOTE [simulated execution]).
  double rateFor(int members, double demand) const {
    if (cores_ <= 0 || demand <= cores_) return 1.0;
    return (members > 1 ? opt_.collective_efficiency : 1.0) * cores_ / demand;
  }

  double demand_() const {
    double demand = 0;
    for (const SimTask* r : running_) demand += static_cast<double>(r->members.size());
    return demand;
  }

  int numNodes(const std::vector<int>& ranks) const {
    std::vector<int> nodes;
    for (int w : ranks) {
      int n = cluster_.nodeOf(w);
      if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    }
    return std::max<int>(1, static_cast<int>(nodes.size()));
  }

  double duration(const TaskDescriptor& d, int32_t* cached_steps, int32_t* cached_passes) {
    TaskKind kind = static_cast<TaskKind>(d.kind);
    if (kind == TaskKind::kFree || kind == TaskKind::kReinit || kind == TaskKind::kShutdown) return 0;
    auto it = shapes_.find(d.request_id);
    GFDIT_CHECK_CODE(kInternal, it != shapes_.end()) << "simulator: task for unknown request " << d.request_id;
    std::vector<int> ranks(d.ranks, d.ranks + d.num_ranks);
    cost::StageQuery q;
    q.shape = it->second;
    q.degree = d.num_ranks;
    q.layout = d.layout;
    q.num_nodes = numNodes(ranks);
    q.batch = std::max(1, d.batch);  // a batched step prices all its members (NOTE [batches] in control.cpp)
    double s = 0;
    switch (kind) {
      case TaskKind::kEncode:
        q.layout = Layout();
        q.layout.ulysses = d.num_ranks;
        s = cost_.seconds(cost::Stage::kEncode, q);
        break;
      case TaskKind::kDenoise: {
        const double full = cost_.seconds(cost::Stage::kDenoise, q);
        s = d.num_steps * full + regroup(ranks);
        auto c = caches_.find(d.request_id);
        if (c == caches_.end()) break;
        // see NOTE [simulated execution]: the cached passes of each step, drawn
        q.cached = q.shape.cache.kind;
        const double cached = std::min(full, cost_.seconds(cost::Stage::kDenoise, q));
        const int32_t passes = q.shape.guidance() ? 2 : 1;
        for (int32_t k = d.step_begin; k < d.step_begin + d.num_steps; ++k) {
          int32_t hit = 0;
          for (int32_t pass = 0; pass < passes; ++pass) {
            int32_t& run = c->second.run[pass];
            const bool may = !q.shape.cache.alwaysFull(k, q.shape.num_steps) &&
                             (q.shape.cache.max_skip < 0 || run < q.shape.cache.max_skip);
            const bool reuse = may && uniform(opt_.cache_seed, d.request_id, static_cast<uint64_t>(k),
                                              static_cast<uint64_t>(pass)) < c->second.p;
            run = reuse ? run + 1 : 0;
            hit += reuse ? 1 : 0;
          }
          s -= (full - cached) * hit / passes;
          *cached_passes += hit;
          *cached_steps += hit == passes ? 1 : 0;
          cached_passes_ += hit;
          passes_ += passes;
        }
        break;
      }
      case TaskKind::kGather:
        q.layout = Layout();
        q.layout.ulysses = d.num_ranks;
        s = cost_.seconds(cost::Stage::kGather, q);
        break;
      case TaskKind::kMigrate:
        q.layout = Layout();
        q.layout.ulysses = d.num_ranks;
        q.num_new = d.num_ranks - 1;
        // the broadcast rides the new group's formation, which its first step pays in regroup_every_change
        s = cost_.seconds(cost::Stage::kMigrate, q) + (opt_.regroup_every_change ? 0 : regroup(ranks));
        break;
      case TaskKind::kDecode:  // a collective over its members (NOTE [parallel decode] in control.cpp)
        q.layout = Layout();
        s = cost_.seconds(cost::Stage::kDecode, q);
        break;
      default: break;
    }
    return std::max(0.0, s);
  }

  // Group formation (SimOptions::regroup_every_change): by default a rank set used for the first time pays
  // it (communicator caches keep the rest); otherwise each rank keeps only its current group, and a task
  // pays whenever one of its members last ran a collective task with another rank set.
  double regroup(const std::vector<int>& ranks) {
    if (regroup_ns_ <= 0 || ranks.size() < 2) return 0;
    uint64_t key = 0;
    for (int w : ranks) key |= uint64_t{1} << w;
    if (!opt_.regroup_every_change) return seen_groups_.insert(key).second ? regroup_ns_ / kNs : 0;
    bool changed = false;
    for (int w : ranks) {
      changed |= current_group_[w] != key;
      current_group_[w] = key;
    }
    return changed ? regroup_ns_ / kNs : 0;
  }

  bool startReady(int64_t now) {
    bool started = false;
    std::vector<int> dirty;
    dirty.swap(dirty_);
    std::sort(dirty.begin(), dirty.end());
    dirty.erase(std::unique(dirty.begin(), dirty.end()), dirty.end());
    for (int w : dirty) {
      if (busy_[w] || queues_[w].empty()) continue;
      SimTask* h = queues_[w].front();
      if (h->running) continue;
      bool ok = h->ready_ns <= now;
      for (int m : h->members) ok = ok && !busy_[m] && !queues_[m].empty() && queues_[m].front() == h;
      if (!ok) continue;
      h->running = true;
      h->start_ns = now;
      for (int m : h->members) busy_[m] = true;
      running_.push_back(h);
      started = true;
    }
    return started;
  }

  void end(SimTask* t, int64_t now) {
    ++num_tasks_;
    Delivery del;
    del.t_ns = now + static_cast<int64_t>(opt_.completion_s * kNs);
    del.seq = seq_++;
    TaskKind kind = static_cast<TaskKind>(t->d.kind);
    for (int m : t->members) {
      busy_[m] = false;
      queues_[m].pop_front();
      dirty_.push_back(m);
      Completion c;
      c.task_id = t->d.task_id;
      c.request_id = t->d.request_id;
      c.kind = t->d.kind;
      c.rank = m;
      c.dispatch_ns = t->d.dispatch_ns;
      c.start_ns = t->start_ns;
      c.end_ns = now;
      c.post_ns = now;
      if (kind == TaskKind::kDenoise) {
        c.step_end = t->d.step_begin + t->d.num_steps;
        c.cached_steps = t->cached_steps;
        c.cached_passes = t->cached_passes;
      }
      if (kind == TaskKind::kMigrate) c.step_end = t->d.step_begin;
      if (kind == TaskKind::kEncode) c.step_end = 0;
      del.completions.push_back(c);
      if (now > t->start_ns) {
        busy_rank_ns_ += static_cast<double>(now - t->start_ns);
        if (opt_.record_intervals) {
          intervals_.push_back({m, t->d.request_id, kind, t->start_ns / kNs, now / kNs});
        }
      }
    }
    deliveries_.push(std::move(del));
    tasks_.erase(t);
  }

  const cost::CostModel& cost_;
  const cost::Cluster& cluster_;
  const SimOptions& opt_;
  VirtualClock& clock_;
  std::vector<std::deque<SimTask*>> queues_;
  std::vector<bool> busy_;
  std::vector<SimTask*> running_;
  std::vector<int> dirty_;
  std::unordered_map<SimTask*, std::unique_ptr<SimTask>> tasks_;
  std::unordered_map<uint64_t, RequestShape> shapes_;
  std::unordered_map<uint64_t, SimCache> caches_;  // the requests with a step cache
  uint64_t cached_passes_ = 0;
  uint64_t passes_ = 0;
  std::unordered_set<uint64_t> seen_groups_;
  std::priority_queue<Delivery, std::vector<Delivery>, std::greater<Delivery>> deliveries_;
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> wakes_;
  int cores_ = 0;
  double regroup_ns_ = 0;
  std::vector<uint64_t> current_group_;  // regroup_every_change: each rank's current group (a rank bitmask)
  int64_t last_ns_ = 0;
  uint64_t seq_ = 0;
  uint64_t num_tasks_ = 0;
  double busy_rank_ns_ = 0;
  std::vector<SimInterval> intervals_;
};

}  // namespace

Simulator::Simulator(std::shared_ptr<const cost::CostModel> cost, cost::Cluster cluster, std::shared_ptr<Policy> policy,
                     SimOptions options)
    : cost_(std::move(cost)), cluster_(std::move(cluster)), policy_(std::move(policy)), options_(options) {
  GFDIT_CHECK(cost_ != nullptr) << "the simulator needs a cost model";
  GFDIT_CHECK(policy_ != nullptr) << "the simulator needs a policy";
  GFDIT_CHECK(cluster_.num_ranks >= 1 && cluster_.num_ranks <= kMaxRanks)
      << "cluster " << cluster_.name << " has " << cluster_.num_ranks << " ranks";
}

Simulator::~Simulator() = default;

SimResult Simulator::run(const std::vector<SimRequest>& requests) {
  auto wall0 = std::chrono::steady_clock::now();
  VirtualClock clock;
  SimExecutor exec(*cost_, cluster_, options_, clock);
  ControlConfig cfg;
  cfg.world_size = cluster_.num_ranks;
  cfg.max_inflight_steps = options_.max_inflight_steps;
  cfg.lookahead = options_.lookahead;
  cfg.record_stages = false;
  cfg.node_of.resize(cluster_.num_ranks);
  for (int w = 0; w < cluster_.num_ranks; ++w) cfg.node_of[w] = cluster_.nodeOf(w);
  ControlPlane plane(cfg, clock, exec, policy_, cost_);

  const cost::ModelArch& arch = cost_->model();
  RequestLimits limits = RequestLimits::of(arch);
  SimResult res;
  res.num_ranks = cluster_.num_ranks;
  res.requests.resize(requests.size());
  std::unordered_map<uint64_t, size_t> index;
  index.reserve(requests.size());
  double prev = -1;
  for (size_t i = 0; i < requests.size(); ++i) {
    const SimRequest& r = requests[i];
    GFDIT_CHECK(r.arrival_s >= 0 && r.arrival_s >= prev)
        << "simulator: request " << r.id << " arrives at " << r.arrival_s << " s, before the one ahead of it";
    prev = r.arrival_s;
    GFDIT_CHECK(index.emplace(r.id + 1, i).second) << "simulator: request id " << r.id << " twice";
    SimOutcome& o = res.requests[i];
    o.id = r.id;
    o.arrival_s = r.arrival_s;
    o.deadline_s = r.deadline_s;
    o.priority = r.priority;
  }
  // The control plane's ids are trace ids + 1 (0 means "assign one").
  plane.setFinishedCallback([&](RequestResult&& rr) {
    SimOutcome& o = res.requests[index.at(rr.id)];
    o.state = rr.state;
    o.finish_s = clock.nowNs() / kNs;
    for (const Transition& t : rr.transitions) {
      if (t.state == RequestState::kEncoding) {
        o.first_start_s = t.t_ns / kNs;
        break;
      }
    }
  });

  size_t next = 0;
  std::vector<Completion> batch;
  while (true) {
    int64_t t_arr =
        next < requests.size() ? static_cast<int64_t>(std::llround(requests[next].arrival_s * kNs)) : INT64_MAX;
    int64_t t = std::min(t_arr, exec.nextEvent());
    if (t == INT64_MAX) break;
    clock.set(t);
    exec.advance(t);
    while (exec.popDelivery(t, batch)) {
      for (const Completion& c : batch) plane.onCompletion(c);
    }
    while (next < requests.size() && static_cast<int64_t>(std::llround(requests[next].arrival_s * kNs)) <= t) {
      const SimRequest& r = requests[next++];
      RequestSpec spec;
      spec.id = r.id + 1;
      spec.shape = r.shape;
      if (spec.shape.num_steps <= 0) spec.shape.num_steps = arch.default_steps;
      if (spec.shape.guidance_scale < 0) spec.shape.guidance_scale = arch.default_guidance;
      checkRequest(spec.shape, limits);
      spec.arrival_ns = t;
      if (!std::isnan(r.deadline_s)) spec.deadline_ns = std::max<int64_t>(1, std::llround(r.deadline_s * kNs));
      spec.priority = r.priority;
      spec.max_degree = kMaxRanks;  // Ring carries a group past the heads' Ulysses limit (RequestCost::max_ulysses)
      spec.num_heads = arch.heads;
      exec.addRequest(spec.id, spec.shape);
      plane.submit(std::move(spec));
    }
    plane.poll();
    exec.advance(t);  // tasks dispatched now that can start now
  }
  GFDIT_CHECK_CODE(kInternal, plane.numRequests() == 0)
      << "simulator: " << plane.numRequests() << " requests never finished (the policy left them waiting)";
  for (const SimOutcome& o : res.requests) res.makespan_s = std::max(res.makespan_s, o.finish_s);
  res.busy_rank_s = exec.busyRankNs() / kNs;
  res.intervals = std::move(exec.intervals());
  res.num_tasks = exec.numTasks();
  res.cached_passes = exec.cachedPasses();
  res.cache_passes = exec.passes();
  res.stats = plane.stats();
  res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return res;
}

}  // namespace runtime
}  // namespace gfdit
