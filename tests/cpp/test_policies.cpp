// The built-in policies on small hand-made views (who gets which ranks, who waits), and in the simulator
// against deadlines worked out from the cost model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "control_harness.h"
#include "gfdit/error.h"
#include "gfdit/planning.h"
#include "gfdit/simulator.h"

using namespace gfdit;
using namespace gfdit::runtime;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kSec = 1000000000;

// A request whose step takes step_s[k] on 2^k ranks (1, 2, 4, 8).
RequestRecord record(uint64_t id, std::vector<double> step_s, int steps_left, double arrival_s = 0) {
  RequestRecord r;
  r.id = id;
  r.state = RequestState::kDenoising;
  r.num_steps = 50;
  r.step = 50 - steps_left;
  r.arrival_ns = static_cast<int64_t>(arrival_s * kSec);
  r.shape.height = r.shape.width = 512;
  r.shape.num_steps = 50;
  r.shape.tokens = 1024;
  r.max_degree = kMaxRanks;
  r.cost.known = true;
  r.cost.max_ulysses = 8;
  r.cost.step_s.fill(kInf);  // degrees that are not powers of two: not allowed
  for (int k = 0; k < static_cast<int>(step_s.size()); ++k) r.cost.step_s[1 << k] = step_s[k];
  for (int d = 1; d <= kMaxRanks; ++d) r.cost.layout[d] = plainLayout(d, 8);
  return r;
}

// A request whose step takes t1 / d on every degree d up to `top` (any degree, not only powers of two).
RequestRecord scalingRecord(uint64_t id, double t1, int steps_left, int top = kMaxRanks, double arrival_s = 0) {
  RequestRecord r = record(id, {}, steps_left, arrival_s);
  for (int d = 1; d <= top; ++d) r.cost.step_s[d] = t1 / d;
  return r;
}

// Scales perfectly up to 8 ranks.
std::vector<double> scales(double t1) { return {t1, t1 / 2, t1 / 4, t1 / 8}; }
// Communication outweighs compute past 2 ranks (a 512 px image).
std::vector<double> smallImage() { return {0.372, 0.315, 0.330, 0.442}; }

struct View {
  std::vector<RequestRecord> recs;
  SchedulerView v;
  View(int world, std::vector<int> free_ranks, int64_t now_ns = 0) {
    v.world_size = world;
    v.free_ranks = std::move(free_ranks);
    v.now_ns = now_ns;
    recs.reserve(64);
  }
  RequestRecord& add(RequestRecord r, bool running = false) {
    r.busy = running;
    recs.push_back(std::move(r));
    return recs.back();
  }
  const SchedulerView& build() {
    v.ready.clear();
    v.running.clear();
    for (const auto& r : recs) (r.busy ? v.running : v.ready).push_back(&r);
    std::sort(v.ready.begin(), v.ready.end(),
              [](const RequestRecord* a, const RequestRecord* b) { return a->arrival_ns < b->arrival_ns; });
    return v;
  }
};

std::vector<int> allRanks(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

std::map<uint64_t, Decision> byId(const std::vector<Decision>& ds) {
  std::map<uint64_t, Decision> m;
  for (const auto& d : ds) m[d.request_id] = d;
  return m;
}

const char* kDynamic[] = {"fcfs", "srtf", "edf", "priority"};

}  // namespace

TEST(Policies, SmallImageIsNotSpreadOverManyRanks) {
  for (const char* name : kDynamic) {
    View view(8, allRanks(8));
    view.add(record(1, smallImage(), 20));
    auto ds = makePolicy(name)->schedule(view.build());
    ASSERT_EQ(ds.size(), 1u) << name;
    EXPECT_EQ(ds[0].ranks.size(), 2u) << name << ": 2 ranks are 15% faster, 4 and 8 slower";
    EXPECT_EQ(ds[0].layout.degree(), 2) << name;
  }
}

TEST(Policies, LargeRequestAloneGetsEveryRankThatPays) {
  for (const char* name : kDynamic) {
    View view(8, allRanks(8));
    view.add(record(1, scales(10.0), 40));
    auto ds = makePolicy(name)->schedule(view.build());
    ASSERT_EQ(ds.size(), 1u) << name;
    EXPECT_EQ(ds[0].ranks, allRanks(8)) << name;
    // lent ranks come back at the next step: one step, nothing dispatched ahead
    EXPECT_EQ(ds[0].num_steps, 1) << name;
    EXPECT_FALSE(ds[0].dispatch_ahead) << name;
  }
  View busy(1, {0});
  busy.add(record(1, {0.02}, 40));
  auto ds = makePolicy("fcfs")->schedule(busy.build());
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_TRUE(ds[0].dispatch_ahead) << "on its base degree a request keeps steps queued";
  EXPECT_EQ(ds[0].num_steps, 2);
}

