// Request state machine, scheduler core and the built-in policies.
#include <algorithm>
#include <sstream>

#include "gfdit/error.h"
#include "gfdit/runtime.h"

namespace gfdit {
namespace runtime {

const char* requestStateName(RequestState s) {
  switch (s) {
    case RequestState::kQueued: return "QUEUED";
    case RequestState::kEncoding: return "ENCODING";
    case RequestState::kDenoising: return "DENOISING";
    case RequestState::kDecoding: return "DECODING";
    case RequestState::kDone: return "DONE";
    case RequestState::kFailed: return "FAILED";
    case RequestState::kCancelled: return "CANCELLED";
  }
  return "UNKNOWN";
}

namespace {

bool finished(RequestState s) {
  return s == RequestState::kDone || s == RequestState::kFailed || s == RequestState::kCancelled;
}

// Which transitions the state machine allows.
bool allowed(RequestState from, RequestState to) {
  if (finished(from)) return false;
  if (to == RequestState::kFailed || to == RequestState::kCancelled) return true;
  switch (from) {
    case RequestState::kQueued: return to == RequestState::kEncoding;
    case RequestState::kEncoding:
      // a request whose encode was lost with a worker starts over
      return to == RequestState::kDenoising || to == RequestState::kQueued;
    case RequestState::kDenoising:
      return to == RequestState::kDenoising || to == RequestState::kDecoding || to == RequestState::kQueued;
    case RequestState::kDecoding: return to == RequestState::kDone || to == RequestState::kQueued;
    default: return false;
  }
}

int largestPowerOfTwoAtMost(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

Layout ulyssesLayout(int degree) {
  Layout l;
  l.ulysses = degree;
  l.ring = 1;
  return l;
}

class StaticPolicy : public Policy {
 public:
  explicit StaticPolicy(int degree) : degree_(degree) { GFDIT_CHECK(degree >= 1) << "static degree " << degree; }
  std::string name() const override { return "static:" + std::to_string(degree_); }

  std::vector<Decision> schedule(const SchedulerView& view) override {
    GFDIT_CHECK(view.world_size % degree_ == 0)
        << "static:" << degree_ << " needs a world size divisible by " << degree_ << ", got " << view.world_size;
    std::vector<bool> free(view.world_size, false);
    for (int r : view.free_ranks) free[r] = true;
    auto groupFree = [&](int g) {
      for (int r = g * degree_; r < (g + 1) * degree_; ++r) {
        if (!free[r]) return false;
      }
      return true;
    };
    std::vector<Decision> out;
    for (const RequestRecord* req : view.ready) {
      int g = -1;
      if (!req->ranks.empty()) {
        g = req->ranks[0] / degree_;  // keeps the group it got first
        if (!groupFree(g)) continue;
      } else {
        for (int c = 0; c < view.world_size / degree_; ++c) {
          if (groupFree(c)) {
            g = c;
            break;
          }
        }
        if (g < 0) break;  // every group busy: later arrivals wait too (first come, first served)
      }
      Decision d;
      d.request_id = req->id;
      for (int r = g * degree_; r < (g + 1) * degree_; ++r) {
        d.ranks.push_back(r);
        free[r] = false;
      }
      d.layout = ulyssesLayout(degree_);
      d.num_steps = std::max(1, req->num_steps - req->step);  // the whole rest: the degree never changes
      out.push_back(d);
    }
    return out;
  }

 private:
  int degree_;
};

class FcfsPolicy : public Policy {
 public:
  explicit FcfsPolicy(int steps) : steps_(steps) {}
  std::string name() const override { return "fcfs"; }

  std::vector<Decision> schedule(const SchedulerView& view) override {
    std::vector<bool> free(view.world_size, false);
    int num_free = 0;
    for (int r : view.free_ranks) {
      free[r] = true;
      ++num_free;
    }
    std::vector<Decision> out;
    size_t n_ready = view.ready.size();
    for (size_t i = 0; i < n_ready && num_free > 0; ++i) {
      const RequestRecord* req = view.ready[i];
      // The oldest gets what it can use, but leaves one rank for each younger ready request.
      int leave = static_cast<int>(std::min<size_t>(n_ready - i - 1, static_cast<size_t>(num_free - 1)));
      int degree = largestPowerOfTwoAtMost(std::max(1, std::min(num_free - leave, req->max_degree)));
      Decision d;
      d.request_id = req->id;
      // Prefer ranks that already hold the request's state: shrinking moves nothing.
      for (int r : req->ranks) {
        if (static_cast<int>(d.ranks.size()) < degree && free[r]) {
          d.ranks.push_back(r);
          free[r] = false;
        }
      }
      for (int r = 0; r < view.world_size && static_cast<int>(d.ranks.size()) < degree; ++r) {
        if (free[r]) {
          d.ranks.push_back(r);
          free[r] = false;
        }
      }
      num_free -= degree;
      d.layout = ulyssesLayout(degree);
      d.num_steps = steps_;
      out.push_back(d);
    }
    return out;
  }

 private:
  int steps_;
};

}  // namespace

std::unique_ptr<Policy> makeStaticPolicy(int degree) { return std::make_unique<StaticPolicy>(degree); }
std::unique_ptr<Policy> makeFcfsPolicy(int steps_per_decision) {
  GFDIT_CHECK(steps_per_decision >= 1) << "steps per decision must be >= 1";
  return std::make_unique<FcfsPolicy>(steps_per_decision);
}

std::unique_ptr<Policy> makePolicy(const std::string& spec) {
  if (spec == "fcfs") return makeFcfsPolicy();
  if (spec.rfind("static:", 0) == 0) {
    int d = 0;
    try {
      d = std::stoi(spec.substr(7));
    } catch (...) {
      d = 0;
    }
    GFDIT_CHECK(d >= 1) << "policy '" << spec << "': the degree must be a positive integer";
    return makeStaticPolicy(d);
  }
  throw Error(ErrorCode::kInvalidUsage, "unknown policy '" + spec + "' (built in: fcfs, static:D)");
}

// ---- Scheduler ----

Scheduler::Scheduler(int world_size, std::unique_ptr<Policy> policy)
    : world_size_(world_size), policy_(std::move(policy)), rank_busy_(world_size, false) {
  GFDIT_CHECK(world_size >= 1 && world_size <= kMaxRanks) << "world size " << world_size;
  GFDIT_CHECK(policy_ != nullptr) << "a scheduler needs a policy";
}

void Scheduler::addRequest(const RequestRecord& record) {
  GFDIT_CHECK(requests_.count(record.id) == 0) << "request " << record.id << " exists";
  GFDIT_CHECK(record.num_steps >= 1) << "request " << record.id << " has no steps";
  RequestRecord r = record;
  r.state = RequestState::kQueued;
  if (r.arrival_ns == 0) r.arrival_ns = nowNs();
  r.transitions.push_back({RequestState::kQueued, 0, r.arrival_ns});
  requests_.emplace(r.id, std::move(r));
}

void Scheduler::transition(uint64_t id, RequestState state, int32_t step, const std::string& reason) {
  RequestRecord& r = mutableRequest(id);
  GFDIT_CHECK(allowed(r.state, state)) << "request " << id << ": " << requestStateName(r.state) << " -> "
                                       << requestStateName(state) << " is not a valid transition";
  r.state = state;
  if (step >= 0) r.step = step;
  if (!reason.empty()) r.reason = reason;
  r.transitions.push_back({state, r.step, nowNs()});
}

void Scheduler::setBusy(uint64_t id, bool busy) { mutableRequest(id).busy = busy; }

void Scheduler::occupy(const std::vector<int>& ranks) {
  for (int r : ranks) {
    GFDIT_CHECK(r >= 0 && r < world_size_) << "rank " << r;
    rank_busy_[r] = true;
  }
}

void Scheduler::release(const std::vector<int>& ranks) {
  for (int r : ranks) {
    GFDIT_CHECK(r >= 0 && r < world_size_) << "rank " << r;
    rank_busy_[r] = false;
  }
}

std::vector<Decision> Scheduler::schedule() {
  SchedulerView view;
  view.now_ns = nowNs();
  view.world_size = world_size_;
  for (int r = 0; r < world_size_; ++r) {
    if (!rank_busy_[r]) view.free_ranks.push_back(r);
  }
  std::vector<const RequestRecord*> all;
  for (const auto& kv : requests_) {
    if (!finished(kv.second.state)) all.push_back(&kv.second);
  }
  std::stable_sort(all.begin(), all.end(), [](const RequestRecord* a, const RequestRecord* b) {
    return a->arrival_ns != b->arrival_ns ? a->arrival_ns < b->arrival_ns : a->id < b->id;
  });
  for (const RequestRecord* r : all) (r->busy ? view.running : view.ready).push_back(r);
  if (view.ready.empty() || view.free_ranks.empty()) return {};
  std::vector<Decision> decisions = policy_->schedule(view);
  // Check what the policy returned before anyone acts on it.
  std::vector<bool> taken(world_size_, false);
  std::vector<uint64_t> seen;
  for (const Decision& d : decisions) {
    GFDIT_CHECK(has(d.request_id)) << "policy " << policy_->name() << " chose unknown request " << d.request_id;
    const RequestRecord& r = request(d.request_id);
    GFDIT_CHECK(!r.busy && !finished(r.state)) << "policy " << policy_->name() << " chose request " << d.request_id
                                               << ", which is not ready";
    GFDIT_CHECK(std::find(seen.begin(), seen.end(), d.request_id) == seen.end())
        << "policy " << policy_->name() << " chose request " << d.request_id << " twice";
    seen.push_back(d.request_id);
    GFDIT_CHECK(!d.ranks.empty() && static_cast<int>(d.ranks.size()) <= world_size_)
        << "policy " << policy_->name() << " gave request " << d.request_id << " " << d.ranks.size() << " ranks";
    for (int rank : d.ranks) {
      GFDIT_CHECK(rank >= 0 && rank < world_size_ && !rank_busy_[rank] && !taken[rank])
          << "policy " << policy_->name() << " gave request " << d.request_id << " rank " << rank
          << ", which is busy, taken twice or out of range";
      taken[rank] = true;
    }
    GFDIT_CHECK(d.layout.ulysses >= 1 && d.layout.ring >= 1 &&
                d.layout.ulysses * d.layout.ring == static_cast<int>(d.ranks.size()))
        << "policy " << policy_->name() << ": layout " << d.layout.ulysses << "x" << d.layout.ring
        << " does not fit " << d.ranks.size() << " ranks";
    GFDIT_CHECK(d.num_steps >= 1) << "policy " << policy_->name() << ": num_steps " << d.num_steps;
  }
  return decisions;
}

const RequestRecord& Scheduler::request(uint64_t id) const {
  auto it = requests_.find(id);
  GFDIT_CHECK(it != requests_.end()) << "unknown request " << id;
  return it->second;
}

RequestRecord& Scheduler::mutableRequest(uint64_t id) {
  auto it = requests_.find(id);
  GFDIT_CHECK(it != requests_.end()) << "unknown request " << id;
  return it->second;
}

std::vector<uint64_t> Scheduler::requestIds() const {
  std::vector<uint64_t> ids;
  for (const auto& kv : requests_) ids.push_back(kv.first);
  return ids;
}

}  // namespace runtime
}  // namespace gfdit
