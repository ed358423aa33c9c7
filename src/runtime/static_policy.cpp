// "static:D": fixed groups of D ranks, a request keeps its group for life (see makeStaticPolicy in
// gfdit/policy.h); the baseline of fixed-degree serving systems. With a cost model it batches as they do: a
// request that finds its group (or, new, every group) taken this round joins the smallest batch of its shape
// decided this round (on its own group when it holds one), by the rule of the dynamic policies (joinBatch in
// gfdit/planning.h: within max_batch and the memory, and only while each request's share of a step falls).
// Requests submitted together (RequestSpec::group) join the batch of the first of them decided in the round.
// The queue is in arrival order (fcfs), or "static:D:srtf" shortest remaining time at D ranks first, or
// "static:D:edf" earliest deadline first (those without one after, by arrival), as the GF-DiT artifact's
// srtf_sp lanes; a new request that finds no group stops the new ones behind it in that order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gfdit/error.h"
#include "gfdit/planning.h"
#include "gfdit/policy.h"

namespace gfdit {
namespace runtime {

namespace {

// The waiting requests in arrival order (the order of SchedulerView::ready), those that hold a group apart
// from new ones (NOTE [ready order] in src/runtime/control.cpp): a round goes through every one that holds a
// group (few: a request keeps its group for the rest of its steps) and through new ones only until one finds
// no group, after which every new one waits.
// A request's place in a static queue order: (a, b, id), smaller first.
struct StaticKey {
  double a = 0, b = 0;
  uint64_t id = 0;
  bool operator<(const StaticKey& o) const { return std::tie(a, b, id) < std::tie(o.a, o.b, o.id); }
};

StaticKey staticKey(PolicyOrder order, int degree, const RequestRecord& r) {
  const double arrival = static_cast<double>(r.arrival_ns);
  switch (order) {
    case PolicyOrder::kRemaining: {
      // the remaining time at the group's degree (steps left at one per unit without a cost model)
      const double left = r.cost.known ? r.remainingSeconds(degree) : static_cast<double>(r.stepsLeft());
      return {std::isfinite(left) ? left : std::numeric_limits<double>::max(), arrival, r.id};
    }
    case PolicyOrder::kDeadline:
      if (r.deadline_ns > 0) return {0, static_cast<double>(r.deadline_ns), r.id};
      return {1, arrival, r.id};
    default: return {arrival, 0, r.id};
  }
}

class StaticOrder : public ReadyOrder {
 public:
  struct Entry {
    StaticKey key;
    const RequestRecord* rec = nullptr;
    bool operator<(const Entry& o) const { return key < o.key; }
  };
  using Set = std::set<Entry>;

  StaticOrder(PolicyOrder order, int degree) : order_(order), degree_(degree) {}
  bool madeFor(PolicyOrder order, int degree) const { return order == order_ && degree == degree_; }

  size_t insert(const RequestRecord* r) override {
    size_t h = slots_.size();
    if (free_.empty()) {
      slots_.emplace_back();
    } else {
      h = free_.back();
      free_.pop_back();
    }
    Slot& s = slots_[h];
    s.set = r->ranks.empty() ? &fresh_ : &holding_;
    // by arrival, arrivals almost always go last
    s.it = s.set->insert(s.set->end(), Entry{staticKey(order_, degree_, *r), r});
    ++size_;
    return h;
  }
  void erase(size_t h) override {
    slots_[h].set->erase(slots_[h].it);
    free_.push_back(h);
    --size_;
  }
  size_t size() const override { return size_; }

  const Set& holding() const { return holding_; }
  const Set& fresh() const { return fresh_; }

 private:
  struct Slot {
    Set* set = nullptr;
    Set::iterator it;
  };
  PolicyOrder order_;
  int degree_;
  Set holding_, fresh_;
  std::vector<Slot> slots_;   // by handle
  std::vector<size_t> free_;  // handles to reuse
  size_t size_ = 0;
};

class StaticPolicy : public Policy {
 public:
  StaticPolicy(int degree, int32_t max_batch, PolicyOrder order)
      : degree_(degree), max_batch_(max_batch), order_(order) {
    GFDIT_CHECK(degree >= 1) << "static degree " << degree;
    GFDIT_CHECK(order == PolicyOrder::kArrival || order == PolicyOrder::kRemaining || order == PolicyOrder::kDeadline)
            .param("order")
        << "a static policy queues in arrival, remaining-time or deadline order";
    GFDIT_CHECK(max_batch >= 1 && max_batch <= kMaxBatch).param("max_batch")
        << "max_batch must be in [1, " << kMaxBatch << "], got " << max_batch;
  }
  std::string name() const override {
    std::string n = "static:" + std::to_string(degree_);
    if (order_ == PolicyOrder::kRemaining) n += ":srtf";
    if (order_ == PolicyOrder::kDeadline) n += ":edf";
    if (max_batch_ != PolicyOptions().max_batch) n += ":batch=" + std::to_string(max_batch_);
    return n;
  }
  std::unique_ptr<ReadyOrder> makeReadyOrder() const override { return std::make_unique<StaticOrder>(order_, degree_); }

