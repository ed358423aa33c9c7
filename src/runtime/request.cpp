// Requests: the names of their states and what their predictions say (see gfdit/request.h).
#include <algorithm>
#include <cmath>
#include <limits>

#include "gfdit/request.h"

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

double RequestCost::stepSeconds(int degree) const {
  return degree >= 1 && degree <= kMaxRanks ? step_s[degree] : std::numeric_limits<double>::infinity();
}

double RequestCost::stepsSeconds(int degree, int32_t from, int32_t count) const {
  if (count <= 0) return 0;
  const double mean = stepSeconds(degree);
  if (!cache.on() || !std::isfinite(mean)) return count * mean;
  const double full = full_step_s[degree];
  const double cached = cached_step_s[degree];
  const int32_t eligible = cache.eligibleSteps(from, count, num_steps);
  return count * full - eligible * cache_share * (full - cached);
}

const Layout& RequestCost::layoutFor(int degree) const { return layout[std::min(std::max(1, degree), kMaxRanks)]; }

double RequestCost::decodeSeconds(int degree) const {
  const double s = degree >= 1 && degree <= kMaxRanks ? decode_at[degree] : 0;
  return std::isfinite(s) && s > 0 ? s : decode_s;
}

int32_t RequestCost::decodeDegree(int at_most) const {
  int32_t best = 1;
  for (int d = 2; d <= std::min(at_most, kMaxRanks); ++d) {
    if (std::isfinite(decode_at[d]) && decode_at[d] > 0 && decode_at[d] < decodeSeconds(best)) best = d;
  }
  return best;
}

double RequestRecord::remainingSeconds(int degree) const {
  if (!cost.known) return 0;
  // the decode splits over holders of the state, so over at most the steps' degree (ControlPlane::dispatchDecode)
  double s = cost.stepsSeconds(degree, step, stepsLeft()) + cost.decodeSeconds(cost.decodeDegree(degree));
  if (state == RequestState::kQueued) s += cost.encode_s;
  return s;
}

}  // namespace runtime
}  // namespace gfdit
