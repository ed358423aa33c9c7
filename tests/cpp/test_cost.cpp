// Tests of the cost model: the registries, the analytic model's shape (monotonic, CFG, scaling, topology)
// and the profiled model's interpolation and refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "error_of.h"
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

using gfdit::testing::errorOf;

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
  // Decode: its own degree's entries (one rank here), whatever the layout; a degree never measured is refused.
  EXPECT_NEAR(cm->seconds(Stage::kDecode, tinyQuery(84, 1)), 0.3, 1e-12);
  std::string msg = errorOf([&] { cm->seconds(Stage::kDecode, tinyQuery(84, 2)); });
  EXPECT_NE(msg.find("stage decode"), std::string::npos) << msg;
  EXPECT_NE(msg.find("degree 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("never measured"), std::string::npos) << msg;
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

// GF-DiT (SJTU-Liquid/GF-DiT, README "Why elastic parallelism"): Qwen-Image's per-step DiT time on an H20 node,
// one pass (guidance off) with the profiler's ~16-token prompt (docs/cost_calibration.md, "How the GF-DiT table is
// read"), at SP (Ulysses) 1, 2 and 4. Every point within 25%, and every change from SP 1 to 2 and from 2 to 4 in
// the published direction: a 512 px step gets slower with more ranks, larger ones faster.
TEST(CostCalibration, GfDitH20StepsAndTheirDirections) {
  ModelArch m = modelArch("qwen-image");
  m.text_tokens = 16;
  auto cm = makeAnalyticCostModel(m, cluster("h20x8"));
  struct Published {
    int32_t side;
    double ms[3];  // SP 1, 2, 4
  };
  const Published table[] = {{512, {155, 161, 172}}, {1024, {605, 350, 207}}, {1536, {1557, 880, 464}}};
  const int32_t degrees[] = {1, 2, 4};
  for (const Published& p : table) {
    double predicted[3];
    for (int i = 0; i < 3; ++i) {
      predicted[i] = 1e3 * cm->seconds(Stage::kDenoise, query(m, p.side, p.side, 1, degrees[i]));
      EXPECT_NEAR(predicted[i] / p.ms[i], 1.0, 0.25)
          << p.side << " px, SP " << degrees[i] << ": " << predicted[i] << " ms, published " << p.ms[i];
    }
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(predicted[i + 1] > predicted[i], p.ms[i + 1] > p.ms[i])
          << p.side << " px, SP " << degrees[i] << " -> " << degrees[i + 1] << ": " << predicted[i] << " -> "
          << predicted[i + 1] << " ms, published " << p.ms[i] << " -> " << p.ms[i + 1];
    }
  }
}

// A block costs the larger of its host and its device work on a GPU, their sum on a CPU (NOTE [analytic step
// model]): with the device's work made negligible, a GPU step is the host's work alone.
TEST(CostAnalytic, HostWorkHidesBehindTheDeviceOnlyOnAGpu) {
  const ModelArch& m = modelArch("qwen-image");
  Cluster cl = cluster("h20x8");
  cl.hw.peak_flops = 1e30;
  cl.hw.mem_bw = 1e30;
  cl.hw.link_bw = 1e30;
  cl.hw.collective_latency_s = 0;
  cl.hw.peer_latency_s = 0;
  const double host = cl.hw.layer_overhead_s + 4 * 3 * cl.hw.peer_host_s;  // Ulysses 4: three peers, 4 all-to-alls
  EXPECT_NEAR(makeAnalyticCostModel(m, cl)->seconds(Stage::kDenoise, query(m, 512, 512, 1, 4)), 60 * host, 1e-12);
  // launched synchronously the device's work adds to it: a 1024 px step is longer by its device time
  Cluster real = cluster("h20x8");
  const double async = makeAnalyticCostModel(m, real)->seconds(Stage::kDenoise, query(m, 1024, 1024, 1));
  real.hw.async_launch = false;
  const double sync = makeAnalyticCostModel(m, real)->seconds(Stage::kDenoise, query(m, 1024, 1024, 1));
  EXPECT_NEAR(sync - async, 60 * real.hw.layer_overhead_s, 1e-9);  // device-bound: the host's work was hidden
}

// See NOTE [decode by degree]: one rank is the decoder's FLOPs over the convolution rate, as before a decode had a
// degree; a group divides the convolutions, runs the gathered mid-block attention whole, and adds a halo exchange
// per convolution and latent frame and the gathers, here worked out by hand for one shape.
TEST(CostDecode, OneRankIsTheFlopCountAndAGroupAddsItsExchanges) {
  const ModelArch& m = modelArch("wan2.1-1.3b");
  const Cluster cl = cluster("h200x8");
  const Hardware& hw = cl.hw;
  auto cm = makeAnalyticCostModel(m, cl);
  const double pixels = 480.0 * 832 * 81;
  const double one = 8.3e6 * pixels / (989e12 * 0.1);  // FLOPs per pixel, the datasheet's peak, conv_efficiency
  StageQuery q = query(m, 480, 832, 81);
  EXPECT_DOUBLE_EQ(cm->seconds(Stage::kDecode, q), one);
  // 4 ranks: 21 latent frames of 60 x 104 positions, 33 convolutions each, two neighbours for the inner members
  const double chunks = 21;
  const double L = 60.0 * 104;
  const double C = 384;
  const double lat = hw.collective_latency_s;
  const double attention = chunks * (4 * L * L * C + 8 * L * C * C) / (989e12 * hw.attention_efficiency);
  const double halo =
      chunks * 33 * (lat + 2 * hw.peer_latency_s + hw.conv_layer_overhead_s) + 2 * 2064.5 * 832 * 81 * 2.0 / hw.link_bw;
  const double gathers =
      chunks * (lat + L * C * 2.0 * 3 / 4 / hw.link_bw) + lat + pixels * 3 * 2.0 * 3 / 4 / hw.link_bw;
  q.degree = 4;
  EXPECT_NEAR(cm->seconds(Stage::kDecode, q), (one - attention) / 4 + attention + halo + gathers, 1e-9);
  // SGLang #27875 (two H200s, this shape): 2631.4 ms on one rank, 1814.8 ms on two; conv_layer_overhead_s was
  // fitted to that ratio, so this holds by construction (docs/cost_calibration.md, "Decode by degree")
  q.degree = 2;
  EXPECT_NEAR(cm->seconds(Stage::kDecode, q) / one, 1814.8 / 2631.4, 0.01);
  // a big video keeps gaining to 8 ranks, a group spanning nodes pays the NIC, and ranks sharing cores share them
  const ModelArch& big = modelArch("wan2.2");
  auto c16 = makeAnalyticCostModel(big, cluster("h20x16"));
  StageQuery v = query(big, 720, 1280, 81);
  const double v1 = c16->seconds(Stage::kDecode, v);
  v.degree = 8;
  const double v8 = c16->seconds(Stage::kDecode, v);
  EXPECT_GT(v1 / v8, 6.0);
  v.num_nodes = 2;
  EXPECT_GT(c16->seconds(Stage::kDecode, v), v8);
  const ModelArch& tiny = modelArch("tiny-wan");
  Cluster cpu = cluster("cpu", 8);
  cpu.hw.num_cores = 2;
  StageQuery t = query(tiny, 256, 256, 33);
  t.degree = 4;
  Cluster own = cpu;
  own.hw.num_cores = 4;
  EXPECT_NEAR(makeAnalyticCostModel(tiny, cpu)->seconds(Stage::kDecode, t) /
                  makeAnalyticCostModel(tiny, own)->seconds(Stage::kDecode, t),
              2.0, 1e-12);
}

TEST(CostDecode, RefusesMoreMembersThanLatentRows) {
  const ModelArch& m = modelArch("qwen-image");
  auto cm = makeAnalyticCostModel(m, cluster("h20x8"));
  StageQuery q = query(m, 32, 512, 1);  // 4 latent rows
  q.degree = 4;
  EXPECT_GT(cm->seconds(Stage::kDecode, q), 0);
  q.degree = 5;
  const std::string msg = errorOf([&] { cm->seconds(Stage::kDecode, q); });
  EXPECT_NE(msg.find("latent row"), std::string::npos) << msg;
}

Profile decodeProfile(std::initializer_list<std::pair<int32_t, double>> degree_seconds) {
  Profile p;
  p.model = "tiny-wan";
  for (const auto& [degree, seconds] : degree_seconds) {
    for (int64_t tokens : {18, 150}) {
      ProfileEntry e;
      e.stage = Stage::kDecode;
      e.degree = degree;
      e.tokens = tokens;
      e.seconds = seconds * tokens / 18;
      p.entries.push_back(e);
    }
  }
  return p;
}

TEST(CostDecode, BestDegreeIsTheFastestMeasuredOrPredictedThatTheLatentAllows) {
  RequestShape s;
  s.height = 64;  // 8 latent rows
  s.width = 96;
  s.num_frames = 9;
  s.tokens = modelArch("tiny-wan").tokens(64, 96, 9);  // 54: inside the measured range
  // measured at 1, 2 and 4 ranks, fastest at 2; 3 was never measured and is skipped
  auto measured = makeProfiledCostModel(decodeProfile({{1, 0.5}, {2, 0.3}, {4, 0.35}}));
  EXPECT_EQ(bestDecodeDegree(*measured, s, 8), 2);
  EXPECT_EQ(bestDecodeDegree(*measured, s, 1), 1);
  // only degree 2 measured: degree 1 is refused and skipped
  EXPECT_EQ(bestDecodeDegree(*makeProfiledCostModel(decodeProfile({{2, 0.3}})), s, 4), 2);
  // nothing but degree 4 measured and at most 2 allowed: degree 1's refusal is what the caller sees
  const std::string msg = errorOf([&] { bestDecodeDegree(*makeProfiledCostModel(decodeProfile({{4, 0.3}})), s, 2); });
  EXPECT_NE(msg.find("degree 1"), std::string::npos) << msg;
  // the latent's rows bound the degree: 2 rows allow 2 members however many are offered
  s.height = 16;
  EXPECT_EQ(bestDecodeDegree(*measured, s, 8), 2);
  // analytic: a 720p video gains up to the cluster's 8 ranks, a larger offer is cut to them
  const ModelArch& w = modelArch("wan2.2");
  auto cm = makeAnalyticCostModel(w, cluster("h20x8"));
  RequestShape v;
  v.height = 720;
  v.width = 1280;
  v.num_frames = 81;
  v.tokens = w.tokens(720, 1280, 81);
  EXPECT_EQ(bestDecodeDegree(*cm, v, 64), 8);
  EXPECT_EQ(bestDecodeDegree(*cm, v, 3), 3);
  EXPECT_NE(errorOf([&] { bestDecodeDegree(*cm, v, 0); }).find("max_degree"), std::string::npos);
}

// A batch of b requests of one shape (NOTE [analytic step model]): batch 1 is a query without a batch; compute is b
// requests' (at the efficiency of b times the rows), weights and host work are paid once, collectives move b times
// the bytes for one latency.
TEST(CostBatch, OneBatchedForwardPerStep) {
  const ModelArch& m = modelArch("qwen-image");
  const Cluster cl = cluster("h20x8");
  auto cm = makeAnalyticCostModel(m, cl);
  auto at = [&](int32_t side, int32_t u, int32_t batch, Stage stage = Stage::kDenoise) {
    StageQuery q = query(m, side, side, 1, u, 1, 4.0);
    q.batch = batch;
    if (stage == Stage::kMigrate) q.num_new = 3;
    return cm->seconds(stage, q);
  };
  EXPECT_EQ(at(1024, 2, 1), cm->seconds(Stage::kDenoise, query(m, 1024, 1024, 1, 2, 1, 4.0)));
  // a large image is compute-bound: two cost about two
  EXPECT_GT(at(1536, 1, 2) / at(1536, 1, 1), 1.9);
  EXPECT_LE(at(1536, 1, 2) / at(1536, 1, 1), 2.0);
  // a small one on 4 ranks is host-bound (GF-DiT's 512 px points): four cost far less than four
  EXPECT_LT(at(512, 4, 4), 0.6 * 4 * at(512, 4, 1));
  // decode and encode: one after another
  EXPECT_DOUBLE_EQ(at(1024, 1, 3, Stage::kDecode), 3 * at(1024, 1, 1, Stage::kDecode));
  EXPECT_DOUBLE_EQ(at(1024, 2, 3, Stage::kEncode), 3 * at(1024, 2, 1, Stage::kEncode));
  // migrate: one broadcast, b states; linear in b with the regroup and the tree's latency once
  const double m1 = at(1024, 1, 1, Stage::kMigrate);
  const double m2 = at(1024, 1, 2, Stage::kMigrate);
  EXPECT_NEAR(at(1024, 1, 4, Stage::kMigrate) - m1, 3 * (m2 - m1), 1e-15);
  EXPECT_NEAR(m1 - (m2 - m1), cl.hw.regroup_s + 2 * cl.hw.collective_latency_s, 1e-15);  // 3 new: 2 tree levels
  StageQuery bad = query(m, 1024, 1024, 1);
  bad.batch = 0;
  EXPECT_NE(errorOf([&] { cm->seconds(Stage::kDenoise, bad); }).find("batch"), std::string::npos);
}

// With compute and weight reads made free, a Ulysses-2 step of a batch is its collectives alone, worked out by hand:
// per block 4 all-to-alls of one latency, one peer's latency and b x n x H_u elements, then the output's gather.
TEST(CostBatch, CollectivesMoveTheBatchsBytesForOneLatency) {
  const ModelArch& m = modelArch("qwen-image");
  Cluster cl = cluster("h20x8");
  cl.hw.peak_flops = 1e30;
  cl.hw.mem_bw = 1e30;
  cl.hw.layer_overhead_s = 0;
  cl.hw.peer_host_s = 0;
  auto cm = makeAnalyticCostModel(m, cl);
  const Hardware& hw = cl.hw;
  for (int32_t b : {1, 3}) {
    StageQuery q = query(m, 1024, 1024, 1, 2);
    q.batch = b;
    const double a2a = hw.collective_latency_s + hw.peer_latency_s + b * 2048.0 * (12 * 128) * 2 / hw.link_bw;
    const double gather = hw.collective_latency_s + b * 4096.0 * 64 * 4 / 2 / hw.link_bw;
    EXPECT_NEAR(cm->seconds(Stage::kDenoise, q), 60 * 4 * a2a + gather, 1e-12) << b;
  }
}

TEST(CostProfile, BatchesInterpolateBetweenMeasuredOnes) {
  Profile p = tinyProfile();
  auto add = [&p](int64_t tokens, double seconds) {
    ProfileEntry e;
    e.stage = Stage::kDenoise;
    e.degree = 2;
    e.ulysses = 2;
    e.guidance = true;
    e.batch = 4;
    e.tokens = tokens;
    e.seconds = seconds;
    p.entries.push_back(e);
  };
  add(18, 0.025);
  add(150, 0.150);
  auto cm = makeProfiledCostModel(p);
  auto at = [&](int64_t tokens, int32_t batch) {
    StageQuery q = tinyQuery(tokens, 2);
    q.batch = batch;
    return cm->seconds(Stage::kDenoise, q);
  };
  EXPECT_DOUBLE_EQ(at(18, 1), 0.010);
  EXPECT_DOUBLE_EQ(at(18, 4), 0.025);
  EXPECT_NEAR(at(18, 2), 0.010 + (0.025 - 0.010) / 3, 1e-12);
  const double one = 0.025 + (0.060 - 0.025) * (102 - 54) / 96.0;    // batch 1 at 102 tokens, between 54 and 150
  const double four = 0.025 + (0.150 - 0.025) * (102 - 18) / 132.0;  // batch 4, between 18 and 150
  EXPECT_NEAR(at(102, 3), one + (four - one) * 2 / 3, 1e-12);
  std::string msg = errorOf([&] { at(18, 8); });
  EXPECT_NE(msg.find("batch 8 is outside the measured batches (1, 4)"), std::string::npos) << msg;
  // decode and encode were measured at batch 1 only
  StageQuery d = tinyQuery(84, 1);
  d.batch = 2;
  msg = errorOf([&] { cm->seconds(Stage::kDecode, d); });
  EXPECT_NE(msg.find("batch 2"), std::string::npos) << msg;
  EXPECT_NE(errorOf([&] { cm->seconds(Stage::kEncode, d); }).find("batch 2"), std::string::npos);
  p.entries.back().batch = 0;
  EXPECT_NE(errorOf([&] { makeProfiledCostModel(p); }).find("batch must be >= 1"), std::string::npos);
}

TEST(CostMemory, ActivationsPerRankAndTheLargestBatchThatFits) {
  const ModelArch& m = modelArch("qwen-image");
  StageQuery q = query(m, 1024, 1024, 1);
  // 4096 image and 128 text tokens; per token the FFN's peak, 2 H + 2 F = 30720 elements (above 9 H), bf16
  const double one = (4096.0 + 128) * 30720 * 2;
  EXPECT_DOUBLE_EQ(activationBytesPerRank(m, 2, q), one);
  q.batch = 3;
  EXPECT_DOUBLE_EQ(activationBytesPerRank(m, 2, q), 3 * one);
  StageQuery u4 = query(m, 1024, 1024, 1, 4);
  EXPECT_DOUBLE_EQ(activationBytesPerRank(m, 2, u4), (1024.0 + 128) * 30720 * 2);
  u4.layout.cfg = 2;  // two halves of 4: each pass on 2 ranks
  u4.layout.ulysses = 2;
  EXPECT_DOUBLE_EQ(activationBytesPerRank(m, 2, u4), (2048.0 + 128) * 30720 * 2);
  // an H20's 96 GB less the 20.4e9 bf16 weights every rank holds
  const Hardware& h20 = hardware("h20");
  EXPECT_EQ(maxBatch(m, h20, q), static_cast<int32_t>(std::floor((96e9 - 20.4e9 * 2) / one)));
  Hardware small = h20;
  small.mem_bytes = 40e9;  // not even the weights
  EXPECT_EQ(maxBatch(m, small, q), 0);
  small.mem_bytes = 0;
  EXPECT_NE(errorOf([&] { maxBatch(m, small, q); }).find("memory size is unknown"), std::string::npos);
  // a two-expert model keeps both experts
  const ModelArch& w = modelArch("wan2.2");
  const StageQuery v = query(w, 720, 1280, 81, 8);
  EXPECT_EQ(maxBatch(w, h20, v),
            static_cast<int32_t>(std::floor((96e9 - 2 * 14.0e9 * 2) / activationBytesPerRank(w, 2, v))));
  // the cpu's memory is shared among the cluster's ranks
  EXPECT_DOUBLE_EQ(cluster("cpu", 4).hw.mem_bytes, hardware("cpu").mem_bytes / 4);
}

}  // namespace
}  // namespace cost
}  // namespace gfdit
