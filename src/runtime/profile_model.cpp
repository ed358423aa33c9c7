// The profiled cost model: stage times measured on the machine at hand (`gfdit profile`), interpolated.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "gfdit/cost.h"
#include "gfdit/error.h"

namespace gfdit {
namespace cost {

namespace {

// NOTE [profile interpolation]
// Entries are grouped by everything but the token count and the batch: (stage, degree, ulysses, ring, mode, cfg,
// guidance, num_new); a profile written before CFG-parallel existed reads as cfg 1, one written before batches as
// batch 1 (gfdit.planning.cost.load_profile). Within a group each measured batch has its curve in tokens. A
// denoise, decode or migrate query is answered piecewise linearly in tokens between the two nearest measured token
// counts of its batch's curve (exact at a measured point), and for a batch between two measured batches linearly
// in batch between their two answers; outside the measured tokens or batches, or for a group never measured, the
// query is refused: a profile says nothing about shapes it did not see, and a policy must not schedule on a guess it
// cannot tell from a measurement. Fallbacks, each for a quantity the time does not depend on:
// - kMigrate: a broadcast from one holder to num_new members, whatever layout the group runs later: the
//   entries with the nearest measured num_new (the same degree preferred among equals), either guidance.
// - kDecode depends on its degree (patch-parallel over the group, NOTE [decode by degree] in cost.cpp) but not on
//   the transformer's layout, so its entries are grouped by degree alone; guidance does not change a decode, so
//   either guidance's entries serve. A degree never measured is refused, as for a step.
// - kDenoise of a step that reuses a step cache (StageQuery::cached): the full step's answer times the share
//   `gfdit profile` measured for that kind (Profile::fbcache_step_ratio, teacache_step_ratio), or else
//   cachedStepFraction's share of the model's blocks. kGather: the cache's bytes at the per-byte rate of the
//   measured migration of the state to one new member.
// - kEncode does not depend on tokens: the mean of the entries of that degree and batch (same guidance
//   preferred), or of the nearest measured degree (every member encodes alone; only contention for cores
//   changes).
// Repeated measurements of one point are averaged.
using Key = std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, int32_t, bool, int32_t>;
constexpr int kKeyGuidance = 6;
constexpr int kKeyNumNew = 7;

Key keyOf(Stage stage, int32_t degree, int32_t ulysses, int32_t ring, LayoutMode mode, int32_t cfg, bool guidance,
          int32_t num_new) {
  if (stage == Stage::kDecode) return Key{static_cast<int32_t>(stage), degree, 1, 1, 0, 1, guidance, 0};
  return Key{static_cast<int32_t>(stage), degree, ulysses, ring, static_cast<int32_t>(mode), cfg, guidance, num_new};
}

using Curve = std::vector<std::pair<int64_t, double>>;  // (tokens, seconds), sorted, unique tokens
using Series = std::map<int32_t, Curve>;                // the curves of one group, by batch

class ProfiledCostModel : public CostModel {
 public:
  explicit ProfiledCostModel(const Profile& profile) : profile_(profile), model_(modelArch(profile.model)) {
    GFDIT_CHECK(!profile_.entries.empty()) << "profile of " << profile_.model << " has no entries";
    std::map<Key, std::map<int32_t, std::map<int64_t, std::pair<double, int>>>> acc;
    for (size_t i = 0; i < profile_.entries.size(); ++i) {
      const ProfileEntry& e = profile_.entries[i];
      GFDIT_CHECK(e.seconds > 0 && std::isfinite(e.seconds))
          << "profile entry " << i << ": seconds must be positive, got " << e.seconds;
      GFDIT_CHECK(e.tokens > 0) << "profile entry " << i << ": tokens must be positive, got " << e.tokens;
      GFDIT_CHECK(e.degree >= 1 && e.ulysses >= 1 && e.ring >= 1)
          << "profile entry " << i << ": degree, ulysses and ring must be >= 1";
      GFDIT_CHECK(e.cfg == 1 || e.cfg == 2) << "profile entry " << i << ": cfg must be 1 or 2, got " << e.cfg;
      GFDIT_CHECK(e.stage != Stage::kDenoise || e.ulysses * e.ring * e.cfg == e.degree)
          << "profile entry " << i << ": ulysses " << e.ulysses << " x ring " << e.ring
          << (e.cfg != 1 ? " x cfg " + std::to_string(e.cfg) : std::string()) << " != degree " << e.degree;
      GFDIT_CHECK(e.cfg == 1 || e.guidance) << "profile entry " << i << ": cfg 2 needs guidance";
      GFDIT_CHECK(e.num_new >= 0) << "profile entry " << i << ": num_new must be >= 0";
      GFDIT_CHECK(e.mode == LayoutMode::kUsp || e.mode == LayoutMode::kTorus)
          << "profile entry " << i << ": mode must be usp or torus, got " << static_cast<int32_t>(e.mode);
      GFDIT_CHECK(e.samples >= 0) << "profile entry " << i << ": samples must be >= 0, got " << e.samples;
      GFDIT_CHECK(e.batch >= 1) << "profile entry " << i << ": batch must be >= 1, got " << e.batch;
      auto& slot =
          acc[keyOf(e.stage, e.degree, e.ulysses, e.ring, e.mode, e.cfg, e.guidance, e.num_new)][e.batch][e.tokens];
      slot.first += e.seconds;
      slot.second += 1;
      if (e.stage == Stage::kDenoise) max_batch_ = std::max(max_batch_, e.batch);
    }
    for (const auto& [key, batches] : acc) {
      for (const auto& [batch, points] : batches) {
        Curve& c = series_[key][batch];
        for (const auto& [tokens, sum] : points) c.emplace_back(tokens, sum.first / sum.second);
      }
    }
  }

