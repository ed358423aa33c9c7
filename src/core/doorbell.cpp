#include "doorbell.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <sstream>

namespace gfdit {
namespace core {

using Clock = std::chrono::steady_clock;

void ringBell(uint32_t* value, const uint32_t* waiters) {
  __atomic_fetch_add(value, 1u, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(waiters, __ATOMIC_SEQ_CST) != 0) {
    syscall(SYS_futex, value, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

void blockOnBell(uint32_t* value, uint32_t* waiters, uint32_t seen, std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  __atomic_fetch_add(waiters, 1u, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(value, __ATOMIC_SEQ_CST) == seen) {
    timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
    syscall(SYS_futex, value, FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  __atomic_fetch_sub(waiters, 1u, __ATOMIC_SEQ_CST);
}

namespace {

int64_t sinceEpochNs(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// The first line of a file, or "" where it cannot be read.
std::string firstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// ceil(quota / period) where both are positive numbers, else 0.
int coresOf(const std::string& quota, const std::string& period) {
  long long q = 0, p = 0;
  std::istringstream qs(quota), ps(period);
  if (!(qs >> q) || !(ps >> p) || q <= 0 || p <= 0) return 0;
  return static_cast<int>(std::max<long long>(1, (q + p - 1) / p));
}

}  // namespace

SpinPolicy::SpinPolicy(Backoff ceiling, std::chrono::microseconds floor)
    : floor_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(std::min(floor, ceiling.spin)).count()),
      ceiling_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(ceiling.spin).count()),
      yield_(ceiling.yield),
      spin_ns_(ceiling_ns_),
      window_ns_(0),
      preemptions_(0) {}

SpinPolicy::SpinPolicy(const SpinPolicy& other)
    : floor_ns_(other.floor_ns_),
      ceiling_ns_(other.ceiling_ns_),
      yield_(other.yield_),
      spin_ns_(other.spin_ns_.load(std::memory_order_relaxed)),
      window_ns_(other.window_ns_.load(std::memory_order_relaxed)),
      preemptions_(other.preemptions_.load(std::memory_order_relaxed)) {}

Backoff SpinPolicy::current() const {
  auto spin = std::chrono::nanoseconds(spin_ns_.load(std::memory_order_relaxed));
  return Backoff{std::chrono::duration_cast<std::chrono::microseconds>(spin), yield_};
}

void SpinPolicy::observe(int64_t preemptions, Clock::time_point now) {
  if (!adaptive()) return;
  // Racing observers may count a window twice or lose a look: either is one wait's worth.
  const int64_t period = std::chrono::nanoseconds(kRegrowPeriod).count();
  int64_t t = sinceEpochNs(now);
  int64_t begun = window_ns_.load(std::memory_order_relaxed);
  if (begun == 0) {
    window_ns_.store(t, std::memory_order_relaxed);
    begun = t;
  }
  int64_t count = preemptions_.fetch_add(preemptions, std::memory_order_relaxed) + preemptions;
  int64_t elapsed = t - begun;
  if (count >= kBusyPreemptions && count * period >= kBusyPreemptions * std::max(elapsed, period)) {
    spin_ns_.store(floor_ns_, std::memory_order_relaxed);
  } else if (elapsed >= period) {
    if (count * period < elapsed) {  // fewer than one per period: the host has a core to spare
      int64_t spin = spin_ns_.load(std::memory_order_relaxed);
      // From a floor of 0 the budget grows to 1 us first.
      spin_ns_.store(std::min(ceiling_ns_, std::max<int64_t>(2 * spin, 1000)), std::memory_order_relaxed);
    }
  } else {
    return;  // the window goes on
  }
  window_ns_.store(t, std::memory_order_relaxed);
  preemptions_.store(0, std::memory_order_relaxed);
}

int64_t preemptionsSinceLastLook() {
  thread_local long last = -1;
  rusage ru{};
  if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
  int64_t preemptions = last >= 0 ? ru.ru_nivcsw - last : 0;
  last = ru.ru_nivcsw;
  return preemptions;
}

bool waitBell(uint32_t* value, uint32_t* waiters, uint32_t seen, SpinPolicy& policy, std::chrono::nanoseconds slice) {
  auto start = Clock::now();
  Backoff backoff = policy.current();
  auto spin_end = start + backoff.spin;
  for (int i = 0;; ++i) {
    if (__atomic_load_n(value, __ATOMIC_ACQUIRE) != seen) return false;
    cpuRelax();
    if ((i & 63) != 63) continue;
    auto now = Clock::now();
    if (i == 63 && policy.adaptive()) {  // not over at once: see NOTE [adaptive spin]
      policy.observe(preemptionsSinceLastLook(), now);
      backoff = policy.current();
      spin_end = start + backoff.spin;
    }
    if (now >= spin_end) break;
  }
  auto yield_end = Clock::now() + backoff.yield;
  while (Clock::now() < yield_end) {
    if (__atomic_load_n(value, __ATOMIC_ACQUIRE) != seen) return false;
    sched_yield();
  }
  blockOnBell(value, waiters, seen, slice - (Clock::now() - start));
  return true;
}

int quotaCores(const std::string& cpu_max, const std::string& quota, const std::string& period) {
  std::istringstream v2(cpu_max);
  std::string q2, p2;
  if (v2 >> q2 >> p2) return coresOf(q2, p2);  // "max 100000": no quota (not a number)
  return coresOf(quota, period);
}

int usableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cores <= 0) cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  // The cgroup as a container sees it (its own cgroup namespace): v2 at the root, v1 under cpu/.
  int quota = quotaCores(firstLine("/sys/fs/cgroup/cpu.max"), firstLine("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
                         firstLine("/sys/fs/cgroup/cpu/cpu.cfs_period_us"));
  return quota > 0 ? std::min(cores, quota) : cores;
}

}  // namespace core
}  // namespace gfdit
