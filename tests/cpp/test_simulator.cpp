// The simulator: the control plane on simulated workers, checked against times worked out by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "control_harness.h"
#include "gfdit/error.h"
#include "gfdit/simulator.h"

using namespace gfdit;
using namespace gfdit::runtime;
using gfdit::testing::FixedCost;

namespace {

cost::Cluster gpus(int n, int per_node = 8) {
  cost::Cluster c;
  c.name = "test";
  c.num_ranks = n;
  c.ranks_per_node = per_node;
  c.hw.name = "test";
  c.hw.regroup_s = 0;
  c.hw.num_cores = 0;
  return c;
}

SimRequest image(uint64_t id, double arrival, int steps, int side = 64) {
  SimRequest r;
  r.id = id;
  r.arrival_s = arrival;
  r.shape.height = side;
  r.shape.width = side;
  r.shape.num_frames = 1;
  r.shape.num_steps = steps;
  return r;
}

}  // namespace

TEST(Simulator, OneRequestTakesTheSumOfItsStages) {
  // 64x64: 16 tokens; a step 0.016 s * 16/256 = 1 ms on one rank
  auto cost = std::make_shared<FixedCost>(0.010, 0.016, 0.020, 0.001);
  SimOptions opt;
  opt.dispatch_s = 0.0001;
  opt.completion_s = 0.0002;
  Simulator sim(cost, gpus(1), makePolicy("fcfs"), opt);
  SimResult res = sim.run({image(7, 0.5, 5)});
  ASSERT_EQ(res.requests.size(), 1u);
  const SimOutcome& o = res.requests[0];
  EXPECT_EQ(o.id, 7u);
  EXPECT_EQ(o.state, RequestState::kDone);
  // the encode and the steps behind it in the FIFO (dispatched ahead, so no round trip between them), then
  // the decode once the last step's completion is back
  double expect = 0.5 + 0.0001 + 0.010 + 5 * 0.001 + 0.0002 + (0.0001 + 0.020 + 0.0002);
  EXPECT_NEAR(o.finish_s, expect, 1e-6);
  EXPECT_NEAR(res.busy_rank_s, 0.010 + 5 * 0.001 + 0.020, 1e-6);
  EXPECT_EQ(res.num_ranks, 1);
}

TEST(Simulator, StaticGroupsQueueWhileFcfsSpreads) {
  // perfect scaling: a step on d ranks takes 1/d; two requests at once on 2 ranks
  auto cost = std::make_shared<FixedCost>(0.0, 0.016, 0.0, 0.0, 1.0);
  Simulator s2(cost, gpus(2), makePolicy("static:2"));
  SimResult r2 = s2.run({image(0, 0, 10), image(1, 0, 10)});
  // static:2: one after the other, 10 ms each on two ranks (0.5 ms a step)
  EXPECT_NEAR(r2.requests[0].finish_s, 0.005, 1e-6);
  EXPECT_NEAR(r2.requests[1].finish_s, 0.010, 1e-6);
  Simulator s1(cost, gpus(2), makePolicy("static:1"));
  SimResult r1 = s1.run({image(0, 0, 10), image(1, 0, 10)});
  EXPECT_NEAR(r1.requests[0].finish_s, 0.010, 1e-6);
  EXPECT_NEAR(r1.requests[1].finish_s, 0.010, 1e-6);
  EXPECT_NEAR(r1.busy_rank_s, 0.020, 1e-6);
}

TEST(Simulator, ALoneRequestTakesEveryRankOfAWorldOfSix) {
  // perfect scaling (1 ms a step on one rank): on all six ranks, 12 steps take 2 ms
  auto cost = std::make_shared<FixedCost>(0.0, 0.016, 0.0, 0.0, 1.0);
  Simulator sim(cost, gpus(6), makePolicy("fcfs"));
  SimResult res = sim.run({image(0, 0, 12)});
  ASSERT_EQ(res.requests.size(), 1u);
  EXPECT_NEAR(res.requests[0].finish_s, 0.002, 1e-6);
  EXPECT_NEAR(res.busy_rank_s, 6 * 0.002, 1e-6);
}

TEST(Simulator, SharedCoresSlowConcurrentTasks) {
  auto cost = std::make_shared<FixedCost>(0.0, 0.016, 0.0, 0.0);
  SimOptions opt;
  opt.num_cores = 1;  // two ranks on one core
  Simulator sim(cost, gpus(2), makePolicy("static:1"), opt);
  SimResult r = sim.run({image(0, 0, 10), image(1, 0, 10)});
  EXPECT_NEAR(r.requests[0].finish_s, 0.020, 1e-6);  // each runs at half speed
  EXPECT_NEAR(r.requests[1].finish_s, 0.020, 1e-6);
  SimResult alone = sim.run({image(0, 0, 10)});
  EXPECT_NEAR(alone.requests[0].finish_s, 0.010, 1e-6);
}

