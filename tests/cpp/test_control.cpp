// The control plane against a scripted executor: task graph, completion aggregation, holders, lookahead,
// cancellation, failures and recovery, deadlines, pruning, policies, request checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "control_harness.h"
#include "gfdit/error.h"
#include "gfdit/planning.h"

using namespace gfdit;
using namespace gfdit::runtime;
using gfdit::testing::ScriptExecutor;
using gfdit::testing::spec;

namespace {

struct Fixture {
  explicit Fixture(int world, const std::string& policy = "fcfs", ControlConfig cfg = {})
      : Fixture(world, makePolicy(policy), nullptr, cfg) {}
  Fixture(int world, std::shared_ptr<Policy> policy, std::shared_ptr<const cost::CostModel> cost = nullptr,
          ControlConfig cfg = {}) {
    cfg.world_size = world;
    cp = std::make_unique<ControlPlane>(cfg, clock, exec, std::move(policy), std::move(cost));
    cp->setFinishedCallback([this](RequestResult&& r) { results.push_back(std::move(r)); });
  }
  const RequestResult* result(uint64_t id) const {
    for (const auto& r : results) {
      if (r.id == id) return &r;
    }
    return nullptr;
  }
  VirtualClock clock;
  ScriptExecutor exec;
  std::unique_ptr<ControlPlane> cp;
  std::vector<RequestResult> results;
};

int countKind(const ScriptExecutor& e, TaskKind k) {
  int n = 0;
  for (const auto& s : e.sent) n += static_cast<TaskKind>(s.d.kind) == k;
  return n;
}

}  // namespace

TEST(ControlPlane, TrajectoryEncodeStepsDecodeDoneAndPruned) {
  Fixture f(2);
  uint64_t id = f.cp->submit(spec(3));
  f.cp->poll();
  // the encode once, on rank 0, its state copied to rank 1 (NOTE [stages]), and right behind them in the workers'
  // FIFOs two steps (dispatch-ahead, across one-step fcfs decisions by lookahead)
  ASSERT_EQ(f.exec.kinds(), (std::vector<std::string>{"encode", "migrate", "denoise", "denoise"}));
  const auto& enc = f.exec.sent[0];
  EXPECT_EQ(static_cast<TaskKind>(enc.d.kind), TaskKind::kEncode);
  EXPECT_EQ(enc.workers, (std::vector<int>{0}));  // once, on the first rank
  EXPECT_EQ(enc.payload, "{\"prompt\": \"p\"}");
  EXPECT_EQ(f.exec.sent[1].workers, (std::vector<int>{0, 1}));
  EXPECT_EQ(f.exec.sent[1].d.src_rank, 0);
  EXPECT_EQ(f.exec.sent[2].d.step_begin, 0);
  EXPECT_EQ(f.exec.sent[3].d.step_begin, 1);
  f.exec.completeHead(*f.cp, 0);  // the encode
  EXPECT_EQ(f.cp->status(id).state, RequestState::kDenoising);
  f.exec.completeHead(*f.cp, 0);  // the copy is one task on two workers: it completes when both report
  f.exec.completeHead(*f.cp, 1);
  EXPECT_EQ(f.exec.sent.size(), 4u);  // no more than two steps in flight
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 1u);
  const RequestResult& r = f.results[0];
  EXPECT_EQ(r.state, RequestState::kDone);
  EXPECT_STREQ(r.output.name, ("/out-" + std::to_string(f.exec.sent[5].d.task_id)).c_str());
  std::vector<std::string> kinds;
  for (const auto& s : r.stages) kinds.push_back(taskKindName(s.kind));
  EXPECT_EQ(kinds, (std::vector<std::string>{"encode", "migrate", "denoise", "denoise", "denoise", "decode"}));
  std::vector<RequestState> states;
  for (const auto& t : r.transitions) states.push_back(t.state);
  EXPECT_EQ(states.front(), RequestState::kQueued);
  EXPECT_EQ(states.back(), RequestState::kDone);
  EXPECT_EQ(f.cp->numRequests(), 0u);  // pruned
  EXPECT_FALSE(f.cp->status(id).known);
  EXPECT_EQ(countKind(f.exec, TaskKind::kFree), 1);  // the holders dropped the state
  EXPECT_GE(f.cp->stats().lookahead_hits, 1u);
}

TEST(ControlPlane, FcfsShrinksOntoHoldersWithoutMigration) {
  Fixture f(4);
  uint64_t a = f.cp->submit(spec(6));
  f.cp->poll();
  f.exec.completeHead(*f.cp, 0);  // encode on rank 0
  f.exec.completeHead(*f.cp, 0);
  f.exec.completeHead(*f.cp, 1);
  f.exec.completeHead(*f.cp, 2);
  f.exec.completeHead(*f.cp, 3);  // its copy to all four
  const int copies = countKind(f.exec, TaskKind::kMigrate);
  EXPECT_EQ(copies, 1);
  uint64_t b = f.cp->submit(spec(2, 64, 64, f.clock.nowNs() + 1));
  f.cp->poll();
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 2u);
  // a started on four ranks; when b came it shrank onto ranks it held: no state had to move (b's encode copy
  // aside, if b got more than one rank)
  int moves = 0;
  for (const auto& s : f.exec.sent)
    moves += static_cast<TaskKind>(s.d.kind) == TaskKind::kMigrate && s.d.request_id == a;
  EXPECT_EQ(moves, 1);
  std::set<size_t> degrees;
  for (const auto& s : f.result(a)->stages) {
    if (s.kind == TaskKind::kDenoise) degrees.insert(s.ranks.size());
  }
  EXPECT_TRUE(degrees.count(4) && degrees.size() >= 2) << "a never changed degree";
  EXPECT_EQ(f.result(b)->state, RequestState::kDone);
}

