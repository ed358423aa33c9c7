// Scheduling policies: what a policy sees (SchedulerView), what it answers (Decision), the interface, and
// the built-in policies by name. A policy is pure: it reads a snapshot and returns decisions; the control
// plane validates and applies them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gfdit/cost.h"
#include "gfdit/layout.h"
#include "gfdit/request.h"

namespace gfdit {
namespace runtime {

/// Which layouts a policy considers for a group (docs/architecture.md, Policies).
enum class LayoutFamily : int32_t {
  kAuto = 0,   ///< whatever the cost model predicts fastest: Ulysses, Ring, USP in either placement, Torus
  kUsp = 1,    ///< xDiT's USP: Ulysses inside a node, Ring across nodes
  kSwift = 2,  ///< SwiftFusion's placement: Ring inside a node, Ulysses across nodes
  kTorus = 3,  ///< Torus (overlapped Ulysses x Ring)
};

/// Name of a layout family ("auto", "usp", "swift", "torus").
const char* layoutFamilyName(LayoutFamily f);

/// A policy's answer for one ready request: run it on `ranks` (in order) with `layout` for `num_steps`
/// steps before the next decision. layout.degree() must equal the number of ranks; layout.cfg = 2 only for a
/// request with guidance (the first half of `ranks` runs the conditional pass, the second the unconditional).
struct Decision {
  uint64_t request_id = 0;
  std::vector<int> ranks;
  Layout layout;
  int32_t num_steps = 1;
  /// Whether steps may be dispatched ahead of completions (NOTE [lookahead] in src/runtime/control.cpp). A
  /// policy that lends a request ranks others may soon need turns it off, so the ranks come back after one
  /// step, not two.
  bool dispatch_ahead = true;
  /// Ranks the VAE decode splits over when these steps end the denoising (NOTE [parallel decode] in
  /// src/runtime/control.cpp): 0 leaves it to the cost model (RequestCost::decode_degree); at most the
  /// request's latent rows.
  int32_t decode_degree = 0;
  /// Other ready requests that run these steps with it, in one batched transformer forward per step on the same
  /// ranks and layout (NOTE [batches] in src/runtime/control.cpp): each of the same shape (height, width, frames)
  /// and guidance as this one, none chosen twice; each keeps its own steps, sampler, seed and guidance. The
  /// decision's steps are capped by the member with the fewest left; at its end the members part.
  std::vector<uint64_t> batch;
  /// What it runs (NOTE [stages] in src/runtime/control.cpp). kDenoise: the request's next `num_steps` steps, after
  /// its encode when it has not started (once, on the first rank; the state then migrates to the others). kEncode:
  /// its encode alone, on the first of `ranks` (the state is then copied to the others), for a QUEUED request; it
  /// then waits there at step 0 for a decision of its steps. kDecode: its decode on `ranks` (the latent migrates
  /// there from a holder first), for a request whose steps are done; only a policy that places decodes
  /// (Policy::placesDecodes) sees such requests. Neither kEncode nor kDecode takes a batch.
  cost::Stage stage = cost::Stage::kDenoise;
};

/// The ready requests (waiting for a decision) kept in a policy's own order between scheduling points
/// (Policy::makeReadyOrder), so that a round reads the head of the order instead of sorting the whole queue.
/// The control plane owns it and tells it every change: a request is inserted when it starts waiting for a
/// decision, erased when it stops, and erased and inserted again whenever its record changes while it waits
/// (state, step, holders), before a policy runs. Only the policy that made it reads it (NOTE [ready order] in
/// src/runtime/control.cpp).
class ReadyOrder {
 public:
  virtual ~ReadyOrder() = default;
  /// `r` waits for a decision; the record stays valid until it is erased. Returns the handle that erases it (a
  /// request's entry is found by it, not by the record's fields, which may have changed by then).
  virtual size_t insert(const RequestRecord* r) = 0;
  /// Erases the request whose insert() returned `handle`: it no longer waits, or its record has changed.
  virtual void erase(size_t handle) = 0;
  /// Requests inserted and not erased.
  virtual size_t size() const = 0;
};

/// What a policy sees at a scheduling point. Pointers are valid during the call only.
struct SchedulerView {
  int64_t now_ns = 0;
  int world_size = 0;
  std::vector<int> free_ranks;  ///< alive ranks with no decision running
  /// Waiting for a decision, in arrival order: every such request when `order` is null (always so for a
  /// policy without Policy::makeReadyOrder, every Python policy among them); with `order`, only those it does
  /// not hold (the lookahead's request as it will be at its boundary: NOTE [lookahead] in src/runtime/control.cpp).
  std::vector<const RequestRecord*> ready;
  std::vector<const RequestRecord*> running;  ///< a decision of theirs is running
  std::vector<int> node_of;                   ///< node of each rank (topology)
  const cost::CostModel* cost = nullptr;      ///< predictions, when the control plane has a model
  double long_step_s = 0.1;                   ///< ControlConfig::long_step_s: such steps are not dispatched ahead
  /// The other ready requests, in the order the policy made (Policy::makeReadyOrder), or null. The policy may
  /// reorganise it while it reads it (keys that move with the clock), never change what it holds.
  ReadyOrder* order = nullptr;