TEST(Simulator, RegroupCostIsPaidOncePerRankSet) {
  auto cost = std::make_shared<FixedCost>(0.0, 0.016, 0.0, 0.0, 1.0);
  SimOptions opt;
  opt.regroup_s = 0.5;
  Simulator sim(cost, gpus(2), makePolicy("static:2"), opt);
  SimResult r = sim.run({image(0, 0, 4), image(1, 1.0, 4)});
  EXPECT_NEAR(r.requests[0].finish_s, 0.5 + 0.002, 1e-6);  // first use of {0,1}
  EXPECT_NEAR(r.requests[1].finish_s, 1.0 + 0.002, 1e-6);  // cached afterwards
}

TEST(Simulator, ManyRequestsAllFinishAndIntervalsCoverBusyTime) {
  auto cost = std::make_shared<FixedCost>(0.002, 0.016, 0.003, 0.0005, 0.8);
  SimOptions opt;
  opt.record_intervals = true;
  Simulator sim(cost, gpus(8), makePolicy("fcfs"), opt);
  std::vector<SimRequest> reqs;
  for (int i = 0; i < 2000; ++i) reqs.push_back(image(i, i * 0.004, 4 + i % 20, 64 + 16 * (i % 5)));
  SimResult r = sim.run(reqs);
  double busy = 0;
  for (const auto& iv : r.intervals) {
    ASSERT_GE(iv.end_s, iv.start_s);
    busy += iv.end_s - iv.start_s;
  }
  EXPECT_NEAR(busy, r.busy_rank_s, 1e-6 * r.busy_rank_s);
  for (const auto& o : r.requests) {
    ASSERT_EQ(o.state, RequestState::kDone);
    ASSERT_GT(o.finish_s, o.arrival_s);
  }
  EXPECT_GT(r.num_tasks, 2000u * 6);
  EXPECT_GT(r.stats.regroups, 0u);
}

TEST(Simulator, RefusesUnorderedTraces) {
  auto cost = std::make_shared<FixedCost>(0.0, 0.016, 0.0, 0.0);
  Simulator sim(cost, gpus(2), makePolicy("fcfs"));
  EXPECT_THROW(sim.run({image(0, 1.0, 2), image(1, 0.5, 2)}), Error);
  EXPECT_THROW(sim.run({image(0, 0, 2), image(0, 0.5, 2)}), Error);
  SimRequest bad = image(0, 0, 2, 63);
  EXPECT_THROW(sim.run({bad}), Error);
}

TEST(Simulator, CollectivesLoseTheirShareWhenRanksOutnumberCores) {
  // 4 ranks on 2 cores; two requests on two groups of two (static:2). A step of a two-rank group alone takes
  // 1 ms (perfect scaling of 2 ms); both at once share the cores (x2), and collectives get only 75% of that.
  auto cost = std::make_shared<FixedCost>(0.0, 0.032, 0.0, 0.0, 1.0);
  SimOptions opt;
  opt.num_cores = 2;
  opt.collective_efficiency = 0.75;
  Simulator sim(cost, gpus(4), makePolicy("static:2"), opt);
  SimResult alone = sim.run({image(0, 0, 10)});
  EXPECT_NEAR(alone.requests[0].finish_s, 0.010, 1e-6);  // two members fit two cores
  SimResult both = sim.run({image(0, 0, 10), image(1, 0, 10)});
  EXPECT_NEAR(both.requests[0].finish_s, 0.010 * 2 / 0.75, 1e-6);
  EXPECT_NEAR(both.requests[1].finish_s, 0.010 * 2 / 0.75, 1e-6);
  Simulator ones(cost, gpus(4), makePolicy("static:1"), opt);  // one-member tasks only share the cores
  SimResult four = ones.run({image(0, 0, 5), image(1, 0, 5), image(2, 0, 5), image(3, 0, 5)});
  for (const auto& o : four.requests) EXPECT_NEAR(o.finish_s, 0.010 * 2, 1e-6);
}

namespace {

/// FixedCost whose decode takes 20 ms on one rank and 20 / d ms on d ranks.
class SplitDecode : public FixedCost {
 public:
  SplitDecode() : FixedCost(0.010, 0.016, 0.020, 0.001, 1.0) {}
  double seconds(cost::Stage stage, const cost::StageQuery& q) const override {
    if (stage == cost::Stage::kDecode) return 0.020 / std::max(1, q.degree);
    return FixedCost::seconds(stage, q);
  }
};

}  // namespace

