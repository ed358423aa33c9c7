// Plain value types the runtime, the cost model and policies share: a step's parallel layout and a
// request's shape.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "gfdit/step_cache.h"

namespace gfdit {

/// How one transformer pass splits attention over its ulysses x ring members.
enum class LayoutMode : int32_t {
  kUsp = 0,    ///< USP: Ulysses all-to-all along one axis of the member grid, Ring along the other
  kTorus = 1,  ///< Torus: the same grid, the all-to-all chunked by heads and pipelined against the ring
};

/// Which axis of the ulysses x ring grid consecutive members of the group form.
enum class Placement : int32_t {
  kAuto = 0,        ///< from the topology: Ring on the axis inside a node, Ulysses across nodes
  kUlyssesLow = 1,  ///< Ulysses among consecutive members (member = ring_idx * ulysses + ulysses_idx)
  kRingLow = 2,     ///< Ring among consecutive members (member = ulysses_idx * ring + ring_idx)
};

/// Name of a mode ("usp", "torus"; "unknown" for a value outside the enum).
const char* layoutModeName(LayoutMode m);
/// The mode of a name as layoutModeName writes it; other names throw InvalidUsage listing the valid ones.
LayoutMode layoutModeFromName(const std::string& name);
/// Name of a placement ("auto", "ulysses-low", "ring-low"; "unknown" for a value outside the enum).
const char* placementName(Placement p);
/// The placement of a name as placementName writes it; other names throw InvalidUsage listing the valid ones.
Placement placementFromName(const std::string& name);

/// Parallel layout of a step: ulysses x ring per transformer pass, USP or Torus, and CFG-parallel.
///
/// cfg = 1: the guidance passes (conditional, unconditional) run one after the other on the whole group of
/// ulysses x ring ranks. cfg = 2 (CFG-parallel, a request with guidance only): the first half of the group
/// runs the conditional pass and the second half the unconditional one, each half with the ulysses x ring
/// layout, at once; one exchange of the two predictions between the halves combines them.
struct Layout {
  int32_t ulysses = 1;
  int32_t ring = 1;
  LayoutMode mode = LayoutMode::kUsp;
  Placement placement = Placement::kAuto;
  int32_t cfg = 1;  ///< 1 = the guidance passes in turn, 2 = CFG-parallel (one pass per half)

  /// Ranks the layout spans: ulysses x ring x cfg.
  int32_t degree() const { return ulysses * ring * cfg; }
  /// Ranks one transformer pass spans: ulysses x ring.
  int32_t passDegree() const { return ulysses * ring; }
  bool operator==(const Layout& o) const {
    return ulysses == o.ulysses && ring == o.ring && mode == o.mode && placement == o.placement && cfg == o.cfg;
  }
  bool operator!=(const Layout& o) const { return !(*this == o); }
};
// Layout travels byte for byte inside TaskDescriptor (gfdit/messages.h): five 32-bit fields, nothing else.
static_assert(sizeof(Layout) == 5 * sizeof(int32_t) && std::is_trivially_copyable<Layout>::value &&
                  std::is_standard_layout<Layout>::value,
              "Layout must stay plain data of five int32_t");

/// What a request asks for, as far as scheduling and cost are concerned.
struct RequestShape {
  int32_t height = 0;
  int32_t width = 0;
  int32_t num_frames = 1;
  int32_t num_steps = 0;
  double guidance_scale = 1.0;  ///< > 1: two transformer passes per step
  int64_t tokens = 0;           ///< image/video tokens the transformer sees (from the model's strides)
  /// Latent rows (height / the VAE's spatial stride): the most members a decode can split over (NOTE
  /// [patch-parallel decode] in gfdit.models.patch_decode); 0 where not known, and then a decode runs on one rank.
  int32_t latent_rows = 0;
  /// The step cache its steps use (NOTE [step caches] in gfdit/step_cache.h); off by default.
  CacheSpec cache;

  /// Whether a step runs the conditional and the unconditional pass.
  bool guidance() const { return guidance_scale > 1.0; }
};

}  // namespace gfdit