TEST(ControlPlane, GrowingMigratesFromAHolderAndFreesStaleOnes) {
  class Plan : public Policy {  // step k of every request on plan[k]
   public:
    std::string name() const override { return "plan"; }
    std::vector<Decision> schedule(const SchedulerView& v) override {
      std::vector<Decision> out;
      std::vector<bool> free(v.world_size, false);
      for (int w : v.free_ranks) free[w] = true;
      for (const auto* r : v.ready) {
        std::vector<int> ranks = plan[std::min<size_t>(r->step, plan.size() - 1)];
        bool ok = true;
        for (int w : ranks) ok = ok && free[w];
        if (!ok) continue;
        for (int w : ranks) free[w] = false;
        Decision d;
        d.request_id = r->id;
        d.ranks = ranks;
        d.layout.ulysses = static_cast<int>(ranks.size());
        out.push_back(d);
      }
      return out;
    }
    std::vector<std::vector<int>> plan{{0}, {2, 0}, {1, 3}, {3}};
  };
  VirtualClock clock;
  ScriptExecutor exec;
  ControlConfig cfg;
  cfg.world_size = 4;
  ControlPlane cp(cfg, clock, exec, std::make_shared<Plan>());
  std::vector<RequestResult> results;
  cp.setFinishedCallback([&](RequestResult&& r) { results.push_back(std::move(r)); });
  cp.submit(spec(4));
  cp.poll();
  exec.drain(cp);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].state, RequestState::kDone);
  std::vector<std::vector<int>> groups;
  for (const auto& s : results[0].stages) {
    if (s.kind == TaskKind::kDenoise) groups.push_back(s.ranks);
  }
  EXPECT_EQ(groups, (std::vector<std::vector<int>>{{0}, {2, 0}, {1, 3}, {3}}));
  // [0] -> [2,0]: migrate 0 -> 2; [2,0] -> [1,3]: migrate from a holder to 1 and 3, free 2 and 0;
  // [1,3] -> [3]: nothing moves, 1 is freed
  std::vector<std::vector<int>> migrations, frees;
  for (const auto& s : exec.sent) {
    std::vector<int> ranks(s.d.ranks, s.d.ranks + s.d.num_ranks);
    if (static_cast<TaskKind>(s.d.kind) == TaskKind::kMigrate) migrations.push_back(ranks);
    if (static_cast<TaskKind>(s.d.kind) == TaskKind::kFree) frees.push_back(ranks);
  }
  ASSERT_EQ(migrations.size(), 2u);
  EXPECT_EQ(migrations[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(migrations[1].size(), 3u);
  EXPECT_TRUE(migrations[1][0] == 2 || migrations[1][0] == 0);
  EXPECT_EQ(frees[0], (std::vector<int>{2, 0}));
  EXPECT_EQ(frees[1], (std::vector<int>{1}));
}

TEST(ControlPlane, CancelEndsAtOnceThenDrainsAndDiscardsLateOutput) {
  Fixture f(1);
  uint64_t id = f.cp->submit(spec(1));
  f.cp->poll();
  f.exec.completeHead(*f.cp, 0);  // encode
  f.exec.completeHead(*f.cp, 0);  // the step
  ASSERT_EQ(static_cast<TaskKind>(f.exec.sent.back().d.kind), TaskKind::kDecode);
  f.cp->cancel(id);
  ASSERT_EQ(f.results.size(), 1u);
  EXPECT_EQ(f.results[0].state, RequestState::kCancelled);
  EXPECT_EQ(f.cp->numRequests(), 1u);  // its decode is still in flight
  f.exec.drain(*f.cp);
  EXPECT_EQ(f.cp->numRequests(), 0u);
  ASSERT_EQ(f.exec.discarded.size(), 1u);  // the decoded output nobody will read
  // a queued request cancels without any task
  uint64_t q = f.cp->submit(spec(2));
  f.cp->cancel(q);
  EXPECT_EQ(f.result(q)->state, RequestState::kCancelled);
  EXPECT_EQ(f.cp->numRequests(), 0u);
}

TEST(ControlPlane, FailedRequestDoesNotStopOthers) {
  Fixture f(2, "static:1");
  uint64_t bad = f.cp->submit(spec(2));
  uint64_t good = f.cp->submit(spec(2));
  f.cp->poll();
  f.exec.completeHead(*f.cp, 0, TaskError::kModelError);  // bad's encode raises
  f.exec.drain(*f.cp);
  EXPECT_EQ(f.result(bad)->state, RequestState::kFailed);
  EXPECT_NE(f.result(bad)->reason.find("injected model_error"), std::string::npos) << f.result(bad)->reason;
  EXPECT_EQ(f.result(good)->state, RequestState::kDone);
  EXPECT_EQ(f.exec.aborts, 0);
}

TEST(ControlPlane, AFailedEncodeFailsItsRequestEvenWhenALostStateStartedARecoveryFirst) {
  // The encode raises on member 0, and member 1's copy of its state and the step queued behind it fail
  // (an abort's echo, a lost state) before the encode's failure arrives. They start a recovery, but the request
  // fails with the encode's error: an encode runs no collective, so its error is its own.
  Fixture f(2, "static:2");
  uint64_t id = f.cp->submit(spec(2));
  f.cp->poll();
  // the encode on member 0, its copy to member 1, and steps dispatched behind them (NOTE [stages])
  ASSERT_EQ(f.exec.kinds(), (std::vector<std::string>{"encode", "migrate", "denoise", "denoise"}));
  f.exec.completeHead(*f.cp, 1, TaskError::kCommError);  // the copy fails on member 1 first: a recovery
  f.exec.completeHead(*f.cp, 1, TaskError::kStateLost);
  f.exec.completeHead(*f.cp, 1, TaskError::kStateLost);
  f.exec.completeHead(*f.cp, 0, TaskError::kModelError);  // then the encode's own error
  f.exec.completeHead(*f.cp, 0, TaskError::kCommError);
  f.exec.completeHead(*f.cp, 0, TaskError::kStateLost);
  f.exec.completeHead(*f.cp, 0, TaskError::kStateLost);
  f.exec.drain(*f.cp);
  ASSERT_NE(f.result(id), nullptr);
  EXPECT_EQ(f.result(id)->state, RequestState::kFailed);
  EXPECT_NE(f.result(id)->reason.find("injected model_error"), std::string::npos) << f.result(id)->reason;
}

TEST(ControlPlane, WorkerDeathRecoversFromTheMostAdvancedSurvivingCopy) {
  Fixture f(3);
  uint64_t id = f.cp->submit(spec(5));
  f.cp->poll();
  f.exec.completeHead(*f.cp, 0);                              // encode on 0
  for (int w = 0; w < 3; ++w) f.exec.completeHead(*f.cp, w);  // its copy to [0, 1, 2]
  for (int w = 0; w < 3; ++w) f.exec.completeHead(*f.cp, w);  // step 0
  EXPECT_EQ(f.cp->status(id).step, 1);
  // step 1 is in flight; worker 1 dies
  f.exec.queues[1].clear();
  f.cp->onWorkerDeath(1);
  EXPECT_EQ(f.exec.aborts, 1);
  EXPECT_TRUE(f.cp->recovering());
  // the survivors' step-1 tasks fail (the collective lost a member), and the step-2 ones behind them: their
  // copies stay at step 1
  for (int w : {0, 2}) {
    while (!f.exec.queues[w].empty() &&
           static_cast<TaskKind>(f.exec.sent[f.exec.queues[w].front()].d.kind) == TaskKind::kDenoise) {
      f.exec.completeHead(*f.cp, w, TaskError::kCommError, 1);
    }
  }
  f.cp->poll();
  // then the world is re-created among 0 and 2
  const auto& last = f.exec.sent.back();
  ASSERT_EQ(static_cast<TaskKind>(last.d.kind), TaskKind::kReinit);
  EXPECT_EQ(last.workers, (std::vector<int>{0, 2}));
  ReinitPlan plan = ReinitPlan::decode(last.payload);  // the typed payload (NOTE [typed messages])
  EXPECT_EQ(plan.workers, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(plan.epoch, 1u);
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 1u);
  EXPECT_EQ(f.results[0].state, RequestState::kDone);
  EXPECT_EQ(f.cp->stats().recoveries, 1u);
  // it resumed at step 1 (the copies at step 1 survived), on live ranks only
  bool resumed = false;
  for (size_t i = 0; i < f.exec.sent.size(); ++i) {
    const auto& s = f.exec.sent[i];
    if (static_cast<TaskKind>(s.d.kind) == TaskKind::kReinit) resumed = true;
    if (resumed) {
      for (int w : s.workers) EXPECT_NE(w, 1);
    }
  }
  int steps_after = 0;
  resumed = false;
  for (const auto& s : f.results[0].stages) {
    if (s.kind == TaskKind::kDenoise && s.error == TaskError::kOk) ++steps_after;
  }
  EXPECT_EQ(steps_after, 5);
}

// Fails worker w's queued tasks (a lost peer's echo) up to the REINIT the recovery sends.
void failUpToReinit(Fixture& f, int w) {
  while (!f.exec.queues[w].empty() &&
         static_cast<TaskKind>(f.exec.sent[f.exec.queues[w].front()].d.kind) != TaskKind::kReinit) {
    f.exec.completeHead(*f.cp, w, TaskError::kCommError);
  }
}

// see NOTE [replacements]
TEST(ControlPlane, AReplacementJoinsAtAStepBoundaryAndIsScheduledAgain) {
  Fixture f(2, "fcfs");
  f.cp->setReplacing(true);
  uint64_t id = f.cp->submit(spec(12));
  f.cp->poll();
  f.exec.queues[1].clear();
  f.cp->onWorkerDeath(1);  // during the encode: the request starts again on worker 0 alone
  EXPECT_EQ(f.cp->stats().worker_deaths, 1u);
  failUpToReinit(f, 0);
  f.cp->poll();
  ASSERT_EQ(static_cast<TaskKind>(f.exec.sent.back().d.kind), TaskKind::kReinit);
  EXPECT_EQ(f.exec.sent.back().workers, (std::vector<int>{0}));
  f.exec.completeHead(*f.cp, 0);  // the world of one
  f.cp->poll();
  for (int i = 0; i < 3; ++i) {  // its encode and two steps on worker 0 alone
    f.exec.completeHead(*f.cp, 0);
    f.cp->poll();
  }
  // the replacement says hello while steps are in flight
  ASSERT_FALSE(f.exec.queues[0].empty());
  const size_t before = f.exec.sent.size();
  f.cp->onWorkerJoin(1);
  EXPECT_TRUE(f.cp->joining(1));
  EXPECT_FALSE(f.cp->alive(1));
  EXPECT_EQ(f.exec.sent.size(), before);  // nothing goes out, not even the REINIT, before they are done
  while (!f.exec.queues[0].empty() &&
         static_cast<TaskKind>(f.exec.sent[f.exec.queues[0].front()].d.kind) != TaskKind::kReinit) {
    f.exec.completeHead(*f.cp, 0);
    f.cp->poll();
  }
  // then one REINIT of both, and nothing else was sent meanwhile
  ASSERT_EQ(f.exec.sent.size(), before + 1);
  const auto& reinit = f.exec.sent.back();
  ASSERT_EQ(static_cast<TaskKind>(reinit.d.kind), TaskKind::kReinit);
  EXPECT_EQ(reinit.workers, (std::vector<int>{0, 1}));
  EXPECT_EQ(ReinitPlan::decode(reinit.payload).workers, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(f.cp->status(id).state, RequestState::kDenoising);  // it kept its state and its step
  const int32_t step = f.cp->status(id).step;
  EXPECT_GE(step, 2);
  f.exec.completeHead(*f.cp, 0);
  f.exec.completeHead(*f.cp, 1);
  f.cp->poll();
  EXPECT_TRUE(f.cp->alive(1));
  EXPECT_FALSE(f.cp->joining(1));
  EXPECT_EQ(f.cp->stats().replacements, 1u);
  EXPECT_EQ(f.cp->stats().recoveries, 1u);  // a join is no recovery
  const size_t joined_at = f.exec.sent.size();
  f.exec.drain(*f.cp);
  ASSERT_NE(f.result(id), nullptr);
  EXPECT_EQ(f.result(id)->state, RequestState::kDone) << f.result(id)->reason;
  // the replacement works: fcfs gives the request both ranks again, from the step it had reached
  bool on_replacement = false;
  for (size_t i = joined_at; i < f.exec.sent.size(); ++i) {
    const auto& s = f.exec.sent[i];
    if (static_cast<TaskKind>(s.d.kind) == TaskKind::kEncode) ADD_FAILURE() << "the request started again";
    on_replacement = on_replacement || std::find(s.workers.begin(), s.workers.end(), 1) != s.workers.end();
  }
  EXPECT_TRUE(on_replacement);
}

TEST(ControlPlane, AReplacementThatSaysHelloDuringARecoveryWaitsForTheNextReinit) {
  Fixture f(2, "fcfs");
  f.cp->setReplacing(true);
  uint64_t id = f.cp->submit(spec(6));
  f.cp->poll();
  f.exec.queues[1].clear();
  f.cp->onWorkerDeath(1);
  failUpToReinit(f, 0);
  f.cp->poll();
  ASSERT_EQ(static_cast<TaskKind>(f.exec.sent.back().d.kind), TaskKind::kReinit);
  ASSERT_EQ(f.exec.sent.back().workers, (std::vector<int>{0}));  // the survivors' world, under way
  const size_t survivors = f.exec.sent.size() - 1;
  f.cp->onWorkerJoin(1);          // a replacement's hello arrives meanwhile
  f.exec.completeHead(*f.cp, 0);  // the world of worker 0 alone is made
  f.cp->poll();
  // worker 1 is not in that world: it stays a joiner, and once what went out to worker 0 is done, the next
  // REINIT takes it in
  EXPECT_FALSE(f.cp->alive(1));
  EXPECT_TRUE(f.cp->joining(1));
  for (int i = 0; i < 10 && static_cast<TaskKind>(f.exec.sent.back().d.kind) != TaskKind::kReinit; ++i) {
    ASSERT_FALSE(f.exec.queues[0].empty());
    f.exec.completeHead(*f.cp, 0);
    f.cp->poll();
  }
  ASSERT_EQ(static_cast<TaskKind>(f.exec.sent.back().d.kind), TaskKind::kReinit);
  EXPECT_EQ(f.exec.sent.back().workers, (std::vector<int>{0, 1}));
  const size_t reinit = f.exec.sent.size() - 1;
  f.exec.drain(*f.cp);
  EXPECT_TRUE(f.cp->alive(1));
  EXPECT_EQ(f.cp->stats().replacements, 1u);
  ASSERT_NE(f.result(id), nullptr);
  EXPECT_EQ(f.result(id)->state, RequestState::kDone) << f.result(id)->reason;
  for (size_t i = survivors; i < reinit; ++i) {  // nothing named worker 1 between the two worlds
    const auto& w = f.exec.sent[i].workers;
    EXPECT_EQ(std::find(w.begin(), w.end(), 1), w.end()) << "task " << i << " names worker 1 before its REINIT";
  }
}

TEST(ControlPlane, TheOnlyWorkerDiesAndItsReplacementRunsTheRequestsFromTheirBeginning) {
  for (bool replacing : {false, true}) {
    Fixture f(1, "fcfs");
    f.cp->setReplacing(replacing);
    uint64_t a = f.cp->submit(spec(4));
    uint64_t b = f.cp->submit(spec(4));
    f.cp->poll();
    f.exec.completeHead(*f.cp, 0);  // a's encode
    f.exec.completeHead(*f.cp, 0);  // a step
    f.exec.queues[0].clear();
    f.cp->onWorkerDeath(0);
    f.cp->poll();
    if (!replacing) {  // nobody will come: every request fails, as before replacements existed
      ASSERT_NE(f.result(a), nullptr);
      EXPECT_EQ(f.result(a)->state, RequestState::kFailed);
      EXPECT_EQ(f.result(b)->state, RequestState::kFailed);
      continue;
    }
    EXPECT_TRUE(f.results.empty());  // they wait for a replacement
    f.cp->onWorkerJoin(0);
    f.cp->poll();
    ASSERT_EQ(static_cast<TaskKind>(f.exec.sent.back().d.kind), TaskKind::kReinit);
    f.exec.drain(*f.cp);
    ASSERT_EQ(f.results.size(), 2u);
    for (const auto& r : f.results) EXPECT_EQ(r.state, RequestState::kDone) << r.reason;
    // a started again from its encode: two encodes of a were sent
    int encodes = 0;
    for (const auto& s : f.exec.sent) {
      encodes += static_cast<TaskKind>(s.d.kind) == TaskKind::kEncode && s.d.request_id == a;
    }
    EXPECT_EQ(encodes, 2);
    EXPECT_EQ(f.cp->stats().replacements, 1u);
  }
}

TEST(ControlPlane, AReplacementThatDiesBeforeJoiningOrWhileJoiningIsNotTheWorldsEnd) {
  Fixture f(2, "static:1");
  f.cp->setReplacing(true);
  uint64_t id = f.cp->submit(spec(3));
  f.cp->poll();
  f.exec.queues[1].clear();
  f.cp->onWorkerDeath(1);
  failUpToReinit(f, 0);
  f.exec.drain(*f.cp);  // recovery among worker 0, and the request runs there
  f.cp->onWorkerJoin(1);
  f.cp->poll();
  // the REINIT of both is out; the joiner dies in it: a retry among the survivors
  ASSERT_EQ(static_cast<TaskKind>(f.exec.sent.back().d.kind), TaskKind::kReinit);
  f.exec.queues[1].clear();
  f.cp->onWorkerDeath(1);
  f.exec.drain(*f.cp);
  EXPECT_FALSE(f.cp->alive(1));
  EXPECT_TRUE(f.cp->alive(0));
  EXPECT_EQ(f.cp->stats().worker_deaths, 2u);
  // then a joiner whose REINIT fails on the survivor (the rendezvous timed out) is tried again
  f.cp->onWorkerJoin(1);
  f.cp->poll();
  f.exec.completeHead(*f.cp, 0, TaskError::kCommError);
  f.exec.completeHead(*f.cp, 1);
  f.cp->poll();
  f.exec.drain(*f.cp);
  EXPECT_TRUE(f.cp->alive(1));
  EXPECT_EQ(f.cp->stats().replacements, 1u);
  uint64_t later = f.cp->submit(spec(2));
  f.cp->poll();
  f.exec.drain(*f.cp);
  ASSERT_NE(f.result(id), nullptr);
  EXPECT_EQ(f.result(id)->state, RequestState::kDone);
  ASSERT_NE(f.result(later), nullptr);
  EXPECT_EQ(f.result(later)->state, RequestState::kDone);
}

TEST(ControlPlane, ABadConfigurationIsRefusedNamingItsField) {
  struct Case {
    const char* param;
    void (*spoil)(ControlConfig&);
  };
  const Case cases[] = {
      {"world_size", [](ControlConfig& c) { c.world_size = 0; }},
      {"world_size", [](ControlConfig& c) { c.world_size = kMaxRanks + 1; }},
      {"max_inflight_steps", [](ControlConfig& c) { c.max_inflight_steps = 0; }},
      {"task_timeout_s", [](ControlConfig& c) { c.task_timeout_s = -1; }},
      {"task_timeout_s", [](ControlConfig& c) { c.task_timeout_s = INFINITY; }},
      {"task_timeout_s", [](ControlConfig& c) { c.task_timeout_s = NAN; }},
  };
  for (const Case& c : cases) {
    ControlConfig cfg;
    cfg.world_size = 2;
    c.spoil(cfg);
    try {
      Fixture f(cfg.world_size, "fcfs", cfg);
      ADD_FAILURE() << "accepted a bad " << c.param;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage) << e.what();
      EXPECT_EQ(e.param(), c.param) << e.what();
    }
  }
}

TEST(ControlPlane, RequestFailsAfterTooManyRecoveries) {
  ControlConfig cfg;
  cfg.max_attempts = 2;
  Fixture f(2, "fcfs", cfg);
  uint64_t id = f.cp->submit(spec(3));
  f.cp->poll();
  f.exec.completeHead(*f.cp, 0);
  f.exec.completeHead(*f.cp, 1);
  for (int round = 0; round < 2 && f.results.empty(); ++round) {
    // the step fails with a communication error on both: recovery, again and again
    for (int w : {0, 1}) {
      while (!f.exec.queues[w].empty()) {
        auto k = static_cast<TaskKind>(f.exec.sent[f.exec.queues[w].front()].d.kind);
        f.exec.completeHead(*f.cp, w, k == TaskKind::kDenoise ? TaskError::kCommError : TaskError::kOk);
      }
    }
    f.cp->poll();
    for (int w : {0, 1}) {
      while (!f.exec.queues[w].empty()) {
        auto k = static_cast<TaskKind>(f.exec.sent[f.exec.queues[w].front()].d.kind);
        if (k == TaskKind::kDenoise) break;
        f.exec.completeHead(*f.cp, w);
      }
    }
    f.cp->poll();
  }
  f.exec.drain(*f.cp);
  ASSERT_NE(f.result(id), nullptr);
  EXPECT_EQ(f.result(id)->state, RequestState::kFailed);
  EXPECT_NE(f.result(id)->reason.find("failed 2 times"), std::string::npos) << f.result(id)->reason;
}

TEST(ControlPlane, TaskDeadlineAbortsThenKillsTheWedgedWorker) {
  ControlConfig cfg;
  cfg.task_timeout_s = 1.0;
  Fixture f(2, "static:1", cfg);
  uint64_t stuck = f.cp->submit(spec(2));
  uint64_t fine = f.cp->submit(spec(2));
  f.cp->poll();
  f.exec.completeHead(*f.cp, 1);  // fine's encode; stuck's encode on worker 0 never completes
  while (!f.exec.queues[1].empty()) {
    f.exec.completeHead(*f.cp, 1);
    f.cp->poll();
  }
  EXPECT_EQ(f.result(fine)->state, RequestState::kDone);
  f.clock.set(int64_t{500} * 1000000);
  f.cp->poll();
  EXPECT_EQ(f.exec.aborts, 0);
  f.clock.set(int64_t{1100} * 1000000);
  f.cp->poll();
  EXPECT_EQ(f.exec.aborts, 1);  // first an abort
  EXPECT_TRUE(f.exec.killed.empty());
  f.clock.set(int64_t{3200} * 1000000);
  f.cp->poll();
  EXPECT_EQ(f.exec.killed, (std::vector<int>{0}));  // then the kill
  // the executor reports the death; recovery; the stuck request starts again on worker 1
  f.exec.queues[0].clear();
  f.cp->onWorkerDeath(0);
  f.cp->poll();
  f.exec.drain(*f.cp);
  ASSERT_NE(f.result(stuck), nullptr);
  EXPECT_EQ(f.result(stuck)->state, RequestState::kDone);  // restarted from encode on worker 1
  EXPECT_GE(f.cp->stats().task_timeouts, 1u);
}

TEST(ControlPlane, ARefusedDecisionLosesNothingAndTheOthersRun) {
  // see NOTE [refused decisions]: every request on rank 0; the second decision takes a rank twice and is refused,
  // the first runs, and the second request runs once rank 0 is free again
  class Greedy : public Policy {
   public:
    std::string name() const override { return "greedy"; }
    std::vector<Decision> schedule(const SchedulerView& v) override {
      std::vector<Decision> out;
      for (const auto* r : v.ready) {
        Decision d;
        d.request_id = r->id;
        d.ranks = {0};
        out.push_back(d);
      }
      return out;
    }
  };
  Fixture f(2, std::make_shared<Greedy>());
  uint64_t a = f.cp->submit(spec(1));
  uint64_t b = f.cp->submit(spec(1));
  f.cp->poll();
  EXPECT_TRUE(f.results.empty());
  EXPECT_EQ(f.cp->stats().refused_decisions, 1u);
  EXPECT_NE(f.cp->lastRefusal().find("rank 0"), std::string::npos) << f.cp->lastRefusal();
  EXPECT_EQ(f.cp->status(a).state, RequestState::kEncoding);
  EXPECT_EQ(f.cp->status(b).state, RequestState::kQueued);
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 2u);
  for (const auto& r : f.results) EXPECT_EQ(r.state, RequestState::kDone) << r.reason;
}

