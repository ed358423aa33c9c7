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

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

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

// NOTE [adaptive spin]
// A rank with a core of its own spins up to 1 ms before it blocks: a futex round trip costs tens of
// microseconds, spinning costs nobody. That holds only while the host has a core to spare. On a shared host
// (an engine's control thread, a server, other processes, a compile) a spinning rank burns its share of a
// core that its peer or another process needs, and a two-rank step takes several times as long. So the spin
// budget follows the evidence of each waiting thread: at the start of every wait that is not over at once,
// the thread reads its count of involuntary context switches (getrusage RUSAGE_THREAD, ru_nivcsw; one
// system call, about 0.4 us), the times another task was given its core while it ran, computed or spun.
// The policy counts them in windows of kRegrowPeriod: at kBusyPreemptions or more per period the host is
// oversubscribed now, and the budget drops at once to the floor (2 us, what a rank that shares its core
// spins), so waits block on their doorbell almost at once; a window with fewer than one per period doubles
// it back towards its ceiling (2 us to 1 ms in 9 doublings, about 0.2 s); in between it stays. A single
// preemption is no evidence: a rank's own heartbeat thread (every 20 ms, NOTE [liveness]) or the engine's
// control thread waking on its core preempts it for microseconds, and dropping on each of those makes every
// small collective on a quiet machine pay a futex round trip (a 4 KiB all-to-all of two ranks takes about
// 20 us blocking, 4 us spinning). Other signals, and why not: the thread's CPU time against the wall time
// of a spin tells only a spin that was itself preempted (a 1 ms spin mostly is not, yet it still holds a
// core someone waits for); /proc/loadavg counts the runnable tasks of the whole machine, not of the cores
// this process may use, and costs about 4 us to read. A yield that hands the core to another task counts
// as involuntary too, rightly: someone else wanted the core. The adaptive waits do not yield (a yield to a
// foreign task gives the core away for its whole slice, where a blocked waiter is woken the moment its
// doorbell rings).
// Where ranks outnumber the cores of the process (usableCores(): its CPU affinity and cgroup quota), every
// wait spins 2 us and yields 300 us. GFDIT_SPIN_US, GFDIT_YIELD_US and WorldOptions::spin_us fix the values
// and turn adapting off.

/// How long the waits of one world spin and yield: fixed, or adapted to whether the host has a core to
/// spare right now (NOTE [adaptive spin]). Lock-free: waits of several threads may observe at once.
class SpinPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  /// The window in which preemptions are counted; a quiet one doubles the budget.
  static constexpr std::chrono::milliseconds kRegrowPeriod{20};
  /// Preemptions per period from which the host counts as oversubscribed.
  static constexpr int64_t kBusyPreemptions = 3;

  /// Every wait spins and yields as `fixed` says.
  explicit SpinPolicy(Backoff fixed) : SpinPolicy(fixed, fixed.spin) {}
  /// Waits spin at most ceiling.spin, at least `floor`, and yield ceiling.yield; adaptive where floor <
  /// ceiling.spin. The budget starts at the ceiling.
  SpinPolicy(Backoff ceiling, std::chrono::microseconds floor);
  SpinPolicy(const SpinPolicy& other);

  bool adaptive() const { return floor_ns_ < ceiling_ns_; }
  /// The spin and yield of a wait that starts now.
  Backoff current() const;
  /// One look of a waiting thread at `now`: the times it was preempted since its previous look.
  void observe(int64_t preemptions, Clock::time_point now);

 private:
  int64_t floor_ns_;
  int64_t ceiling_ns_;
  std::chrono::microseconds yield_;
  std::atomic<int64_t> spin_ns_;
  std::atomic<int64_t> window_ns_;    // Clock time the current window began (0: none yet)
  std::atomic<int64_t> preemptions_;  // counted in the current window
};

/// The times the calling thread was preempted (ru_nivcsw) since its previous call; 0 on its first.
int64_t preemptionsSinceLastLook();

/// Waits until *value != seen: spins for the policy's budget, yields the core for its yield (a peer may
/// need it when ranks outnumber cores), then blocks on the futex; returns after at most `slice` in any case.
/// An adaptive policy observes the thread once per wait that is not over at once. Returns whether it blocked.
bool waitBell(uint32_t* value, uint32_t* waiters, uint32_t seen, SpinPolicy& policy, std::chrono::nanoseconds slice);

/// The cores this process may run on: its CPU affinity, fewer where a cgroup CPU quota allows less; at
/// least 1.
int usableCores();
/// The cores a cgroup CPU quota allows, rounded up, or 0 for none: `cpu_max` is cgroup v2's cpu.max
/// ("max 100000", "150000 100000"), `quota` and `period` cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us
/// ("-1" for none); "" where a file is absent.
int quotaCores(const std::string& cpu_max, const std::string& quota, const std::string& period);

}  // namespace core
}  // namespace gfdit
