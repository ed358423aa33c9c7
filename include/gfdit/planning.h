// Predictions policies plan with: the layout of a group without a cost model (plainLayout), the fastest
// layout the cost model prices (bestLayout), and a request's predictions for every degree (predictCosts).
#pragma once

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

/// The largest Ulysses degree a model of `heads` attention heads allows: the heads (an uneven split gives each
/// member floor or ceil of heads / ulysses), at least 1 and at most kMaxRanks.
int maxUlyssesDegree(int heads);

}  // namespace runtime
}  // namespace gfdit