TEST(ControlPlane, ARefusedDecisionWithNothingInFlightFailsItsRequest) {
  // nothing runs, so no completion would ever ask the policy again: the request it named fails, with the reason
  class DeadRank : public Policy {
   public:
    std::string name() const override { return "dead-rank"; }
    std::vector<Decision> schedule(const SchedulerView& v) override {
      std::vector<Decision> out;
      for (const auto* r : v.ready) {
        Decision d;
        d.request_id = r->id;
        d.ranks = {7};
        out.push_back(d);
      }
      return out;
    }
  };
  Fixture f(2, std::make_shared<DeadRank>());
  f.cp->submit(spec(1));
  f.cp->submit(spec(1));
  f.cp->poll();
  ASSERT_EQ(f.results.size(), 2u);
  for (const auto& r : f.results) {
    EXPECT_EQ(r.state, RequestState::kFailed);
    EXPECT_NE(r.reason.find("policy dead-rank"), std::string::npos) << r.reason;
    EXPECT_NE(r.reason.find("rank 7"), std::string::npos) << r.reason;
  }
  EXPECT_TRUE(f.exec.sent.empty());
}

TEST(ControlPlane, BrokenPolicyFailsTheRequestsItWasAskedAbout) {
  class Throws : public Policy {
   public:
    std::string name() const override { return "throws"; }
    std::vector<Decision> schedule(const SchedulerView&) override { throw std::runtime_error("no idea"); }
  };
  Fixture f(2, std::make_shared<Throws>());
  f.cp->submit(spec(1));
  f.cp->submit(spec(1));
  f.cp->poll();
  ASSERT_EQ(f.results.size(), 2u);
  for (const auto& r : f.results) {
    EXPECT_EQ(r.state, RequestState::kFailed);
    EXPECT_NE(r.reason.find("policy throws failed: no idea"), std::string::npos) << r.reason;
  }
  EXPECT_TRUE(f.exec.sent.empty());
}

