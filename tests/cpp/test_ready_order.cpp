// The built-in policies' ready orders (NOTE [ready order] in src/runtime/control.cpp): each policy decides the
// same with its order as with the full list of waiting requests a view carries without one, on simulated
// traces under overload and on control planes driven by random arrivals, completions, cancellations, deaths
// and a clock that jumps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "control_harness.h"
#include "gfdit/planning.h"
#include "gfdit/simulator.h"

using namespace gfdit;
using namespace gfdit::runtime;
using gfdit::testing::ScriptExecutor;

namespace {

constexpr int64_t kSec = 1000000000;

// The policy as it was before ready orders: it makes none, so every view lists every waiting request and the
// policy sorts them all.
class FullList : public Policy {
 public:
  explicit FullList(std::unique_ptr<Policy> p) : p_(std::move(p)) {}
  std::string name() const override { return p_->name(); }
  LayoutFamily layouts() const override { return p_->layouts(); }
  bool placesDecodes() const override { return p_->placesDecodes(); }
  std::vector<Decision> schedule(const SchedulerView& view) override {
    EXPECT_EQ(view.order, nullptr);
    return p_->schedule(view);
  }

 private:
  std::unique_ptr<Policy> p_;
};

// Every built-in policy, the layout restrictions of the dynamic ones included.
const char* kPolicies[] = {"fcfs",         "srtf",          "edf",          "priority",          "static:1",
                           "static:2",     "static:4",      "static:8",     "srtf:layout=torus", "edf:layout=usp",
                           "fcfs:batch=1", "static:2:srtf", "static:2:edf", "fcfs:stages=split", "static:4:batch=2"};

// A trace well past capacity: Qwen-Image images of mixed sizes and steps, nearly a third arriving at the same
// instant as the one before, deadlines for most (some too tight to meet from the start, some only once they waited),
// three priority classes.
std::vector<SimRequest> overloadTrace(size_t n, double rate, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::uniform_real_distribution<double> u(0, 1);
  static const int kSides[] = {256, 512, 768, 1024, 1328};
  std::vector<SimRequest> out;
  double t = 0;
  for (size_t i = 0; i < n; ++i) {
    if (u(rng) > 0.3) t += gap(rng);
    SimRequest r;
    r.id = i;
    r.arrival_s = t;
    r.shape.height = kSides[rng() % 5];
    r.shape.width = kSides[rng() % 5];
    r.shape.num_frames = 1;
    r.shape.num_steps = 4 + static_cast<int>(rng() % 30);
    r.shape.guidance_scale = u(rng) < 0.5 ? 4.0 : 1.0;
    const double p = u(rng);
    if (p < 0.8) r.deadline_s = t + (p < 0.1 ? 0.5 : 2 + 60 * u(rng));
    r.priority = static_cast<int32_t>(rng() % 3);
    out.push_back(r);
  }
  return out;
}

void expectSameOutcomes(const SimResult& a, const SimResult& b, const std::string& what) {
  ASSERT_EQ(a.requests.size(), b.requests.size()) << what;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const SimOutcome &x = a.requests[i], &y = b.requests[i];
    ASSERT_EQ(x.state, y.state) << what << ": request " << x.id;
    ASSERT_EQ(x.finish_s, y.finish_s) << what << ": request " << x.id;  // exactly: the same decisions
    ASSERT_EQ(x.first_start_s, y.first_start_s) << what << ": request " << x.id;
  }
  EXPECT_EQ(a.num_tasks, b.num_tasks) << what;
  EXPECT_EQ(a.stats.policy_calls, b.stats.policy_calls) << what;
  EXPECT_EQ(a.stats.lookahead_hits, b.stats.lookahead_hits) << what;
  EXPECT_EQ(a.stats.regroups, b.stats.regroups) << what;
  EXPECT_EQ(a.stats.migrations, b.stats.migrations) << what;
  EXPECT_EQ(a.busy_rank_s, b.busy_rank_s) << what;
}

}  // namespace