TEST(Policies, UnderLoadEveryRequestRunsOnOneRankAndSrtfPicksTheShortest) {
  View view(4, allRanks(4));
  // arrival order 1..6, remaining work 60, 50, 10, 40, 20, 30 s on one rank
  double work[] = {60, 50, 10, 40, 20, 30};
  for (int i = 0; i < 6; ++i) view.add(record(i + 1, scales(work[i] / 10), 10, 0.1 * i));
  const SchedulerView& v = view.build();
  auto fcfs = byId(makePolicy("fcfs")->schedule(v));
  auto srtf = byId(makePolicy("srtf")->schedule(v));
  ASSERT_EQ(fcfs.size(), 4u);
  ASSERT_EQ(srtf.size(), 4u);
  for (uint64_t id : {1, 2, 3, 4}) EXPECT_EQ(fcfs.count(id), 1u) << "fcfs runs the oldest";
  for (uint64_t id : {3, 5, 6, 4}) EXPECT_EQ(srtf.count(id), 1u) << "srtf runs the shortest";
  for (auto& kv : srtf) EXPECT_EQ(kv.second.ranks.size(), 1u);
}

TEST(Policies, LongRequestYieldsRanksAtItsBoundaryAndShrinksOntoItsHolders) {
  // The long request held ranks 0-3 for its last step; four short ones run on 4-7; a fifth waits.
  View view(8, {0, 1, 2, 3});
  RequestRecord& lng = view.add(record(1, scales(100.0), 40, 0.0));
  lng.ranks = {0, 1, 2, 3};
  lng.layout.ulysses = 4;
  for (int i = 0; i < 4; ++i) {
    RequestRecord& s = view.add(record(10 + i, {1.0, 0.95, 0.95, 0.95}, 10, 1.0), true);
    s.ranks = {4 + i};
    s.layout.ulysses = 1;
  }
  view.add(record(20, {1.0, 0.95, 0.95, 0.95}, 10, 2.0));
  auto ds = byId(makePolicy("srtf")->schedule(view.build()));
  ASSERT_EQ(ds.count(20), 1u) << "the waiting short request runs";
  ASSERT_EQ(ds.count(1), 1u);
  EXPECT_EQ(ds[1].ranks.size(), 2u) << "the long one keeps what is left over, as a power of two";
  for (int w : ds[1].ranks) EXPECT_LT(w, 4) << "it shrinks onto ranks that hold its state";
  EXPECT_EQ(std::count(ds[1].ranks.begin(), ds[1].ranks.end(), ds[20].ranks[0]), 0);
}

TEST(Policies, WaitingRequestPrefersItsHoldersAndOthersAvoidThem) {
  View view(8, allRanks(8));
  RequestRecord& paused = view.add(record(1, {1.0, 0.6, 0.5, 0.5}, 10, 5.0));  // younger: placed second
  paused.ranks = {5, 6};
  view.add(record(2, {1.0, 0.6, 0.5, 0.5}, 10, 0.0));  // a new one
  auto ds = byId(makePolicy("fcfs")->schedule(view.build()));
  ASSERT_EQ(ds.size(), 2u);
  for (int w : ds[2].ranks) EXPECT_TRUE(w != 5 && w != 6) << "rank " << w << " holds request 1's state";
  for (int w : {5, 6}) {
    EXPECT_EQ(std::count(ds[1].ranks.begin(), ds[1].ranks.end(), w), 1) << "request 1 resumes on its holder " << w;
  }
}

TEST(Policies, EdfGivesTheSmallestDegreeThatMeetsTheDeadlineAndHopelessOnesLast) {
  // 10 steps of 8 s on one rank: 80 s; on 4 ranks 20 s. Deadline in 25 s -> 4 ranks.
  View view(8, allRanks(8), 100 * kSec);
  RequestRecord& a = view.add(record(1, scales(8.0), 10, 90.0));
  a.deadline_ns = 125 * kSec;
  RequestRecord& late = view.add(record(2, scales(8.0), 10, 10.0));  // no degree can save it
  late.deadline_ns = 101 * kSec;
  RequestRecord& loose = view.add(record(3, scales(8.0), 10, 50.0));  // 1 rank meets it
  loose.deadline_ns = 1000 * kSec;
  auto edf = byId(makePolicy("edf")->schedule(view.build()));
  ASSERT_EQ(edf.count(1), 1u);
  EXPECT_GE(edf[1].ranks.size(), 4u);
  // with one rank free, the feasible earliest deadline wins; the hopeless one is last
  View one(1, {0}, 100 * kSec);
  one.add(late);
  one.add(loose);
  auto ds = makePolicy("edf")->schedule(one.build());
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].request_id, 3u);
}

TEST(Policies, EdfLetsTheRequestThatWouldMakeOthersLateGiveWay) {
  // One rank. A needs 9 s by t=10, B 2 s by 10.5, C 2 s by 11: plain EDF runs A and both others miss. The
  // admission rule (NOTE [deadline admission]) lets A give way: B and C make it.
  View view(1, {0});
  auto add = [&](uint64_t id, double work_s, double deadline_s) {
    RequestRecord& r = view.add(record(id, {work_s / 10}, 10, 0.0));
    r.deadline_ns = static_cast<int64_t>(deadline_s * kSec);
  };
  add(1, 9.0, 10.0);
  add(2, 2.0, 10.5);
  add(3, 2.0, 11.0);
  PolicyOptions o;
  o.order = PolicyOrder::kDeadline;
  o.deadline_margin = 1.0;
  auto ds = makePlanningPolicy(o)->schedule(view.build());
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].request_id, 2u);
}