TEST(ControlPlane, CfgParallelNeedsGuidanceAndTravelsWithTheTasks) {
  // A policy that runs every request CFG-parallel on ranks 0 and 1 (one rank per guidance pass).
  class CfgPolicy : public Policy {
   public:
    std::string name() const override { return "cfg2"; }
    std::vector<Decision> schedule(const SchedulerView& v) override {
      std::vector<Decision> out;
      if (v.free_ranks.size() < 2 || v.ready.empty()) return out;
      Decision d;
      d.request_id = v.ready[0]->id;
      d.ranks = {0, 1};
      d.layout.cfg = 2;
      d.num_steps = 10;
      out.push_back(d);
      return out;
    }
  };
  VirtualClock clock;
  ScriptExecutor exec;
  ControlConfig cfg;
  cfg.world_size = 2;
  ControlPlane cp(cfg, clock, exec, std::make_shared<CfgPolicy>());
  std::vector<RequestResult> results;
  cp.setFinishedCallback([&](RequestResult&& r) { results.push_back(std::move(r)); });
  RequestSpec guided = spec(3);
  guided.shape.guidance_scale = 4.0;
  const uint64_t ok = cp.submit(guided);
  cp.poll();
  exec.drain(cp);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].id, ok);
  EXPECT_EQ(results[0].state, RequestState::kDone) << results[0].reason;
  int denoise = 0;
  for (const auto& sent : exec.sent) {
    if (static_cast<TaskKind>(sent.d.kind) != TaskKind::kDenoise) continue;
    ++denoise;
    EXPECT_EQ(sent.d.layout.cfg, 2);
    EXPECT_EQ(sent.workers, (std::vector<int>{0, 1}));
  }
  EXPECT_EQ(denoise, 3);
  for (const auto& st : results[0].stages) {
    if (st.kind == TaskKind::kDenoise) EXPECT_EQ(st.layout.cfg, 2);
  }
  // Without guidance there is one pass per step: the decision is refused and the request fails, saying why.
  cp.submit(spec(3));
  cp.poll();
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[1].state, RequestState::kFailed);
  EXPECT_NE(results[1].reason.find("cfg 2 (CFG-parallel)"), std::string::npos) << results[1].reason;
  EXPECT_NE(results[1].reason.find("no guidance"), std::string::npos) << results[1].reason;
}