TEST(ReadyOrder, SimulatedOverloadDecidesAsTheFullList) {
  for (const char* cluster_name : {"h20x8", "h20x16"}) {
    const cost::Cluster cluster = cost::cluster(cluster_name);
    auto cost = cost::makeAnalyticCostModel(cost::modelArch("qwen-image"), cluster);
    // about three times what the cluster serves on one rank per request
    const auto trace = overloadTrace(700, 3.0 * cluster.num_ranks / 20.0, 7);
    for (const char* name : kPolicies) {
      if (cluster.num_ranks % (std::string(name).rfind("static:", 0) == 0 ? std::stoi(name + 7) : 1) != 0) continue;
      const std::string what = std::string(name) + " on " + cluster_name;
      Simulator with_order(cost, cluster, makePolicy(name));
      Simulator full_list(cost, cluster, std::make_shared<FullList>(makePolicy(name)));
      SimResult a = with_order.run(trace);
      SimResult b = full_list.run(trace);
      expectSameOutcomes(a, b, what);
      size_t missed = 0;
      for (const SimOutcome& o : a.requests) missed += !std::isnan(o.deadline_s) && o.finish_s > o.deadline_s;
      EXPECT_GT(missed, 0u) << what << ": the trace is meant to miss deadlines";
    }
  }
}

namespace {

// A clock a test sets freely, backwards too (NOTE [planning order]: an order puts missed deadlines back).
class SetClock : public Clock {
 public:
  int64_t nowNs() const override { return now_ns; }
  int64_t now_ns = 0;
};

// One control plane with a policy and its scripted workers.
struct Plane {
  Plane(int world, std::shared_ptr<Policy> policy, std::shared_ptr<const cost::CostModel> cost) {
    ControlConfig cfg;
    cfg.world_size = world;
    cfg.node_of.resize(world);
    for (int w = 0; w < world; ++w) cfg.node_of[w] = w / 4;
    cp = std::make_unique<ControlPlane>(cfg, clock, exec, std::move(policy), std::move(cost));
    cp->setFinishedCallback([this](RequestResult&& r) { finished.push_back(r.id); });
  }
  SetClock clock;
  ScriptExecutor exec;
  std::unique_ptr<ControlPlane> cp;
  std::vector<uint64_t> finished;
};

std::string describe(const ScriptExecutor::Sent& s) {
  std::string out = std::string(taskKindName(static_cast<TaskKind>(s.d.kind))) + " of " +
                    std::to_string(s.d.request_id) + " steps " + std::to_string(s.d.step_begin) + "+" +
                    std::to_string(s.d.num_steps) + " layout " + std::to_string(s.d.layout.ulysses) + "x" +
                    std::to_string(s.d.layout.ring) + "x" + std::to_string(s.d.layout.cfg) + " mode " +
                    std::to_string(static_cast<int>(s.d.layout.mode)) + " on";
  for (int w : s.workers) out += " " + std::to_string(w);
  return out;
}

}  // namespace

