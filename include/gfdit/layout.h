// Plain value types the runtime, the cost model and policies share: a step's parallel layout and a
// request's shape.
#pragma once

#include <cstdint>

namespace gfdit {

/// Parallel layout of a step: ulysses x ring per transformer pass, USP or Torus, and CFG-parallel.
///
/// cfg = 1: the guidance passes (conditional, unconditional) run one after the other on the whole group of
/// ulysses x ring ranks. cfg = 2 (CFG-parallel, a request with guidance only): the first half of the group
/// runs the conditional pass and the second half the unconditional one, each half with the ulysses x ring
/// layout, at once; one exchange of the two predictions between the halves combines them.
struct Layout {
  int32_t ulysses = 1;
  int32_t ring = 1;
  int32_t mode = 0;       ///< 0 = usp, 1 = torus
  int32_t placement = 0;  ///< 0 = auto, 1 = ulysses-low, 2 = ring-low
  int32_t cfg = 1;        ///< 1 = the guidance passes in turn, 2 = CFG-parallel (one pass per half)

  /// Ranks the layout spans: ulysses x ring x cfg.
  int32_t degree() const { return ulysses * ring * cfg; }
  /// Ranks one transformer pass spans: ulysses x ring.
  int32_t passDegree() const { return ulysses * ring; }
  bool operator==(const Layout& o) const {
    return ulysses == o.ulysses && ring == o.ring && mode == o.mode && placement == o.placement && cfg == o.cfg;
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
