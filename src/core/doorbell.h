// Doorbells and bounded waits: how a rank that cannot make progress gives up its core.
//
// NOTE [doorbell]
// Anyone who stores a signal or ack into region r (or pushes into a ring) then increments r's doorbell and,
// if r has announced a blocked waiter, wakes it. A waiter reads the doorbell, tries to make progress, and
// blocks only while the doorbell still holds the value it read: an update between the read and the block
// changes the doorbell and the block returns at once. All doorbell and waiter-count accesses are
// sequentially consistent (Dekker's pattern: "increment doorbell, read waiters" vs "increment waiters, read
// doorbell"). The words live in shared memory: the futex is not FUTEX_PRIVATE.
#pragma once

#include <chrono>
#include <cstdint>

namespace gfdit {
namespace core {

/// A pause for a spinning loop (x86 pause, Arm yield).
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// The doorbell's current value (sequentially consistent).
inline uint32_t readBell(const uint32_t* value) { return __atomic_load_n(value, __ATOMIC_SEQ_CST); }

/// Rings: increments *value and wakes the waiters if *waiters says there are any. See NOTE [doorbell].
void ringBell(uint32_t* value, const uint32_t* waiters);

/// Blocks while *value == seen, at most `timeout`, announcing itself in *waiters meanwhile.
void blockOnBell(uint32_t* value, uint32_t* waiters, uint32_t seen, std::chrono::nanoseconds timeout);

/// How long a waiter spins and then yields before it blocks.
struct Backoff {
  std::chrono::microseconds spin{0};
  std::chrono::microseconds yield{0};
};

/// Waits until *value != seen: spins for backoff.spin, yields the core for backoff.yield (a peer may need
/// it when ranks outnumber cores), then blocks on the futex; returns after at most `slice` in any case.
/// Returns whether it blocked.
bool waitBell(uint32_t* value, uint32_t* waiters, uint32_t seen, const Backoff& backoff,
              std::chrono::nanoseconds slice);

}  // namespace core
}  // namespace gfdit