TEST(Policies, PriorityPreemptsAtTheStepBoundary) {
  // One rank. The low-priority video is at its step boundary when a high-priority image waits.
  View view(1, {0});
  RequestRecord& video = view.add(record(1, {30.0}, 40, 0.0));
  video.ranks = {0};
  RequestRecord& img = view.add(record(2, {1.0}, 20, 5.0));
  img.priority = 1;
  auto ds = makePolicy("priority")->schedule(view.build());
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].request_id, 2u) << "the image takes the rank; the video waits, paused on its holder";
  auto fcfs = makePolicy("fcfs")->schedule(view.build());
  EXPECT_EQ(fcfs[0].request_id, 1u);
}

TEST(Policies, HigherClassReservesRanksItWillGrowInto) {
  // A high-priority request runs on 2 of 4 ranks and could use 4; a low one waits: the 2 free ranks stay
  // free for the high one's next boundary.
  View view(4, {2, 3});
  RequestRecord& hi = view.add(record(1, scales(4.0), 20, 0.0), true);
  hi.priority = 1;
  hi.ranks = {0, 1};
  hi.layout.ulysses = 2;
  view.add(record(2, scales(4.0), 20, 1.0));
  EXPECT_TRUE(makePolicy("priority")->schedule(view.build()).empty());
  // fcfs (one class) gives the waiting one a rank at once
  EXPECT_FALSE(makePolicy("fcfs")->schedule(view.build()).empty());
}

TEST(Policies, GroupsStayInsideANodeAndLayoutsFollowTheTopology) {
  auto cl = cost::cluster("h20x16");
  auto cm = cost::makeAnalyticCostModel(cost::modelArch("wan2.2"), cl);
  RequestShape shape;
  shape.height = 720;
  shape.width = 1280;
  shape.num_frames = 121;
  shape.num_steps = 40;
  shape.tokens = cost::modelArch("wan2.2").tokens(720, 1280, 121);
  for (double guidance : {1.0, 4.0}) {
    shape.guidance_scale = guidance;
    for (LayoutFamily fam : {LayoutFamily::kAuto, LayoutFamily::kUsp, LayoutFamily::kSwift, LayoutFamily::kTorus}) {
      RequestCost c = predictCosts(*cm, shape, 16, 8, fam);
      ASSERT_TRUE(c.known);
      const Layout& l = c.layoutFor(16);
      EXPECT_EQ(l.degree(), 16);
      EXPECT_LE(l.ulysses, c.max_ulysses);
      if (guidance == 1.0) EXPECT_EQ(l.cfg, 1) << "no guidance: one pass, nothing to split";
      if (l.cfg == 1) {  // the group's pass spans both nodes
        if (fam == LayoutFamily::kUsp) EXPECT_EQ(l.placement, Placement::kUlyssesLow) << "Ulysses inside the node";
        if (fam == LayoutFamily::kSwift) EXPECT_EQ(l.placement, Placement::kRingLow) << "Ring inside the node";
      } else {  // CFG-parallel: a half per node, each half's pass inside its node (the family's one-node layout)
        EXPECT_EQ(l.passDegree(), 8);
        if (fam == LayoutFamily::kUsp || fam == LayoutFamily::kSwift) EXPECT_EQ(l.ulysses, 8);
      }
      if (fam == LayoutFamily::kTorus) EXPECT_EQ(l.mode, LayoutMode::kTorus);
      // auto is the fastest of all of them
      RequestCost a = predictCosts(*cm, shape, 16, 8, LayoutFamily::kAuto);
      EXPECT_LE(a.stepSeconds(16), c.stepSeconds(16) * (1 + 1e-12));
    }
  }
  // A 4-rank group on a 16-rank cluster with node 0 half busy goes to node 1 whole.
  View view(16, {0, 1, 2, 8, 9, 10, 11, 12, 13, 14, 15});
  view.v.node_of.resize(16);
  for (int w = 0; w < 16; ++w) view.v.node_of[w] = w / 8;
  view.v.cost = cm.get();
  RequestRecord r = record(1, {8.0, 4.0, 2.0, 1.9}, 10);  // 4 ranks pay, 8 do not
  view.add(r);
  auto ds = makePolicy("fcfs")->schedule(view.build());
  ASSERT_EQ(ds.size(), 1u);
  ASSERT_EQ(ds[0].ranks.size(), 4u);
  for (int w : ds[0].ranks) EXPECT_GE(w, 8) << "one node, best fit";
}

