// Plain value types the runtime, the cost model and policies share: a step's parallel layout and a
// request's shape.
#pragma once

#include <cstdint>

namespace gfdit {

/// Parallel layout of a step: ulysses x ring over the group, USP or Torus.
struct Layout {
  int32_t ulysses = 1;
  int32_t ring = 1;
  int32_t mode = 0;       ///< 0 = usp, 1 = torus
  int32_t placement = 0;  ///< 0 = auto, 1 = ulysses-low, 2 = ring-low

  /// Ranks the layout spans.
  int32_t degree() const { return ulysses * ring; }
  bool operator==(const Layout& o) const {
    return ulysses == o.ulysses && ring == o.ring && mode == o.mode && placement == o.placement;
  }
  bool operator!=(const Layout& o) const { return !(*this == o); }
};

/// What a request asks for, as far as scheduling and cost are concerned.
struct RequestShape {
  int32_t height = 0;
  int32_t width = 0;
  int32_t num_frames = 1;
  int32_t num_steps = 0;
  double guidance_scale = 1.0;  ///< > 1: two transformer passes per step
  int64_t tokens = 0;           ///< image/video tokens the transformer sees (from the model's strides)

  /// Whether a step runs the conditional and the unconditional pass.
  bool guidance() const { return guidance_scale > 1.0; }
};

}  // namespace gfdit
