// Step caches outside the model (NOTE [step caches] in gfdit/step_cache.h): the spec and its checks, the
// arithmetic of cached shares, the messages that carry them, their prices in the cost model, the control plane's
// gathers before a regroup, the counts that reach a request's timeline, and the simulator's draws.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "control_harness.h"
#include "gfdit/error.h"
#include "gfdit/planning.h"
#include "gfdit/simulator.h"
#include "gfdit/step_cache.h"

using namespace gfdit;
using namespace gfdit::runtime;
using gfdit::testing::errorOf;
using gfdit::testing::ScriptExecutor;

namespace {

// FixedCost with a step cache: a cached step costs a tenth of a full one, a pass reuses the cache with
// probability `p` at any threshold, a gather costs 5 ms.
class CachedCost : public gfdit::testing::FixedCost {
 public:
  explicit CachedCost(double p) : FixedCost(0.01, 0.16, 0.02, 0.001), p_(p) {}
  double seconds(cost::Stage stage, const cost::StageQuery& q) const override {
    if (stage == cost::Stage::kGather) return 0.005;
    const double s = FixedCost::seconds(stage, q);
    return stage == cost::Stage::kDenoise && q.cached != CacheKind::kNone ? s * 0.1 : s;
  }
  SkipCurve skipCurve(CacheKind kind) const override {
    SkipCurve c;
    c.kind = kind;
    c.points = {{1e-9, p_}};
    return c;
  }

 private:
  double p_;
};

RequestSpec cachedSpec(int steps, const std::string& cache, int h = 64) {
  RequestSpec s;
  s.shape.height = h;
  s.shape.width = 64;
  s.shape.num_frames = 1;
  s.shape.num_steps = steps;
  s.shape.cache = CacheSpec::parse(cache);
  checkRequest(s.shape, RequestLimits::of(gfdit::testing::testArch()));
  s.max_degree = 4;
  s.payload = "p";
  return s;
}

// Runs the ready request on the next rank set of `plan` (plain Ulysses, or cfg 2), one step per decision.
class Plan : public Policy {
 public:
  Plan(std::vector<std::vector<int>> plan, std::vector<int> cfg = {}) : plan_(std::move(plan)), cfg_(std::move(cfg)) {}
  std::string name() const override { return "plan"; }
  std::vector<Decision> schedule(const SchedulerView& v) override {
    std::vector<Decision> out;
    if (v.ready.empty() || i_ >= plan_.size()) return out;
    const std::vector<int>& ranks = plan_[i_];
    for (int w : ranks) {
      if (std::find(v.free_ranks.begin(), v.free_ranks.end(), w) == v.free_ranks.end()) return out;
    }
    Decision d;
    d.request_id = v.ready[0]->id;
    d.ranks = ranks;
    d.layout.cfg = i_ < cfg_.size() ? cfg_[i_] : 1;
    d.layout.ulysses = static_cast<int32_t>(ranks.size()) / d.layout.cfg;
    d.num_steps = 1;
    d.dispatch_ahead = false;
    ++i_;
    out.push_back(d);
    return out;
  }

 private:
  std::vector<std::vector<int>> plan_;
  std::vector<int> cfg_;
  size_t i_ = 0;
};

struct Plane {
  Plane(int world, std::shared_ptr<Policy> policy, std::shared_ptr<const cost::CostModel> cost = nullptr) {
    ControlConfig cfg;
    cfg.world_size = world;
    cfg.lookahead = false;
    cp = std::make_unique<ControlPlane>(cfg, clock, exec, std::move(policy), std::move(cost));
    cp->setFinishedCallback([this](RequestResult&& r) { results.push_back(std::move(r)); });
  }
  std::vector<const ScriptExecutor::Sent*> ofKind(TaskKind k) const {
    std::vector<const ScriptExecutor::Sent*> out;
    for (const auto& s : exec.sent) {
      if (static_cast<TaskKind>(s.d.kind) == k) out.push_back(&s);
    }
    return out;
  }
  /// Completes worker 0's tasks in order until `n` requests ended; `edit` may change each completion and give it a
  /// payload.
  void completeOnRank0(size_t n, const std::function<void(Completion&, std::string&)>& edit) {
    for (int round = 0; round < 50 && results.size() < n; ++round) {
      if (exec.queues[0].empty()) {
        cp->poll();
        continue;
      }
      const size_t i = exec.queues[0].front();
      exec.queues[0].pop_front();
      Completion c = exec.completionOf(i, 0);
      std::string payload;
      edit(c, payload);
      cp->onCompletion(c, payload);
      cp->poll();
    }
  }
  VirtualClock clock;
  ScriptExecutor exec;
  std::unique_ptr<ControlPlane> cp;
  std::vector<RequestResult> results;
};

}  // namespace