  std::vector<Decision> schedule(const SchedulerView& view) override {
    GFDIT_CHECK(view.world_size % degree_ == 0)
        << "static:" << degree_ << " needs a world size divisible by " << degree_ << ", got " << view.world_size;
    const StaticOrder* order = view.order != nullptr ? dynamic_cast<const StaticOrder*>(view.order) : nullptr;
    GFDIT_CHECK(view.order == nullptr || (order != nullptr && order->madeFor(order_, degree_)))
        << "policy " << name() << ": the view's ready order was made by another policy";
    free_.assign(view.world_size, false);
    for (int r : view.free_ranks) free_[r] = true;
    auto groupFree = [&](int g) {
      for (int r = g * degree_; r < (g + 1) * degree_; ++r) {
        if (!free_[r]) return false;
      }
      return true;
    };
    std::vector<Decision> out;
    batches_.clear();  // the batch plan of each decision in `out`, and the group of its first request
    groups_.clear();
    const bool batching = max_batch_ > 1 && view.cost != nullptr;
    // a request of one shape joins a batch decided this round: on its own group, or (a new one) on any
    // decision i takes req into its batch, when joinBatch lets it
    auto take = [&](size_t i, const RequestRecord* req) {
      if (!joinBatch(*view.cost, max_batch_, PolicyOptions().batch_gain, *req, view.now_ns, batches_[i])) return false;
      out[i].batch.push_back(req->id);
      out[i].num_steps = std::min(out[i].num_steps, std::max(1, req->num_steps - req->step));
      return true;
    };
    auto join = [&](const RequestRecord* req, int group) {
      if (!batching) return false;
      std::vector<bool> full(out.size(), false);
      while (true) {  // the smallest batch of its shape with room first (the earliest among equals)
        int best = -1;
        for (size_t i = 0; i < out.size(); ++i) {
          if (full[i] || (group >= 0 && out[i].ranks[0] / degree_ != group)) continue;
          if (!sameBatchShape(batches_[i].shape, req->shape)) continue;
          if (best < 0 || out[i].batch.size() < out[best].batch.size()) best = static_cast<int>(i);
        }
        if (best < 0) return false;
        if (take(best, req)) return true;
        full[best] = true;
      }
    };
    // a request of a group (RequestSpec::group) joins the batch decided this round for the first of its group
    auto joinGroup = [&](const RequestRecord* req) {
      if (!batching || req->group == 0) return false;
      for (size_t i = 0; i < out.size(); ++i) {
        if (groups_[i] == req->group && sameBatchShape(batches_[i].shape, req->shape)) return take(i, req);
      }
      return false;
    };
    bool waiting = false;  // an earlier new request found no group: later new ones wait too (FCFS)
    auto consider = [&](const RequestRecord* req) {
      if (joinGroup(req)) return;
      int g = -1;
      if (!req->ranks.empty()) {
        g = req->ranks[0] / degree_;  // keeps the group it got first
        if (!groupFree(g)) {
          join(req, g);
          return;
        }
      } else {
        if (waiting) return;
        for (int c = 0; c < view.world_size / degree_; ++c) {
          if (groupFree(c)) {
            g = c;
            break;
          }
        }
        if (g < 0) {
          waiting = !join(req, -1);
          return;
        }
      }
      Decision d;
      d.request_id = req->id;
      for (int r = g * degree_; r < (g + 1) * degree_; ++r) {
        d.ranks.push_back(r);
        free_[r] = false;
      }
      d.layout = req->cost.known ? req->cost.layoutFor(degree_) : plainLayout(degree_, req->num_heads);
      d.num_steps = std::max(1, req->num_steps - req->step);  // the whole rest: the degree never changes
      BatchPlan b;
      b.start(*req, degree_, d.layout, view.now_ns);
      out.push_back(std::move(d));
      batches_.push_back(b);
      groups_.push_back(req->group);
    };
    auto before = [&](const RequestRecord* a, const RequestRecord* b) {
      return staticKey(order_, degree_, *a) < staticKey(order_, degree_, *b);
    };
    if (order == nullptr) {
      std::vector<const RequestRecord*> ready(view.ready.begin(), view.ready.end());
      if (order_ != PolicyOrder::kArrival) std::stable_sort(ready.begin(), ready.end(), before);
      for (const RequestRecord* req : ready) consider(req);
      return out;
    }
    // The same requests in the same order as a full list: the three sources merged by arrival; new ones stop
    // mattering once one of them waits.
    auto holding = order->holding().begin();
    auto fresh = order->fresh().begin();
    auto extra = view.ready.begin();
    while (true) {
      const RequestRecord* next = nullptr;
      if (holding != order->holding().end()) next = holding->rec;
      if (!waiting && fresh != order->fresh().end() && (next == nullptr || before(fresh->rec, next))) {
        next = fresh->rec;
      }
      if (extra != view.ready.end() && (next == nullptr || before(*extra, next))) next = *extra;
      if (next == nullptr) break;
      if (holding != order->holding().end() && next == holding->rec) {
        ++holding;
      } else if (fresh != order->fresh().end() && next == fresh->rec) {
        ++fresh;
      } else {
        ++extra;
      }
      consider(next);
    }
    return out;
  }

 private:
  int degree_;
  int32_t max_batch_;
  PolicyOrder order_;
  std::vector<bool> free_;
  std::vector<BatchPlan> batches_;
  std::vector<uint64_t> groups_;
};

}  // namespace

std::unique_ptr<Policy> makeStaticPolicy(int degree, int32_t max_batch, PolicyOrder order) {
  return std::make_unique<StaticPolicy>(degree, max_batch, order);
}

}  // namespace runtime
}  // namespace gfdit