TEST(Policies, DegreesNeedNotBePowersOfTwo) {
  // A lone request that scales takes the whole world, whatever its size (6: not 4; 3: not 2).
  for (const char* name : kDynamic) {
    for (int world : {3, 5, 6, 7}) {
      View view(world, allRanks(world));
      view.add(scalingRecord(1, 10.0, 40));
      auto ds = makePolicy(name)->schedule(view.build());
      ASSERT_EQ(ds.size(), 1u) << name;
      EXPECT_EQ(ds[0].ranks, allRanks(world)) << name << " world " << world;
      EXPECT_EQ(ds[0].layout.degree(), world) << name;
    }
  }
  // Five free ranks (three busy with a decode): five, not four.
  View five(8, {0, 1, 2, 3, 4});
  five.add(scalingRecord(1, 10.0, 40));
  auto ds = makePolicy("fcfs")->schedule(five.build());
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].ranks.size(), 5u);
  // Two requests on 6 ranks: the one with far more work left gets the spare ranks, 5 against 1 ...
  View two(6, allRanks(6));
  two.add(scalingRecord(1, 10.0, 40, kMaxRanks, 0.0));
  two.add(scalingRecord(2, 0.1, 2, kMaxRanks, 1.0));
  auto by = byId(makePolicy("srtf")->schedule(two.build()));
  ASSERT_EQ(by.size(), 2u);
  EXPECT_EQ(by[1].ranks.size(), 5u);
  EXPECT_EQ(by[2].ranks.size(), 1u);
  // ... and equal work splits 3 and 3.
  View even(6, allRanks(6));
  even.add(scalingRecord(1, 10.0, 40, kMaxRanks, 0.0));
  even.add(scalingRecord(2, 10.0, 40, kMaxRanks, 1.0));
  by = byId(makePolicy("fcfs")->schedule(even.build()));
  ASSERT_EQ(by.size(), 2u);
  EXPECT_EQ(by[1].ranks.size(), 3u);
  EXPECT_EQ(by[2].ranks.size(), 3u);
  // A degree without a prediction (a profile never measured it) is skipped: 6 free, 5 and 6 unpriced -> 4.
  View gaps(6, allRanks(6));
  RequestRecord g = scalingRecord(1, 10.0, 40, 4);
  gaps.add(g);
  ds = makePolicy("fcfs")->schedule(gaps.build());
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].ranks.size(), 4u);
  // EDF's base degree is the smallest that meets the deadline, 3 here: 10 steps of 9 s on one rank, 46 s left,
  // margin 1.5 (spare ranks off: min_gain 0.99).
  View dl(8, allRanks(8), 100 * kSec);
  RequestRecord& r = dl.add(scalingRecord(1, 9.0, 10, kMaxRanks, 90.0));
  r.deadline_ns = 146 * kSec;
  PolicyOptions o;
  o.order = PolicyOrder::kDeadline;
  o.min_gain = 0.99;
  ds = makePlanningPolicy(o)->schedule(dl.build());
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].ranks.size(), 3u);
}

TEST(Policies, AnalyticModelOnWorldsThatAreNotPowersOfTwo) {
  // A long Wan 2.2 video alone on 6 and on 3 H20s takes every rank, with a layout of that degree (Ulysses may
  // split the 40 heads unevenly, e.g. 6 ways).
  const cost::ModelArch& wan = cost::modelArch("wan2.2");
  for (int world : {3, 6}) {
    auto cl = cost::cluster("h20x8", world);
    auto cm = cost::makeAnalyticCostModel(wan, cl);
    RequestRecord r = record(1, {}, 40);
    r.shape.height = 720;
    r.shape.width = 1280;
    r.shape.num_frames = 81;
    r.shape.guidance_scale = 4.0;
    r.shape.tokens = wan.tokens(720, 1280, 81);
    r.cost = predictCosts(*cm, r.shape, world, 8, LayoutFamily::kAuto);
    for (int d = 2; d <= world; ++d) EXPECT_LT(r.cost.stepSeconds(d), r.cost.stepSeconds(d - 1)) << d;
    EXPECT_FALSE(std::isfinite(r.cost.stepSeconds(world + 1)));
    for (const char* name : {"fcfs", "srtf", "edf", "priority"}) {
      View view(world, allRanks(world));
      view.v.cost = cm.get();
      view.add(r);
      auto ds = makePolicy(name)->schedule(view.build());
      ASSERT_EQ(ds.size(), 1u);
      EXPECT_EQ(ds[0].ranks, allRanks(world)) << name << " world " << world;
      EXPECT_EQ(ds[0].layout.degree(), world) << name;
      EXPECT_LE(ds[0].layout.ulysses, wan.heads);
    }
  }
  // bestLayout factorises degrees that are not powers of two: 12 = 6 x 2, 4 x 3, 3 x 4, ... (here on two
  // nodes of 6); every choice has Ulysses within the heads and the right degree.
  auto cl = cost::cluster("h20x16", 12);
  auto cm = cost::makeAnalyticCostModel(wan, cl);
  RequestShape s;
  s.height = 720;
  s.width = 1280;
  s.num_frames = 81;
  s.num_steps = 40;
  s.guidance_scale = 4.0;
  s.tokens = wan.tokens(720, 1280, 81);
  for (int d : {5, 6, 7, 9, 10, 12}) {
    double t = 0;
    Layout l = bestLayout(*cm, s, d, d > 8 ? 2 : 1, wan.heads, LayoutFamily::kAuto, &t);
    EXPECT_EQ(l.degree(), d);
    EXPECT_TRUE(std::isfinite(t)) << d;
  }
}

