// Requests: the names of their states and what their predictions say (see gfdit/request.h).
#include <algorithm>
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

const Layout& RequestCost::layoutFor(int degree) const { return layout[std::min(std::max(1, degree), kMaxRanks)]; }

double RequestRecord::remainingSeconds(int degree) const {
  if (!cost.known) return 0;
  double s = stepsLeft() * cost.stepSeconds(degree) + cost.decode_s;
  if (state == RequestState::kQueued) s += cost.encode_s;
  return s;
}

}  // namespace runtime
}  // namespace gfdit
