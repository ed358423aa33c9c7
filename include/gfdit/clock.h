// Where the control plane reads the time: a clock object, real or virtual, so that a test or the simulator
// runs a day of traffic in a second.
#pragma once

#include <cstdint>

namespace gfdit {
namespace runtime {

/// Monotonic nanoseconds (CLOCK_MONOTONIC, the same in every process of the machine).
int64_t nowNs();

/// Where the control plane reads the time. Nothing inside it calls a system clock directly.
class Clock {
 public:
  virtual ~Clock() = default;
  /// Nanoseconds on this clock's time line.
  virtual int64_t nowNs() const = 0;
};

/// The machine's monotonic clock.
class RealClock : public Clock {
 public:
  int64_t nowNs() const override { return runtime::nowNs(); }
};

/// A clock that moves only when told (the simulator, tests).
class VirtualClock : public Clock {
 public:
  int64_t nowNs() const override { return now_ns_; }
  /// Moves the clock to `t_ns` (never backwards).
  void set(int64_t t_ns) { now_ns_ = t_ns > now_ns_ ? t_ns : now_ns_; }

 private:
  int64_t now_ns_ = 0;
};

}  // namespace runtime
}  // namespace gfdit