TEST(Policies, CfgParallelWhereTheCostModelSaysItIsCheaper) {
  // A 512 px Qwen-Image image on a high-latency cluster: a second rank barely helps as Ulysses (two passes,
  // each with all-to-alls), but halves the step as CFG-parallel (one pass per rank, one exchange).
  const cost::ModelArch& qwen = cost::modelArch("qwen-image");
  cost::Cluster slow = cost::cluster("h20x8", 2);
  slow.hw.collective_latency_s = 1e-3;
  auto cm = cost::makeAnalyticCostModel(qwen, slow);
  auto request = [&](double guidance) {
    RequestRecord r = record(1, {}, 20);
    r.shape.height = r.shape.width = 512;
    r.shape.num_frames = 1;
    r.shape.guidance_scale = guidance;
    r.shape.tokens = qwen.tokens(512, 512, 1);
    r.cost = predictCosts(*cm, r.shape, 2, 8, LayoutFamily::kAuto);
    return r;
  };
  RequestRecord guided = request(4.0);
  EXPECT_EQ(guided.cost.layoutFor(2).cfg, 2);
  EXPECT_EQ(guided.cost.layoutFor(1).cfg, 1);
  for (const char* name : {"fcfs", "srtf", "edf", "priority", "static:2"}) {
    View view(2, allRanks(2));
    view.v.cost = cm.get();
    view.add(guided);
    auto ds = makePolicy(name)->schedule(view.build());
    ASSERT_EQ(ds.size(), 1u) << name;
    EXPECT_EQ(ds[0].ranks.size(), 2u) << name;
    EXPECT_EQ(ds[0].layout.cfg, 2) << name;
    EXPECT_EQ(ds[0].layout.passDegree(), 1) << name;
  }
  // The same image without guidance: one pass, never CFG-parallel; the second rank does not pay.
  RequestRecord plain = request(1.0);
  for (int d = 1; d <= 2; ++d) EXPECT_EQ(plain.cost.layoutFor(d).cfg, 1);
  for (const char* name : kDynamic) {
    View view(2, allRanks(2));
    view.v.cost = cm.get();
    view.add(plain);
    auto ds = makePolicy(name)->schedule(view.build());
    ASSERT_EQ(ds.size(), 1u) << name;
    EXPECT_EQ(ds[0].layout.cfg, 1) << name;
  }
  // A profile that measured CFG-parallel slower than Ulysses 2 (say its exchange is slow here): Ulysses 2.
  // The layout families restrict the per-pass layout, CFG-parallel or not (torus: a Torus pass).
  cost::Profile p;
  p.model = "qwen-image";
  p.world_size = 2;
  auto add = [&](cost::Stage stage, int degree, int u, int r, int cfg, LayoutMode mode, double s) {
    for (int64_t tokens : {256, 4096}) {
      cost::ProfileEntry e;
      e.stage = stage;
      e.tokens = tokens;
      e.degree = degree;
      e.ulysses = u;
      e.ring = r;
      e.cfg = cfg;
      e.mode = mode;
      e.guidance = true;
      e.num_new = stage == cost::Stage::kMigrate ? 1 : 0;
      e.seconds = s * tokens / 256;
      p.entries.push_back(e);
    }
  };
  add(cost::Stage::kEncode, 1, 1, 1, 1, LayoutMode::kUsp, 0.1);
  add(cost::Stage::kDecode, 1, 1, 1, 1, LayoutMode::kUsp, 0.1);
  add(cost::Stage::kMigrate, 2, 1, 1, 1, LayoutMode::kUsp, 0.001);
  add(cost::Stage::kDenoise, 1, 1, 1, 1, LayoutMode::kUsp, 1.0);
  add(cost::Stage::kDenoise, 2, 2, 1, 1, LayoutMode::kUsp, 0.55);
  add(cost::Stage::kDenoise, 2, 1, 1, 2, LayoutMode::kUsp, 0.6);
  add(cost::Stage::kDenoise, 2, 1, 1, 2, LayoutMode::kTorus, 0.5);  // a Torus-mode pass (one axis: plain), faster
  auto prof = cost::makeProfiledCostModel(p);
  RequestShape shape = guided.shape;
  double s = 0;
  Layout l = bestLayout(*prof, shape, 2, 1, qwen.heads, LayoutFamily::kUsp, &s);
  EXPECT_EQ(l.cfg, 1);
  EXPECT_EQ(l.ulysses, 2);
  EXPECT_DOUBLE_EQ(s, 0.55 * 4);
  l = bestLayout(*prof, shape, 2, 1, qwen.heads, LayoutFamily::kTorus, &s);
  EXPECT_EQ(l.cfg, 2);
  EXPECT_EQ(l.mode, LayoutMode::kTorus);
  for (const char* name : {"fcfs", "edf", "fcfs:layout=usp", "static:2"}) {
    RequestRecord r = guided;
    r.cost = predictCosts(*prof, shape, 2, 8, makePolicy(name)->layouts());
    View view(2, allRanks(2));
    view.v.cost = prof.get();
    view.add(r);
    auto ds = makePolicy(name)->schedule(view.build());
    ASSERT_EQ(ds.size(), 1u) << name;
    EXPECT_EQ(ds[0].layout.cfg, 1) << name << ": Ulysses 2 was measured faster than CFG-parallel";
    EXPECT_EQ(ds[0].layout.ulysses, 2) << name;
  }
}

