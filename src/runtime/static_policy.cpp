// "static:D": fixed groups of D ranks, a request keeps its group for life (see makeStaticPolicy in
// gfdit/policy.h); the baseline of fixed-degree serving systems.
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
  explicit StaticPolicy(int degree) : degree_(degree) { GFDIT_CHECK(degree >= 1) << "static degree " << degree; }
  std::string name() const override { return "static:" + std::to_string(degree_); }
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
    bool waiting = false;  // an earlier new request found no group: later new ones wait too (FCFS)
    auto consider = [&](const RequestRecord* req) {
      int g = -1;
      if (!req->ranks.empty()) {
        g = req->ranks[0] / degree_;  // keeps the group it got first
        if (!groupFree(g)) return;
      } else {
        if (waiting) return;
        for (int c = 0; c < view.world_size / degree_; ++c) {
          if (groupFree(c)) {
            g = c;
            break;
          }
        }
        if (g < 0) {
          waiting = true;
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
      out.push_back(std::move(d));
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
  std::vector<bool> free_;
};

}  // namespace

std::unique_ptr<Policy> makeStaticPolicy(int degree) { return std::make_unique<StaticPolicy>(degree); }

}  // namespace runtime
}  // namespace gfdit