TEST(ControlPlane, StaticKeepsItsGroupForLife) {
  Fixture f(4, "static:2");
  for (int i = 0; i < 5; ++i) f.cp->submit(spec(3, 64, 64, 10 + i));
  f.cp->poll();
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 5u);
  for (const auto& r : f.results) {
    std::set<std::vector<int>> groups;
    for (const auto& s : r.stages) {
      if (s.kind == TaskKind::kDenoise) groups.insert(s.ranks);
    }
    ASSERT_EQ(groups.size(), 1u);
    auto g = *groups.begin();
    EXPECT_TRUE(g == std::vector<int>({0, 1}) || g == std::vector<int>({2, 3}));
  }
  EXPECT_EQ(countKind(f.exec, TaskKind::kMigrate), 5);  // each encode's copy to its group's second rank, no more
}

TEST(ControlPlane, MemoryStaysFlatOverManyRequests) {
  auto rss = [] {
    std::ifstream f("/proc/self/statm");
    long pages = 0, resident = 0;
    f >> pages >> resident;
    return resident * 4096L;
  };
  Fixture f(2);
  f.cp->setFinishedCallback([](RequestResult&&) {});
  long before = 0;
  size_t most = 0;
  for (int i = 0; i < 100000; ++i) {
    f.cp->submit(spec(2));
    f.cp->poll();
    if (i % 4 == 3) f.exec.drain(*f.cp);
    most = std::max(most, f.cp->numRequests());
    if (i == 10000) before = rss();
    if (i % 1000 == 999) {  // the harness's own log, not the plane's
      f.exec.drain(*f.cp);
      f.exec.sent.clear();
      f.exec.queues.clear();
    }
  }
  f.exec.drain(*f.cp);
  EXPECT_LE(most, 8u);
  EXPECT_EQ(f.cp->numTasksInFlight(), 0u);
  EXPECT_LT(rss() - before, 8L << 20) << "resident memory grew";
}

TEST(ControlPlane, PoliciesByName) {
  EXPECT_EQ(makePolicy("fcfs")->name(), "fcfs");
  EXPECT_EQ(makePolicy("static:4")->name(), "static:4");
  for (const char* bad : {"lifo", "static:0", "static:x", "static:2x", "static:"}) {
    try {
      makePolicy(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage);
      if (std::string(bad) == "lifo") EXPECT_NE(std::string(e.what()).find("fcfs"), std::string::npos);
    }
  }
}

TEST(CheckRequest, NamesTheField) {
  RequestLimits lim = RequestLimits::of(gfdit::testing::testArch());
  auto expectRefused = [&](RequestShape s, const char* field) {
    try {
      checkRequest(s, lim);
      ADD_FAILURE() << "accepted, expected a complaint about " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  RequestShape ok;
  ok.height = 64;
  ok.width = 128;
  ok.num_steps = 4;
  checkRequest(ok, lim);
  EXPECT_EQ(ok.tokens, 4 * 8);
  RequestShape s = ok;
  s.height = 33;
  expectRefused(s, "height");
  s = ok;
  s.width = 100000;
  expectRefused(s, "pixels");
  s = ok;
  s.num_steps = 1000000000;
  expectRefused(s, "num_inference_steps");
  s = ok;
  s.num_frames = 9;
  expectRefused(s, "num_frames");
  s = ok;
  s.guidance_scale = INFINITY;
  expectRefused(s, "guidance_scale");
  s = ok;
  s.guidance_scale = NAN;
  expectRefused(s, "guidance_scale");
  lim.is_video = true;
  lim.max_frames = 33;
  lim.temporal_stride = 4;
  s = ok;
  s.num_frames = 10;
  expectRefused(s, "num_frames");
  s.num_frames = 9;
  checkRequest(s, lim);
  EXPECT_EQ(s.tokens, 3 * 4 * 8);
  // Ulysses splits heads, unevenly where it must (floor or ceil of heads / ulysses each): up to the heads
  EXPECT_EQ(maxUlyssesDegree(24), 24);
  EXPECT_EQ(maxUlyssesDegree(12), 12);
  EXPECT_EQ(maxUlyssesDegree(40), 40);
  EXPECT_EQ(maxUlyssesDegree(100), kMaxRanks);
  EXPECT_EQ(maxUlyssesDegree(0), 1);
}

// See NOTE [task durations]: a request's estimates are its own shape's. A large request (100 ms steps) runs; a
// small one (1 ms steps) arrives while it does. One moving average per task kind would still say about 80 ms
// after the small request's first step, so the small request would get no more steps ahead than the large
// one and its next completion would be expected far too late.
TEST(ControlPlane, EachShapeGetsItsOwnDurationEstimate) {
  ControlConfig cfg;
  cfg.max_inflight_steps = 1;
  cfg.min_queued_s = 0.02;
  Fixture f(2, "static:1", cfg);
  const int64_t kMs = 1000000;
  const uint64_t large = f.cp->submit(spec(40, 1024, 1024));  // 4096 tokens, on rank 0
  f.cp->poll();
  // Each worker runs its queue in order; a task starts when the worker is free and it was dispatched.
  std::vector<int64_t> free_at(2, 0);
  auto duration = [&](const TaskDescriptor& d) {
    switch (static_cast<TaskKind>(d.kind)) {
      case TaskKind::kEncode: return 10 * kMs;
      case TaskKind::kDenoise: return d.request_id == large ? 100 * kMs : 1 * kMs;
      default: return kMs / 10;
    }
  };
  auto runUntil = [&](auto done) {
    for (int n = 0; n < 1000 && !done(); ++n) {
      int best = -1;
      int64_t best_start = 0, best_end = 0;
      for (int w = 0; w < 2; ++w) {
        if (f.exec.queues[w].empty()) continue;
        const TaskDescriptor& d = f.exec.sent[f.exec.queues[w].front()].d;
        const int64_t start = std::max(free_at[w], d.dispatch_ns);
        const int64_t end = start + duration(d);
        if (best < 0 || end < best_end) {
          best = w;
          best_start = start;
          best_end = end;
        }
      }
      ASSERT_GE(best, 0) << "nothing left to run";
      size_t i = f.exec.queues[best].front();
      f.exec.queues[best].pop_front();
      f.clock.set(best_end);
      free_at[best] = best_end;
      Completion c = f.exec.completionOf(i, best);
      c.start_ns = best_start;
      c.end_ns = best_end;
      f.cp->onCompletion(c);
      f.cp->poll();
    }
    ASSERT_TRUE(done());
  };
  auto inFlight = [&](int w) {
    int n = 0;
    for (size_t i : f.exec.queues[w]) n += static_cast<TaskKind>(f.exec.sent[i].d.kind) == TaskKind::kDenoise;
    return n;
  };
  runUntil([&] { return f.cp->status(large).step >= 3; });
  const uint64_t small = f.cp->submit(spec(40));  // 16 tokens, on rank 1
  f.cp->poll();
  runUntil([&] { return f.cp->status(small).state == RequestState::kDenoising; });
  // its first step: no measurement of its own yet, so the last step of any shape (100 ms) stands in
  EXPECT_EQ(inFlight(1), 1);
  runUntil([&] { return f.cp->status(small).step >= 1; });
  EXPECT_EQ(f.cp->status(large).state, RequestState::kDenoising);
  EXPECT_EQ(inFlight(0), 1);  // 100 ms steps: max_inflight_steps
  EXPECT_EQ(inFlight(1), 8);  // 1 ms steps: enough for min_queued_s, at most kMaxStepsAhead
  // the small request's next step is due 1 ms from now (the large one's much later)
  const int64_t due = f.cp->expectedCompletionNs() - f.clock.nowNs();
  EXPECT_GT(due, 0);
  EXPECT_LE(due, 2 * kMs);
}

// ---- parallel decode (NOTE [parallel decode] in control.cpp) ----

namespace {

/// Runs every ready request on `ranks` (plain Ulysses) with the decode degree given.
class OnRanks : public Policy {
 public:
  OnRanks(std::vector<int> ranks, int32_t decode_degree) : ranks_(std::move(ranks)), decode_degree_(decode_degree) {}
  std::string name() const override { return "on-ranks"; }
  std::vector<Decision> schedule(const SchedulerView& v) override {
    std::vector<Decision> out;
    for (const auto* r : v.ready) {
      for (int w : ranks_) {
        if (std::find(v.free_ranks.begin(), v.free_ranks.end(), w) == v.free_ranks.end()) return out;
      }
      Decision d;
      d.request_id = r->id;
      d.ranks = ranks_;
      d.layout.ulysses = static_cast<int32_t>(ranks_.size());
      d.num_steps = r->num_steps - r->step;
      d.decode_degree = decode_degree_;
      out.push_back(d);
      return out;  // one at a time
    }
    return out;
  }

 private:
  std::vector<int> ranks_;
  int32_t decode_degree_;
};

/// FixedCost whose decode takes 1 s on one rank and 1 / d s on d ranks.
class SplitDecodeCost : public gfdit::testing::FixedCost {
 public:
  SplitDecodeCost() : FixedCost(0.01, 0.1, 1.0, 0.01) {}
  double seconds(cost::Stage stage, const cost::StageQuery& q) const override {
    if (stage == cost::Stage::kDecode) return 1.0 / std::max(1, q.degree);
    return FixedCost::seconds(stage, q);
  }
};

const ScriptExecutor::Sent* decodeOf(const ScriptExecutor& e, uint64_t request_id) {
  for (const auto& s : e.sent) {
    if (static_cast<TaskKind>(s.d.kind) == TaskKind::kDecode && s.d.request_id == request_id) return &s;
  }
  return nullptr;
}

}  // namespace

TEST(ControlPlane, DecodeSplitsOverAsManyHoldersAsTheDecisionAsks) {
  Fixture f(4, std::make_shared<OnRanks>(std::vector<int>{2, 0, 3}, 2));
  ControlPlane& cp = *f.cp;
  ScriptExecutor& exec = f.exec;
  std::vector<RequestResult>& results = f.results;
  uint64_t id = cp.submit(spec(3));
  cp.poll();
  exec.drain(cp);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].state, RequestState::kDone);
  const auto* dec = decodeOf(exec, id);
  ASSERT_NE(dec, nullptr);
  EXPECT_EQ(dec->workers, (std::vector<int>{2, 0}));  // the first holders in the group's order
  EXPECT_EQ(dec->d.layout.ulysses, 2);
  // the first member's output is the result's
  EXPECT_EQ(std::string(results[0].output.name), "/out-" + std::to_string(dec->d.task_id));
}