TEST(ReadyOrder, RandomEventsDecideAsTheFullList) {
  const int world = 8;
  for (const char* name : kPolicies) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      const std::string what = std::string(name) + " seed " + std::to_string(seed);
      // steps of 2 ms .. 0.3 s on one rank, scaling as degree^0.8: some dispatched ahead, some one at a time
      auto cost = std::make_shared<gfdit::testing::FixedCost>(0.004, 0.05, 0.006, 0.002, 0.8);
      Plane a(world, makePolicy(name), cost);
      Plane b(world, std::make_shared<FullList>(makePolicy(name)), cost);
      std::mt19937_64 rng(seed);
      std::uniform_real_distribution<double> u(0, 1);
      std::vector<uint64_t> ids;
      int64_t now = kSec;
      bool dead = false, went_back = false;
      size_t compared = 0;  // tasks compared so far
      for (int event = 0; event < 4000; ++event) {
        const double p = u(rng);
        if (p < 0.25) {  // an arrival, now or a little in the past (out of order), often at the same instant
          const int side = 64 * (1 + static_cast<int>(rng() % 8));
          RequestSpec sp = gfdit::testing::spec(2 + static_cast<int>(rng() % 20), side, side,
                                                u(rng) < 0.2 ? now - static_cast<int64_t>(rng() % kSec) : now);
          sp.max_degree = 1 + static_cast<int>(rng() % world);
          sp.shape.guidance_scale = u(rng) < 0.5 ? 4.0 : 1.0;
          if (u(rng) < 0.7) sp.deadline_ns = now + static_cast<int64_t>(u(rng) * 3 * kSec);
          sp.priority = static_cast<int32_t>(rng() % 3);
          sp.id = 1 + ids.size();
          ids.push_back(sp.id);
          a.cp->submit(sp);
          b.cp->submit(sp);
        } else if (p < 0.8) {  // a worker reports its oldest task
          const int w = static_cast<int>(rng() % world);
          a.exec.completeHead(*a.cp, w);
          b.exec.completeHead(*b.cp, w);
        } else if (p < 0.85 && !ids.empty()) {
          const uint64_t id = ids[rng() % ids.size()];
          a.cp->cancel(id);
          b.cp->cancel(id);
        } else if (p < 0.851 && !dead && event > 1000) {  // a death and the recovery after it
          dead = true;
          const int w = static_cast<int>(rng() % world);
          a.cp->onWorkerDeath(w);
          b.cp->onWorkerDeath(w);
          a.exec.queues[w].clear();
          b.exec.queues[w].clear();
        } else if (p < 0.855 && !went_back && event > 2000) {
          went_back = true;
          now -= 2 * kSec;  // a clock that jumps back: missed deadlines may be met again
        } else {
          now += static_cast<int64_t>(u(rng) * 0.05 * kSec);
        }
        a.clock.now_ns = b.clock.now_ns = now;
        a.cp->poll();
        b.cp->poll();
        ASSERT_EQ(a.exec.sent.size(), b.exec.sent.size()) << what << ", event " << event;
        for (; compared < a.exec.sent.size(); ++compared) {
          ASSERT_EQ(describe(a.exec.sent[compared]), describe(b.exec.sent[compared]))
              << what << ", event " << event << ", task " << compared;
        }
      }
      EXPECT_EQ(a.finished, b.finished) << what;
      EXPECT_GT(a.finished.size(), 100u) << what;
      EXPECT_GT(a.cp->numRequests(), 10u) << what << ": requests were meant to queue up";
    }
  }
}

TEST(ReadyOrder, APolicyWithoutOneSeesEveryWaitingRequest) {
  // Python policies make no order: their views list every waiting request, in arrival order.
  class Count : public Policy {
   public:
    std::string name() const override { return "count"; }
    std::vector<Decision> schedule(const SchedulerView& view) override {
      EXPECT_EQ(view.order, nullptr);
      seen = view.ready.size();
      for (size_t i = 1; i < view.ready.size(); ++i) EXPECT_LT(view.ready[i - 1]->id, view.ready[i]->id);
      return {};
    }
    size_t seen = 0;
  };
  auto policy = std::make_shared<Count>();
  gfdit::runtime::VirtualClock clock;
  ScriptExecutor exec;
  ControlConfig cfg;
  cfg.world_size = 2;
  ControlPlane cp(cfg, clock, exec, policy);
  for (int i = 0; i < 50; ++i) cp.submit(gfdit::testing::spec(3));
  cp.poll();
  EXPECT_EQ(policy->seen, 50u);
}

