// Tests of the cost model: the registries, the analytic model's shape (monotonic, CFG, scaling, topology)
// and the profiled model's interpolation and refusals.
#include <gtest/gtest.h>

#include <string>

#include "gfdit/cost.h"
#include "gfdit/error.h"

namespace gfdit {
namespace cost {
namespace {

StageQuery query(const ModelArch& m, int32_t h, int32_t w, int32_t f, int32_t u = 1, int32_t r = 1,
                 double guidance = 1.0, int32_t num_nodes = 1) {
  StageQuery q;
  q.shape.height = h;
  q.shape.width = w;
  q.shape.num_frames = f;
  q.shape.num_steps = m.default_steps;
  q.shape.guidance_scale = guidance;
  q.shape.tokens = m.tokens(h, w, f);
  q.degree = u * r;
  q.layout.ulysses = u;
  q.layout.ring = r;
  q.num_nodes = num_nodes;
  return q;
}

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage);
    return e.what();
  }
  ADD_FAILURE() << "no gfdit::Error thrown";
  return "";
}

TEST(CostRegistry, TokensFollowStridesAndPatches) {
  const ModelArch& q = modelArch("qwen-image");
  EXPECT_EQ(q.tokens(1024, 1024, 1), 4096);
  EXPECT_EQ(q.spatialMultiple(), 16);
  const ModelArch& w = modelArch("wan2.2");
  EXPECT_EQ(w.tokens(720, 1280, 81), 21 * 45 * 80);  // docs/architecture.md, The cost model: 75,600
  EXPECT_EQ(modelArch("wan2.2-5b").tokens(704, 1280, 121), 31 * 22 * 40);
  EXPECT_EQ(modelArch("tiny-wan").tokens(32, 48, 9), 3 * 2 * 3);
  EXPECT_EQ(modelArch("tiny-qwen-image").tokens(48, 80, 1), 15);
  for (const std::string& name : modelNames()) {
    const ModelArch& m = modelArch(name);
    EXPECT_EQ(m.hidden, m.heads * m.head_dim) << name;
    EXPECT_GT(m.max_tokens, m.tokens(m.default_height, m.default_width, m.default_frames)) << name;
    EXPECT_LE(static_cast<int64_t>(m.default_height) * m.default_width, m.max_pixels) << name;
  }
}