  /// Requests waiting for a decision: `ready` and those `order` holds.
  size_t numReady() const { return ready.size() + (order != nullptr ? order->size() : 0); }
};

/// Decides, at each scheduling point, which ready requests run next and where. Pure: reads the view,
/// returns decisions; the control plane validates and applies them.
class Policy {
 public:
  virtual ~Policy() = default;
  /// Name as the engine accepts it ("fcfs", "static:2").
  virtual std::string name() const = 0;
  /// Decisions for some ready requests; each uses distinct ranks from view.free_ranks.
  virtual std::vector<Decision> schedule(const SchedulerView& view) = 0;
  /// The layouts it chooses from: RequestRecord::cost is predicted for these.
  virtual LayoutFamily layouts() const { return LayoutFamily::kAuto; }
  /// An empty order of ready requests for a control plane to keep for this policy (SchedulerView::order), or
  /// null (the default): every view then lists all ready requests in SchedulerView::ready. A policy that makes
  /// one reads it in schedule() whenever a view carries it.
  virtual std::unique_ptr<ReadyOrder> makeReadyOrder() const { return nullptr; }
  /// Whether it places decodes itself (Decision::stage kDecode): a request whose steps are done then waits for its
  /// decision (ready, with no steps left) instead of decoding on its holders at once (NOTE [parallel decode]).
  virtual bool placesDecodes() const { return false; }
};

/// How a built-in dynamic policy orders requests.
enum class PolicyOrder : int32_t {
  kArrival = 0,    ///< fcfs
  kRemaining = 1,  ///< srtf: shortest remaining trajectory time first, with aging
  kDeadline = 2,   ///< edf: earliest deadline first; requests that cannot make theirs last
  kPriority = 3,   ///< priority: strict classes (larger first), EDF inside a class
};

/// Options of the built-in dynamic policies (fcfs, srtf, edf, priority).
struct PolicyOptions {
  PolicyOrder order = PolicyOrder::kArrival;
  LayoutFamily layouts = LayoutFamily::kAuto;
  int32_t steps_per_decision = 2;  ///< steps before the next decision (NOTE [lookahead] asks again before they end)
  /// Spare ranks grow a group of d ranks to d' only when its step gets at least this much faster per doubling:
  /// step(d') <= step(d) x (1 - min_gain)^log2(d' / d) (NOTE [planning] in src/runtime/planning_policy.cpp).
  double min_gain = 0.1;
  /// srtf: a request waiting this many times its remaining time alone goes first (no starvation).
  double aging = 4.0;
  /// edf, priority: the degree a deadline needs is the smallest whose predicted remaining time, times this,
  /// fits before the deadline (predictions miss queueing and later preemption).
  double deadline_margin = 1.5;
  /// Most requests one batch steps together (NOTE [planning], 3b); 1: no batching. The cost model's memory
  /// limit (CostModel::maxBatch) caps it further.
  int32_t max_batch = 8;
  /// A request joins a batch only while each request's share of its step stays at least this much below a step
  /// alone, and no dearer than before: step(d, b + 1) / (b + 1) <= min(step(d, 1) x (1 - batch_gain), step(d, b) / b).
  double batch_gain = 0.05;
  /// Ranks the VAE decode splits over (Decision::decode_degree); 0: the cost model's fastest.
  int32_t decode_degree = 0;
  /// Disaggregated stages (NOTE [planning], 6): the last `aux_ranks` ranks run every encode and decode (one rank
  /// each), the others the denoising steps; 0: every rank runs every stage.
  int32_t aux_ranks = 0;
};

/// "static:D": ranks split into fixed groups of D (0..D-1, D..2D-1, ...); a request keeps the group it
/// got first for its whole life; the baseline of fixed-degree serving systems. With a cost model, requests
/// of one shape that find no free group join a batch on a group taken in the same round (its holders' batch, or
/// a new one), up to `max_batch` and the model's memory limit, as batching serving systems do at a fixed degree.
/// `order`: the queue's order, kArrival (fcfs), kRemaining (srtf: the remaining time at D ranks) or kDeadline (edf).
std::unique_ptr<Policy> makeStaticPolicy(int degree, int32_t max_batch = PolicyOptions().max_batch,
                                         PolicyOrder order = PolicyOrder::kArrival);
/// The built-in dynamic policies (NOTE [planning] in src/runtime/planning_policy.cpp): at every step
/// boundary, requests in the policy's order get a degree from the cost model and the load, the ranks that
/// hold their state where possible, and a layout for the topology; requests that do not fit wait (paused on
/// their holders).
std::unique_ptr<Policy> makePlanningPolicy(const PolicyOptions& options);
/// Parses a policy name: "fcfs", "srtf", "edf", "priority", "static:D", the dynamic ones optionally with
/// ":layout=auto|usp|swift|torus", ":decode=N" (the decode's degree; 0: the cost model's) and ":stages=split[=K]"
/// (encodes and decodes on the last K ranks, default 1), "static:D" with ":fcfs|srtf|edf" (its queue order), any of
/// them with ":batch=N" (N in [1, kMaxBatch]: the most requests one batch steps; 1 turns batching off); unknown
/// names list the built-in ones.
std::unique_ptr<Policy> makePolicy(const std::string& spec);
/// Names of the built-in policies ("static:D" stands for any degree).
std::vector<std::string> policyNames();

}  // namespace runtime
}  // namespace gfdit
