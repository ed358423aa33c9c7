// The built-in policies and the request checks at submit.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "gfdit/control.h"
#include "gfdit/error.h"

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

std::unique_ptr<Policy> makeFcfsPolicy(int steps_per_decision) {
  PolicyOptions o;
  o.steps_per_decision = steps_per_decision;
  return makePlanningPolicy(o);
}

std::vector<std::string> policyNames() { return {"fcfs", "srtf", "edf", "priority", "static:D"}; }

namespace {

[[noreturn]] void unknownPolicy(const std::string& spec, const std::string& why) {
  std::ostringstream os;
  os << "unknown policy '" << spec << "'" << why << "; built in:";
  for (const auto& n : policyNames()) os << " " << n;
  os << " (the dynamic ones take :layout=auto|usp|swift|torus)";
  throw Error(ErrorCode::kInvalidUsage, os.str());
}

}  // namespace

std::unique_ptr<Policy> makePolicy(const std::string& spec) {
  if (spec.rfind("static:", 0) == 0) {
    int d = 0;
    try {
      size_t used = 0;
      d = std::stoi(spec.substr(7), &used);
      if (used != spec.size() - 7) d = 0;
    } catch (...) {
      d = 0;
    }
    GFDIT_CHECK(d >= 1 && d <= kMaxRanks)
        << "policy '" << spec << "': the degree must be an integer in [1, " << kMaxRanks << "]";
    return makeStaticPolicy(d);
  }
  const size_t colon = spec.find(':');
  const std::string base = spec.substr(0, colon);
  PolicyOptions o;
  if (base == "fcfs") {
    o.order = PolicyOrder::kArrival;
  } else if (base == "srtf") {
    o.order = PolicyOrder::kRemaining;
  } else if (base == "edf") {
    o.order = PolicyOrder::kDeadline;
  } else if (base == "priority") {
    o.order = PolicyOrder::kPriority;
  } else {
    unknownPolicy(spec, "");
  }
  if (colon != std::string::npos) {
    const std::string opt = spec.substr(colon + 1);
    if (opt == "layout=auto") {
      o.layouts = LayoutFamily::kAuto;
    } else if (opt == "layout=usp") {
      o.layouts = LayoutFamily::kUsp;
    } else if (opt == "layout=swift") {
      o.layouts = LayoutFamily::kSwift;
    } else if (opt == "layout=torus") {
      o.layouts = LayoutFamily::kTorus;
    } else {
      unknownPolicy(spec, ": option '" + opt + "' is not layout=auto|usp|swift|torus");
    }
  }
  return makePlanningPolicy(o);
}

// ---- request checks ----

int maxUlyssesDegree(int heads) { return std::max(1, std::min(heads, kMaxRanks)); }

RequestLimits RequestLimits::of(const cost::ModelArch& arch) {
  RequestLimits l;
  l.vae_stride_s = arch.vae_stride_s;
  l.patch_s = arch.patch_s;
  l.temporal_stride = arch.vae_stride_t;
  l.patch_t = arch.patch_t;
  l.is_video = arch.is_video;
  if (arch.max_steps > 0) l.max_steps = arch.max_steps;
  if (arch.max_pixels > 0) l.max_pixels = arch.max_pixels;
  l.max_frames = arch.is_video ? std::max(1, arch.max_frames) : 1;
  if (arch.max_tokens > 0) l.max_tokens = arch.max_tokens;
  return l;
}

int64_t RequestLimits::tokens(int32_t height, int32_t width, int32_t num_frames) const {
  int64_t m = static_cast<int64_t>(vae_stride_s) * patch_s;
  int64_t latent_frames = is_video ? (num_frames - 1) / std::max(1, temporal_stride) + 1 : 1;
  return latent_frames / std::max(1, patch_t) * (height / m) * (width / m);
}

void checkRequest(RequestShape& s, const RequestLimits& limits) {
  GFDIT_CHECK(s.num_steps >= 1 && s.num_steps <= limits.max_steps)
      << "num_inference_steps " << s.num_steps << " is outside [1, " << limits.max_steps << "]";
  GFDIT_CHECK(s.height >= 1 && s.width >= 1) << "height and width must be positive, got " << s.height << "x" << s.width;
  int m = std::max(1, limits.vae_stride_s * limits.patch_s);
  GFDIT_CHECK(s.height % m == 0) << "height " << s.height << " is not a multiple of " << m << " (the model's stride)";
  GFDIT_CHECK(s.width % m == 0) << "width " << s.width << " is not a multiple of " << m << " (the model's stride)";
  GFDIT_CHECK(static_cast<int64_t>(s.height) * s.width <= limits.max_pixels)
      << "height x width " << s.height << "x" << s.width << " = " << static_cast<int64_t>(s.height) * s.width
      << " pixels exceeds the limit of " << limits.max_pixels;
  if (!limits.is_video) {
    GFDIT_CHECK(s.num_frames == 1) << "num_frames " << s.num_frames
                                   << ": this is an image model (num_frames must be 1)";
  } else {
    GFDIT_CHECK(s.num_frames >= 1 && s.num_frames <= limits.max_frames)
        << "num_frames " << s.num_frames << " is outside [1, " << limits.max_frames << "]";
    int t = std::max(1, limits.temporal_stride);
    GFDIT_CHECK((s.num_frames - 1) % t == 0)
        << "num_frames " << s.num_frames << " must be " << t << " * k + 1 (the model's temporal stride)";
  }
  GFDIT_CHECK(std::isfinite(s.guidance_scale) && s.guidance_scale >= 0 && s.guidance_scale <= 100)
      << "guidance_scale " << s.guidance_scale << " must be a finite number in [0, 100]";
  s.tokens = limits.tokens(s.height, s.width, s.num_frames);
  GFDIT_CHECK(s.tokens <= limits.max_tokens)
      << "the request has " << s.tokens << " tokens (height x width x num_frames), over the limit of "
      << limits.max_tokens;
}

}  // namespace runtime
}  // namespace gfdit