  double seconds(Stage stage, const StageQuery& q) const override {
    GFDIT_CHECK(q.batch >= 1) << "batch must be >= 1, got " << q.batch;
    const int64_t tokens =
        q.shape.tokens > 0 ? q.shape.tokens : model_.tokens(q.shape.height, q.shape.width, q.shape.num_frames);
    const bool g = q.shape.guidance();
    const Layout& l = q.layout;
    switch (stage) {
      case Stage::kEncode: return encode(q, tokens);
      case Stage::kDenoise: {
        const Series* s = find(keyOf(stage, q.degree, l.ulysses, l.ring, l.mode, l.cfg, g, 0));
        if (s == nullptr) refuseLayout(stage, q, tokens);
        const double full = inTokensAndBatch(*s, stage, q, tokens);
        if (q.cached == CacheKind::kNone) return full;
        // see NOTE [profile interpolation]: a step that reuses the cache, as a measured share of a full one
        const double measured =
            q.cached == CacheKind::kFbCache ? profile_.fbcache_step_ratio : profile_.teacache_step_ratio;
        return full * (measured > 0 ? measured : cachedStepFraction(model_, q.cached));
      }
      case Stage::kGather: {
        // see NOTE [profile interpolation]: the cache's bytes at the rate the state's migration was measured at
        const double cache = cacheBytes(model_, q.shape, 4);
        if (cache <= 0 || q.degree < 2) return 0.0;
        StageQuery m = q;
        m.num_new = 1;
        m.shape.cache = CacheSpec();
        const double per_byte = seconds(Stage::kMigrate, m) / stateBytes(model_, m.shape, 4);
        return per_byte * cache * (q.degree - 1) / q.degree;
      }
      case Stage::kDecode: {
        const Series* s = find(keyOf(stage, q.degree, 1, 1, LayoutMode::kUsp, 1, g, 0));
        if (s == nullptr) s = find(keyOf(stage, q.degree, 1, 1, LayoutMode::kUsp, 1, !g, 0));
        if (s == nullptr) refuseLayout(stage, q, tokens);
        return inTokensAndBatch(*s, stage, q, tokens);
      }
      case Stage::kMigrate: {
        if (q.num_new <= 0) return 0.0;  // nothing moves
        const Series* best = nullptr;
        std::tuple<int32_t, int32_t, int32_t> best_rank;
        for (const auto& [key, series] : series_) {
          if (std::get<0>(key) != static_cast<int32_t>(stage)) continue;
          auto rank = std::make_tuple(std::abs(std::get<kKeyNumNew>(key) - q.num_new),
                                      std::get<1>(key) == q.degree ? 0 : 1, std::get<kKeyGuidance>(key) == g ? 0 : 1);
          if (best == nullptr || rank < best_rank) {
            best = &series;
            best_rank = rank;
          }
        }
        if (best == nullptr) refuseLayout(stage, q, tokens);
        const double state = inTokensAndBatch(*best, stage, q, tokens);
        // a step cache travels with the state: its bytes at the rate the state's were measured at
        const double cache = cacheBytes(model_, q.shape, 4);
        return cache > 0 ? state * (1.0 + cache / stateBytes(model_, q.shape, 4)) : state;
      }
    }
    return 0.0;
  }

  std::string describe() const override {
    std::ostringstream os;
    os << "profile of " << profile_.model << " on " << profile_.hardware << " (world " << profile_.world_size << ", "
       << profile_.entries.size() << " entries)";
    return os.str();
  }

  const ModelArch& model() const override { return model_; }
  int32_t sharedCores() const override { return profile_.num_cores; }
  int32_t maxBatch(const StageQuery&) const override { return max_batch_; }  // the largest measured
  SkipCurve skipCurve(CacheKind kind) const override {
    for (const SkipCurve& c : profile_.skip_curves) {
      if (c.kind == kind && !c.empty()) return c;
    }
    return CostModel::skipCurve(kind);
  }

 private:
  const Series* find(const Key& key) const {
    auto it = series_.find(key);
    return it == series_.end() ? nullptr : &it->second;
  }