TEST(ControlPlane, ASecondOutputOfADecodeIsDiscarded) {
  Fixture f(2, std::make_shared<OnRanks>(std::vector<int>{0, 1}, 2));
  ControlPlane& cp = *f.cp;
  ScriptExecutor& exec = f.exec;
  std::vector<RequestResult>& results = f.results;
  uint64_t id = cp.submit(spec(1));
  cp.poll();
  for (int round = 0; round < 10 && decodeOf(exec, id) == nullptr; ++round) {
    for (int w : {0, 1}) exec.completeHead(cp, w);
    cp.poll();
  }
  const auto* dec = decodeOf(exec, id);
  ASSERT_NE(dec, nullptr);
  size_t i = static_cast<size_t>(dec - exec.sent.data());
  Completion extra = exec.completionOf(i, 1);
  std::snprintf(extra.output.name, sizeof(extra.output.name), "/out-extra");
  exec.queues[1].clear();
  cp.onCompletion(extra, "");
  exec.drain(cp);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].state, RequestState::kDone);
  EXPECT_EQ(std::string(results[0].output.name), "/out-" + std::to_string(dec->d.task_id));
  EXPECT_EQ(exec.discarded, (std::vector<std::string>{"/out-extra"}));
}

TEST(ControlPlane, TheCostModelChoosesTheDecodeDegreeWithinTheLatentsRows) {
  Fixture f(4, std::make_shared<OnRanks>(std::vector<int>{0, 1, 2, 3}, 0), std::make_shared<SplitDecodeCost>());
  ControlPlane& cp = *f.cp;
  ScriptExecutor& exec = f.exec;
  std::vector<RequestResult>& results = f.results;
  uint64_t wide = cp.submit(spec(1, 64, 64));    // 8 latent rows: the fastest decode is on all 4
  uint64_t narrow = cp.submit(spec(1, 16, 64));  // 2 latent rows: at most 2 members
  SplitDecodeCost model;
  const RequestCost w = predictCosts(model, spec(1, 64, 64).shape, 4, 0, LayoutFamily::kAuto);
  const RequestCost n = predictCosts(model, spec(1, 16, 64).shape, 4, 0, LayoutFamily::kAuto);
  EXPECT_EQ(w.decode_degree, 4);
  EXPECT_EQ(n.decode_degree, 2);
  EXPECT_DOUBLE_EQ(w.decodeSeconds(4), 0.25);
  EXPECT_DOUBLE_EQ(n.decodeSeconds(2), 0.5);
  EXPECT_DOUBLE_EQ(n.decodeSeconds(3), 1.0);  // past its rows: not predicted, the one-rank time
  cp.poll();
  exec.drain(cp);
  ASSERT_EQ(results.size(), 2u);
  ASSERT_NE(decodeOf(exec, wide), nullptr);
  ASSERT_NE(decodeOf(exec, narrow), nullptr);
  EXPECT_EQ(decodeOf(exec, wide)->workers.size(), 4u);
  EXPECT_EQ(decodeOf(exec, narrow)->workers.size(), 2u);
}

TEST(ControlPlane, ADecodeDegreeBeyondTheLatentsRowsIsRefused) {
  Fixture f(2, std::make_shared<OnRanks>(std::vector<int>{0, 1}, 9));
  ControlPlane& cp = *f.cp;
  ScriptExecutor& exec = f.exec;
  std::vector<RequestResult>& results = f.results;
  cp.submit(spec(1, 64, 64));  // 8 latent rows
  cp.poll();
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].state, RequestState::kFailed);
  EXPECT_NE(results[0].reason.find("decode_degree 9"), std::string::npos) << results[0].reason;
  EXPECT_NE(results[0].reason.find("8 rows"), std::string::npos) << results[0].reason;
  EXPECT_TRUE(exec.sent.empty());
}

