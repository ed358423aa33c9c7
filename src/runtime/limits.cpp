// The request checks at submit (see gfdit/limits.h).
#include <algorithm>
#include <cmath>
#include <string>

#include "gfdit/error.h"
#include "gfdit/limits.h"

namespace gfdit {
namespace runtime {
namespace {

constexpr double kMaxGuidance = 100;  // a guidance scale beyond this is a typo, not a request

std::string cacheKindsText(uint32_t kinds) {
  std::string out;
  for (CacheKind k : {CacheKind::kFbCache, CacheKind::kTeaCache}) {
    if ((kinds & cacheKindBit(k)) == 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(cacheKindName(k));
  }
  return out.empty() ? "none" : out;
}

}  // namespace

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
  l.two_experts = arch.num_experts > 1;
  l.cache_kinds = kAllCacheKinds;  // a loaded model's hello narrows it (of(arch, info))
  return l;
}

RequestLimits RequestLimits::of(const cost::ModelArch& arch, const ModelInfo& info) {
  RequestLimits l = of(arch);
  l.vae_stride_s = info.vae_stride_s;
  l.patch_s = info.patch_s;
  l.temporal_stride = info.vae_stride_t;
  l.patch_t = info.patch_t;
  l.is_video = info.is_video;
  l.two_experts = info.two_experts;
  l.cache_kinds = info.cache_kinds;
  if (!l.is_video) l.max_frames = 1;
  return l;
}

int64_t RequestLimits::tokens(int32_t height, int32_t width, int32_t num_frames) const {
  int64_t m = static_cast<int64_t>(vae_stride_s) * patch_s;
  int64_t latent_frames = is_video ? (num_frames - 1) / std::max(1, temporal_stride) + 1 : 1;
  return latent_frames / std::max(1, patch_t) * (height / m) * (width / m);
}

void checkRequest(RequestShape& s, const RequestLimits& limits) {
  GFDIT_CHECK(s.num_steps >= 1 && s.num_steps <= limits.max_steps).param("num_inference_steps")
      << "num_inference_steps " << s.num_steps << " is outside [1, " << limits.max_steps << "]";
  GFDIT_CHECK(s.height >= 1).param("height") << "height must be positive, got " << s.height;
  GFDIT_CHECK(s.width >= 1).param("width") << "width must be positive, got " << s.width;
  int m = std::max(1, limits.vae_stride_s * limits.patch_s);
  GFDIT_CHECK(s.height % m == 0).param("height")
      << "height " << s.height << " is not a multiple of " << m << " (the model's stride)";
  GFDIT_CHECK(s.width % m == 0).param("width")
      << "width " << s.width << " is not a multiple of " << m << " (the model's stride)";
  GFDIT_CHECK(static_cast<int64_t>(s.height) * s.width <= limits.max_pixels).param("height")
      << "height x width " << s.height << "x" << s.width << " = " << static_cast<int64_t>(s.height) * s.width
      << " pixels exceeds the limit of " << limits.max_pixels;
  if (!limits.is_video) {
    GFDIT_CHECK(s.num_frames == 1).param("num_frames")
        << "num_frames " << s.num_frames << ": this is an image model (num_frames must be 1)";
  } else {
    GFDIT_CHECK(s.num_frames >= 1 && s.num_frames <= limits.max_frames).param("num_frames")
        << "num_frames " << s.num_frames << " is outside [1, " << limits.max_frames << "]";
    int t = std::max(1, limits.temporal_stride);
    GFDIT_CHECK((s.num_frames - 1) % t == 0).param("num_frames")
        << "num_frames " << s.num_frames << " must be " << t << " * k + 1 (the model's temporal stride)";
  }
  GFDIT_CHECK(std::isfinite(s.guidance_scale) && s.guidance_scale >= 0 && s.guidance_scale <= kMaxGuidance)
          .param("guidance_scale")
      << "guidance_scale " << s.guidance_scale << " must be a finite number in [0, " << kMaxGuidance << "]";
  s.cache.check();
  if (s.cache.on()) {  // what depends on the model
    GFDIT_CHECK((limits.cache_kinds & cacheKindBit(s.cache.kind)) != 0).param("cache")
        << "cache " << cacheKindName(s.cache.kind) << ": "
        << (limits.cache_kinds == 0 ? std::string("this model implements no step cache")
                                    : std::string("this model implements ") + cacheKindsText(limits.cache_kinds));
    GFDIT_CHECK(s.cache.warmup <= limits.max_steps).param("cache")
        << "cache: warmup " << s.cache.warmup << " is outside [0, " << limits.max_steps << "] steps";
    GFDIT_CHECK(s.cache.max_skip <= limits.max_steps).param("cache")
        << "cache: max_skip " << s.cache.max_skip << " is outside [-1, " << limits.max_steps << "] steps";
  }
  s.tokens = limits.tokens(s.height, s.width, s.num_frames);
  s.latent_rows = s.height / std::max(1, limits.vae_stride_s);
  GFDIT_CHECK(s.tokens <= limits.max_tokens).param("height")
      << "the request has " << s.tokens << " tokens (height x width x num_frames), over the limit of "
      << limits.max_tokens;
}

RequestShape checkRequest(GenerationRequest& q, const RequestLimits& limits, const ModelDefaults& d) {
  if (!q.height) q.height = d.height;
  if (!q.width) q.width = d.width;
  if (!q.num_frames) q.num_frames = d.num_frames;
  if (!q.num_inference_steps) q.num_inference_steps = d.num_steps;
  if (!q.guidance_scale) q.guidance_scale = d.guidance_scale;
  RequestShape s;
  s.height = *q.height;
  s.width = *q.width;
  s.num_frames = *q.num_frames;
  s.num_steps = *q.num_inference_steps;
  s.guidance_scale = *q.guidance_scale;
  s.cache = q.cache;
  checkRequest(s, limits);
  if (q.guidance_scale_2) {
    double g2 = *q.guidance_scale_2;
    GFDIT_CHECK(std::isfinite(g2) && g2 >= 0 && g2 <= kMaxGuidance).param("guidance_scale_2")
        << "guidance_scale_2 " << g2 << " must be a finite number in [0, " << kMaxGuidance << "]";
    GFDIT_CHECK(limits.two_experts).param("guidance_scale_2")
        << "guidance_scale_2 is the guidance of a second expert's steps (Wan 2.2 A14B's transformer_2); this model "
           "has one expert";
  }
  if (q.deadline_s) {
    GFDIT_CHECK(std::isfinite(*q.deadline_s) && *q.deadline_s > 0).param("deadline_s")
        << "deadline_s must be a positive number of seconds, got " << *q.deadline_s;
  }
  // The prompts travel in the encode task's payload: refuse what does not fit, naming the longer one.
  size_t bytes = q.encode().size();
  size_t negative = q.negative_prompt ? q.negative_prompt->size() : 0;
  GFDIT_CHECK(bytes <= kMaxPayloadBytes).param(q.prompt.size() >= negative ? "prompt" : "negative_prompt")
      << "prompt and negative_prompt take " << bytes << " bytes as a request message; at most " << kMaxPayloadBytes;
  return s;
}

}  // namespace runtime
}  // namespace gfdit