TEST(CacheSpec, ParsesTheKindItsThresholdAndOptionsWithTheKindsDefaults) {
  CacheSpec off = CacheSpec::parse("");
  EXPECT_FALSE(off.on());
  EXPECT_FALSE(CacheSpec::parse("none").on());
  CacheSpec fb = CacheSpec::parse("fbcache");
  EXPECT_EQ(fb, CacheSpec::defaults(CacheKind::kFbCache));
  EXPECT_DOUBLE_EQ(fb.threshold, 0.08);
  EXPECT_EQ(fb.warmup, 8);
  EXPECT_EQ(fb.max_skip, -1);
  CacheSpec tea = CacheSpec::parse(" teacache:0.1 , warmup=2,max_skip=3 ");
  EXPECT_EQ(tea.kind, CacheKind::kTeaCache);
  EXPECT_DOUBLE_EQ(tea.threshold, 0.1);
  EXPECT_EQ(tea.warmup, 2);
  EXPECT_EQ(tea.max_skip, 3);
  EXPECT_EQ(tea.str(), "teacache:0.1,warmup=2,max_skip=3");
  for (const char* text : {"fbcache:0.08,warmup=0,max_skip=0", "teacache:1e-05,warmup=3,max_skip=-1", "none"}) {
    EXPECT_EQ(CacheSpec::parse(CacheSpec::parse(text).str()), CacheSpec::parse(text)) << text;
  }
}

TEST(CacheSpec, BadTextIsRefusedNamingCache) {
  for (const char* text : {"blockcache", "fbcache:-0.1", "fbcache:nan", "fbcache:inf", "fbcache:11", "fbcache:x",
                           "fbcache,warmup=-1", "fbcache,max_skip=-2", "fbcache,warmup=1.5", "fbcache,depth=2",
                           "fbcache,warmup", "fbcache,", "none,warmup=2", "fbcache,warmup=99999999999"}) {
    Error e = errorOf([&] { CacheSpec::parse(text); });
    EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage) << text;
    EXPECT_EQ(e.param(), "cache") << text;
  }
  CacheSpec field_by_field;
  field_by_field.kind = CacheKind::kFbCache;
  field_by_field.threshold = std::nan("");
  EXPECT_EQ(errorOf([&] { field_by_field.check(); }).param(), "cache");
}

TEST(CacheSpec, WarmUpAndTeaCachesLastStepAlwaysRunInFull) {
  CacheSpec fb = CacheSpec::parse("fbcache,warmup=2");
  CacheSpec tea = CacheSpec::parse("teacache,warmup=1");
  std::vector<bool> fb_full, tea_full;
  for (int k = 0; k < 5; ++k) {
    fb_full.push_back(fb.alwaysFull(k, 5));
    tea_full.push_back(tea.alwaysFull(k, 5));
  }
  EXPECT_EQ(fb_full, (std::vector<bool>{true, true, false, false, false}));
  EXPECT_EQ(tea_full, (std::vector<bool>{true, false, false, false, true}));
  EXPECT_EQ(fb.eligibleSteps(0, 5, 5), 3);
  EXPECT_EQ(fb.eligibleSteps(1, 2, 5), 1);
  EXPECT_EQ(tea.eligibleSteps(0, 5, 5), 3);
  EXPECT_EQ(CacheSpec().eligibleSteps(0, 5, 5), 0);
}

