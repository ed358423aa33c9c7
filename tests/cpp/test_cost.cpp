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
  EXPECT_EQ(w.tokens(720, 1280, 81), 21 * 45 * 80);  // DESIGN.md: 75,600
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
  msg = errorOf([] { stageFromName("denoise"); });
  EXPECT_NE(msg.find("step"), std::string::npos);
  EXPECT_EQ(stageFromName("migrate"), Stage::kMigrate);
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
      const double t = cm->seconds(Stage::kDenoiseStep, query(m, side, side, f, 2, 1));
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
    const double off = cm->seconds(Stage::kDenoiseStep, query(m, 720, 1280, 81, u, 1, 1.0));
    const double on = cm->seconds(Stage::kDenoiseStep, query(m, 720, 1280, 81, u, 1, 4.0));
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
  const double s2 = cm->seconds(Stage::kDenoiseStep, query(m, 512, 512, 1, 2));
  const double s4 = cm->seconds(Stage::kDenoiseStep, query(m, 512, 512, 1, 4));
  EXPECT_GT(s4, 0.95 * s2);
  const double l1 = cm->seconds(Stage::kDenoiseStep, query(m, 1536, 1536, 1, 1));
  const double l4 = cm->seconds(Stage::kDenoiseStep, query(m, 1536, 1536, 1, 4));
  EXPECT_GT(l1 / l4, 2.5);
}

TEST(CostAnalytic, LargeVideoStepsScaleWithDegree) {
  const ModelArch& m = modelArch("wan2.2");
  auto cm = makeAnalyticCostModel(m, cluster("h20x8"));
  const double t1 = cm->seconds(Stage::kDenoiseStep, query(m, 720, 1280, 81, 1, 1, 4.0));
  double prev = t1;
  for (int32_t d : {2, 4, 8}) {
    const double t = cm->seconds(Stage::kDenoiseStep, query(m, 720, 1280, 81, d, 1, 4.0));
    EXPECT_LT(t, prev);
    EXPECT_GT(t1 / t, 0.85 * d) << "degree " << d;  // close to linear for 75,600 tokens
    prev = t;
  }
  // Ulysses 4 x ring 2 is as good as Ulysses 8 within a node (the ring rotation hides behind compute).
  const double u8 = cm->seconds(Stage::kDenoiseStep, query(m, 720, 1280, 81, 8, 1, 4.0));
  const double u4r2 = cm->seconds(Stage::kDenoiseStep, query(m, 720, 1280, 81, 4, 2, 4.0));
  EXPECT_NEAR(u4r2 / u8, 1.0, 0.1);
}

TEST(CostAnalytic, InterNodeUlyssesIsSlower) {
  const ModelArch& m = modelArch("wan2.2");
  auto cm = makeAnalyticCostModel(m, cluster("h20x16"));
  const double intra = cm->seconds(Stage::kDenoiseStep, query(m, 720, 1280, 81, 8, 1, 4.0, 1));
  const double inter = cm->seconds(Stage::kDenoiseStep, query(m, 720, 1280, 81, 8, 1, 4.0, 2));
  EXPECT_GT(inter, intra);  // a 720p video step is compute-bound: the NIC costs a few percent
  const ModelArch& q = modelArch("qwen-image");
  auto cq = makeAnalyticCostModel(q, cluster("h20x16"));
  const double q_intra = cq->seconds(Stage::kDenoiseStep, query(q, 1024, 1024, 1, 8, 1, 4.0, 1));
  const double q_inter = cq->seconds(Stage::kDenoiseStep, query(q, 1024, 1024, 1, 8, 1, 4.0, 2));
  EXPECT_GT(q_inter, 1.05 * q_intra);
  // Across two nodes, Torus (ring inside a node, the all-to-all pipelined against it) beats USP with
  // Ulysses across the nodes.
  StageQuery usp = query(m, 720, 1280, 81, 2, 8, 4.0, 2);
  usp.layout.placement = 2;  // ring-low: Ulysses crosses the nodes
  StageQuery torus = usp;
  torus.layout.mode = 1;
  EXPECT_LT(cm->seconds(Stage::kDenoiseStep, torus), cm->seconds(Stage::kDenoiseStep, usp));
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
  EXPECT_NE(errorOf([&] { cm->seconds(Stage::kDenoiseStep, q); }).find("degree"), std::string::npos);
  EXPECT_NE(errorOf([&] { cm->seconds(Stage::kDenoiseStep, query(m, 1024, 1024, 1, 16)); }).find("h20x8"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { cm->seconds(Stage::kDenoiseStep, query(m, 1024, 1024, 1, 5)); }).find("heads"),
            std::string::npos);
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
  add(Stage::kDenoiseStep, 18, 2, 1, true, 0, 0.010);
  add(Stage::kDenoiseStep, 54, 2, 1, true, 0, 0.020);
  add(Stage::kDenoiseStep, 150, 2, 1, true, 0, 0.060);
  add(Stage::kDenoiseStep, 54, 2, 1, true, 0, 0.030);  // a repeat: averaged with 0.020
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
  EXPECT_DOUBLE_EQ(cm->seconds(Stage::kDenoiseStep, tinyQuery(18, 2)), 0.010);
  EXPECT_DOUBLE_EQ(cm->seconds(Stage::kDenoiseStep, tinyQuery(54, 2)), 0.025);
  EXPECT_DOUBLE_EQ(cm->seconds(Stage::kDenoiseStep, tinyQuery(150, 2)), 0.060);
  EXPECT_NEAR(cm->seconds(Stage::kDenoiseStep, tinyQuery(36, 2)), 0.0175, 1e-12);
  EXPECT_NEAR(cm->seconds(Stage::kDenoiseStep, tinyQuery(102, 2)), 0.0425, 1e-12);
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
  std::string msg = errorOf([&] { cm->seconds(Stage::kDenoiseStep, tinyQuery(151, 2)); });
  EXPECT_NE(msg.find("151 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("32x48x9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step"), std::string::npos) << msg;
  EXPECT_NE(msg.find("degree 2"), std::string::npos) << msg;
  msg = errorOf([&] { cm->seconds(Stage::kDenoiseStep, tinyQuery(54, 4)); });
  EXPECT_NE(msg.find("degree 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("never measured"), std::string::npos) << msg;
  msg = errorOf([&] { cm->seconds(Stage::kDenoiseStep, tinyQuery(54, 2, false)); });
  EXPECT_NE(msg.find("guidance off"), std::string::npos) << msg;
  // encode on a degree never measured: the nearest measured degree (only core contention differs)
  EXPECT_NEAR(cm->seconds(Stage::kEncode, tinyQuery(54, 4)), 0.05, 1e-12);
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