TEST(Simulator, AParallelDecodeHoldsItsMembersForItsDegreesTime) {
  // fcfs spreads the one request over both ranks; the cost model's fastest decode is on both (10 ms), and
  // it holds both: it is a collective (NOTE [parallel decode] in control.cpp)
  auto cost = std::make_shared<SplitDecode>();
  SimOptions opt;
  opt.dispatch_s = 0.0001;
  opt.completion_s = 0.0002;
  Simulator sim(cost, gpus(2), makePolicy("fcfs"), opt);
  SimResult res = sim.run({image(3, 0.5, 4)});
  ASSERT_EQ(res.requests.size(), 1u);
  const SimOutcome& o = res.requests[0];
  EXPECT_EQ(o.state, RequestState::kDone);
  // the encode once on rank 0 (10 ms), its copy to both (1 ms), 4 steps of 0.5 ms on two ranks, then the decode on
  // both
  double expect = 0.5 + 0.0001 + 0.010 + 0.001 + 4 * 0.0005 + 0.0002 + (0.0001 + 0.010 + 0.0002);
  EXPECT_NEAR(o.finish_s, expect, 1e-6);
  EXPECT_NEAR(res.busy_rank_s, 0.010 + 2 * (0.001 + 4 * 0.0005 + 0.010), 1e-6);
}

TEST(Simulator, ABatchRunsItsStepsTogetherAndDecodesInTurn) {
  // 64x64: a step 1 ms alone, 1.2 ms for two together (see NOTE [batches] in control.cpp); two requests arrive
  // together on one rank: both encode (10 ms each), four batched steps, then a decodes (20 ms) and b after it
  auto cost = std::make_shared<FixedCost>(0.010, 0.016, 0.020, 0.001);
  cost->batches(4, 0.2);
  Simulator sim(cost, gpus(1), makePolicy("fcfs"), SimOptions());
  SimResult res = sim.run({image(1, 0.0, 4), image(2, 0.0, 4)});
  ASSERT_EQ(res.requests.size(), 2u);
  EXPECT_NEAR(res.requests[0].finish_s, 2 * 0.010 + 4 * 0.0012 + 0.020, 1e-6);
  EXPECT_NEAR(res.requests[1].finish_s, 2 * 0.010 + 4 * 0.0012 + 2 * 0.020, 1e-6);
  EXPECT_NEAR(res.busy_rank_s, 2 * 0.010 + 4 * 0.0012 + 2 * 0.020, 1e-6);
  EXPECT_EQ(res.stats.batched_steps, 4u);
  // without batching the steps run in turn: 8 ms of steps instead of 4.8
  Simulator alone(cost, gpus(1), makePolicy("fcfs:batch=1"), SimOptions());
  SimResult one = alone.run({image(1, 0.0, 4), image(2, 0.0, 4)});
  EXPECT_NEAR(one.busy_rank_s, 2 * 0.010 + 8 * 0.001 + 2 * 0.020, 1e-6);
  EXPECT_EQ(one.stats.batched_steps, 0u);
}

TEST(Simulator, SplitStagesHandTheStateToTheAuxiliaryRankAndBack) {
  // fcfs:stages=split on two ranks (NOTE [stages] in control.cpp): the encode on rank 1 (10 ms), the state to rank
  // 0 (1 ms), four steps there (1 ms each), the latent back to rank 1 (1 ms) and its decode there (20 ms)
  auto cost = std::make_shared<FixedCost>(0.010, 0.016, 0.020, 0.001);
  SimOptions opt;
  opt.record_intervals = true;
  Simulator sim(cost, gpus(2), makePolicy("fcfs:stages=split"), opt);
  SimResult res = sim.run({image(1, 0.0, 4)});
  ASSERT_EQ(res.requests.size(), 1u);
  EXPECT_EQ(res.requests[0].state, RequestState::kDone);
  EXPECT_NEAR(res.requests[0].finish_s, 0.010 + 0.001 + 4 * 0.001 + 0.001 + 0.020, 1e-6);
  for (const SimInterval& iv : res.intervals) {
    if (iv.kind == TaskKind::kEncode || iv.kind == TaskKind::kDecode) EXPECT_EQ(iv.rank, 1);
    if (iv.kind == TaskKind::kDenoise) EXPECT_EQ(iv.rank, 0);
  }
  // the same request with every stage on its group: the encode on rank 0, its copy, the steps on both ranks, the
  // decode on one (this cost model's decode takes 20 ms on any number: the smallest degree)
  Simulator both(cost, gpus(2), makePolicy("fcfs"), SimOptions());
  SimResult spread = both.run({image(1, 0.0, 4)});
  EXPECT_NEAR(spread.requests[0].finish_s, 0.010 + 0.001 + 4 * 0.0005 + 0.020, 1e-6);
}
