// src/core: shared-memory objects, doorbells, heartbeats, the heap allocator.
#include <gtest/gtest.h>

#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <limits>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "doorbell.h"
#include "gfdit/error.h"
#include "heap.h"
#include "liveness.h"
#include "shm.h"

using namespace gfdit;

namespace {

bool shmExists(const std::string& name) {
  struct stat st;
  return ::stat(("/dev/shm" + name).c_str(), &st) == 0;
}

}  // namespace

TEST(Core, SharedMemoryIsZeroedMappedTwiceAndUnlinked) {
  std::string name;
  {
    auto a = core::SharedMemory::createUnique("gfdit-test", 8192);
    name = a.name();
    ASSERT_EQ(a.size(), 8192u);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.data()[i], 0);
    a.data()[100] = 42;
    auto b = core::SharedMemory::open(name);  // the whole size from fstat
    EXPECT_EQ(b.size(), 8192u);
    EXPECT_EQ(b.data()[100], 42);
    EXPECT_TRUE(shmExists(name));
    a.unlink();
    EXPECT_FALSE(shmExists(name));
    EXPECT_EQ(b.data()[100], 42);  // the mappings stay
    EXPECT_THROW(core::SharedMemory::open(name), Error);
  }
  {
    auto c = core::SharedMemory::createUnique("gfdit-test", 4096);
    name = c.name();
    EXPECT_THROW(core::SharedMemory::createNamed(name, 4096), Error);  // O_EXCL
  }
  EXPECT_FALSE(shmExists(name));  // the creator removes a name it still owns
}

TEST(Core, DoorbellWakesABlockedWaiterAcrossProcesses) {
  auto m = core::SharedMemory::createUnique("gfdit-test", 4096);
  auto* words = reinterpret_cast<uint32_t*>(m.data());
  uint32_t seen = core::readBell(&words[0]);
  pid_t child = fork();
  if (child == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    core::ringBell(&words[0], &words[16]);
    _exit(0);
  }
  auto start = std::chrono::steady_clock::now();
  while (core::readBell(&words[0]) == seen) {
    core::SpinPolicy fixed(core::Backoff{});
    core::waitBell(&words[0], &words[16], seen, fixed, std::chrono::seconds(5));
  }
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(waited, 4.0);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_EQ(words[16], 0u);  // the waiter count is back to zero
}

TEST(Core, AdaptiveSpinDropsToTheFloorWhenPreemptedOftenAndDoublesBackEachQuietPeriod) {
  using std::chrono::microseconds;
  const auto period = core::SpinPolicy::kRegrowPeriod;
  core::SpinPolicy p(core::Backoff{microseconds(1000), microseconds(0)}, microseconds(2));
  ASSERT_TRUE(p.adaptive());
  auto t = core::SpinPolicy::Clock::time_point{} + std::chrono::hours(1);
  EXPECT_EQ(p.current().spin, microseconds(1000));  // an idle host's budget at first
  p.observe(0, t);                                  // the window begins
  // Two stray preemptions in a period (a heartbeat, a control thread waking): no evidence, the budget stays.
  p.observe(1, t + period / 4);
  p.observe(1, t + period / 2);
  EXPECT_EQ(p.current().spin, microseconds(1000));
  p.observe(0, t + period);  // the window closes: two per period is neither busy nor quiet
  EXPECT_EQ(p.current().spin, microseconds(1000));
  // Three within a period: oversubscribed, at once.
  t += period;
  p.observe(2, t + period / 4);
  EXPECT_EQ(p.current().spin, microseconds(1000));
  p.observe(1, t + period / 2);
  EXPECT_EQ(p.current().spin, microseconds(2));
  EXPECT_EQ(p.current().yield, microseconds(0));
  t += period / 2;  // a new window began at the drop
  p.observe(0, t + period / 2);
  EXPECT_EQ(p.current().spin, microseconds(2));  // no growth within a period
  // One doubling per quiet period, whatever the number of looks within it: 2, 4, ..., 512, then the ceiling.
  int64_t expected = 2;
  for (int k = 1; k <= 12; ++k) {
    for (int look = 1; look <= 8; ++look) p.observe(0, t + (k - 1) * period + look * period / 8);
    expected = std::min<int64_t>(1000, 2 * expected);
    EXPECT_EQ(p.current().spin.count(), expected) << "after " << k << " quiet periods";
  }
  // Sparse looks: 4 preemptions over 5 periods is less than one per period, so the host has a core to spare.
  t += 12 * period;
  p.observe(3, t);  // 3 in a new window that is just begun: busy
  EXPECT_EQ(p.current().spin, microseconds(2));
  p.observe(4, t + 5 * period);
  EXPECT_EQ(p.current().spin, microseconds(4));
  // A busy host (3 preemptions every period) keeps it at the floor.
  t += 5 * period;
  for (int k = 1; k <= 10; ++k) {
    p.observe(3, t + k * period);
    EXPECT_EQ(p.current().spin, microseconds(2)) << "busy period " << k;
  }
}

