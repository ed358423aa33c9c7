#include "liveness.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gfdit/settings.h"

namespace gfdit {
namespace core {

uint64_t pidNamespace() {
  struct stat st;
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

bool processAlive(pid_t pid) {
  if (pid <= 0) return true;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A process that exited but was not reaped yet still answers kill(pid, 0): read its state.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

Heartbeat::Heartbeat(uint64_t* word) : word_(word) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      __atomic_fetch_add(word_, uint64_t{1}, __ATOMIC_RELEASE);  // see NOTE [liveness]
      cv_.wait_for(lock, kHeartbeatPeriod, [this] { return stop_; });
    }
  });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

PeerLiveness::PeerLiveness(const uint64_t* heartbeat, pid_t pid, uint64_t pid_ns, std::chrono::milliseconds stale)
    : heartbeat_(heartbeat),
      pid_(pid),
      same_namespace_(pid_ns != 0 && pid_ns == pidNamespace() && pidLivenessEnabled()),
      stale_(stale),
      last_(heartbeat != nullptr ? __atomic_load_n(heartbeat, __ATOMIC_ACQUIRE) : 0),
      last_change_(std::chrono::steady_clock::now()) {}

bool PeerLiveness::alive(std::chrono::steady_clock::time_point now) {
  if (same_namespace_ && !processAlive(pid_)) {
    std::snprintf(reason_, sizeof(reason_), "pid %d has exited", static_cast<int>(pid_));
    return false;
  }
  if (heartbeat_ == nullptr) return true;
  uint64_t beat = __atomic_load_n(heartbeat_, __ATOMIC_ACQUIRE);
  if (beat != last_) {
    last_ = beat;
    last_change_ = now;
    return true;
  }
  if (now - last_change_ > stale_) {
    std::snprintf(reason_, sizeof(reason_), "its heartbeat has not moved for %.1f s",
                  std::chrono::duration<double>(now - last_change_).count());
    return false;
  }
  return true;
}

bool pidLivenessEnabled() { return settings::pidLiveness(); }

std::chrono::milliseconds heartbeatStaleBound() {
  return std::chrono::milliseconds(static_cast<int64_t>(settings::heartbeatStaleS() * 1000.0));
}

}  // namespace core
}  // namespace gfdit
