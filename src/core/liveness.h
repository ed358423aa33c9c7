// Liveness of peer processes: a heartbeat word in each region, and the pid where it can be trusted.
//
// NOTE [liveness]
// Every world region carries a heartbeat: a 64-bit counter that a thread of its owner increments every
// kHeartbeatPeriod (release), for as long as the world exists. A peer waiting on the owner reads it
// (acquire) every so often; a counter that has not moved for the stale bound means the owner is gone
// (killed, or stopped), wherever it runs: ranks in other pid namespaces (containers) cannot see each
// other's pids, so a pid check alone would call them dead or, worse, probe an unrelated process. Where both
// ranks share a pid namespace (the region records its owner's namespace), a pid that no longer exists
// (or is a zombie) is also death, and is noticed at once rather than after the stale bound.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace gfdit {
namespace core {

/// How often a heartbeat ticks.
constexpr std::chrono::milliseconds kHeartbeatPeriod{20};
/// How often a waiting rank checks its peers' liveness and the abort word (World::watchAbort), so a dead peer
/// or an abort ends a wait within about this long.
constexpr std::chrono::milliseconds kPeerCheckPeriod{100};

/// An identifier of this process's pid namespace (the inode of /proc/self/ns/pid; 0 if unknown).
uint64_t pidNamespace();

/// Whether a process of this pid namespace is alive (a zombie is not).
bool processAlive(pid_t pid);

/// A thread that increments `*word` every kHeartbeatPeriod until destroyed. See NOTE [liveness].
class Heartbeat {
 public:
  explicit Heartbeat(uint64_t* word);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  uint64_t* word_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

/// One peer as a waiter sees it: its heartbeat word, and its pid where namespaces match.
class PeerLiveness {
 public:
  PeerLiveness() = default;
  /// heartbeat: the word in the peer's region; pid and pid_ns: as its region records them.
  PeerLiveness(const uint64_t* heartbeat, pid_t pid, uint64_t pid_ns, std::chrono::milliseconds stale);
  /// Whether the peer still looks alive at `now` (call it every so often while waiting on the peer).
  bool alive(std::chrono::steady_clock::time_point now);
  /// Why alive() said no ("pid 123 has exited", "heartbeat unchanged for 10.0 s").
  const char* reason() const { return reason_; }
  pid_t pid() const { return pid_; }

 private:
  const uint64_t* heartbeat_ = nullptr;
  pid_t pid_ = 0;
  bool same_namespace_ = false;
  std::chrono::milliseconds stale_{0};
  uint64_t last_ = 0;
  std::chrono::steady_clock::time_point last_change_{};
  char reason_[96] = {};
};

/// Whether pids are trusted where namespaces match (GFDIT_PID_LIVENESS=0 turns it off: heartbeats only).
bool pidLivenessEnabled();

/// The stale bound: GFDIT_HEARTBEAT_STALE_S (seconds) if set, else 10 s.
std::chrono::milliseconds heartbeatStaleBound();

}  // namespace core
}  // namespace gfdit