TEST(Core, FixedSpinNeverAdapts) {
  using std::chrono::microseconds;
  auto t = core::SpinPolicy::Clock::time_point{} + std::chrono::hours(1);
  core::SpinPolicy fixed(core::Backoff{microseconds(7), microseconds(9)});
  core::SpinPolicy floor_above(core::Backoff{microseconds(7), microseconds(9)}, microseconds(50));
  for (core::SpinPolicy* p : {&fixed, &floor_above}) {
    EXPECT_FALSE(p->adaptive());
    p->observe(100, t);
    p->observe(0, t + std::chrono::seconds(1));
    EXPECT_EQ(p->current().spin, microseconds(7));
    EXPECT_EQ(p->current().yield, microseconds(9));
  }
}

TEST(Core, APreemptedThreadSeesItsPreemption) {
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &mine)) ++cpu;
  // The looking thread and a spinning one share one CPU: the scheduler has to take it from the looker.
  auto pin = [cpu] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof(one), &one) == 0;
  };
  std::atomic<bool> stop{false};
  std::atomic<bool> hog_pinned{false};
  std::thread hog([&] {
    hog_pinned = pin();
    while (!stop.load(std::memory_order_relaxed)) core::cpuRelax();
  });
  int64_t first = -1;
  bool seen = false, pinned = false;
  std::thread looker([&] {
    pinned = pin();
    first = core::preemptionsSinceLastLook();
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!seen && std::chrono::steady_clock::now() < until) {
      auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
      while (std::chrono::steady_clock::now() < next) core::cpuRelax();
      seen = core::preemptionsSinceLastLook() > 0;
    }
  });
  looker.join();
  stop = true;
  hog.join();
  ASSERT_TRUE(pinned && hog_pinned);
  EXPECT_EQ(first, 0);  // a thread's first look has nothing to compare with
  EXPECT_TRUE(seen);
}

TEST(Core, UsableCoresFollowTheAffinity) {
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  int all = core::usableCores();
  EXPECT_GE(all, 1);
  EXPECT_LE(all, CPU_COUNT(&mine));
  int on_one = 0;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &mine)) {
        CPU_SET(cpu, &one);
        break;
      }
    }
    if (sched_setaffinity(0, sizeof(one), &one) == 0) on_one = core::usableCores();
  });
  t.join();
  EXPECT_EQ(on_one, 1);
}

TEST(Core, QuotaCoresFromCgroupFiles) {
  EXPECT_EQ(core::quotaCores("max 100000", "", ""), 0);
  EXPECT_EQ(core::quotaCores("150000 100000", "", ""), 2);  // 1.5 cores: rounded up
  EXPECT_EQ(core::quotaCores("50000 100000", "", ""), 1);
  EXPECT_EQ(core::quotaCores("400000 100000", "100000", "100000"), 4);  // v2 wins where both exist
  EXPECT_EQ(core::quotaCores("", "-1", "100000"), 0);
  EXPECT_EQ(core::quotaCores("", "300000", "100000"), 3);
  EXPECT_EQ(core::quotaCores("", "", ""), 0);
  EXPECT_EQ(core::quotaCores("lots", "x", "y"), 0);
}

