#include "doorbell.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

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

bool waitBell(uint32_t* value, uint32_t* waiters, uint32_t seen, const Backoff& backoff,
              std::chrono::nanoseconds slice) {
  auto start = Clock::now();
  auto spin_end = start + backoff.spin;
  for (int i = 0;; ++i) {
    if (__atomic_load_n(value, __ATOMIC_ACQUIRE) != seen) return false;
    cpuRelax();
    if ((i & 63) == 63 && Clock::now() >= spin_end) break;
  }
  auto yield_end = Clock::now() + backoff.yield;
  while (Clock::now() < yield_end) {
    if (__atomic_load_n(value, __ATOMIC_ACQUIRE) != seen) return false;
    sched_yield();
  }
  blockOnBell(value, waiters, seen, slice - (Clock::now() - start));
  return true;
}

}  // namespace core
}  // namespace gfdit
