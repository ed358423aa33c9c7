// "static:D": fixed groups of D ranks, a request keeps its group for life (see makeStaticPolicy in
// gfdit/policy.h); the baseline of fixed-degree serving systems.
#include <algorithm>
#include <string>
#include <vector>

#include "gfdit/error.h"
#include "gfdit/planning.h"
#include "gfdit/policy.h"

namespace gfdit {
namespace runtime {

namespace {

class StaticPolicy : public Policy {
 public:
  explicit StaticPolicy(int degree) : degree_(degree) { GFDIT_CHECK(degree >= 1) << "static degree " << degree; }
  std::string name() const override { return "static:" + std::to_string(degree_); }

  std::vector<Decision> schedule(const SchedulerView& view) override {
    GFDIT_CHECK(view.world_size % degree_ == 0)
        << "static:" << degree_ << " needs a world size divisible by " << degree_ << ", got " << view.world_size;
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
    for (const RequestRecord* req : view.ready) {
      int g = -1;
      if (!req->ranks.empty()) {
        g = req->ranks[0] / degree_;  // keeps the group it got first
        if (!groupFree(g)) continue;
      } else {
        if (waiting) continue;
        for (int c = 0; c < view.world_size / degree_; ++c) {
          if (groupFree(c)) {
            g = c;
            break;
          }
        }
        if (g < 0) {
          waiting = true;
          continue;
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
