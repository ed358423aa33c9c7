// The machine's monotonic clock (see gfdit/clock.h).
#include <time.h>

#include "gfdit/clock.h"

namespace gfdit {
namespace runtime {

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace runtime
}  // namespace gfdit