TEST(ControlPlane, AMemberLostDuringAParallelDecodeIsRecovered) {
  Fixture f(3, std::make_shared<OnRanks>(std::vector<int>{0, 1, 2}, 3));
  ControlPlane& cp = *f.cp;
  ScriptExecutor& exec = f.exec;
  std::vector<RequestResult>& results = f.results;
  uint64_t id = cp.submit(spec(2));
  cp.poll();
  for (int round = 0; round < 10 && decodeOf(exec, id) == nullptr; ++round) {
    for (int w : {0, 1, 2}) {
      if (decodeOf(exec, id) == nullptr) exec.completeHead(cp, w);  // up to the decode, on no member yet
    }
    cp.poll();
  }
  ASSERT_NE(decodeOf(exec, id), nullptr);
  ASSERT_EQ(decodeOf(exec, id)->workers.size(), 3u);
  // worker 1 dies in the decode; its peers' halo exchange fails
  exec.queues[1].clear();
  cp.onWorkerDeath(1);
  EXPECT_TRUE(cp.recovering());
  for (int w : {0, 2}) exec.completeHead(cp, w, TaskError::kCommError);
  exec.drain(cp);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].state, RequestState::kDone) << results[0].reason;
  // decoded again from the surviving holders, without the dead one
  const ScriptExecutor::Sent* last = nullptr;
  for (const auto& s : exec.sent) {
    if (static_cast<TaskKind>(s.d.kind) == TaskKind::kDecode) last = &s;
  }
  ASSERT_NE(last, nullptr);
  EXPECT_NE(last, decodeOf(exec, id));
  for (int w : last->workers) EXPECT_NE(w, 1);
}

namespace {

// Every ready request on rank 0, one step per decision, all of one shape in one batch (the first is its head).
class BatchAll : public Policy {
 public:
  std::string name() const override { return "batch-all"; }
  std::vector<Decision> schedule(const SchedulerView& v) override {
    std::vector<Decision> out;
    if (v.ready.empty() || std::find(v.free_ranks.begin(), v.free_ranks.end(), 0) == v.free_ranks.end()) return out;
    Decision d;
    d.request_id = v.ready[0]->id;
    d.ranks = {0};
    d.dispatch_ahead = false;
    for (size_t i = 1; i < v.ready.size(); ++i) {
      if (v.ready[i]->shape.height == v.ready[0]->shape.height || !same_shape_only) d.batch.push_back(v.ready[i]->id);
    }
    out.push_back(d);
    return out;
  }
  bool same_shape_only = true;
};

BatchMembers membersOf(const ScriptExecutor::Sent& s) {
  return s.d.batch > 1 ? BatchMembers::decode(s.payload) : BatchMembers();
}

}  // namespace

TEST(ControlPlane, ABatchStepsItsMembersInOneTaskEachAtItsOwnStep) {
  // see NOTE [batches]: a joins at step 1 of its own, b at step 0; both decode on the one rank, in turn
  Fixture f(1, std::make_shared<BatchAll>());
  uint64_t a = f.cp->submit(spec(3));
  f.cp->poll();
  f.exec.completeHead(*f.cp, 0);  // a's encode
  uint64_t b = f.cp->submit(spec(2));
  f.exec.completeHead(*f.cp, 0);  // a's step 0: its boundary, where b joins
  f.cp->poll();
  ASSERT_EQ(f.exec.kinds(), (std::vector<std::string>{"encode", "denoise", "encode", "denoise"}));
  const auto& batched = f.exec.sent[3];
  EXPECT_EQ(batched.d.request_id, a);
  EXPECT_EQ(batched.d.step_begin, 1);
  EXPECT_EQ(batched.d.batch, 2);
  BatchMembers m = membersOf(batched);
  EXPECT_EQ(m.request_ids, (std::vector<uint64_t>{b}));
  EXPECT_EQ(m.step_begins, (std::vector<int32_t>{0}));
  EXPECT_EQ(f.cp->status(b).state, RequestState::kEncoding);
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 2u);
  for (const auto& r : f.results) EXPECT_EQ(r.state, RequestState::kDone) << r.reason;
  // a: steps 0 alone, 1 and 2 with b; b: steps 0 and 1 with a; then the two decodes one after the other
  auto denoised = [&](uint64_t id) {
    std::vector<std::pair<int32_t, int32_t>> out;  // (step, batch)
    for (const auto& s : f.result(id)->stages) {
      if (s.kind == TaskKind::kDenoise) out.emplace_back(s.step_begin, s.batch);
    }
    return out;
  };
  EXPECT_EQ(denoised(a), (std::vector<std::pair<int32_t, int32_t>>{{0, 1}, {1, 2}, {2, 2}}));
  EXPECT_EQ(denoised(b), (std::vector<std::pair<int32_t, int32_t>>{{0, 2}, {1, 2}}));
  EXPECT_EQ(countKind(f.exec, TaskKind::kDecode), 2);
  EXPECT_EQ(f.cp->stats().batched_steps, 2u);
  EXPECT_EQ(f.cp->numRequests(), 0u);
}

TEST(ControlPlane, ABatchOfDifferentShapesIsRefusedAndLosesNothing) {
  // The first round batches a 64x64 request with a 128x64 one on rank 0 (refused) and runs a third request on
  // rank 1 (accepted); later rounds batch only equal shapes. Nothing is lost: every request ends DONE.
  class MixesOnce : public BatchAll {
   public:
    std::vector<Decision> schedule(const SchedulerView& v) override {
      if (calls++ > 0) return BatchAll::schedule(v);
      Decision bad;
      bad.request_id = v.ready[0]->id;
      bad.ranks = {0};
      bad.batch = {v.ready[1]->id};
      Decision ok;
      ok.request_id = v.ready[2]->id;
      ok.ranks = {1};
      return {bad, ok};
    }
    int calls = 0;
  };
  Fixture f(2, std::make_shared<MixesOnce>());
  uint64_t a = f.cp->submit(spec(2));
  uint64_t b = f.cp->submit(spec(2, 128, 64));
  uint64_t c = f.cp->submit(spec(2));
  f.cp->poll();
  EXPECT_EQ(f.cp->stats().refused_decisions, 1u);
  EXPECT_NE(f.cp->lastRefusal().find("cannot batch"), std::string::npos) << f.cp->lastRefusal();
  EXPECT_NE(f.cp->lastRefusal().find("128x64"), std::string::npos) << f.cp->lastRefusal();
  EXPECT_EQ(f.cp->status(a).state, RequestState::kQueued);
  EXPECT_EQ(f.cp->status(b).state, RequestState::kQueued);
  EXPECT_EQ(f.cp->status(c).state, RequestState::kEncoding);
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 3u);
  for (const auto& r : f.results) EXPECT_EQ(r.state, RequestState::kDone) << r.reason;
}

TEST(ControlPlane, AMemberThatLeavesABatchLeavesTheOthersRunning) {
  // the head is cancelled between steps: its first rider leads on; a cancelled rider drops out of the next step
  Fixture f(1, std::make_shared<BatchAll>());
  uint64_t a = f.cp->submit(spec(4));
  uint64_t b = f.cp->submit(spec(4));
  uint64_t c = f.cp->submit(spec(4));
  f.cp->poll();
  // encodes of a, b, c, then one step of all three
  ASSERT_EQ(f.exec.kinds(), (std::vector<std::string>{"encode", "encode", "encode", "denoise"}));
  EXPECT_EQ(f.exec.sent[3].d.batch, 3);
  f.cp->cancel(a);
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 3u);
  EXPECT_EQ(f.result(a)->state, RequestState::kCancelled);
  EXPECT_EQ(f.result(b)->state, RequestState::kDone);
  EXPECT_EQ(f.result(c)->state, RequestState::kDone);
  for (size_t i = 4; i < f.exec.sent.size(); ++i) {  // nothing of a goes out after its cancel but a free
    const auto& s = f.exec.sent[i];
    if (static_cast<TaskKind>(s.d.kind) != TaskKind::kDenoise) continue;
    EXPECT_NE(s.d.request_id, a);
    for (uint64_t id : membersOf(s).request_ids) EXPECT_NE(id, a);
  }
  int batched = 0;
  for (const auto& s : f.result(c)->stages) batched += s.kind == TaskKind::kDenoise && s.batch == 2;
  EXPECT_GE(batched, 3);  // b and c on together
}

