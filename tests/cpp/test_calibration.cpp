// Tests of the inter-node calibration (NOTE [inter-node calibration] in src/runtime/cost.cpp): the terms that
// calibratedCluster fits to measured links, those that transferredCluster scales on another cluster, their
// refusals, and what the calibrated terms do to the analytic model's price of a layout across nodes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "error_of.h"
#include "gfdit/cost.h"
#include "gfdit/error.h"

namespace gfdit {
namespace cost {
namespace {

using gfdit::testing::errorOf;

// A link as the emulated cluster measures it: two ranks per node sharing a 1 Gbit/s link, drawn around the
// figures of a real run so that no test depends on one set of numbers.
LinkMeasurement drawnLink(std::mt19937& gen, int32_t node_a = 0, int32_t node_b = 1) {
  std::uniform_real_distribution<double> u(0.8, 1.2);
  LinkMeasurement l;
  l.node_a = node_a;
  l.node_b = node_b;
  l.ranks_per_node = 2;
  l.line_bytes_per_s = 125e6;
  l.stream_bytes_per_s = 118e6 * u(gen);
  l.concurrent_bytes_per_s = std::min(l.line_bytes_per_s, 115e6 * u(gen));
  l.round_trip_s = 60e-6 * u(gen);
  l.collective_s = 70e-6 * u(gen);
  l.intra_collective_s = 20e-6 * u(gen);
  return l;
}

StageQuery stepQuery(const ModelArch& m, int64_t tokens, int32_t u, int32_t r, Placement placement, int32_t num_nodes) {
  StageQuery q;
  q.shape.height = m.default_height;
  q.shape.width = m.default_width;
  q.shape.num_frames = m.default_frames;
  q.shape.num_steps = m.default_steps;
  q.shape.guidance_scale = m.default_guidance;
  q.shape.tokens = tokens;
  q.degree = u * r;
  q.layout.ulysses = u;
  q.layout.ring = r;
  q.layout.placement = placement;
  q.num_nodes = num_nodes;
  return q;
}

TEST(CostCalibration, NoLinksLeaveTheClusterAsItIs) {
  const Cluster h20 = cluster("h20x16");
  for (const Cluster& c : {calibratedCluster(h20, {}), transferredCluster(h20, {})}) {
    EXPECT_EQ(c.name, h20.name);
    EXPECT_EQ(c.hw.inter_node_bw, h20.hw.inter_node_bw);
    EXPECT_EQ(c.hw.inter_node_latency_s, h20.hw.inter_node_latency_s);
    EXPECT_EQ(c.ranks_per_node, h20.ranks_per_node);
  }
}

TEST(CostCalibration, FitTakesEachRanksShareAndTheSlowestLink) {
  std::mt19937 gen(11);
  const Cluster cpu = cluster("cpu", 6);
  // three nodes of two ranks: three pairs of nodes, the worst of each figure wins
  std::vector<LinkMeasurement> links = {drawnLink(gen, 0, 1), drawnLink(gen, 0, 2), drawnLink(gen, 1, 2)};
  double want_bw = 1e300;
  double want_latency = 0;
  for (const LinkMeasurement& l : links) {
    want_bw = std::min(want_bw, l.concurrent_bytes_per_s / 2);
    want_latency = std::max(want_latency, l.collective_s);
  }
  const Cluster c = calibratedCluster(cpu, links);
  EXPECT_DOUBLE_EQ(c.hw.inter_node_bw, want_bw);
  EXPECT_DOUBLE_EQ(c.hw.inter_node_latency_s, want_latency);
  EXPECT_EQ(c.ranks_per_node, 2);
  EXPECT_EQ(c.hw.ranks_per_node, 2);
  EXPECT_EQ(c.nodeOf(3), 1);
  EXPECT_EQ(c.num_ranks, 6);
  // the intra-node terms are the hardware's own
  EXPECT_EQ(c.hw.link_bw, cpu.hw.link_bw);
  EXPECT_EQ(c.hw.collective_latency_s, cpu.hw.collective_latency_s);
  // the datasheet's 5 GB/s per rank across nodes was 80 times the 1 Gbit/s link's share of a rank
  EXPECT_LT(c.hw.inter_node_bw, cpu.hw.inter_node_bw / 50);
}

TEST(CostCalibration, TransferScalesByTheMeasuredShareAndLatencyRatio) {
  std::mt19937 gen(12);
  const Cluster h20 = cluster("h20x16");
  const LinkMeasurement a = drawnLink(gen, 0, 1);
  const LinkMeasurement b = drawnLink(gen, 0, 1);
  const Cluster c = transferredCluster(h20, {a, b});
  const double share = std::min(a.concurrent_bytes_per_s, b.concurrent_bytes_per_s) / 125e6;
  const double ratio = std::max(a.collective_s / a.intra_collective_s, b.collective_s / b.intra_collective_s);
  EXPECT_DOUBLE_EQ(c.hw.inter_node_bw, 50e9 * share);
  EXPECT_DOUBLE_EQ(c.hw.inter_node_latency_s, 30e-6 * ratio);
  EXPECT_LE(c.hw.inter_node_bw, h20.hw.inter_node_bw);  // a share of the line rate, never more
  // the topology and everything inside a node stay the datasheet's
  EXPECT_EQ(c.ranks_per_node, 8);
  EXPECT_EQ(c.num_ranks, 16);
  EXPECT_EQ(c.hw.link_bw, h20.hw.link_bw);
  EXPECT_EQ(c.hw.collective_latency_s, h20.hw.collective_latency_s);
}

TEST(CostCalibration, TransferNeverMakesCrossingCheaperThanStaying) {
  LinkMeasurement l;
  l.ranks_per_node = 2;
  l.line_bytes_per_s = 125e6;
  l.concurrent_bytes_per_s = 120e6;
  l.collective_s = 15e-6;  // less than inside a node: the noise of a shared machine
  l.intra_collective_s = 25e-6;
  const Cluster c = transferredCluster(cluster("h20x16"), {l});
  EXPECT_DOUBLE_EQ(c.hw.inter_node_latency_s, c.hw.collective_latency_s);
}

TEST(CostCalibration, RefusesLinksItCannotUse) {
  const Cluster cpu = cluster("cpu", 4);
  std::mt19937 gen(13);
  LinkMeasurement zero = drawnLink(gen);
  zero.concurrent_bytes_per_s = 0;
  EXPECT_NE(errorOf([&] { calibratedCluster(cpu, {zero}); }).find("concurrent_bytes_per_s"), std::string::npos);
  LinkMeasurement nan = drawnLink(gen);
  nan.collective_s = std::nan("");
  EXPECT_NE(errorOf([&] { calibratedCluster(cpu, {nan}); }).find("link 0"), std::string::npos);
  LinkMeasurement three = drawnLink(gen);
  three.ranks_per_node = 3;
  EXPECT_NE(errorOf([&] { calibratedCluster(cpu, {drawnLink(gen), three}); }).find("ranks per node"),
            std::string::npos);
  LinkMeasurement no_line = drawnLink(gen);
  no_line.line_bytes_per_s = 0;
  EXPECT_NE(errorOf([&] { transferredCluster(cluster("h20x16"), {no_line}); }).find("line rate"), std::string::npos);
  LinkMeasurement no_intra = drawnLink(gen);
  no_intra.intra_collective_s = 0;
  EXPECT_NE(errorOf([&] { transferredCluster(cluster("h20x16"), {no_intra}); }).find("intra_collective_s"),
            std::string::npos);
}

TEST(CostCalibration, ASlowerLinkMakesTheAxisAcrossNodesCostMore) {
  // tiny-wan on 2 x 2 ranks: a layout whose Ulysses crosses the nodes (ring-low) pays the measured link in its
  // all-to-alls; the datasheet's link made that almost free
  std::mt19937 gen(14);
  const ModelArch& m = modelArch("tiny-wan");
  const Cluster two_nodes = [] {
    Cluster c = cluster("cpu", 4);
    c.ranks_per_node = 2;
    c.hw.ranks_per_node = 2;
    return c;
  }();
  const auto assumed = makeAnalyticCostModel(m, two_nodes);
  const auto measured = makeAnalyticCostModel(m, calibratedCluster(two_nodes, {drawnLink(gen)}));
  const auto inside = makeAnalyticCostModel(m, cluster("cpu", 4));  // one node: nothing crosses
  for (int64_t tokens : {1024, 4096, 16384}) {
    const StageQuery across = stepQuery(m, tokens, 2, 2, Placement::kRingLow, 2);
    const StageQuery one_node = stepQuery(m, tokens, 2, 2, Placement::kRingLow, 1);
    const double before = assumed->seconds(Stage::kDenoise, across);
    const double after = measured->seconds(Stage::kDenoise, across);
    EXPECT_GT(after, before) << tokens;
    EXPECT_GT(before, 0.99 * inside->seconds(Stage::kDenoise, one_node)) << tokens;
    // the difference grows with the bytes that cross (linear in tokens), so the larger shape pays more
    if (tokens == 16384) {
      const StageQuery small = stepQuery(m, 1024, 2, 2, Placement::kRingLow, 2);
      EXPECT_GT(after - before, measured->seconds(Stage::kDenoise, small) - assumed->seconds(Stage::kDenoise, small));
    }
  }
}

}  // namespace
}  // namespace cost
}  // namespace gfdit