TEST(CacheSpec, TheCachedShareIsTheLongRunShareOfACappedRun) {
  EXPECT_DOUBLE_EQ(cachedShare(0.0, -1), 0.0);
  EXPECT_DOUBLE_EQ(cachedShare(0.7, -1), 0.7);
  EXPECT_DOUBLE_EQ(cachedShare(0.7, 0), 0.0);
  EXPECT_DOUBLE_EQ(cachedShare(1.0, 1), 0.5);  // cached, full, cached, full, ...
  // against the process itself: independent draws with probability p, at most m in a row
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (double p : {0.3, 0.8, 0.95}) {
    for (int m : {1, 2, 3, 6}) {
      int run = 0;
      int64_t hits = 0;
      const int64_t n = 400000;
      for (int64_t i = 0; i < n; ++i) {
        const bool hit = run < m && u(rng) < p;
        run = hit ? run + 1 : 0;
        hits += hit;
      }
      EXPECT_NEAR(cachedShare(p, m), static_cast<double>(hits) / n, 0.005) << "p " << p << " m " << m;
    }
  }
}

TEST(CacheSpec, ASkipCurveIsLinearBetweenItsPointsFromZeroAndFlatPastTheLast) {
  SkipCurve c;
  c.points = {{0.1, 0.4}, {0.2, 0.8}};
  EXPECT_DOUBLE_EQ(c.at(0), 0);
  EXPECT_DOUBLE_EQ(c.at(0.05), 0.2);
  EXPECT_DOUBLE_EQ(c.at(0.1), 0.4);
  EXPECT_DOUBLE_EQ(c.at(0.15), 0.6);
  EXPECT_DOUBLE_EQ(c.at(1.0), 0.8);
  EXPECT_DOUBLE_EQ(SkipCurve().at(0.5), 0);
}

TEST(CacheMessages, TheCacheTravelsWithTheRequestTheHelloAndABatchsCompletion) {
  GenerationRequest q;
  q.prompt = "p";
  q.cache = CacheSpec::parse("teacache:0.12,warmup=3,max_skip=2");
  GenerationRequest back = GenerationRequest::decode(q.encode());
  EXPECT_EQ(back.cache, q.cache);
  EXPECT_FALSE(GenerationRequest::decode(GenerationRequest().encode()).cache.on());
  ModelInfo m;
  m.name = "tiny-wan";
  m.cache_kinds = cacheKindBit(CacheKind::kFbCache);
  EXPECT_EQ(ModelInfo::decode(m.encode()), m);
  BatchCacheCounts c;
  c.cached_steps = {1, 0};
  c.cached_passes = {2, 1};
  BatchCacheCounts c2 = BatchCacheCounts::decode(c.encode());
  EXPECT_EQ(c2.cached_steps, c.cached_steps);
  EXPECT_EQ(c2.cached_passes, c.cached_passes);
  EXPECT_EQ(errorOf([&] { BatchCacheCounts::decode(q.encode()); }).code(), ErrorCode::kInternal);
}

TEST(CacheChecks, AModelThatLacksTheKindOrAWarmUpPastTheStepLimitIsRefusedNamingCache) {
  RequestLimits lim = RequestLimits::of(gfdit::testing::testArch());
  lim.cache_kinds = 0;  // a model whose hello lists no cache
  GenerationRequest q;
  q.prompt = "p";
  q.cache = CacheSpec::parse("fbcache");
  ModelDefaults d;
  d.height = d.width = 64;
  d.num_steps = 4;
  Error e = errorOf([&] { checkRequest(q, lim, d); });
  EXPECT_EQ(e.param(), "cache");
  EXPECT_NE(e.message().find("implements no step cache"), std::string::npos) << e.message();
  lim.cache_kinds = cacheKindBit(CacheKind::kTeaCache);
  e = errorOf([&] { checkRequest(q, lim, d); });
  EXPECT_NE(e.message().find("implements teacache"), std::string::npos) << e.message();
  lim.cache_kinds = kAllCacheKinds;
  EXPECT_EQ(checkRequest(q, lim, d).cache, q.cache);
  q.cache.warmup = lim.max_steps + 1;
  EXPECT_EQ(errorOf([&] { checkRequest(q, lim, d); }).param(), "cache");
  q.cache.warmup = 0;
  q.cache.threshold = -1;  // a spec built field by field is checked too
  EXPECT_EQ(errorOf([&] { checkRequest(q, lim, d); }).param(), "cache");
  // a loaded model's hello says what it implements
  ModelInfo info;
  info.cache_kinds = cacheKindBit(CacheKind::kFbCache);
  EXPECT_EQ(RequestLimits::of(cost::modelArch("tiny-wan"), info).cache_kinds, info.cache_kinds);
  EXPECT_EQ(RequestLimits::of(cost::modelArch("tiny-wan")).cache_kinds, kAllCacheKinds);
}

