// Step caches: which one a request asks for (CacheSpec, parsed and checked once, at submit), and what the
// cost model, the policies and the simulator know of it (which steps may reuse the cache, how often they do).
//
// NOTE [step caches]
// A step cache skips most of a transformer pass when the pass's input changed little since the pass was last
// computed in full, reusing the residual of the blocks it skips (the algorithms: NOTE [step cache algorithms]
// in python/gfdit/models/cache.py). In gfdit the cache is part of the request's denoise state, sharded like the
// hidden states over the members of each pass, and it moves with the state:
// - each pass (conditional, unconditional) keeps its own cache and makes its own decision, one value agreed by
//   every member of the pass (an all-reduce of the change metric);
// - when a request's next steps run on other ranks, in another order or with another CFG split, the control
//   plane first sends its holders a GATHER task (NOTE [cache gathers] in src/runtime/control.cpp), which leaves
//   the whole cache with each of them, so a migration carries it and the new group slices its shards from it;
// - the first `warmup` steps always run in full, and so does teacache's last step; a pass reuses the cache at
//   most `max_skip` steps in a row (-1: no limit).
// The cost model prices a step whose passes reuse the cache (StageQuery::cached), says how often a pass past
// its warm-up does (CostModel::skipRate, from a profile measured by `gfdit profile` or the figures published
// for a reference model), and each request's predictions average the two over its steps (RequestCost in
// gfdit/request.h), which is what the policies' remaining-time and deadline arithmetic reads.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gfdit {

/// Which step cache a request uses.
enum class CacheKind : int32_t {
  kNone = 0,      ///< every step computes every block
  kFbCache = 1,   ///< first-block cache (cache-dit's DBCache with Fn = 1, Bn = 0): block 0 decides, the rest is reused
  kTeaCache = 2,  ///< TeaCache: the first block's timestep-modulated input decides, all blocks are reused
};

/// Name of a cache kind ("none", "fbcache", "teacache").
const char* cacheKindName(CacheKind k);
/// The kind of a name as cacheKindName writes it; another name throws InvalidUsage naming "cache".
CacheKind cacheKindFromName(const std::string& name);
/// The bit of `k` in a set of kinds (ModelInfo::cache_kinds).
inline uint32_t cacheKindBit(CacheKind k) { return uint32_t{1} << static_cast<int32_t>(k); }
/// Every kind gfdit implements, as a set.
constexpr uint32_t kAllCacheKinds = (uint32_t{1} << 1) | (uint32_t{1} << 2);

/// The largest threshold a request may give: past it every pass past its warm-up would reuse the cache.
constexpr double kMaxCacheThreshold = 10.0;

/// A request's step cache and its settings: `kind[:threshold][,warmup=N][,max_skip=M]` as text.
struct CacheSpec {
  CacheKind kind = CacheKind::kNone;
  double threshold = 0;   ///< a pass reuses the cache while its change metric stays below this
  int32_t warmup = 0;     ///< the first `warmup` steps always run in full
  int32_t max_skip = -1;  ///< at most this many steps in a row reuse the cache (-1: no limit)

  bool on() const { return kind != CacheKind::kNone; }
  /// The published defaults of a kind: fbcache 0.08, warm-up 8 (cache-dit's DBCacheConfig); teacache 0.08,
  /// warm-up 1 (TeaCache4Wan2.1); no limit on consecutive cached steps.
  static CacheSpec defaults(CacheKind kind);
  /// Reads `kind[:threshold][,warmup=N][,max_skip=M]` ("" or "none": no cache; unset fields: the kind's
  /// defaults). Throws InvalidUsage naming "cache" for an unknown kind or option, a malformed number, a
  /// threshold that is negative, not finite or above kMaxCacheThreshold, a negative warm-up, or a max_skip
  /// below -1. Ranges that depend on the model (warm-up past its step limit) are checkRequest's.
  static CacheSpec parse(const std::string& text);
  /// Throws InvalidUsage naming "cache" for values parse() refuses (a spec built field by field).
  void check() const;
  /// The canonical text parse() reads back to this spec ("none" when off).
  std::string str() const;
  /// Whether step `step` of `num_steps` always runs in full: warm-up, and teacache's last step.
  bool alwaysFull(int32_t step, int32_t num_steps) const;
  /// Steps of `num_steps` in [from, from + count) that may reuse the cache.
  int32_t eligibleSteps(int32_t from, int32_t count, int32_t num_steps) const;
  bool operator==(const CacheSpec& o) const {
    return kind == o.kind && threshold == o.threshold && warmup == o.warmup && max_skip == o.max_skip;
  }
  bool operator!=(const CacheSpec& o) const { return !(*this == o); }
};

/// The long-run share of a pass's eligible steps that reuse the cache when each does with probability `p`
/// (independently), at most `max_skip` in a row (-1: no limit): a run of cached steps ends at a full step
/// or at the limit, so the share is S / (S + 1) with S = p + p^2 + ... + p^max_skip.
double cachedShare(double p, int32_t max_skip);

/// How often a pass past its warm-up reuses a cache, by threshold: points (threshold, probability) sorted by
/// threshold, linear between them, 0 at threshold 0, flat past the last point.
struct SkipCurve {
  CacheKind kind = CacheKind::kNone;
  std::vector<std::pair<double, double>> points;
  std::string source;  ///< where the points come from ("measured on ...", a publication)

  bool empty() const { return points.empty(); }
  /// The probability at `threshold` (0 for an empty curve).
  double at(double threshold) const;
};

}  // namespace gfdit
