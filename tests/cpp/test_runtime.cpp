// The data path between control plane and workers: message rings, queue sets across processes, outputs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gfdit/clock.h"
#include "gfdit/error.h"
#include "gfdit/messages.h"
#include "gfdit/outputs.h"
#include "gfdit/rings.h"
#include "rank_harness.h"

using namespace gfdit;
using namespace gfdit::runtime;

namespace {

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : mem(n + 64, 0) {}
  void* get() { return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(mem.data()) + 63) & ~uintptr_t{63}); }
  std::vector<uint8_t> mem;
};

}  // namespace

TEST(MessageRing, FifoFullEmptyAndWrap) {
  AlignedBuffer buf(MessageRing::footprint(4096));
  MessageRing q = MessageRing::create(buf.get(), 4096, nullptr);
  std::string out;
  EXPECT_FALSE(q.tryPop(out));
  EXPECT_TRUE(q.empty());
  // messages of varying sizes, many laps: every byte comes back in order
  std::mt19937 gen(7);
  uint64_t pushed = 0, popped = 0;
  std::vector<std::string> inflight;
  for (int round = 0; round < 2000; ++round) {
    std::string m(gen() % 700, '\0');
    for (auto& ch : m) ch = static_cast<char>(gen());
    if (q.tryPush(m.data(), m.size())) {
      inflight.push_back(m);
      ++pushed;
    } else {
      ASSERT_FALSE(inflight.empty()) << "full while empty";
    }
    if (gen() % 3 == 0 || inflight.size() > 4) {
      while (!inflight.empty() && gen() % 2 == 0) {
        ASSERT_TRUE(q.tryPop(out));
        ASSERT_EQ(out, inflight.front());
        inflight.erase(inflight.begin());
        ++popped;
      }
    }
  }
  while (!inflight.empty()) {
    ASSERT_TRUE(q.tryPop(out));
    ASSERT_EQ(out, inflight.front());
    inflight.erase(inflight.begin());
  }
  EXPECT_FALSE(q.tryPop(out));
  EXPECT_GT(pushed, 1000u);
  // two-part messages, and a bounded wait on an empty ring
  const char a[] = "head", b[] = "payload";
  ASSERT_TRUE(q.tryPush(a, 4, b, 7));
  ASSERT_TRUE(q.tryPop(out));
  EXPECT_EQ(out, "headpayload");
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(q.pop(out, std::chrono::milliseconds(30)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
  std::string huge(q.maxMessage() + 1, 'x');
  EXPECT_THROW(q.tryPush(huge.data(), huge.size()), Error);
}

TEST(QueueSet, TasksWithPayloadsAndCompletionsAcrossProcesses) {
  auto set = QueueSet::create(3, 1 << 18);
  const int kWorkers = 3, kTasks = 300;
  std::vector<pid_t> kids;
  for (int w = 0; w < kWorkers; ++w) {
    pid_t pid = fork();
    if (pid == 0) {
      auto mine = QueueSet::attach(set->name());
      TaskDescriptor t;
      std::string payload;
      for (int i = 0; i < kTasks; ++i) {
        if (!mine->popTask(w, t, payload, std::chrono::seconds(20))) _exit(3);
        if (t.task_id != static_cast<uint64_t>(i) || payload != std::string(i * 37 % 20000, 'a' + i % 26)) _exit(4);
        Completion c;
        c.task_id = t.task_id;
        c.rank = w;
        c.step_end = i;
        if (!mine->pushCompletion(w, c, std::chrono::seconds(20))) _exit(2);
      }
      _exit(0);
    }
    kids.push_back(pid);
  }
  for (int i = 0; i < kTasks; ++i) {
    for (int w = 0; w < kWorkers; ++w) {
      TaskDescriptor t;
      t.task_id = static_cast<uint64_t>(i);
      std::string payload(i * 37 % 20000, 'a' + i % 26);  // prompts up to ~20 KB
      t.payload_bytes = static_cast<uint32_t>(payload.size());
      ASSERT_TRUE(set->pushTask(w, t, payload, std::chrono::seconds(20)));
    }
  }
  std::vector<int> next(kWorkers, 0);
  int got = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got < kWorkers * kTasks && std::chrono::steady_clock::now() < deadline) {
    uint32_t bell = __atomic_load_n(&set->controlBell()->value, __ATOMIC_SEQ_CST);
    bool any = false;
    for (int w = 0; w < kWorkers; ++w) {
      Completion c;
      while (set->tryPopCompletion(w, c)) {
        any = true;
        ASSERT_EQ(c.rank, w);
        ASSERT_EQ(c.task_id, static_cast<uint64_t>(next[w])) << "worker " << w << " out of order";
        ++next[w];
        ++got;
      }
    }
    if (!any) waitDoorbell(set->controlBell(), bell, nowNs() + 50000000);
  }
  EXPECT_EQ(got, kWorkers * kTasks);
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  set->unlinkName();
  for (const auto& n : gfdit::testing::shmNames()) EXPECT_NE("/" + n, set->name());
}

TEST(QueueSet, ProducerKilledMidPushDoesNotWedgeTheRings) {
  auto set = QueueSet::create(2, 1 << 16);
  pid_t pid = fork();
  if (pid == 0) {
    auto mine = QueueSet::attach(set->name());
    Completion c;
    c.rank = 0;
    for (uint64_t i = 0;; ++i) {  // as fast as it can, until killed (blocking when full)
      c.task_id = i;
      std::string message = "completion " + std::to_string(i);
      c.payload_bytes = static_cast<uint32_t>(message.size());
      mine->pushCompletion(0, c, std::chrono::seconds(60), true, message);
    }
  }
  // let it fill and drain a few laps, then kill it while it pushes
  uint64_t expect = 0;
  Completion c;
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until) {
    while (set->tryPopCompletion(0, c)) {
      ASSERT_EQ(c.task_id, expect++);
    }
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  std::string message;
  while (set->tryPopCompletion(0, c, &message)) {  // whatever it published is whole and in order
    ASSERT_EQ(c.task_id, expect);
    ASSERT_EQ(message, "completion " + std::to_string(expect));
    ++expect;
  }
  EXPECT_GT(expect, 100u);
  // the other worker's ring, and the dead one's ring for a successor, still work
  Completion d;
  d.task_id = 42;
  ASSERT_TRUE(set->pushCompletion(1, d, std::chrono::seconds(1)));
  ASSERT_TRUE(set->tryPopCompletion(1, c));
  EXPECT_EQ(c.task_id, 42u);
  ASSERT_TRUE(set->pushCompletion(0, d, std::chrono::seconds(1)));
  ASSERT_TRUE(set->tryPopCompletion(0, c));
  EXPECT_EQ(c.task_id, 42u);
}

TEST(Dispatcher, AFullRingNeverBlocksAndKeepsTheOrder) {
  // A worker that reads nothing: pushes return at once, and what does not fit waits in order
  auto set = QueueSet::create(2);
  Dispatcher out(*set);
  const std::string payload(16 * 1024, 'p');
  const int kTasks = 200;  // ~3 MB for a ring of about 1 MB
  const int64_t t0 = nowNs();
  for (int i = 0; i < kTasks; ++i) {
    TaskDescriptor t;
    t.task_id = static_cast<uint64_t>(i + 1);
    t.payload_bytes = static_cast<uint32_t>(payload.size());
    out.push(0, t, payload, t0);
  }
  EXPECT_GT(out.backlog(0), 0u);
  EXPECT_EQ(out.backlog(1), 0u);
  EXPECT_TRUE(out.waiting());
  // the worker takes its tasks slowly: each flush moves what fits, and every task arrives once, in order
  TaskDescriptor t;
  std::string got;
  uint64_t next = 1;
  for (int round = 0; round < 10000 && next <= static_cast<uint64_t>(kTasks); ++round) {
    while (set->popTask(0, t, got, std::chrono::microseconds(0))) {
      ASSERT_EQ(t.task_id, next);
      ASSERT_EQ(got, payload);
      ++next;
    }
    EXPECT_TRUE(out.flush(t0, int64_t{5} * 1000000000).empty());
  }
  EXPECT_EQ(next, static_cast<uint64_t>(kTasks) + 1);
  EXPECT_FALSE(out.waiting());
  // a backlog older than its bound names its worker (wedged) and is dropped
  for (int i = 0; i < kTasks; ++i) {
    TaskDescriptor u;
    u.task_id = static_cast<uint64_t>(i + 1);
    u.payload_bytes = static_cast<uint32_t>(payload.size());
    out.push(1, u, payload, t0);
  }
  EXPECT_TRUE(out.flush(t0 + 1000, 5000).empty());
  EXPECT_EQ(out.flush(t0 + 6000, 5000), (std::vector<int>{1}));
  EXPECT_EQ(out.backlog(1), 0u);
}

TEST(QueueSet, AReplacementAttachesThroughAnInheritedDescriptorToEmptiedRings) {
  // see NOTE [replacements]: the name is gone; the worker's old tasks and completions are dropped
  auto set = QueueSet::create(1);
  int fd = ::shm_open(set->name().c_str(), O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  set->unlinkName();
  TaskDescriptor t;
  t.task_id = 7;
  ASSERT_TRUE(set->pushTask(0, t, std::string(), std::chrono::seconds(1)));
  {
    auto old = QueueSet::attach(set->name(), ::dup(fd));
    Completion c;
    c.task_id = 6;
    ASSERT_TRUE(old->pushCompletion(0, c, std::chrono::seconds(1)));
  }
  set->resetWorker(0);
  EXPECT_EQ(set->pendingTasks(0), 0u);
  Completion c;
  EXPECT_FALSE(set->tryPopCompletion(0, c));
  t.task_id = 8;
  ASSERT_TRUE(set->pushTask(0, t, std::string(), std::chrono::seconds(1)));
  auto fresh = QueueSet::attach(set->name(), fd);
  std::string payload;
  ASSERT_TRUE(fresh->popTask(0, t, payload, std::chrono::seconds(1)));
  EXPECT_EQ(t.task_id, 8u);
  EXPECT_FALSE(fresh->popTask(0, t, payload, std::chrono::microseconds(0)));
}

TEST(Outputs, WrittenMappedUnlinkedAndSwept) {
  auto set = QueueSet::create(1, 1 << 16);
  std::string prefix = outputPrefix(set->name());
  std::vector<float> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i) * 0.5f;
  OutputRef ref;
  writeOutput(prefix + "7-0", data.data(), data.size() * sizeof(float), ref);
  {
    auto m = MappedOutput::open(ref);
    ASSERT_EQ(m->bytes(), data.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(m->data(), data.data(), m->bytes()), 0);
    for (const auto& n : gfdit::testing::shmNames()) EXPECT_NE("/" + n, prefix + "7-0");  // unlinked at open
  }
  OutputRef lost1, lost2;
  writeOutput(prefix + "8-0", data.data(), 64, lost1);
  writeOutput(prefix + "9-1", data.data(), 64, lost2);
  discardOutput(lost1);
  EXPECT_EQ(unlinkOutputs(prefix), 1);
  EXPECT_EQ(unlinkOutputs(prefix), 0);
  EXPECT_THROW(MappedOutput::open(lost2), Error);
}