TEST(Policies, SpareRanksOnlyWhileEveryBusyRankKeepsACore) {
  // Four ranks on two cores (a CPU): a request that scales perfectly may take the second core, not the other
  // two ranks, and none at all while another request decodes on a third rank (its decode takes a core).
  struct TwoCores : gfdit::testing::FixedCost {
    TwoCores() : FixedCost(0.0, 0.016, 0.0, 0.0) {}
    int32_t sharedCores() const override { return 2; }
  } cores;
  for (const char* name : kDynamic) {
    View alone(4, allRanks(4));
    alone.v.cost = &cores;
    alone.add(scalingRecord(1, 1.0, 20));
    auto ds = makePolicy(name)->schedule(alone.build());
    ASSERT_EQ(ds.size(), 1u) << name;
    EXPECT_EQ(ds[0].ranks.size(), 2u) << name << ": one rank per core";

    View decoding(4, {0, 1, 2});
    decoding.v.cost = &cores;
    decoding.add(scalingRecord(1, 1.0, 20));
    RequestRecord& d = decoding.add(scalingRecord(2, 1.0, 0), true);
    d.state = RequestState::kDecoding;
    d.ranks = {3};
    ds = makePolicy(name)->schedule(decoding.build());
    ASSERT_EQ(ds.size(), 1u) << name;
    EXPECT_EQ(ds[0].request_id, 1u) << name;
    EXPECT_EQ(ds[0].ranks.size(), 1u) << name << ": the decode holds the other core";

    View nocores(4, allRanks(4));  // one device per rank: every rank that pays
    nocores.add(scalingRecord(1, 1.0, 20));
    ds = makePolicy(name)->schedule(nocores.build());
    ASSERT_EQ(ds.size(), 1u) << name;
    EXPECT_EQ(ds[0].ranks.size(), 4u) << name;
  }
}

TEST(Policies, NamesAndOptions) {
  for (const char* n : {"fcfs", "srtf", "edf", "priority", "static:2", "edf:layout=usp", "srtf:layout=torus"}) {
    EXPECT_EQ(makePolicy(n)->name(), n);
  }
  EXPECT_EQ(makePolicy("edf:layout=swift")->layouts(), LayoutFamily::kSwift);
  for (const char* bad : {"sjf", "edf:layout=mesh", "edf:foo", "srtf:"}) {
    try {
      makePolicy(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage);
      EXPECT_NE(std::string(e.what()).find("edf"), std::string::npos) << e.what();
    }
  }
}

// ---- in the simulator ----

namespace {

SimRequest qwen(uint64_t id, double arrival_s, int px, int steps, double deadline_s = NAN, int priority = 0) {
  SimRequest r;
  r.id = id;
  r.arrival_s = arrival_s;
  r.shape.height = r.shape.width = px;
  r.shape.num_frames = 1;
  r.shape.num_steps = steps;
  r.shape.guidance_scale = 4.0;
  r.deadline_s = deadline_s;
  r.priority = priority;
  return r;
}

SimResult simulate(const std::string& policy, const std::vector<SimRequest>& reqs, const std::string& cl = "h20x8") {
  auto cluster = cost::cluster(cl);
  auto cm = cost::makeAnalyticCostModel(cost::modelArch("qwen-image"), cluster);
  Simulator sim(cm, cluster, std::shared_ptr<Policy>(makePolicy(policy)));
  return sim.run(reqs);
}

double aloneSeconds(int px, int steps, int degree) {
  auto cluster = cost::cluster("h20x8");
  auto cm = cost::makeAnalyticCostModel(cost::modelArch("qwen-image"), cluster);
  RequestShape s;
  s.height = s.width = px;
  s.num_steps = steps;
  s.guidance_scale = 4.0;
  s.tokens = cm->model().tokens(px, px, 1);
  RequestCost c = predictCosts(*cm, s, 8, 8, LayoutFamily::kAuto);
  return c.encode_s + steps * c.stepSeconds(degree) + c.decode_s;
}

int met(const SimResult& res) {
  int n = 0;
  for (const auto& o : res.requests) n += o.state == RequestState::kDone && o.finish_s <= o.deadline_s;
  return n;
}

}  // namespace

TEST(PoliciesSimulated, EdfMeetsDeadlinesAStaticSplitMisses) {
  // A 1536 px image due in 1.3x its time alone on 8 ranks, and three 512 px images with loose deadlines. A
  // static split into pairs gives the big one 2 ranks: it misses. EDF gives it what its deadline needs.
  const double big8 = aloneSeconds(1536, 50, 8);
  ASSERT_LT(1.3 * big8, aloneSeconds(1536, 50, 2));
  std::vector<SimRequest> reqs{qwen(0, 0.0, 1536, 50, 1.3 * big8)};
  for (int i = 1; i <= 3; ++i) reqs.push_back(qwen(i, 0.001 * i, 512, 20, 100.0));
  SimResult edf = simulate("edf", reqs);
  SimResult st2 = simulate("static:2", reqs);
  EXPECT_EQ(met(edf), 4);
  EXPECT_LT(met(st2), 4);
  EXPECT_GT(edf.requests[0].finish_s, 0);
}