TEST(CacheCost, ACachedStepRunsOneBlockOrNoneAndACacheAddsToMigrationsAndGathers) {
  auto m = cost::makeAnalyticCostModel(cost::modelArch("wan2.1-1.3b"), cost::cluster("h20x8"));
  cost::StageQuery q;
  q.shape.height = 480;
  q.shape.width = 832;
  q.shape.num_frames = 81;
  q.shape.num_steps = 50;
  q.shape.guidance_scale = 5;
  q.degree = 2;
  q.layout.ulysses = 2;
  const double full = m->seconds(cost::Stage::kDenoise, q);
  q.cached = CacheKind::kFbCache;
  const double fb = m->seconds(cost::Stage::kDenoise, q);
  q.cached = CacheKind::kTeaCache;
  const double tea = m->seconds(cost::Stage::kDenoise, q);
  EXPECT_LT(tea, fb);
  EXPECT_LT(fb, full / 10);  // 1 block of 30 and the decision
  EXPECT_GT(fb, full / 30);
  q.cached = CacheKind::kNone;
  q.num_new = 1;
  const double migrate = m->seconds(cost::Stage::kMigrate, q);
  EXPECT_EQ(m->seconds(cost::Stage::kGather, q), 0.0);  // no cache, nothing to gather
  q.shape.cache = CacheSpec::parse("fbcache");
  EXPECT_GT(m->seconds(cost::Stage::kMigrate, q), migrate);
  EXPECT_GT(m->seconds(cost::Stage::kGather, q), 0.0);
  // the whole cache: two passes x (the residual and the decision's reference) x tokens x hidden x bf16
  const double bytes = cost::cacheBytes(m->model(), q.shape, 2);
  EXPECT_DOUBLE_EQ(bytes, 2.0 * 2 * m->model().tokens(480, 832, 81) * m->model().hidden * 2);
  // published figures where they exist (NOTE [published skip rates]), none elsewhere
  auto qwen = cost::makeAnalyticCostModel(cost::modelArch("qwen-image"), cost::cluster("h20x8"));
  EXPECT_NEAR(qwen->skipRate(CacheKind::kFbCache, 0.12), 0.9, 1e-12);
  EXPECT_NEAR(qwen->skipRate(CacheKind::kFbCache, 0.06), 0.45, 1e-12);
  EXPECT_EQ(m->skipRate(CacheKind::kFbCache, 0.12), 0.0);
  EXPECT_EQ(qwen->skipRate(CacheKind::kTeaCache, 0.12), 0.0);
}

