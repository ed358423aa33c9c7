// A request as the control plane knows it: its states and their names, what a caller submits, the record
// policies read (with the cost model's predictions for it), and what a caller gets back.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "gfdit/layout.h"
#include "gfdit/messages.h"
#include "gfdit/types.h"

namespace gfdit {
namespace runtime {

/// Where a request is. DENOISING carries the step in RequestRecord::step.
enum class RequestState : int32_t { kQueued, kEncoding, kDenoising, kDecoding, kDone, kFailed, kCancelled };

/// Name of a state ("QUEUED", ...).
const char* requestStateName(RequestState s);
/// Whether a state is final.
inline bool isFinished(RequestState s) {
  return s == RequestState::kDone || s == RequestState::kFailed || s == RequestState::kCancelled;
}

/// One time-stamped transition.
struct Transition {
  RequestState state;
  int32_t step;
  int64_t t_ns;
};

/// One task of a request as it ran: what, where, with which layout, when.
struct StageRecord {
  TaskKind kind = TaskKind::kEncode;
  std::vector<int> ranks;
  Layout layout;
  int32_t step_begin = 0;
  int32_t num_steps = 0;
  int64_t dispatch_ns = 0;
  int64_t start_ns = 0;  ///< earliest start over the members
  int64_t end_ns = 0;    ///< latest end over the members
  TaskError error = TaskError::kOk;
  bool regroup = false;  ///< a denoise task on another set of ranks than the request's previous one (NOTE [regroups])
  int32_t batch = 1;     ///< requests the task stepped in one batched forward (NOTE [batches]), this one included
  /// kDenoise: steps whose every pass reused the step cache, and the passes that did (NOTE [step caches])
  int32_t cached_steps = 0;
  int32_t cached_passes = 0;
};

/// What a caller submits.
struct RequestSpec {
  uint64_t id = 0;                 ///< 0: the control plane assigns one (a caller that needs ids first assigns its own)
  RequestShape shape;              ///< num_steps >= 1; tokens filled in by checkRequest
  int64_t arrival_ns = 0;          ///< 0: now
  int64_t deadline_ns = 0;         ///< absolute, on the control plane's clock; 0: none
  int32_t priority = 0;            ///< larger is more urgent
  int32_t max_degree = kMaxRanks;  ///< largest group the request may get (the engine: its world size)
  int32_t num_heads = 0;           ///< the model's attention heads (layouts without a cost model); 0: unknown
  std::string payload;             ///< opaque to the control plane: what encode tasks carry to the worker
  /// Requests submitted together as one job (the n images of one HTTP request; EngineLoop::submitGroup): the
  /// built-in policies run them as one batch where batching pays (NOTE [planning], 3a). 0: none.
  uint64_t group = 0;
};

/// The cost model's predictions for one request, for every group degree 1 .. kMaxRanks, filled in by the
/// control plane at submit when it has a cost model (predictCosts in gfdit/planning.h). Groups are assumed
/// placed as compactly as the topology allows (ceil(degree / ranks per node) nodes).
struct RequestCost {
  bool known = false;   ///< false: no cost model; policies fall back to shape-only rules
  double encode_s = 0;  ///< text encoder, once, on the first group
  double decode_s = 0;  ///< VAE decode, on one rank
  /// decode_at[d]: the VAE decode split over d ranks; infinity where not predicted or past the latent's rows
  /// ([0] is unused; [1] is decode_s).
  std::array<double, kMaxRanks + 1> decode_at{};
  int32_t decode_degree = 1;  ///< decodeDegree(kMaxRanks): the fastest predicted decode on any number of ranks
  double migrate_s = 0;       ///< state hand-off to one new member
  int32_t max_ulysses = 1;    ///< the largest Ulysses degree: the model's heads (at most kMaxRanks)
  /// step_s[d]: one denoising step on d ranks with layout[d], the mean over the request's steps of what its step
  /// cache is expected to leave of them (NOTE [step caches]; a full step without one); infinity where the degree
  /// was not predicted (past the request's or the world's largest degree) or no layout of it can run ([0] is
  /// unused).
  std::array<double, kMaxRanks + 1> step_s{};
  std::array<Layout, kMaxRanks + 1> layout{};
  /// full_step_s[d]: a step that computes every block; cached_step_s[d]: a step whose passes all reuse the cache
  /// (the full step without a cache).
  std::array<double, kMaxRanks + 1> full_step_s{};
  std::array<double, kMaxRanks + 1> cached_step_s{};
  CacheSpec cache;        ///< the request's step cache
  int32_t num_steps = 0;  ///< the request's steps (which of them may reuse the cache)
  double cache_share =
      0;  ///< expected share of the steps past the warm-up that reuse it (cachedShare in gfdit/step_cache.h)

