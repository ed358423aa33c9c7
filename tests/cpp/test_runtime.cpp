// Runtime control plane: shared-memory rings, the request state machine, the scheduler and policies.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "gfdit/error.h"
#include "gfdit/runtime.h"
#include "rank_harness.h"

using namespace gfdit;
using namespace gfdit::runtime;

TEST(ShmQueue, FifoFullAndEmpty) {
  std::vector<uint8_t> mem(ShmQueue::footprint(4, 16) + 64, 0);
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(mem.data()) + 63) & ~uintptr_t{63});
  ShmQueue q = ShmQueue::create(aligned, 4, 16);
  uint8_t e[16] = {};
  for (int i = 0; i < 4; ++i) {
    e[0] = static_cast<uint8_t>(i);
    EXPECT_TRUE(q.tryPush(e));
  }
  EXPECT_FALSE(q.tryPush(e));
  EXPECT_EQ(q.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(q.tryPop(e));
    EXPECT_EQ(e[0], i);
  }
  EXPECT_FALSE(q.tryPop(e));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(q.pop(e, std::chrono::milliseconds(30)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
}

TEST(ShmQueue, ManyProducersOneConsumerAcrossProcesses) {
  auto set = QueueSet::create(3, 64);
  const int kProducers = 3, kPerProducer = 20000;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProducers; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      auto mine = QueueSet::attach(set->name());
      // take this worker's dispatch queue in order
      TaskDescriptor t;
      for (int i = 0; i < 100; ++i) {
        if (!mine->dispatch(p).pop(&t, std::chrono::seconds(20)) || t.task_id != static_cast<uint64_t>(i)) _exit(3);
      }
      Completion c;
      for (int i = 0; i < kPerProducer; ++i) {
        c.rank = p;
        c.task_id = static_cast<uint64_t>(i);
        if (!mine->completion().push(&c, std::chrono::seconds(20))) _exit(2);
      }
      _exit(0);
    }
    kids.push_back(pid);
  }
  for (int p = 0; p < kProducers; ++p) {
    TaskDescriptor t;
    for (int i = 0; i < 100; ++i) {
      t.task_id = static_cast<uint64_t>(i);
      ASSERT_TRUE(set->dispatch(p).push(&t, std::chrono::seconds(20)));
    }
  }
  std::vector<uint64_t> next(kProducers, 0);
  Completion c;
  for (int i = 0; i < kProducers * kPerProducer; ++i) {
    ASSERT_TRUE(set->completion().pop(&c, std::chrono::seconds(20))) << "after " << i;
    ASSERT_EQ(c.task_id, next[c.rank]) << "producer " << c.rank << " out of order";
    ++next[c.rank];
  }
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  set->unlinkName();
  for (const auto& n : gfdit::testing::shmNames()) EXPECT_NE("/" + n, set->name());
}

TEST(Scheduler, StateMachineRecordsTransitions) {
  Scheduler s(2, makePolicy("fcfs"));
  RequestRecord r;
  r.id = 7;
  r.num_steps = 3;
  s.addRequest(r);
  s.transition(7, RequestState::kEncoding);
  s.transition(7, RequestState::kDenoising, 0);
  s.transition(7, RequestState::kDenoising, 1);
  EXPECT_THROW(s.transition(7, RequestState::kEncoding), Error);
  s.transition(7, RequestState::kDecoding, 3);
  s.transition(7, RequestState::kDone);
  EXPECT_THROW(s.transition(7, RequestState::kCancelled), Error);
  const auto& t = s.request(7).transitions;
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[0].state, RequestState::kQueued);
  EXPECT_EQ(t[5].state, RequestState::kDone);
  for (size_t i = 1; i < t.size(); ++i) EXPECT_GE(t[i].t_ns, t[i - 1].t_ns);
}

namespace {

RequestRecord req(uint64_t id, int64_t arrival, int steps = 4) {
  RequestRecord r;
  r.id = id;
  r.arrival_ns = arrival;
  r.num_steps = steps;
  return r;
}

}  // namespace

TEST(Scheduler, StaticKeepsItsGroup) {
  Scheduler s(4, makePolicy("static:2"));
  s.addRequest(req(1, 10));
  s.addRequest(req(2, 20));
  s.addRequest(req(3, 30));
  auto d = s.schedule();
  ASSERT_EQ(d.size(), 2u);  // two groups of two; the third request waits
  EXPECT_EQ(d[0].request_id, 1u);
  EXPECT_EQ(d[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(d[1].ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(d[0].layout.ulysses, 2);
  EXPECT_EQ(d[0].num_steps, 4);
  // Request 1 ran on {0,1}; it must come back to {0,1} even when {2,3} is free.
  s.mutableRequest(1).ranks = {0, 1};
  s.mutableRequest(2).ranks = {2, 3};
  s.occupy({0, 1});
  s.setBusy(3, true);  // keep 3 out of the way
  auto d2 = s.schedule();
  for (const auto& x : d2) EXPECT_NE(x.request_id, 1u);
  s.release({0, 1});
  s.occupy({2, 3});
  auto d3 = s.schedule();
  ASSERT_EQ(d3.size(), 1u);
  EXPECT_EQ(d3[0].request_id, 1u);
  EXPECT_EQ(d3[0].ranks, (std::vector<int>{0, 1}));
}

TEST(Scheduler, FcfsChangesDegreeWithLoad) {
  Scheduler s(4, makePolicy("fcfs"));
  s.addRequest(req(1, 10));
  auto d = s.schedule();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].ranks.size(), 4u);  // alone: all four ranks
  s.mutableRequest(1).ranks = d[0].ranks;
  s.addRequest(req(2, 20));
  s.addRequest(req(3, 30));
  d = s.schedule();
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].request_id, 1u);
  EXPECT_EQ(d[0].ranks.size(), 2u);  // shrinks to make room, keeping ranks it holds
  EXPECT_EQ(d[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(d[1].ranks.size(), 1u);
  EXPECT_EQ(d[2].ranks.size(), 1u);
  std::set<int> used;
  for (const auto& x : d)
    for (int r : x.ranks) EXPECT_TRUE(used.insert(r).second);
}

TEST(Scheduler, RejectsBadPolicyAnswers) {
  class Greedy : public Policy {
   public:
    std::string name() const override { return "greedy"; }
    std::vector<Decision> schedule(const SchedulerView& v) override {
      std::vector<Decision> out;
      for (const auto* r : v.ready) {
        Decision d;
        d.request_id = r->id;
        d.ranks = {0};  // every request on rank 0
        out.push_back(d);
      }
      return out;
    }
  };
  Scheduler s(2, std::make_unique<Greedy>());
  s.addRequest(req(1, 1));
  s.addRequest(req(2, 2));
  EXPECT_THROW(s.schedule(), Error);
  EXPECT_THROW(makePolicy("static:0"), Error);
  EXPECT_THROW(makePolicy("lifo"), Error);
}