TEST(CacheCost, PredictionsAverageFullAndCachedStepsPastTheWarmUp) {
  CachedCost c(0.5);
  RequestShape shape = cachedSpec(10, "fbcache:0.1,warmup=2").shape;  // 8 eligible steps, share 0.5
  RequestCost rc = predictCosts(c, shape, 2, 8, LayoutFamily::kAuto);
  const double full = rc.full_step_s[1];
  const double cached = rc.cached_step_s[1];
  EXPECT_NEAR(cached, full * 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(rc.cache_share, 0.5);
  EXPECT_NEAR(rc.stepSeconds(1), full - (full - cached) * 0.5 * 8 / 10, 1e-12);
  EXPECT_NEAR(rc.stepsSeconds(1, 0, 10), 10 * rc.stepSeconds(1), 1e-12);
  EXPECT_NEAR(rc.stepsSeconds(1, 0, 2), 2 * full, 1e-12);  // the warm-up
  EXPECT_NEAR(rc.stepsSeconds(1, 2, 8), 8 * (full * 0.5 + cached * 0.5), 1e-12);
  // remaining time reads it: after the warm-up, the rest at the mix
  RequestRecord rec;
  rec.cost = rc;
  rec.num_steps = 10;
  rec.step = 2;
  rec.state = RequestState::kDenoising;
  EXPECT_NEAR(rec.remainingSeconds(1), 8 * (full * 0.5 + cached * 0.5) + rc.decodeSeconds(1), 1e-12);
  // without a cache nothing changes
  RequestCost plain = predictCosts(c, cachedSpec(10, "none").shape, 2, 8, LayoutFamily::kAuto);
  EXPECT_DOUBLE_EQ(plain.stepSeconds(1), plain.full_step_s[1]);
  EXPECT_DOUBLE_EQ(plain.cached_step_s[1], plain.full_step_s[1]);
}

TEST(CacheGathers, ARegroupOfACachedRequestGathersOnItsHoldersFirst) {
  // see NOTE [cache gathers]: steps on {0, 1}, then {1} (shrink), {1, 2} in another order ({2, 1}), then with
  // CFG-parallel on the same ranks, then {2, 1} again: a gather before each change, none before the last
  std::vector<std::vector<int>> plan = {{0, 1}, {1}, {2, 1}, {2, 1}, {2, 1}};
  Plane f(3, std::make_shared<Plan>(plan, std::vector<int>{1, 1, 1, 2, 2}));
  RequestSpec s = cachedSpec(5, "fbcache:0.1,warmup=0");
  s.shape.guidance_scale = 5;
  f.cp->submit(s);
  f.cp->poll();
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 1u);
  EXPECT_EQ(f.results[0].state, RequestState::kDone) << f.results[0].reason;
  std::vector<std::string> kinds;
  for (const auto& st : f.results[0].stages) kinds.push_back(taskKindName(st.kind));
  // {0, 1} -> {1}: a gather on {0, 1}; {1} -> {2, 1}: the one holder holds it whole, so none; CFG-parallel on
  // {2, 1}: a gather on {2, 1}; the same again: none
  // (a FREE leaves no stage in the timeline)
  EXPECT_EQ(kinds, (std::vector<std::string>{"encode", "migrate", "denoise", "gather", "denoise", "migrate", "denoise",
                                             "gather", "denoise", "denoise", "decode"}));
  auto gathers = f.ofKind(TaskKind::kGather);
  ASSERT_EQ(gathers.size(), 2u);
  EXPECT_EQ(gathers[0]->workers, (std::vector<int>{0, 1}));
  EXPECT_EQ(gathers[0]->d.step_begin, 1);
  EXPECT_EQ(gathers[1]->workers, (std::vector<int>{2, 1}));
  EXPECT_EQ(f.cp->stats().cache_gathers, 2u);
}

TEST(CacheGathers, NoGatherWithoutACacheOrBeforeTheFirstStep) {
  for (const char* cache : {"none", "fbcache"}) {
    Plane f(2, std::make_shared<Plan>(std::vector<std::vector<int>>{{0, 1}, {1}, {0, 1}}));
    f.cp->submit(cachedSpec(3, cache));
    f.cp->poll();
    f.exec.drain(*f.cp);
    ASSERT_EQ(f.results.size(), 1u);
    EXPECT_EQ(f.results[0].state, RequestState::kDone);
    EXPECT_EQ(f.ofKind(TaskKind::kGather).size(), std::string(cache) == "none" ? 0u : 1u) << cache;
  }
}

TEST(CacheCounts, EachRequestsTimelineSaysWhichOfItsStepsReusedTheCache) {
  Plane f(1, std::make_shared<Plan>(std::vector<std::vector<int>>{{0}, {0}, {0}}));
  f.cp->submit(cachedSpec(3, "fbcache,warmup=1"));
  f.cp->poll();
  // complete by hand: step 0 full, step 1 one pass of two cached (a partial step), step 2 fully cached
  std::vector<std::pair<int32_t, int32_t>> counts = {{0, 0}, {0, 1}, {1, 2}};
  size_t step = 0;
  f.completeOnRank0(1, [&](Completion& c, std::string&) {
    if (static_cast<TaskKind>(c.kind) == TaskKind::kDenoise) std::tie(c.cached_steps, c.cached_passes) = counts[step++];
  });
  ASSERT_EQ(f.results.size(), 1u);
  std::vector<std::pair<int32_t, int32_t>> seen;
  for (const auto& st : f.results[0].stages) {
    if (st.kind == TaskKind::kDenoise) seen.emplace_back(st.cached_steps, st.cached_passes);
  }
  EXPECT_EQ(seen, counts);
}