TEST(PoliciesSimulated, SrtfDoesNotStarveALongRequest) {
  // One long image, then a stream of short ones arriving 1.4x faster than the cluster serves them: without
  // aging the long one would wait for the whole stream. With it, it ranks like a short one that arrived
  // aging x (its remaining time - theirs) later, and finishes long before the stream does.
  std::vector<SimRequest> reqs{qwen(0, 0.0, 1536, 50)};
  for (int i = 1; i <= 2400; ++i) reqs.push_back(qwen(i, 0.01 + i / 1.5, 512, 20));
  SimResult res = simulate("srtf", reqs);
  double last_short = 0;
  for (size_t i = 1; i < res.requests.size(); ++i) last_short = std::max(last_short, res.requests[i].finish_s);
  ASSERT_EQ(res.requests[0].state, RequestState::kDone);
  EXPECT_LT(res.requests[0].finish_s, 0.6 * last_short) << "aging brings the long one forward";
}

TEST(PoliciesSimulated, EveryPolicyFinishesEveryRequest) {
  std::vector<SimRequest> reqs;
  int sizes[] = {512, 1024, 768, 1536, 1280};
  for (int i = 0; i < 60; ++i) {
    double arrival = 2.0 * i;
    reqs.push_back(qwen(i, arrival, sizes[i % 5], 20 + 5 * (i % 7), arrival + 60.0, i % 3 == 0));
  }
  for (const char* p : {"fcfs", "srtf", "edf", "priority", "static:1", "static:2", "static:4", "static:8"}) {
    SimResult res = simulate(p, reqs);
    for (const auto& o : res.requests) EXPECT_EQ(o.state, RequestState::kDone) << p << " request " << o.id;
  }
}

namespace {

// Four 64x64 requests waiting (arrivals 0..3), and a cost model whose batch of b costs 1 + 0.2 (b - 1) steps.
struct BatchView {
  std::shared_ptr<gfdit::testing::FixedCost> cost =
      std::make_shared<gfdit::testing::FixedCost>(0.01, 0.016, 0.02, 0.001);
  View view;
  explicit BatchView(int world, int n, int max_batch = 4, double batch_cost = 0.2) : view(world, allRanks(world)) {
    cost->batches(max_batch, batch_cost);
    view.v.cost = cost.get();
    for (int i = 0; i < n; ++i) {
      RequestRecord r = scalingRecord(static_cast<uint64_t>(i + 1), 0.001, 10, kMaxRanks, i);
      r.shape.height = r.shape.width = 64;
      view.add(r);
    }
  }
};

std::map<uint64_t, std::vector<uint64_t>> batchesOf(const std::vector<Decision>& ds) {
  std::map<uint64_t, std::vector<uint64_t>> out;
  for (const Decision& d : ds) out[d.request_id] = d.batch;
  return out;
}

}  // namespace

TEST(Policies, RequestsBatchOnlyWhenTheyWouldOtherwiseWait) {
  // two ranks: two requests run alone; four run as two batches of two, in arrival order
  for (const char* name : {"fcfs", "srtf", "edf", "priority"}) {
    auto policy = makePolicy(name);
    BatchView two(2, 2);
    auto ds = policy->schedule(two.view.build());
    ASSERT_EQ(ds.size(), 2u) << name;
    for (const Decision& d : ds) EXPECT_TRUE(d.batch.empty()) << name;
    BatchView four(2, 4);
    auto b = batchesOf(policy->schedule(four.view.build()));
    EXPECT_EQ(b, (std::map<uint64_t, std::vector<uint64_t>>{{1, {3}}, {2, {4}}})) << name;
  }
}

TEST(Policies, BatchesStopWhereTheyStopPayingOrTheMemoryEnds) {
  // one rank, six waiting: a batch of at most max_batch 4 (memory)
  auto fcfs = makePolicy("fcfs");
  BatchView mem(1, 6, 4);
  auto b = batchesOf(fcfs->schedule(mem.view.build()));
  EXPECT_EQ(b, (std::map<uint64_t, std::vector<uint64_t>>{{1, {2, 3, 4}}}));
  // a step that grows with the batch as fast as the requests in turn: nothing batches
  BatchView bound(1, 6, 4, 1.0);
  b = batchesOf(fcfs->schedule(bound.view.build()));
  EXPECT_EQ(b, (std::map<uint64_t, std::vector<uint64_t>>{{1, {}}}));
  // batch=1 turns batching off; batch=2 caps it
  b = batchesOf(makePolicy("fcfs:batch=1")->schedule(mem.view.build()));
  EXPECT_EQ(b, (std::map<uint64_t, std::vector<uint64_t>>{{1, {}}}));
  b = batchesOf(makePolicy("fcfs:batch=2")->schedule(mem.view.build()));
  EXPECT_EQ(b, (std::map<uint64_t, std::vector<uint64_t>>{{1, {2}}}));
  EXPECT_EQ(makePolicy("fcfs:batch=2")->name(), "fcfs:batch=2");
  EXPECT_THROW(makePolicy("fcfs:batch=0"), Error);
  EXPECT_THROW(makePolicy("static:2:batch=x"), Error);
}

