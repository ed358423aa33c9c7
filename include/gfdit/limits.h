// What a request is checked against at submit: the model's strides and the serving limits. Bad input is
// refused here, naming the field, before anything of it runs.
#pragma once

#include <cstdint>

#include "gfdit/cost.h"
#include "gfdit/layout.h"
#include "gfdit/messages.h"

namespace gfdit {
namespace runtime {

/// What a request is checked against at submit: the model's strides and the serving limits.
struct RequestLimits {
  int32_t vae_stride_s = 8;     ///< spatial VAE compression
  int32_t patch_s = 2;          ///< spatial patch: height and width are multiples of vae_stride_s * patch_s
  int32_t temporal_stride = 4;  ///< video: num_frames = stride * k + 1
  int32_t patch_t = 1;
  bool is_video = false;  ///< image models take num_frames == 1 only
  int32_t max_steps = 1000;
  int64_t max_pixels = 2048 * 2048;
  int32_t max_frames = 1;
  int64_t max_tokens = 1 << 20;  ///< image/video tokens the transformer sees
  bool two_experts = false;      ///< a second expert's guidance (guidance_scale_2) applies
  /// The step caches the model implements (a set of cacheKindBit): every kind for a registered model (traces,
  /// the simulator), what its workers' hello says for a loaded one.
  uint32_t cache_kinds = 0;
  /// Limits of a known model (its registry entry).
  static RequestLimits of(const cost::ModelArch& arch);
  /// Limits of a loaded model: its registry entry's serving limits, with the strides the model itself
  /// reported in its workers' hello (they decide what it can patch).
  static RequestLimits of(const cost::ModelArch& arch, const ModelInfo& info);
  /// Image/video tokens of a request of this size.
  int64_t tokens(int32_t height, int32_t width, int32_t num_frames) const;
};

/// Checks a request's shape against `limits` and fills shape.tokens; throws InvalidUsage whose param() names
/// the field ("height", "width", "num_frames", "num_inference_steps", "guidance_scale", "cache").
void checkRequest(RequestShape& shape, const RequestLimits& limits);
/// Fills the unset fields of `request` with `defaults`, checks every field against `limits` (sizes, steps,
/// guidance, the deadline, and the prompts' bytes against kMaxPayloadBytes) and returns its shape, tokens
/// included. Throws InvalidUsage whose param() names the field; the one place a request's values are checked.
RequestShape checkRequest(GenerationRequest& request, const RequestLimits& limits, const ModelDefaults& defaults);

}  // namespace runtime
}  // namespace gfdit
