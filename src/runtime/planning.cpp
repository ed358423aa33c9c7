// Predictions policies plan with: plainLayout, bestLayout, predictCosts (see gfdit/planning.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "gfdit/error.h"
#include "gfdit/planning.h"

namespace gfdit {
namespace runtime {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The largest divisor of n (n >= 1) that is at most cap (at least 1).
int largestDivisorAtMost(int n, int cap) {
  for (int u = std::min(n, cap); u > 1; --u) {
    if (n % u == 0) return u;
  }
  return 1;
}

double stepQuery(const cost::CostModel& cost, const RequestShape& shape, int degree, int num_nodes,
                 const Layout& layout) {
  cost::StageQuery q;
  q.shape = shape;
  q.degree = degree;
  q.layout = layout;
  q.num_nodes = std::min(num_nodes, degree);
  try {
    return cost.seconds(cost::Stage::kDenoise, q);
  } catch (const Error&) {
    return kInf;  // a profile that did not measure this layout
  }
}

double stageQuery(const cost::CostModel& cost, cost::Stage stage, const RequestShape& shape, int degree, int num_new) {
  cost::StageQuery q;
  q.shape = shape;
  q.degree = degree;
  q.layout.ulysses = degree;
  q.num_new = num_new;
  try {
    return cost.seconds(stage, q);
  } catch (const Error&) {
    return 0;
  }
}

}  // namespace

Layout plainLayout(int degree, int num_heads) {
  Layout l;
  degree = std::max(1, degree);
  l.ulysses = num_heads > 0 ? std::gcd(degree, num_heads) : degree;
  l.ring = degree / l.ulysses;
  return l;
}

Layout bestLayout(const cost::CostModel& cost, const RequestShape& shape, int degree, int num_nodes, int max_ulysses,
                  LayoutFamily family, double* step_s) {
  degree = std::max(1, degree);
  num_nodes = std::max(1, std::min(num_nodes, degree));
  max_ulysses = std::max(1, max_ulysses);
  Layout best = plainLayout(degree, cost.model().heads);
  double best_s = kInf;
  auto consider = [&](int u, int r, LayoutMode mode, Placement placement, int cfg) {
    Layout l;
    l.ulysses = u;
    l.ring = r;
    l.mode = mode;
    l.placement = placement;
    l.cfg = cfg;
    double s = stepQuery(cost, shape, degree, num_nodes, l);
    if (s < best_s) {
      best_s = s;
      best = l;
    }
  };
  // The family's layouts of one pass on p ranks over `nodes` nodes (with cfg = 2, each half's).
  auto passLayouts = [&](int p, int nodes, int cfg) {
    const int per_node = (p + nodes - 1) / nodes;
    const int top_u = std::min(p, max_ulysses);
    switch (family) {
      case LayoutFamily::kAuto:
        for (int u = 1; u <= top_u; ++u) {
          if (p % u != 0) continue;
          const int r = p / u;
          // one node: placement auto; across nodes: each axis inside a node in turn (Layout::placement)
          for (Placement placement : {Placement::kAuto, Placement::kUlyssesLow, Placement::kRingLow}) {
            if ((placement == Placement::kAuto) != (nodes == 1)) continue;
            consider(u, r, LayoutMode::kUsp, placement, cfg);
            if (u > 1 && r > 1) consider(u, r, LayoutMode::kTorus, placement, cfg);
          }
        }
        break;
      case LayoutFamily::kUsp: {  // Ulysses over the ranks of a node, Ring across
        const int u = largestDivisorAtMost(p, std::min(per_node, max_ulysses));
        consider(u, p / u, LayoutMode::kUsp, nodes > 1 ? Placement::kUlyssesLow : Placement::kAuto, cfg);
        break;
      }
      case LayoutFamily::kSwift: {  // Ring over the ranks of a node, Ulysses across (one node: Ulysses)
        const int u = largestDivisorAtMost(p, nodes == 1 ? max_ulysses : std::min(nodes, max_ulysses));
        consider(u, p / u, LayoutMode::kUsp, nodes == 1 ? Placement::kAuto : Placement::kRingLow, cfg);
        break;
      }
      case LayoutFamily::kTorus: {  // both axes where the pass has room for them (Torus with one is plain)
        bool mixed = false;
        for (int u = 2; u < p && u <= top_u; ++u) {
          if (p % u != 0) continue;
          consider(u, p / u, LayoutMode::kTorus, Placement::kAuto, cfg);
          mixed = true;
        }
        for (int u = 1; !mixed && u <= top_u; ++u) {
          if (p % u == 0) consider(u, p / u, LayoutMode::kTorus, Placement::kAuto, cfg);
        }
        break;
      }
    }
  };
  passLayouts(degree, num_nodes, 1);
  if (shape.guidance() && degree % 2 == 0) {  // CFG-parallel: a half per guidance pass
    passLayouts(degree / 2, std::min(degree / 2, (num_nodes + 1) / 2), 2);
  }
  if (step_s != nullptr) *step_s = best_s;
  return best;
}

RequestCost predictCosts(const cost::CostModel& cost, const RequestShape& shape, int max_degree, int ranks_per_node,
                         LayoutFamily family) {
  RequestCost c;
  c.max_ulysses = maxUlyssesDegree(cost.model().heads);
  ranks_per_node = ranks_per_node > 0 ? ranks_per_node : kMaxRanks;
  const int top = std::max(0, std::min(max_degree, kMaxRanks));
  for (int d = 0; d <= kMaxRanks; ++d) {
    c.step_s[d] = kInf;
    c.layout[d] = plainLayout(d, cost.model().heads);
  }
  // see NOTE [step caches]: the cache's expected share of the steps past the warm-up, from the model's skip curve
  c.cache = shape.cache;
  c.num_steps = shape.num_steps;
  const int32_t eligible = shape.cache.eligibleSteps(0, shape.num_steps, shape.num_steps);
  if (shape.cache.on()) {
    c.cache_share = cachedShare(cost.skipRate(shape.cache.kind, shape.cache.threshold), shape.cache.max_skip);
  }
  for (int d = 0; d <= kMaxRanks; ++d) c.full_step_s[d] = c.cached_step_s[d] = kInf;
  for (int d = 1; d <= top; ++d) {
    const int nodes = (d + ranks_per_node - 1) / ranks_per_node;
    double full = kInf;
    c.layout[d] = bestLayout(cost, shape, d, nodes, c.max_ulysses, family, &full);
    double cached = full;
    if (shape.cache.on() && std::isfinite(full)) {
      cost::StageQuery q;
      q.shape = shape;
      q.degree = d;
      q.layout = c.layout[d];
      q.num_nodes = std::min(nodes, d);
      q.cached = shape.cache.kind;
      try {
        cached = std::min(full, cost.seconds(cost::Stage::kDenoise, q));
      } catch (const Error&) {
        cached = full;  // a model that cannot price it: no gain assumed
      }
    }
    c.full_step_s[d] = full;
    c.cached_step_s[d] = cached;
    c.step_s[d] = std::isfinite(full) && shape.num_steps > 0
                      ? full - (full - cached) * c.cache_share * eligible / shape.num_steps
                      : full;
    if (std::isfinite(c.step_s[d])) c.known = true;
  }
  c.encode_s = stageQuery(cost, cost::Stage::kEncode, shape, 1, 0);
  c.decode_s = stageQuery(cost, cost::Stage::kDecode, shape, 1, 0);
  c.decode_at[1] = c.decode_s;
  const int rows = shape.latent_rows > 0 ? shape.latent_rows : cost.model().latentRows(shape.height);
  for (int d = 2; d <= kMaxRanks; ++d) {
    c.decode_at[d] = kInf;
    if (d > top || d > rows) continue;
    cost::StageQuery q;  // as cost::bestDecodeDegree asks, so that decodeDegree picks what it would
    q.shape = shape;
    q.degree = d;
    q.num_nodes = (d + ranks_per_node - 1) / ranks_per_node;
    try {
      c.decode_at[d] = cost.seconds(cost::Stage::kDecode, q);  // one not measured stays infinite
    } catch (const Error&) {
    }
  }
  c.decode_degree = c.decodeDegree(kMaxRanks);
  c.migrate_s = stageQuery(cost, cost::Stage::kMigrate, shape, 2, 1);
  return c;
}

int maxUlyssesDegree(int heads) { return std::max(1, std::min(heads, kMaxRanks)); }

bool sameBatchShape(const RequestShape& a, const RequestShape& b) {
  return a.height == b.height && a.width == b.width && a.num_frames == b.num_frames && a.guidance() == b.guidance() &&
         a.cache.kind == b.cache.kind;
}

namespace {

// The longest step with which `r` still meets its deadline (its steps left, then its decode, after its encode
// when it has not started), or infinity: no deadline, no prediction, or one it misses already with `step_s`.
double stepBudget(const RequestRecord& r, double step_s, int64_t now_ns) {
  if (r.deadline_ns <= 0 || !r.cost.known || r.stepsLeft() <= 0) return std::numeric_limits<double>::infinity();
  double left = (r.deadline_ns - now_ns) * 1e-9 - r.cost.decode_s;
  if (r.state == RequestState::kQueued) left -= r.cost.encode_s;
  const double budget = left / r.stepsLeft();
  return budget >= step_s ? budget : std::numeric_limits<double>::infinity();
}

}  // namespace

void BatchPlan::start(const RequestRecord& head, int degree_, const Layout& layout_, int64_t now_ns) {
  shape = head.shape;
  degree = degree_;
  layout = layout_;
  members = 1;
  max_members = 0;
  step_s = alone_s = 0;
  const double alone = head.cost.known ? head.cost.stepSeconds(degree_) : 0;
  step_budget_s = stepBudget(head, alone, now_ns);
}

bool joinBatch(const cost::CostModel& cost, int32_t max_batch, double gain, const RequestRecord& joiner, int64_t now_ns,
               BatchPlan& b) {
  cost::StageQuery q;
  q.shape = b.shape;
  q.degree = b.degree;
  q.layout = b.layout;
  try {
    if (b.max_members == 0) b.max_members = std::max(1, std::min({max_batch, kMaxBatch, cost.maxBatch(q)}));
    if (b.step_s <= 0) b.step_s = cost.seconds(cost::Stage::kDenoise, q);
    if (b.alone_s <= 0) b.alone_s = b.step_s / b.members;
    if (b.members >= b.max_members) return false;
    q.batch = b.members + 1;
    const double step = cost.seconds(cost::Stage::kDenoise, q);
    // cheaper per request than alone by `gain`, and no dearer than the batch without it
    if (!(step / q.batch <= b.alone_s * (1 - gain) && step / q.batch <= b.step_s / b.members)) {
      b.max_members = b.members;  // a larger batch pays less still
      return false;
    }
    const double budget = std::min(b.step_budget_s, stepBudget(joiner, b.step_s, now_ns));
    if (step > budget) return false;  // a member would miss its deadline; another joiner may not
    b.step_budget_s = budget;
    b.members = q.batch;
    b.step_s = step;
    return true;
  } catch (const std::exception&) {
    b.max_members = b.members;  // the model does not price a larger batch
    return false;
  }
}

}  // namespace runtime
}  // namespace gfdit