  /// Seconds of one step on a group of `degree` ranks (any degree), the mean over the request's steps;
  /// infinity where not predicted.
  double stepSeconds(int degree) const;
  /// Seconds of steps [from, from + count) on `degree` ranks: those that always run in full (warm-up, teacache's
  /// last) at the full step's time, the others at the expected mix of full and cached; infinity where not
  /// predicted.
  double stepsSeconds(int degree, int32_t from, int32_t count) const;
  /// The layout predictions assume for `degree` ranks.
  const Layout& layoutFor(int degree) const;
  /// Seconds of the decode on `degree` ranks; decode_s where that degree was not predicted.
  double decodeSeconds(int degree) const;
  /// The degree in [1, at_most] of the fastest predicted decode (the smallest among equals): the rule of
  /// cost::bestDecodeDegree, on the predictions made once at submit.
  int32_t decodeDegree(int at_most) const;
};

/// What the control plane knows of a request; what policies see.
struct RequestRecord {
  uint64_t id = 0;
  RequestState state = RequestState::kQueued;
  int32_t step = 0;       ///< denoising steps completed
  int32_t num_steps = 0;  ///< total denoising steps
  int64_t arrival_ns = 0;
  int64_t deadline_ns = 0;  ///< 0: none
  int32_t priority = 0;
  RequestShape shape;
  int32_t max_degree = kMaxRanks;
  int32_t num_heads = 0;   ///< the model's attention heads, when the submitter said (0: unknown)
  std::vector<int> ranks;  ///< the ranks holding the request's state after its last completed step
  Layout layout;           ///< the layout of its current or last decision
  bool busy = false;       ///< a decision of it is running (its group's ranks are occupied)
  int32_t steps_in_flight = 0;
  int32_t attempts = 0;         ///< recoveries it went through
  int64_t decision_end_ns = 0;  ///< busy: predicted end of its running decision (0: unknown)
  /// busy: the request whose decision it runs in (its own id when it leads one; NOTE [batches] in
  /// src/runtime/control.cpp), and how many requests that decision steps together; 0 and 1 when not busy.
  uint64_t batch_leader = 0;
  int32_t batch_size = 1;
  uint64_t group = 0;  ///< RequestSpec::group: submitted together with the other requests of this group (0: none)
  RequestCost cost;    ///< predictions (cost.known is false without a cost model)
  std::string reason;  ///< FAILED / CANCELLED
  std::vector<Transition> transitions;

  int32_t stepsLeft() const { return num_steps - step; }
  /// Predicted seconds from now to its end on `degree` ranks: encode when it has not started, the steps left,
  /// decode (0 without a cost model).
  double remainingSeconds(int degree) const;
};

/// The result of a finished request, handed to the finished-callback once, when it ends.
struct RequestResult {
  uint64_t id = 0;
  RequestState state = RequestState::kQueued;
  std::string reason;
  std::vector<StageRecord> stages;
  std::vector<Transition> transitions;
  OutputRef output;  ///< DONE: where the worker left the output
  int64_t arrival_ns = 0;
  int64_t deadline_ns = 0;
  int32_t priority = 0;
};

/// A request's progress, for status queries.
struct RequestStatus {
  bool known = false;
  RequestState state = RequestState::kQueued;
  int32_t step = 0;
  int32_t num_steps = 0;
  std::vector<int> ranks;
};

/// A change of a request's progress, as the control plane tells it (ControlPlane::setProgressCallback): its
/// state, the steps done, and the ranks it runs on (a running decision's group) or is paused on (its holders).
struct RequestProgress {
  uint64_t id = 0;
  RequestState state = RequestState::kQueued;
  int32_t step = 0;
  int32_t num_steps = 0;
  bool running = false;  ///< a decision of it is running
  std::vector<int> ranks;
  int64_t t_ns = 0;  ///< when, on the control plane's clock
};

}  // namespace runtime
}  // namespace gfdit