TEST(CostRegistry, UnknownNamesListValidOnes) {
  std::string msg = errorOf([] { modelArch("sdxl"); });
  EXPECT_NE(msg.find("sdxl"), std::string::npos);
  EXPECT_NE(msg.find("qwen-image"), std::string::npos);
  EXPECT_NE(msg.find("tiny-wan"), std::string::npos);
  msg = errorOf([] { hardware("b200"); });
  EXPECT_NE(msg.find("h20"), std::string::npos);
  EXPECT_NE(msg.find("cpu"), std::string::npos);
  msg = errorOf([] { cluster("h20x4"); });
  EXPECT_NE(msg.find("h20x16"), std::string::npos);
  msg = errorOf([] { stageFromName("step"); });
  EXPECT_NE(msg.find("'step'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("encode, denoise, migrate, decode"), std::string::npos) << msg;
  EXPECT_EQ(stageFromName("migrate"), Stage::kMigrate);
}

TEST(CostRegistry, StageAndLayoutNamesRoundTrip) {
  // a stage is named as the task kind that runs it
  for (Stage s : {Stage::kEncode, Stage::kDenoise, Stage::kMigrate, Stage::kDecode}) {
    EXPECT_EQ(stageFromName(stageName(s)), s) << stageName(s);
  }
  EXPECT_STREQ(stageName(Stage::kDenoise), "denoise");
  for (LayoutMode m : {LayoutMode::kUsp, LayoutMode::kTorus}) EXPECT_EQ(layoutModeFromName(layoutModeName(m)), m);
  for (Placement p : {Placement::kAuto, Placement::kUlyssesLow, Placement::kRingLow}) {
    EXPECT_EQ(placementFromName(placementName(p)), p);
  }
  EXPECT_STREQ(layoutModeName(LayoutMode::kTorus), "torus");
  EXPECT_STREQ(placementName(Placement::kUlyssesLow), "ulysses-low");
  EXPECT_STREQ(placementName(Placement::kRingLow), "ring-low");
  EXPECT_STREQ(layoutModeName(static_cast<LayoutMode>(7)), "unknown");
  std::string msg = errorOf([] { layoutModeFromName("ring"); });
  EXPECT_NE(msg.find("'ring'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("usp, torus"), std::string::npos) << msg;
  msg = errorOf([] { placementFromName("low"); });
  EXPECT_NE(msg.find("auto, ulysses-low, ring-low"), std::string::npos) << msg;  // errorOf: InvalidUsage
}

TEST(CostRegistry, Clusters) {
  Cluster c = cluster("h20x16");
  EXPECT_EQ(c.num_ranks, 16);
  EXPECT_EQ(c.nodeOf(7), 0);
  EXPECT_EQ(c.nodeOf(8), 1);
  EXPECT_DOUBLE_EQ(c.hw.link_bw, 450e9);  // per direction: half of the 900 GB/s aggregate
  Cluster cpu = cluster("cpu", 6);
  EXPECT_EQ(cpu.num_ranks, 6);
  EXPECT_EQ(cpu.nodeOf(5), 0);
  EXPECT_GE(cpu.hw.num_cores, 1);
}

TEST(CostAnalytic, MonotonicInTokens) {
  for (const std::string& name : {"qwen-image", "wan2.2", "wan2.1-1.3b", "tiny-wan"}) {
    const ModelArch& m = modelArch(name);
    auto cm = makeAnalyticCostModel(m, cluster(name == std::string("tiny-wan") ? "cpu" : "h20x8", 4));
    const int32_t f = m.is_video ? 33 : 1;
    double prev = 0;
    for (int32_t side = 128; side <= 512; side += 64) {
      const double t = cm->seconds(Stage::kDenoise, query(m, side, side, f, 2, 1));
      EXPECT_GT(t, prev) << name << " " << side;
      prev = t;
      EXPECT_GT(cm->seconds(Stage::kDecode, query(m, side, side, f)), 0);
    }
  }
}

TEST(CostAnalytic, GuidanceDoublesTheStep) {
  const ModelArch& m = modelArch("wan2.2");
  auto cm = makeAnalyticCostModel(m, cluster("h100x8"));
  for (int32_t u : {1, 2, 4, 8}) {
    const double off = cm->seconds(Stage::kDenoise, query(m, 720, 1280, 81, u, 1, 1.0));
    const double on = cm->seconds(Stage::kDenoise, query(m, 720, 1280, 81, u, 1, 4.0));
    EXPECT_NEAR(on / off, 2.0, 1e-9) << u;
  }
  EXPECT_NEAR(cm->seconds(Stage::kEncode, query(m, 720, 1280, 81, 1, 1, 4.0)) /
                  cm->seconds(Stage::kEncode, query(m, 720, 1280, 81)),
              2.0, 1e-9);
}

TEST(CostAnalytic, SmallImagesGainNothingFromMoreRanks) {
  // GF-DiT (H20): a 512 px Qwen-Image step is no faster on 4 ranks than on 2 (communication outweighs
  // compute), while a 1536 px step scales.
  const ModelArch& m = modelArch("qwen-image");
  auto cm = makeAnalyticCostModel(m, cluster("h20x8"));
  const double s2 = cm->seconds(Stage::kDenoise, query(m, 512, 512, 1, 2));
  const double s4 = cm->seconds(Stage::kDenoise, query(m, 512, 512, 1, 4));
  EXPECT_GT(s4, 0.95 * s2);
  const double l1 = cm->seconds(Stage::kDenoise, query(m, 1536, 1536, 1, 1));
  const double l4 = cm->seconds(Stage::kDenoise, query(m, 1536, 1536, 1, 4));
  EXPECT_GT(l1 / l4, 2.5);
}

TEST(CostAnalytic, LargeVideoStepsScaleWithDegree) {
  const ModelArch& m = modelArch("wan2.2");
  auto cm = makeAnalyticCostModel(m, cluster("h20x8"));
  const double t1 = cm->seconds(Stage::kDenoise, query(m, 720, 1280, 81, 1, 1, 4.0));
  double prev = t1;
  for (int32_t d : {2, 4, 8}) {
    const double t = cm->seconds(Stage::kDenoise, query(m, 720, 1280, 81, d, 1, 4.0));
    EXPECT_LT(t, prev);
    EXPECT_GT(t1 / t, 0.85 * d) << "degree " << d;  // close to linear for 75,600 tokens
    prev = t;
  }
  // Ulysses 4 x ring 2 is as good as Ulysses 8 within a node (the ring rotation hides behind compute).
  const double u8 = cm->seconds(Stage::kDenoise, query(m, 720, 1280, 81, 8, 1, 4.0));
  const double u4r2 = cm->seconds(Stage::kDenoise, query(m, 720, 1280, 81, 4, 2, 4.0));
  EXPECT_NEAR(u4r2 / u8, 1.0, 0.1);
}

TEST(CostAnalytic, InterNodeUlyssesIsSlower) {
  const ModelArch& m = modelArch("wan2.2");
  auto cm = makeAnalyticCostModel(m, cluster("h20x16"));
  const double intra = cm->seconds(Stage::kDenoise, query(m, 720, 1280, 81, 8, 1, 4.0, 1));
  const double inter = cm->seconds(Stage::kDenoise, query(m, 720, 1280, 81, 8, 1, 4.0, 2));
  EXPECT_GT(inter, intra);  // a 720p video step is compute-bound: the NIC costs a few percent
  const ModelArch& q = modelArch("qwen-image");
  auto cq = makeAnalyticCostModel(q, cluster("h20x16"));
  const double q_intra = cq->seconds(Stage::kDenoise, query(q, 1024, 1024, 1, 8, 1, 4.0, 1));
  const double q_inter = cq->seconds(Stage::kDenoise, query(q, 1024, 1024, 1, 8, 1, 4.0, 2));
  EXPECT_GT(q_inter, 1.05 * q_intra);
  // Across two nodes, Torus (ring inside a node, the all-to-all pipelined against it) beats USP with
  // Ulysses across the nodes.
  StageQuery usp = query(m, 720, 1280, 81, 2, 8, 4.0, 2);
  usp.layout.placement = Placement::kRingLow;  // Ulysses crosses the nodes
  StageQuery torus = usp;
  torus.layout.mode = LayoutMode::kTorus;
  EXPECT_LT(cm->seconds(Stage::kDenoise, torus), cm->seconds(Stage::kDenoise, usp));
  // Migration across nodes is slower than inside one.
  StageQuery mig = query(m, 720, 1280, 81, 1, 1, 4.0, 1);
  mig.degree = 8;
  mig.num_new = 4;
  const double mig_intra = cm->seconds(Stage::kMigrate, mig);
  mig.num_nodes = 2;
  EXPECT_GT(cm->seconds(Stage::kMigrate, mig), mig_intra);
  mig.num_new = 0;
  EXPECT_EQ(cm->seconds(Stage::kMigrate, mig), 0.0);
}

TEST(CostAnalytic, CpuRanksShareCores) {
  const ModelArch& m = modelArch("tiny-wan");
  Cluster c = cluster("cpu", 64);
  c.hw.num_cores = 2;
  auto cm = makeAnalyticCostModel(m, c);
  const double e2 = cm->seconds(Stage::kEncode, query(m, 32, 48, 9, 2));
  const double e8 = cm->seconds(Stage::kEncode, query(m, 32, 48, 9, 8));
  EXPECT_NEAR(e8 / e2, 4.0, 1e-9);
}

TEST(CostAnalytic, RefusesBadQueries) {
  const ModelArch& m = modelArch("qwen-image");
  auto cm = makeAnalyticCostModel(m, cluster("h20x8"));
  StageQuery q = query(m, 1024, 1024, 1, 2, 2);
  q.degree = 2;  // layout 2 x 2 != degree 2
  EXPECT_NE(errorOf([&] { cm->seconds(Stage::kDenoise, q); }).find("degree"), std::string::npos);
  EXPECT_NE(errorOf([&] { cm->seconds(Stage::kDenoise, query(m, 1024, 1024, 1, 16)); }).find("h20x8"),
            std::string::npos);
  // Ulysses may split the heads unevenly (5 of 24 is fine) but not past them
  EXPECT_GT(cm->seconds(Stage::kDenoise, query(m, 1024, 1024, 1, 5)), 0);
  const ModelArch& tiny = modelArch("tiny-wan");  // 4 heads
  auto ct = makeAnalyticCostModel(tiny, cluster("cpu", 8));
  EXPECT_NE(errorOf([&] { ct->seconds(Stage::kDenoise, query(tiny, 32, 48, 9, 5)); }).find("heads"), std::string::npos);
  // CFG-parallel: 1 or 2, with guidance only, ulysses x ring x cfg == degree
  StageQuery c = query(m, 1024, 1024, 1, 2, 1, 4.0);
  c.layout.cfg = 3;
  c.degree = 6;
  EXPECT_NE(errorOf([&] { cm->seconds(Stage::kDenoise, c); }).find("cfg"), std::string::npos);
  c.layout.cfg = 2;
  c.degree = 2;  // 2 x 1 x 2 != 2
  EXPECT_NE(errorOf([&] { cm->seconds(Stage::kDenoise, c); }).find("degree"), std::string::npos);
  c.degree = 4;
  EXPECT_GT(cm->seconds(Stage::kDenoise, c), 0);
  c.shape.guidance_scale = 1.0;
  EXPECT_NE(errorOf([&] { cm->seconds(Stage::kDenoise, c); }).find("guidance"), std::string::npos);
}

// Ulysses that does not divide the heads gives some members one head more; the pass waits for them.
TEST(CostAnalytic, UnevenUlyssesCostsLikeItsLargestMember) {
  const ModelArch& m = modelArch("qwen-image");  // 24 heads
  auto cm = makeAnalyticCostModel(m, cluster("h20x8"));
  auto step = [&](int32_t u) { return cm->seconds(Stage::kDenoise, query(m, 1536, 1536, 1, u, 1, 4.0)); };
  EXPECT_GT(step(4), step(5));  // 5 heads at most instead of 6, and fewer tokens per rank
  EXPECT_GT(step(5), step(6));
  // 7 ranks: the largest member has 4 heads, as with 6: only the token-parallel parts shrink by 6/7
  EXPECT_LT(step(7), step(6));
  EXPECT_GT(step(7), step(6) * 6.0 / 7.0 * 1.01);
  EXPECT_LT(step(8), step(7));  // 3 heads each, even
}

// CFG-parallel: each half runs one pass on degree / 2 ranks, at once, then one exchange of the prediction.
TEST(CostAnalytic, CfgParallelIsOnePassPerHalfPlusAnExchange) {
  const ModelArch& m = modelArch("qwen-image");
  const Cluster cl = cluster("h20x8");
  auto cm = makeAnalyticCostModel(m, cl);
  const int64_t tokens = m.tokens(1024, 1024, 1);
  const double exchange = cl.hw.collective_latency_s + tokens * 64 * 4.0 / cl.hw.link_bw;  // float32 velocity
  for (int32_t u : {1, 2, 4}) {
    StageQuery cfg1 = query(m, 1024, 1024, 1, u, 1, 4.0);  // both passes in turn on u ranks
    StageQuery cfg2 = query(m, 1024, 1024, 1, u, 1, 4.0);  // one pass per half of 2u ranks
    cfg2.layout.cfg = 2;
    cfg2.degree = 2 * u;
    const double two_passes = cm->seconds(Stage::kDenoise, cfg1);
    EXPECT_NEAR(cm->seconds(Stage::kDenoise, cfg2), two_passes / 2 + exchange, 1e-12 * two_passes) << u;
  }
  // On two nodes the halves sit one on each: each half's pass stays inside its node, the exchange crosses.
  auto c16 = makeAnalyticCostModel(m, cluster("h20x16"));
  StageQuery inside = query(m, 1024, 1024, 1, 8, 1, 4.0, 1);
  StageQuery across = query(m, 1024, 1024, 1, 8, 1, 4.0, 2);
  across.layout.cfg = 2;
  across.degree = 16;
  const Hardware& hw = cluster("h20x16").hw;
  EXPECT_NEAR(
      c16->seconds(Stage::kDenoise, across),
      c16->seconds(Stage::kDenoise, inside) / 2 + hw.inter_node_latency_s + tokens * 64 * 4.0 / hw.inter_node_bw, 1e-9);
}

// When communication dominates (a small image; more so with slow collectives) CFG-parallel on 2 ranks is much
// faster than Ulysses 2 with the passes in turn; for a long video the two are close (compute scales either way).
TEST(CostAnalytic, CfgParallelWinsWhenCommunicationDominates) {
  const ModelArch& m = modelArch("qwen-image");
  Cluster slow = cluster("h20x8");
  slow.hw.collective_latency_s = 1e-3;  // a high-latency interconnect
  for (const Cluster& cl : {cluster("h20x8"), slow}) {
    auto cm = makeAnalyticCostModel(m, cl);
    StageQuery u2 = query(m, 512, 512, 1, 2, 1, 4.0);
    StageQuery c2 = query(m, 512, 512, 1, 1, 1, 4.0);
    c2.layout.cfg = 2;
    c2.degree = 2;
    const double one = cm->seconds(Stage::kDenoise, query(m, 512, 512, 1, 1, 1, 4.0));
    const double t_u2 = cm->seconds(Stage::kDenoise, u2);
    const double t_c2 = cm->seconds(Stage::kDenoise, c2);
    EXPECT_LT(t_c2, 0.7 * t_u2) << cl.hw.collective_latency_s;
    EXPECT_LT(t_c2, 0.6 * one) << "two ranks almost halve the step";
  }
  const ModelArch& w = modelArch("wan2.2");
  auto cw = makeAnalyticCostModel(w, cluster("h20x8"));
  StageQuery u2 = query(w, 720, 1280, 81, 2, 1, 4.0);
  StageQuery c2 = query(w, 720, 1280, 81, 1, 1, 4.0);
  c2.layout.cfg = 2;
  c2.degree = 2;
  EXPECT_NEAR(cw->seconds(Stage::kDenoise, c2) / cw->seconds(Stage::kDenoise, u2), 1.0, 0.05);
}

// The migration moves the sampler's history too: Wan's UniPC keeps two earlier outputs and a sample.
TEST(CostAnalytic, MigrationCountsTheSamplerHistory) {
  const ModelArch& w = modelArch("wan2.2");
  EXPECT_EQ(w.sampler_history_latents, 3);
  EXPECT_EQ(modelArch("qwen-image").sampler_history_latents, 0);
  const Cluster cl = cluster("h20x8");
  StageQuery q = query(w, 720, 1280, 81, 1, 1, 4.0);
  q.degree = 2;
  q.num_new = 1;
  const double with = makeAnalyticCostModel(w, cl)->seconds(Stage::kMigrate, q);
  ModelArch none = w;
  none.sampler_history_latents = 0;
  const double without = makeAnalyticCostModel(none, cl)->seconds(Stage::kMigrate, q);
  const double latent = 16.0 * 21 * 90 * 160 * 4;  // float32 [16, 21, 90, 160]
  EXPECT_NEAR(with - without, 3 * latent / cl.hw.link_bw, 1e-12);
}

Profile tinyProfile() {
  Profile p;
  p.model = "tiny-wan";
  p.hardware = "cpu";
  p.world_size = 4;
  auto add = [&p](Stage s, int64_t tokens, int32_t u, int32_t r, bool g, int32_t num_new, double sec) {
    ProfileEntry e;
    e.stage = s;
    e.tokens = tokens;
    e.degree = u * r;
    e.ulysses = u;
    e.ring = r;
    e.guidance = g;
    e.num_new = num_new;
    e.seconds = sec;
    p.entries.push_back(e);
  };
  add(Stage::kDenoise, 18, 2, 1, true, 0, 0.010);
  add(Stage::kDenoise, 54, 2, 1, true, 0, 0.020);
  add(Stage::kDenoise, 150, 2, 1, true, 0, 0.060);
  add(Stage::kDenoise, 54, 2, 1, true, 0, 0.030);  // a repeat: averaged with 0.020
  add(Stage::kDecode, 18, 1, 1, true, 0, 0.1);
  add(Stage::kDecode, 150, 1, 1, true, 0, 0.5);
  add(Stage::kMigrate, 18, 2, 1, true, 1, 0.001);
  add(Stage::kMigrate, 150, 2, 1, true, 1, 0.003);
  add(Stage::kMigrate, 18, 2, 1, true, 3, 0.002);
  add(Stage::kMigrate, 150, 2, 1, true, 3, 0.004);
  add(Stage::kEncode, 18, 1, 1, true, 0, 0.04);
  add(Stage::kEncode, 150, 1, 1, true, 0, 0.06);
  return p;
}

StageQuery tinyQuery(int64_t tokens, int32_t u, bool guidance = true) {
  StageQuery q;
  q.shape.height = 32;
  q.shape.width = 48;
  q.shape.num_frames = 9;
  q.shape.guidance_scale = guidance ? 4.0 : 1.0;
  q.shape.tokens = tokens;
  q.degree = u;
  q.layout.ulysses = u;
  return q;
}

TEST(CostProfile, ExactAtMeasuredPointsLinearBetween) {
  auto cm = makeProfiledCostModel(tinyProfile());
  EXPECT_EQ(cm->model().name, "tiny-wan");
  EXPECT_DOUBLE_EQ(cm->seconds(Stage::kDenoise, tinyQuery(18, 2)), 0.010);
  EXPECT_DOUBLE_EQ(cm->seconds(Stage::kDenoise, tinyQuery(54, 2)), 0.025);
  EXPECT_DOUBLE_EQ(cm->seconds(Stage::kDenoise, tinyQuery(150, 2)), 0.060);
  EXPECT_NEAR(cm->seconds(Stage::kDenoise, tinyQuery(36, 2)), 0.0175, 1e-12);
  EXPECT_NEAR(cm->seconds(Stage::kDenoise, tinyQuery(102, 2)), 0.0425, 1e-12);
  // Decode on a group of 2 uses the one-rank entries.
  EXPECT_NEAR(cm->seconds(Stage::kDecode, tinyQuery(84, 2)), 0.3, 1e-12);
  // Migrate: the nearest measured num_new.
  StageQuery m = tinyQuery(84, 2);
  m.num_new = 1;
  EXPECT_NEAR(cm->seconds(Stage::kMigrate, m), 0.002, 1e-12);
  m.num_new = 4;
  EXPECT_NEAR(cm->seconds(Stage::kMigrate, m), 0.003, 1e-12);
  // Encode: the mean of the entries of the degree, whatever the tokens.
  EXPECT_NEAR(cm->seconds(Stage::kEncode, tinyQuery(1000, 1)), 0.05, 1e-12);
}

TEST(CostProfile, OutOfRangeAndUnmeasuredLayoutsNameTheShape) {
  auto cm = makeProfiledCostModel(tinyProfile());
  std::string msg = errorOf([&] { cm->seconds(Stage::kDenoise, tinyQuery(151, 2)); });
  EXPECT_NE(msg.find("151 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("32x48x9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage denoise"), std::string::npos) << msg;
  EXPECT_NE(msg.find("degree 2"), std::string::npos) << msg;
  msg = errorOf([&] { cm->seconds(Stage::kDenoise, tinyQuery(54, 4)); });
  EXPECT_NE(msg.find("degree 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("never measured"), std::string::npos) << msg;
  msg = errorOf([&] { cm->seconds(Stage::kDenoise, tinyQuery(54, 2, false)); });
  EXPECT_NE(msg.find("guidance off"), std::string::npos) << msg;
  // encode on a degree never measured: the nearest measured degree (only core contention differs)
  EXPECT_NEAR(cm->seconds(Stage::kEncode, tinyQuery(54, 4)), 0.05, 1e-12);
}

TEST(CostProfile, CfgParallelEntriesAreTheirOwnLayout) {
  Profile p = tinyProfile();
  ProfileEntry e;
  e.stage = Stage::kDenoise;
  e.degree = 2;
  e.cfg = 2;
  e.guidance = true;
  e.tokens = 18;
  e.seconds = 0.004;
  p.entries.push_back(e);
  e.tokens = 150;
  e.seconds = 0.040;
  p.entries.push_back(e);
  auto cm = makeProfiledCostModel(p);
  StageQuery q = tinyQuery(18, 1);
  q.degree = 2;
  q.layout.cfg = 2;
  EXPECT_DOUBLE_EQ(cm->seconds(Stage::kDenoise, q), 0.004);
  EXPECT_DOUBLE_EQ(cm->seconds(Stage::kDenoise, tinyQuery(18, 2)), 0.010) << "Ulysses 2 is another curve";
  q.layout.ulysses = 2;
  q.degree = 4;
  std::string msg = errorOf([&] { cm->seconds(Stage::kDenoise, q); });
  EXPECT_NE(msg.find("x cfg 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("never measured"), std::string::npos) << msg;
  // refused: cfg 2 without guidance, a degree that is not ulysses x ring x cfg, cfg 3
  Profile bad = p;
  bad.entries.back().guidance = false;
  EXPECT_NE(errorOf([&] { makeProfiledCostModel(bad); }).find("guidance"), std::string::npos);
  bad = p;
  bad.entries.back().degree = 1;
  EXPECT_NE(errorOf([&] { makeProfiledCostModel(bad); }).find("x cfg 2 != degree 1"), std::string::npos);
  bad = p;
  bad.entries.back().cfg = 3;
  EXPECT_NE(errorOf([&] { makeProfiledCostModel(bad); }).find("cfg must be 1 or 2"), std::string::npos);
}

TEST(CostProfile, RefusesBadProfiles) {
  Profile p = tinyProfile();
  p.model = "nope";
  EXPECT_NE(errorOf([&] { makeProfiledCostModel(p); }).find("tiny-wan"), std::string::npos);
  p = tinyProfile();
  p.entries[2].seconds = -1;
  EXPECT_NE(errorOf([&] { makeProfiledCostModel(p); }).find("entry 2"), std::string::npos);
  p = tinyProfile();
  p.entries.clear();
  errorOf([&] { makeProfiledCostModel(p); });
}

}  // namespace
}  // namespace cost
}  // namespace gfdit