TEST(CacheCounts, ABatchsOtherRequestsGetTheirCountsFromItsCompletion) {
  class BatchBoth : public Policy {
   public:
    std::string name() const override { return "batch-both"; }
    std::vector<Decision> schedule(const SchedulerView& v) override {
      if (v.ready.size() < 2) return {};
      Decision d;
      d.request_id = v.ready[0]->id;
      d.ranks = {0};
      d.batch = {v.ready[1]->id};
      d.num_steps = 1;
      d.dispatch_ahead = false;
      return {d};
    }
  };
  Plane f(1, std::make_shared<BatchBoth>());
  const uint64_t a = f.cp->submit(cachedSpec(1, "fbcache,warmup=0"));
  const uint64_t b = f.cp->submit(cachedSpec(1, "fbcache,warmup=0"));
  f.cp->poll();
  f.completeOnRank0(2, [](Completion& c, std::string& payload) {
    if (static_cast<TaskKind>(c.kind) != TaskKind::kDenoise) return;
    c.cached_steps = 1;
    c.cached_passes = 1;
    BatchCacheCounts riders;
    riders.cached_steps = {0};
    riders.cached_passes = {0};
    payload = riders.encode();
  });
  ASSERT_EQ(f.results.size(), 2u);
  auto countsOf = [&](uint64_t id) {
    for (const auto& r : f.results) {
      if (r.id != id) continue;
      for (const auto& st : r.stages) {
        if (st.kind == TaskKind::kDenoise) return std::make_pair(st.cached_steps, st.cached_passes);
      }
    }
    return std::make_pair(-1, -1);
  };
  EXPECT_EQ(countsOf(a), std::make_pair(1, 1));
  EXPECT_EQ(countsOf(b), std::make_pair(0, 0));
}

TEST(CacheSimulation, CachedStepsAreDrawnFromTheSkipCurveAndShortenTheRequest) {
  auto run = [](double p, const std::string& cache, uint64_t seed) {
    auto cost = std::make_shared<CachedCost>(p);
    cost::Cluster cl;
    cl.name = "test";
    cl.num_ranks = 1;
    cl.ranks_per_node = 8;
    cl.hw.regroup_s = 0;
    SimOptions opt;
    opt.cache_seed = seed;
    Simulator sim(cost, cl, makePolicy("fcfs"), opt);
    std::vector<SimRequest> reqs;
    for (int i = 0; i < 4; ++i) {
      SimRequest r;
      r.id = i;
      r.arrival_s = 0;
      r.shape = cachedSpec(40, cache).shape;
      r.shape.guidance_scale = 5;
      reqs.push_back(r);
    }
    return sim.run(reqs);
  };
  SimResult none = run(0.9, "none", 1);
  SimResult all = run(1.0, "fbcache,warmup=4", 1);
  SimResult capped = run(1.0, "fbcache,warmup=4,max_skip=1", 1);
  SimResult some = run(0.5, "fbcache,warmup=4", 1);
  EXPECT_EQ(none.cache_passes, 0u);
  EXPECT_EQ(all.cache_passes, 4u * 40 * 2);
  EXPECT_EQ(all.cached_passes, 4u * 36 * 2);     // every pass past the warm-up
  EXPECT_EQ(capped.cached_passes, 4u * 18 * 2);  // one in two
  EXPECT_NEAR(static_cast<double>(some.cached_passes) / (4 * 36 * 2), 0.5, 0.1);
  EXPECT_LT(all.makespan_s, capped.makespan_s);
  EXPECT_LT(capped.makespan_s, none.makespan_s);
  // the draws are the seed's
  EXPECT_EQ(run(0.5, "fbcache,warmup=4", 1).cached_passes, some.cached_passes);
  EXPECT_DOUBLE_EQ(run(0.5, "fbcache,warmup=4", 1).makespan_s, some.makespan_s);
  EXPECT_NE(run(0.5, "fbcache,warmup=4", 2).cached_passes, some.cached_passes);
}