namespace {

// A waiting or running request of random shape and predictions, for the hand-made views below.
RequestRecord randomRecord(std::mt19937_64& rng, uint64_t id, int world, int64_t now_ns) {
  std::uniform_real_distribution<double> u(0, 1);
  RequestRecord r;
  r.id = id;
  r.num_steps = 2 + static_cast<int>(rng() % 40);
  r.state = u(rng) < 0.3 ? RequestState::kQueued : RequestState::kDenoising;
  r.step = r.state == RequestState::kQueued ? 0 : static_cast<int>(rng() % r.num_steps);
  r.arrival_ns = now_ns - static_cast<int64_t>(rng() % 4) * kSec / 2;  // many at the same instant
  r.priority = static_cast<int32_t>(rng() % 3);
  r.shape.height = r.shape.width = 256 * (1 + static_cast<int>(rng() % 4));
  r.shape.num_steps = r.num_steps;
  r.shape.tokens = (r.shape.height / 16) * (r.shape.width / 16);
  r.max_degree = 1 + static_cast<int>(rng() % kMaxRanks);  // past the world too
  r.num_heads = 8;
  r.cost.known = u(rng) < 0.9;
  r.cost.max_ulysses = 8;
  const double t1 = 0.05 + u(rng);
  for (int d = 0; d <= kMaxRanks; ++d) {
    r.cost.step_s[d] =
        d >= 1 && u(rng) < 0.9 ? t1 / std::pow(d, 0.3 + 0.6 * u(rng)) : std::numeric_limits<double>::infinity();
    r.cost.layout[d] = plainLayout(std::max(1, d), 8);
  }
  r.cost.encode_s = 0.1 * u(rng);
  r.cost.decode_s = 0.2 * u(rng);
  if (u(rng) < 0.3) {  // it holds its state on a few ranks
    for (int w = 0; w < world; ++w) {
      if (u(rng) < 0.3) r.ranks.push_back(w);
    }
  }
  return r;
}

// Decisions of `name` on views of `recs` (those with busy set run on their ranks) at each of `times` in turn:
// with the full list of waiting requests, and with the policy's own order, kept across the calls.
void expectSameDecisions(const char* name, const std::vector<RequestRecord>& recs, int world,
                         const std::vector<int64_t>& times, const std::string& what) {
  auto full = makePolicy(name);
  auto ordered = makePolicy(name);
  auto order = ordered->makeReadyOrder();
  SchedulerView with_list;
  with_list.world_size = world;
  std::vector<bool> busy_rank(world, false);
  for (const RequestRecord& r : recs) {
    if (!r.busy) continue;
    with_list.running.push_back(&r);
    for (int w : r.ranks) busy_rank[w] = true;
  }
  for (int w = 0; w < world; ++w) {
    if (!busy_rank[w]) with_list.free_ranks.push_back(w);
  }
  SchedulerView with_order = with_list;
  for (const RequestRecord& r : recs) {
    if (r.busy) continue;
    with_list.ready.push_back(&r);
    order->insert(&r);
  }
  std::sort(with_list.ready.begin(), with_list.ready.end(), [](const RequestRecord* a, const RequestRecord* b) {
    return a->arrival_ns != b->arrival_ns ? a->arrival_ns < b->arrival_ns : a->id < b->id;
  });
  with_order.order = order.get();
  for (int64_t t : times) {
    with_list.now_ns = with_order.now_ns = t;
    const auto a = full->schedule(with_list);
    const auto b = ordered->schedule(with_order);
    ASSERT_EQ(a.size(), b.size()) << name << ", " << what << ", t " << t;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].request_id, b[i].request_id) << name << ", " << what << ", t " << t;
      ASSERT_EQ(a[i].ranks, b[i].ranks) << name << ", " << what;
      ASSERT_TRUE(a[i].layout == b[i].layout) << name << ", " << what;
      ASSERT_EQ(a[i].num_steps, b[i].num_steps) << name << ", " << what;
      ASSERT_EQ(a[i].dispatch_ahead, b[i].dispatch_ahead) << name << ", " << what;
    }
  }
}

}  // namespace

