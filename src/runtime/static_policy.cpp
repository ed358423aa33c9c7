// "static:D": fixed groups of D ranks, a request keeps its group for life (see makeStaticPolicy in
// gfdit/policy.h); the baseline of fixed-degree serving systems. With a cost model it batches as they do: a
// request that finds its group (or, new, every group) taken this round joins the smallest batch of its shape
// decided this round (on its own group when it holds one), by the rule of the dynamic policies (joinBatch in
// gfdit/planning.h: within max_batch and the memory, and only while each request's share of a step falls).
#include <algorithm>
#include <set>
#include <string>
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
class StaticOrder : public ReadyOrder {
 public:
  struct Entry {
    int64_t arrival_ns = 0;
    uint64_t id = 0;
    const RequestRecord* rec = nullptr;
    bool operator<(const Entry& o) const { return arrival_ns != o.arrival_ns ? arrival_ns < o.arrival_ns : id < o.id; }
  };
  using Set = std::set<Entry>;

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
    s.it = s.set->insert(s.set->end(), Entry{r->arrival_ns, r->id, r});  // arrivals almost always go last
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
  Set holding_, fresh_;
  std::vector<Slot> slots_;   // by handle
  std::vector<size_t> free_;  // handles to reuse
  size_t size_ = 0;
};

class StaticPolicy : public Policy {
 public:
  StaticPolicy(int degree, int32_t max_batch) : degree_(degree), max_batch_(max_batch) {
    GFDIT_CHECK(degree >= 1) << "static degree " << degree;
    GFDIT_CHECK(max_batch >= 1 && max_batch <= kMaxBatch).param("max_batch")
        << "max_batch must be in [1, " << kMaxBatch << "], got " << max_batch;
  }
  std::string name() const override {
    std::string n = "static:" + std::to_string(degree_);
    if (max_batch_ != PolicyOptions().max_batch) n += ":batch=" + std::to_string(max_batch_);
    return n;
  }
  std::unique_ptr<ReadyOrder> makeReadyOrder() const override { return std::make_unique<StaticOrder>(); }

  std::vector<Decision> schedule(const SchedulerView& view) override {
    GFDIT_CHECK(view.world_size % degree_ == 0)
        << "static:" << degree_ << " needs a world size divisible by " << degree_ << ", got " << view.world_size;
    const StaticOrder* order = view.order != nullptr ? dynamic_cast<const StaticOrder*>(view.order) : nullptr;
    GFDIT_CHECK(view.order == nullptr || order != nullptr)
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
    batches_.clear();  // the batch plan of each decision in `out`
    const bool batching = max_batch_ > 1 && view.cost != nullptr;
    // a request of one shape joins a batch decided this round: on its own group, or (a new one) on any
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
        if (!joinBatch(*view.cost, max_batch_, PolicyOptions().batch_gain, batches_[best])) {
          full[best] = true;
          continue;
        }
        out[best].batch.push_back(req->id);
        out[best].num_steps = std::min(out[best].num_steps, std::max(1, req->num_steps - req->step));
        return true;
      }
    };
    bool waiting = false;  // an earlier new request found no group: later new ones wait too (FCFS)
    auto consider = [&](const RequestRecord* req) {
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
      b.shape = req->shape;
      b.degree = degree_;
      b.layout = d.layout;
      out.push_back(std::move(d));
      batches_.push_back(b);
    };
    if (order == nullptr) {
      for (const RequestRecord* req : view.ready) consider(req);
      return out;
    }
    // The same requests in the same order as a full list: the three sources merged by arrival; new ones stop
    // mattering once one of them waits.
    auto holding = order->holding().begin();
    auto fresh = order->fresh().begin();
    auto extra = view.ready.begin();
    auto before = [](const RequestRecord* a, const RequestRecord* b) {
      return a->arrival_ns != b->arrival_ns ? a->arrival_ns < b->arrival_ns : a->id < b->id;
    };
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
  std::vector<bool> free_;
  std::vector<BatchPlan> batches_;
};

}  // namespace

std::unique_ptr<Policy> makeStaticPolicy(int degree, int32_t max_batch) {
  return std::make_unique<StaticPolicy>(degree, max_batch);
}

}  // namespace runtime
}  // namespace gfdit