TEST(ControlPlane, ABatchedStepThatLosesAWorkerRecoversEveryMember) {
  Fixture f(2, std::make_shared<BatchAll>());
  uint64_t a = f.cp->submit(spec(3));
  uint64_t b = f.cp->submit(spec(3));
  f.cp->poll();
  f.exec.completeHead(*f.cp, 0);  // encodes
  f.exec.completeHead(*f.cp, 0);
  f.exec.completeHead(*f.cp, 0);  // the first batched step
  f.cp->poll();
  ASSERT_EQ(f.exec.sent.back().d.batch, 2);
  ASSERT_GE(f.exec.completeHead(*f.cp, 0, TaskError::kCommError, 1), 0);  // the second fails: both stay at step 1
  f.exec.drain(*f.cp);                                                    // the reinit, then the rest
  ASSERT_EQ(f.results.size(), 2u) << ::testing::PrintToString(f.exec.kinds());
  EXPECT_EQ(f.result(a)->state, RequestState::kDone) << f.result(a)->reason;
  EXPECT_EQ(f.result(b)->state, RequestState::kDone) << f.result(b)->reason;
  EXPECT_EQ(f.cp->stats().recoveries, 1u);
  // both went on from step 1, not from scratch
  EXPECT_EQ(countKind(f.exec, TaskKind::kEncode), 2);
}

namespace {

// Encodes and decodes on rank 1, steps on rank 0 (see NOTE [stages]).
class Split : public Policy {
 public:
  std::string name() const override { return "split"; }
  bool placesDecodes() const override { return true; }
  std::vector<Decision> schedule(const SchedulerView& v) override {
    std::vector<Decision> out;
    std::set<int> free(v.free_ranks.begin(), v.free_ranks.end());
    for (const auto* r : v.ready) {
      Decision d;
      d.request_id = r->id;
      if (r->state == RequestState::kQueued) {
        d.stage = encode_stage;
        d.ranks = {1};
      } else if (r->stepsLeft() == 0) {
        d.stage = cost::Stage::kDecode;
        d.ranks = decode_ranks;
      } else {
        d.ranks = {0};
        d.num_steps = r->stepsLeft();
      }
      bool ok = true;
      for (int w : d.ranks) ok = ok && (free.count(w) || d.stage == cost::Stage::kDecode);  // decodes: as told
      if (!ok) continue;
      for (int w : d.ranks) free.erase(w);
      out.push_back(d);
    }
    return out;
  }
  cost::Stage encode_stage = cost::Stage::kEncode;
  std::vector<int> decode_ranks = {1};
};

}  // namespace

TEST(ControlPlane, StagesRunWhereThePolicyPlacesThem) {
  Fixture f(2, std::make_shared<Split>());
  uint64_t id = f.cp->submit(spec(2));
  f.cp->poll();
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 1u) << ::testing::PrintToString(f.exec.kinds());
  EXPECT_EQ(f.results[0].state, RequestState::kDone) << f.results[0].reason;
  // the encode on 1, the state to 0 for the steps, the latent back to 1 for the decode; stale copies freed
  std::vector<std::pair<std::string, std::vector<int>>> got;
  for (const auto& s : f.exec.sent) got.emplace_back(taskKindName(static_cast<TaskKind>(s.d.kind)), s.workers);
  using P = std::pair<std::string, std::vector<int>>;
  EXPECT_EQ(
      got, (std::vector<P>{P{"encode", {1}}, P{"migrate", {1, 0}}, P{"free", {1}}, P{"denoise", {0}}, P{"denoise", {0}},
                           P{"migrate", {0, 1}}, P{"free", {0}}, P{"decode", {1}}, P{"free", {1}}}));
  EXPECT_FALSE(f.cp->status(id).known);
}

TEST(ControlPlane, AStageForTheWrongRequestIsRefused) {
  // steps done but the decode asked on three ranks of a 64-row latent is fine; one on a dead rank is not
  auto policy = std::make_shared<Split>();
  policy->decode_ranks = {1, 2};
  Fixture f(3, policy);
  f.cp->onWorkerDeath(2);
  f.cp->poll();
  f.exec.drain(*f.cp);  // the reinit
  uint64_t id = f.cp->submit(spec(1));
  f.cp->poll();
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 1u) << ::testing::PrintToString(f.exec.kinds()) << " "
                                  << requestStateName(f.cp->status(id).state) << " " << f.cp->lastRefusal() << " "
                                  << f.cp->numTasksInFlight();
  EXPECT_EQ(f.results[0].state, RequestState::kFailed);  // nothing else in flight: NOTE [refused decisions]
  EXPECT_NE(f.results[0].reason.find("rank 2"), std::string::npos) << f.results[0].reason;
  // a decode for a request with steps left, an encode for one that has started
  class Wrong : public Policy {
   public:
    std::string name() const override { return "wrong"; }
    std::vector<Decision> schedule(const SchedulerView& v) override {
      Decision d;
      d.request_id = v.ready[0]->id;
      d.ranks = {0};
      d.stage = v.ready[0]->state == RequestState::kQueued ? cost::Stage::kDecode : cost::Stage::kEncode;
      return {d};
    }
  };
  Fixture g(1, std::make_shared<Wrong>());
  g.cp->submit(spec(1));
  g.cp->poll();
  ASSERT_EQ(g.results.size(), 1u);
  EXPECT_NE(g.results[0].reason.find("a decode for request"), std::string::npos) << g.results[0].reason;
  EXPECT_EQ(g.cp->stats().refused_decisions, 1u);
}

TEST(ControlPlane, SplitStagesKeepEncodesAndDecodesOnTheAuxiliaryRank) {
  Fixture f(3, "fcfs:stages=split");
  for (int i = 0; i < 4; ++i) f.cp->submit(spec(3, 64, 64, 10 + i));
  f.cp->poll();
  f.exec.drain(*f.cp);
  ASSERT_EQ(f.results.size(), 4u);
  for (const auto& r : f.results) {
    EXPECT_EQ(r.state, RequestState::kDone) << r.reason;
    for (const auto& s : r.stages) {
      if (s.kind == TaskKind::kEncode || s.kind == TaskKind::kDecode) {
        EXPECT_EQ(s.ranks, (std::vector<int>{2}));
      }
      if (s.kind == TaskKind::kDenoise) {
        for (int w : s.ranks) EXPECT_NE(w, 2);
      }
    }
  }
  EXPECT_EQ(makePolicy("fcfs:stages=split=2")->name(), "fcfs:stages=split=2");
  EXPECT_EQ(makePolicy("srtf:decode=1:batch=2")->name(), "srtf:batch=2:decode=1");
  EXPECT_THROW(makePolicy("fcfs:stages=split=0"), Error);
  EXPECT_TRUE(makePolicy("edf:stages=split")->placesDecodes());
  EXPECT_FALSE(makePolicy("edf")->placesDecodes());
}

TEST(ControlPlane, ADeterministicErrorFailsItsRequestWithItsCauseAndIsNotRetried) {
  // member 0 of a two-rank step raises (a bad request); member 1, blocked in the step's collective, is released
  // by the recovery that starts and reports the abort's echo. The request fails with the first cause at once;
  // the recovery re-creates the world for the others, and the request is not run again.
  Fixture f(2, "static:2");
  uint64_t bad = f.cp->submit(spec(3));
  f.cp->poll();
  f.exec.completeHead(*f.cp, 0);  // encode
  f.exec.completeHead(*f.cp, 0);  // its copy
  f.exec.completeHead(*f.cp, 1);
  f.exec.completeHead(*f.cp, 0, TaskError::kInvalidRequest);  // step 0 raises on member 0
  EXPECT_TRUE(f.cp->recovering());                            // member 1 waits in the collective
  f.exec.completeHead(*f.cp, 1, TaskError::kCommError);
  f.exec.drain(*f.cp);
  ASSERT_NE(f.result(bad), nullptr);
  EXPECT_EQ(f.result(bad)->state, RequestState::kFailed);
  EXPECT_NE(f.result(bad)->reason.find("injected invalid_request"), std::string::npos) << f.result(bad)->reason;
  EXPECT_EQ(countKind(f.exec, TaskKind::kEncode), 1);  // not started again
  // a model error too
  Fixture g(1, "static:1");
  uint64_t id = g.cp->submit(spec(2));
  g.cp->poll();
  g.exec.completeHead(*g.cp, 0);
  g.exec.completeHead(*g.cp, 0, TaskError::kModelError);
  g.exec.drain(*g.cp);
  EXPECT_EQ(g.result(id)->state, RequestState::kFailed);
  EXPECT_EQ(countKind(g.exec, TaskKind::kEncode), 1);
}