TEST(Policies, OnlyRequestsOfOneShapeAndGuidanceBatch) {
  auto fcfs = makePolicy("fcfs");
  BatchView v(1, 4);
  v.view.recs[1].shape.height = 128;        // another size
  v.view.recs[2].shape.guidance_scale = 4;  // guidance on
  auto b = batchesOf(fcfs->schedule(v.view.build()));
  EXPECT_EQ(b, (std::map<uint64_t, std::vector<uint64_t>>{{1, {4}}}));
}

TEST(Policies, StaticBatchesRequestsThatFindNoFreeGroup) {
  // static:1 on two ranks: requests 1 and 2 take the groups, 3 and 4 join their batches
  BatchView v(2, 4);
  for (auto& r : v.view.recs) {
    r.state = RequestState::kQueued;
    r.step = 0;
  }
  auto b = batchesOf(makePolicy("static:1")->schedule(v.view.build()));
  EXPECT_EQ(b, (std::map<uint64_t, std::vector<uint64_t>>{{1, {3}}, {2, {4}}}));
  b = batchesOf(makePolicy("static:1:batch=1")->schedule(v.view.build()));
  EXPECT_EQ(b, (std::map<uint64_t, std::vector<uint64_t>>{{1, {}}, {2, {}}}));
}

TEST(Policies, StaticQueuesInItsOrder) {
  // static:1 on one rank, three new requests: fcfs takes the first to arrive, srtf the shortest, edf the earliest
  // deadline (one without a deadline goes after those with one)
  View v(1, {0});
  RequestRecord a = scalingRecord(1, 0.1, 30, kMaxRanks, 0.0);  // first, longest, no deadline
  RequestRecord b = scalingRecord(2, 0.1, 5, kMaxRanks, 1.0);   // shortest, late deadline
  RequestRecord c = scalingRecord(3, 0.1, 10, kMaxRanks, 2.0);  // earliest deadline
  b.deadline_ns = 100 * kSec;
  c.deadline_ns = 50 * kSec;
  for (RequestRecord* r : {&a, &b, &c}) {
    r->state = RequestState::kQueued;
    r->step = 0;
    r->num_steps = r->shape.num_steps = 50 - (r == &a ? 20 : r == &b ? 45 : 40);
    v.add(*r);
  }
  const SchedulerView& view = v.build();
  auto first = [&](const char* name) {
    auto ds = makePolicy(name)->schedule(view);
    return ds.empty() ? uint64_t{0} : ds[0].request_id;
  };
  EXPECT_EQ(first("static:1"), 1u);
  EXPECT_EQ(first("static:1:fcfs"), 1u);
  EXPECT_EQ(first("static:1:srtf"), 2u);
  EXPECT_EQ(first("static:1:edf"), 3u);
  EXPECT_EQ(makePolicy("static:2:srtf:batch=2")->name(), "static:2:srtf:batch=2");
  EXPECT_THROW(makePolicy("static:2:lifo"), Error);
}

TEST(Policies, RequestsSubmittedTogetherRunAsOneBatchWhateverTheLoad) {
  // NOTE [planning], 3a: four ranks free, three requests of one group and one of another: the group's run as one
  // batch on one rank, the other alone; without a group every request gets ranks of its own
  for (const char* name : {"fcfs", "srtf", "edf", "priority", "static:1"}) {
    BatchView v(4, 4);
    for (int i = 0; i < 3; ++i) v.view.recs[i].group = 1;
    auto b = batchesOf(makePolicy(name)->schedule(v.view.build()));
    EXPECT_EQ(b.at(1), (std::vector<uint64_t>{2, 3})) << name;
    EXPECT_TRUE(b.at(4).empty()) << name;
    EXPECT_EQ(b.size(), 2u) << name;
    BatchView alone(4, 4);
    for (const auto& [id, batch] : batchesOf(makePolicy(name)->schedule(alone.view.build()))) {
      EXPECT_TRUE(batch.empty()) << name << " " << id;
    }
  }
  // a group whose batch does not pay (a step that grows as fast as its requests) runs as separate requests
  BatchView bound(4, 3, 4, 1.0);
  for (auto& r : bound.view.recs) r.group = 1;
  EXPECT_EQ(makePolicy("fcfs")->schedule(bound.view.build()).size(), 3u);
}

TEST(Policies, ARequestJoinsNoBatchThatWouldMakeAMemberMissItsDeadline) {
  // one rank, three waiting with 10 steps left; the cost model's step takes 64 ms alone, 76.8 ms for two, 89.6 ms
  // for three. The head's deadline allows 700 ms of steps: a batch of two (768 ms) would make it miss, so nobody
  // joins; with 800 ms one joins and the third would push it to 896 ms
  for (double allowed_ms : {700.0, 800.0}) {
    BatchView v(1, 3);
    v.view.recs[0].deadline_ns = static_cast<int64_t>(allowed_ms * 1e6);
    v.view.recs[0].cost.decode_s = 0;
    v.view.recs[0].cost.step_s[1] = 0.064;
    auto b = batchesOf(makePolicy("fcfs")->schedule(v.view.build()));
    EXPECT_EQ(b.at(1).size(), allowed_ms < 768 ? 0u : 1u) << allowed_ms;
  }
}
