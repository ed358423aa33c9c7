// Predictions policies plan with: the layout of a group without a cost model (plainLayout), the fastest
// layout the cost model prices (bestLayout), and a request's predictions for every degree (predictCosts).
#pragma once

#include <limits>

#include "gfdit/cost.h"
#include "gfdit/layout.h"
#include "gfdit/policy.h"
#include "gfdit/request.h"

namespace gfdit {
namespace runtime {

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

/// A batch the policies grow one request at a time (NOTE [planning], 3b): its head's shape, group and layout, its
/// requests and the predicted seconds of its step.
struct BatchPlan {
  RequestShape shape;
  int degree = 1;
  Layout layout;
  int members = 1;
  int max_members = 0;  ///< max_batch and the cost model's memory limit (0: not computed yet)
  double step_s = 0;    ///< one step of `members` requests (0: not computed yet)
  double alone_s = 0;   ///< one step of one request (0: not computed yet)
  /// The longest step every member that meets its deadline alone still meets it with (infinity: none has one).
  double step_budget_s = std::numeric_limits<double>::infinity();

  /// A batch of `head` alone on `degree` ranks with `layout` (its deadline counted at `now_ns`).
  void start(const RequestRecord& head, int degree_, const Layout& layout_, int64_t now_ns);
};

/// Whether one more request joining `b` keeps each request's share of a step at least `gain` below a step alone
/// and no dearer than before it joined: step(d, b + 1) / (b + 1) <= min(step(d, 1) x (1 - gain), step(d, b) / b),
/// within `max_batch` and the model's memory limit, and while every member that meets its deadline alone in the
/// batch (the joiner included, at `now_ns`) still meets it with the longer step; if so `b` takes it in. A batch
/// the model does not price is full.
bool joinBatch(const cost::CostModel& cost, int32_t max_batch, double gain, const RequestRecord& joiner, int64_t now_ns,
               BatchPlan& b);

/// Whether two requests may run in one batch: the same height, width, frames, guidance and step cache kind (one
/// batched forward runs one kind of cache; each member keeps its own cache and settings).
bool sameBatchShape(const RequestShape& a, const RequestShape& b);

/// The largest Ulysses degree a model of `heads` attention heads allows: the heads (an uneven split gives each
/// member floor or ceil of heads / ulysses), at least 1 and at most kMaxRanks.
int maxUlyssesDegree(int heads);

}  // namespace runtime
}  // namespace gfdit