TEST(ReadyOrder, HandMadeViewsDecideAsTheFullList) {
  // The rounding margins of NOTE [planning order]: deadlines within nanoseconds of where the fastest degree
  // stops meeting them, srtf keys that tie but for rounding, a clock that moves both ways, requests arriving
  // at the same instant; degrees predicted beyond the world.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 60; ++trial) {
    const int world = 1 << (rng() % 4);
    const int64_t t0 = (1000 + static_cast<int64_t>(rng() % 100000)) * kSec;
    std::vector<RequestRecord> recs;
    std::vector<int64_t> boundaries;  // when a request's deadline stops being met at the degree it was made for
    const size_t n = 1 + rng() % 300;
    recs.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      RequestRecord r = randomRecord(rng, 1 + i, world, t0);
      if (u(rng) < 0.6) {  // a deadline that some degree stops meeting at t0 + [0, 2 s]
        const int d = 1 + static_cast<int>(rng() % std::max(1, std::min(world, r.max_degree)));
        const double need = r.remainingSeconds(d) * 1.5;  // edf's margin
        const double until_s = t0 * 1e-9 + 2 * u(rng);
        if (std::isfinite(need)) {
          r.deadline_ns = std::llround((until_s + need) * 1e9);
          boundaries.push_back(std::llround(until_s * 1e9));
        } else {
          r.deadline_ns = t0 + static_cast<int64_t>(u(rng) * 3 * kSec);
        }
      }
      if (i > 0 && u(rng) < 0.3) {  // an srtf key that ties with the previous request's but for rounding
        const RequestRecord& p = recs.back();
        r.state = p.state;
        r.step = 0;
        r.num_steps = p.num_steps - p.step;
        r.cost = p.cost;
        r.cost.decode_s = p.cost.decode_s + (p.arrival_ns - r.arrival_ns) * 1e-9 / 4.0;
      }
      recs.push_back(std::move(r));
    }
    // some run (their ranks busy), the rest wait
    std::vector<bool> busy_rank(world, false);
    for (RequestRecord& r : recs) {
      if (u(rng) < 0.1) {
        int w = static_cast<int>(rng() % world);
        if (busy_rank[w]) continue;
        busy_rank[w] = true;
        r.busy = true;
        r.state = RequestState::kDenoising;
        r.ranks = {w};
        r.layout = Layout();
      }
    }
    // forwards to within nanoseconds of where deadlines stop being met, then back, then forwards again
    std::vector<int64_t> times;
    for (int k = 0; k < 10 && !boundaries.empty(); ++k) {
      times.push_back(boundaries[rng() % boundaries.size()] + static_cast<int64_t>(rng() % 41) - 20);
    }
    std::sort(times.begin(), times.end());
    times.push_back(t0);
    times.push_back(t0 + kSec);
    times.push_back(t0 + 3 * kSec);
    for (const char* name : kPolicies) {
      if (std::string(name).rfind("static:", 0) == 0 && world % std::stoi(name + 7) != 0) continue;
      expectSameDecisions(name, recs, world, times, "trial " + std::to_string(trial));
    }
  }
}

namespace {

// A request of `steps_left` steps of `step_s` each on one rank, nothing else to predict.
RequestRecord oneRank(uint64_t id, double step_s, int steps_left, int64_t arrival_ns, int64_t deadline_ns = 0) {
  RequestRecord r;
  r.id = id;
  r.state = RequestState::kDenoising;
  r.num_steps = steps_left;
  r.arrival_ns = arrival_ns;
  r.deadline_ns = deadline_ns;
  r.shape.tokens = 1024;
  r.max_degree = 1;
  r.cost.known = true;
  r.cost.step_s.fill(std::numeric_limits<double>::infinity());
  r.cost.step_s[1] = step_s;
  return r;
}

}  // namespace