TEST(Core, HeartbeatTicksAndAStoppedOneGoesStale) {
  uint64_t word = 0;
  {
    core::Heartbeat beat(&word);
    core::PeerLiveness peer(&word, ::getpid(), 0, std::chrono::milliseconds(300));
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (__atomic_load_n(&word, __ATOMIC_ACQUIRE) < 3 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_GE(word, 3u);
    EXPECT_TRUE(peer.alive(std::chrono::steady_clock::now()));
  }
  uint64_t stopped = word;  // the heartbeat's thread has ended
  core::PeerLiveness peer(&word, ::getpid(), 0, std::chrono::milliseconds(50));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(peer.alive(t0));
  EXPECT_FALSE(peer.alive(t0 + std::chrono::milliseconds(200)));
  EXPECT_NE(std::string(peer.reason()).find("heartbeat"), std::string::npos) << peer.reason();
  EXPECT_EQ(word, stopped);
}

TEST(Core, PidLivenessOnlyInTheOwnNamespace) {
  pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_FALSE(core::processAlive(child));
  EXPECT_TRUE(core::processAlive(::getpid()));
  uint64_t word = 0;
  auto now = std::chrono::steady_clock::now();
  // Same namespace: the exited pid is death at once.
  core::PeerLiveness here(&word, child, core::pidNamespace(), std::chrono::seconds(60));
  EXPECT_FALSE(here.alive(now));
  // Another namespace (or unknown): the pid means nothing, only the heartbeat counts.
  core::PeerLiveness there(&word, child, core::pidNamespace() + 1, std::chrono::seconds(60));
  EXPECT_TRUE(there.alive(now));
}

TEST(Core, HeapAllocatorFirstFitPlacementAndCoalescing) {
  core::HeapAllocator h(4096, 256);
  EXPECT_EQ(h.rounded(1), 256u);
  size_t a = h.alloc(100), b = h.alloc(300), c = h.alloc(256);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 256u);
  EXPECT_EQ(c, 768u);
  EXPECT_EQ(h.used(), 1024u);
  EXPECT_TRUE(h.free(b));
  EXPECT_FALSE(h.free(b));
  EXPECT_EQ(h.firstFitFrom(0, 256), 256u);
  EXPECT_EQ(h.firstFitFrom(300, 256), 512u);   // aligned up past 300: the rest of the hole at 256
  EXPECT_EQ(h.firstFitFrom(300, 512), 1024u);  // too little of that hole is left after 300
  EXPECT_EQ(h.firstFitFrom(0, 1024), 1024u);
  EXPECT_FALSE(h.allocAt(0, 10));    // taken
  EXPECT_FALSE(h.allocAt(100, 10));  // unaligned
  EXPECT_TRUE(h.allocAt(2048, 512));
  EXPECT_EQ(h.firstFitFrom(1024, 2048), core::HeapAllocator::kNone);
  EXPECT_EQ(h.alloc(4096), core::HeapAllocator::kNone);
  EXPECT_TRUE(h.free(a));
  EXPECT_TRUE(h.free(c));
  EXPECT_TRUE(h.free(2048));
  EXPECT_EQ(h.used(), 0u);
  EXPECT_EQ(h.alloc(4096), 0u);  // every hole merged back into one block
  // Sizes near SIZE_MAX would wrap to a small block when rounded up: refused instead.
  EXPECT_TRUE(h.free(0));
  const size_t huge = std::numeric_limits<size_t>::max() - 10;
  EXPECT_EQ(h.alloc(huge), core::HeapAllocator::kNone);
  EXPECT_EQ(h.firstFitFrom(0, huge), core::HeapAllocator::kNone);
  EXPECT_FALSE(h.allocAt(256, huge));
  EXPECT_EQ(h.used(), 0u);
  // Random alloc / placement / free against a map of 256-byte units: blocks never overlap, used() adds up.
  core::HeapAllocator r(1 << 16, 256);
  std::vector<int> owner((1 << 16) / 256, -1);
  std::vector<std::pair<size_t, size_t>> live;  // offset, rounded bytes
  size_t used = 0;
  std::mt19937 rng(3);
  auto take = [&](size_t off, size_t bytes, int id) {
    for (size_t u = off / 256; u < (off + bytes) / 256; ++u) {
      ASSERT_EQ(owner[u], -1) << "unit " << u << " handed out twice";
      owner[u] = id;
    }
    live.emplace_back(off, bytes);
    used += bytes;
  };
  for (int i = 0; i < 4000; ++i) {
    int op = static_cast<int>(rng() % 3);
    size_t bytes = 1 + rng() % 3000;
    if (op == 0) {
      size_t off = r.alloc(bytes);
      if (off != core::HeapAllocator::kNone) take(off, r.rounded(bytes), i);
    } else if (op == 1) {
      size_t off = r.firstFitFrom(rng() % (1 << 16), bytes);
      if (off != core::HeapAllocator::kNone) {
        ASSERT_TRUE(r.allocAt(off, bytes));
        take(off, r.rounded(bytes), i);
      }
    } else if (!live.empty()) {
      size_t k = rng() % live.size();
      ASSERT_TRUE(r.free(live[k].first));
      for (size_t u = live[k].first / 256; u < (live[k].first + live[k].second) / 256; ++u) owner[u] = -1;
      used -= live[k].second;
      live.erase(live.begin() + static_cast<long>(k));
    }
    ASSERT_EQ(r.used(), used);
  }
}