  std::string describeQuery(Stage stage, const StageQuery& q, int64_t tokens) const {
    std::ostringstream os;
    os << "profile of " << profile_.model << " on " << profile_.hardware << ": stage " << stageName(stage) << ", shape "
       << tokens << " tokens (" << q.shape.height << "x" << q.shape.width << "x" << q.shape.num_frames << "), degree "
       << q.degree;
    if (stage != Stage::kDecode) {
      os << " (ulysses " << q.layout.ulysses << " x ring " << q.layout.ring << (q.layout.cfg == 2 ? " x cfg 2" : "")
         << ", " << layoutModeName(q.layout.mode) << ", guidance " << (q.shape.guidance() ? "on" : "off");
      if (stage == Stage::kMigrate) os << ", num_new " << q.num_new;
      os << ")";
    }
    if (q.batch != 1) os << ", batch " << q.batch;
    return os.str();
  }

  [[noreturn]] void refuseLayout(Stage stage, const StageQuery& q, int64_t tokens) const {
    GFDIT_THROW(kInvalidUsage) << describeQuery(stage, q, tokens)
                               << ": this degree/layout was never measured; run `gfdit profile` for it";
    std::abort();  // unreachable: the builder throws
  }

  // The value at q.batch of `value_of` (a measured batch's answer): exact at a measured batch, linear between the
  // two nearest measured ones; other batches are refused.
  template <typename Batches>
  double inBatch(const Batches& by_batch, Stage stage, const StageQuery& q, int64_t tokens,
                 const std::function<double(const typename Batches::mapped_type&)>& value_of) const {
    auto hi = by_batch.lower_bound(q.batch);
    if (hi != by_batch.end() && hi->first == q.batch) return value_of(hi->second);
    if (hi == by_batch.begin() || hi == by_batch.end()) {
      std::ostringstream measured;
      for (auto it = by_batch.begin(); it != by_batch.end(); ++it) {
        measured << (it == by_batch.begin() ? "" : ", ") << it->first;
      }
      GFDIT_THROW(kInvalidUsage) << describeQuery(stage, q, tokens) << ": batch " << q.batch
                                 << " is outside the measured batches (" << measured.str()
                                 << "); profile that batch with `gfdit profile`";
    }
    auto lo = std::prev(hi);
    const double w = static_cast<double>(q.batch - lo->first) / static_cast<double>(hi->first - lo->first);
    const double at_lo = value_of(lo->second);
    return at_lo + w * (value_of(hi->second) - at_lo);
  }

  double inTokensAndBatch(const Series& s, Stage stage, const StageQuery& q, int64_t tokens) const {
    return inBatch(s, stage, q, tokens, [&](const Curve& c) { return interpolate(c, stage, q, tokens); });
  }

  double interpolate(const Curve& c, Stage stage, const StageQuery& q, int64_t tokens) const {
    if (tokens < c.front().first || tokens > c.back().first) {
      GFDIT_THROW(kInvalidUsage) << describeQuery(stage, q, tokens) << ": outside the measured range "
                                 << c.front().first << ".." << c.back().first
                                 << " tokens; profile larger/smaller shapes with `gfdit profile`";
    }
    auto hi = std::lower_bound(c.begin(), c.end(), tokens,
                               [](const std::pair<int64_t, double>& p, int64_t t) { return p.first < t; });
    if (hi->first == tokens) return hi->second;
    auto lo = hi - 1;
    const double w = static_cast<double>(tokens - lo->first) / static_cast<double>(hi->first - lo->first);
    return lo->second + w * (hi->second - lo->second);
  }

  double encode(const StageQuery& q, int64_t tokens) const {
    const bool g = q.shape.guidance();
    int32_t nearest = -1;
    for (const auto& [key, series] : series_) {
      if (std::get<0>(key) != static_cast<int32_t>(Stage::kEncode)) continue;
      int32_t d = std::get<1>(key);
      if (nearest < 0 || std::abs(d - q.degree) < std::abs(nearest - q.degree)) nearest = d;
    }
    for (bool same_guidance : {true, false}) {
      std::map<int32_t, std::pair<double, int>> by_batch;  // sum and count of the entries of each batch
      for (const auto& [key, series] : series_) {
        if (std::get<0>(key) != static_cast<int32_t>(Stage::kEncode) || std::get<1>(key) != nearest) continue;
        if (same_guidance && std::get<kKeyGuidance>(key) != g) continue;
        for (const auto& [batch, curve] : series) {
          for (const auto& point : curve) {
            by_batch[batch].first += point.second;
            by_batch[batch].second += 1;
          }
        }
      }
      if (!by_batch.empty()) {
        return inBatch(by_batch, Stage::kEncode, q, tokens,
                       [](const std::pair<double, int>& sum) { return sum.first / sum.second; });
      }
    }
    GFDIT_THROW(kInvalidUsage) << "profile of " << profile_.model << " on " << profile_.hardware
                               << ": stage encode was never measured; run `gfdit profile` for it";
    return 0.0;  // unreachable
  }

  Profile profile_;
  ModelArch model_;
  int32_t max_batch_ = 1;
  std::map<Key, Series> series_;
};

}  // namespace

std::shared_ptr<CostModel> makeProfiledCostModel(const Profile& profile) {
  return std::make_shared<ProfiledCostModel>(profile);
}

}  // namespace cost
}  // namespace gfdit