TEST(ReadyOrder, SrtfTakesKeysThatTieButForRounding) {
  // Two requests whose order by remaining + arrival / aging (the order's) and by remaining - (now - arrival) /
  // aging (srtf's) differ only by rounding: with one rank the order must still start the one srtf puts first.
  const int64_t now_ns = 123456 * kSec + 789;
  const double now_s = now_ns * 1e-9;
  std::mt19937_64 rng(5);
  int found = 0;
  for (int attempt = 0; attempt < 200000 && found < 20; ++attempt) {
    const int64_t arr_a = now_ns - static_cast<int64_t>(rng() % (1000 * kSec));
    const int64_t arr_b = arr_a - static_cast<int64_t>(rng() % 1000);
    const double rem_a = 1 + (rng() % 100000) * 1e-3;
    double rem_b = rem_a + (arr_a - arr_b) * 1e-9 / 4.0;
    rem_b = std::nextafter(rem_b, (rng() & 1) ? 0.0 : 1e9);
    auto key = [&](double rem, int64_t arr) { return rem - (now_s - arr * 1e-9) / 4.0; };  // srtf's, aging 4
    auto ordered = [&](double rem, int64_t arr) { return rem + arr * 1e-9 / 4.0; };        // the order's
    const bool srtf_a_first = key(rem_a, arr_a) != key(rem_b, arr_b) ? key(rem_a, arr_a) < key(rem_b, arr_b)
                              : arr_a * 1e-9 != arr_b * 1e-9         ? arr_a * 1e-9 < arr_b * 1e-9
                                                                     : true;
    const bool order_a_first = ordered(rem_a, arr_a) != ordered(rem_b, arr_b)
                                   ? ordered(rem_a, arr_a) < ordered(rem_b, arr_b)
                               : arr_a * 1e-9 != arr_b * 1e-9 ? arr_a * 1e-9 < arr_b * 1e-9
                                                              : true;
    // keys the order tells apart (equal ones it orders by arrival as srtf does, and takes both)
    if (srtf_a_first == order_a_first || ordered(rem_a, arr_a) == ordered(rem_b, arr_b)) continue;
    ++found;
    std::vector<RequestRecord> recs = {oneRank(1, rem_a, 1, arr_a), oneRank(2, rem_b, 1, arr_b)};
    expectSameDecisions("srtf", recs, 1, {now_ns}, "attempt " + std::to_string(attempt));
  }
  EXPECT_GT(found, 0) << "no keys that rounding orders differently";
}

TEST(ReadyOrder, EdfCountsADeadlineMissedInsideTheMargin) {
  // One rank, 65 requests with deadlines. The earliest (X) missed its deadline by a nanosecond, inside the
  // margin that keeps it among those that may meet theirs; the 64 others make the admission head (NOTE
  // [deadline admission]), and the last of them makes the work overflow, so the largest (A) gives way and the
  // next one starts. An order that counted X as meeting its deadline would leave the last one out of the head,
  // and start A.
  const int64_t now_ns = 100000 * kSec;
  const double now_s = now_ns * 1e-9;
  std::vector<RequestRecord> recs;
  const double x_need = 1.0 * 1.5;  // one step of 1 s, edf's margin
  recs.push_back(oneRank(1, 1.0, 1, 0, std::llround((now_s + x_need) * 1e9) - 1));
  recs.push_back(oneRank(2, 4.0, 10, 0, now_ns + 61 * kSec));  // A: 40 s of work, meets its deadline alone
  for (int i = 0; i < 62; ++i) {                               // 0.1 s each, deadlines just after A's
    recs.push_back(oneRank(3 + i, 0.01, 10, 0, now_ns + 61 * kSec + (i + 1) * kSec / 10));
  }
  recs.push_back(oneRank(100, 3.0, 10, 0, now_ns + static_cast<int64_t>(67.3 * kSec)));  // 30 s: the overflow
  ASSERT_GT(now_s + x_need, recs[0].deadline_ns * 1e-9) << "X misses its deadline";
  expectSameDecisions("edf", recs, 1, {now_ns}, "X inside the margin");
  auto ds = makePolicy("edf")->schedule([&] {
    static SchedulerView v;
    v = SchedulerView();
    v.world_size = 1;
    v.free_ranks = {0};
    v.now_ns = now_ns;
    for (const RequestRecord& r : recs) v.ready.push_back(&r);
    return v;
  }());
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].request_id, 3u) << "A gives way to the first short one";
}
