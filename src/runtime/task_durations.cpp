// Measured task durations by kind, shape and layout (NOTE [task durations] in task_durations.h).
#include "task_durations.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace gfdit {
namespace runtime {
namespace {

// The moving average keeps kPreviousWeight of what it knew and takes kSampleWeight of each new measurement.
// A task's length varies from one run to the next (other tasks share the cores, a collective waits for a
// late peer): one outlier moves the estimate by a fifth only, while a lasting change (the load, the
// machine's clocks) shows after a few tasks (two thirds of it after five, nine tenths after ten).
constexpr double kPreviousWeight = 0.8;
constexpr double kSampleWeight = 1.0 - kPreviousWeight;

constexpr double kNsPerSecond = 1e9;

int kindIndex(TaskKind kind) { return static_cast<int>(kind); }

// Steps a measurement or an estimate of a task covers: a denoise task's steps, one for any other kind.
int32_t stepsOf(TaskKind kind, int32_t num_steps) { return kind == TaskKind::kDenoise ? std::max(1, num_steps) : 1; }

}  // namespace

size_t TaskDurations::KeyHash::operator()(const TaskKey& k) const {
  size_t h = std::hash<int64_t>()(k.tokens);
  auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(static_cast<uint64_t>(k.kind));
  mix(k.guidance);
  mix(static_cast<uint64_t>(k.layout.ulysses));
  mix(static_cast<uint64_t>(k.layout.ring));
  mix(static_cast<uint64_t>(k.layout.mode));
  mix(static_cast<uint64_t>(k.layout.placement));
  mix(static_cast<uint64_t>(k.layout.cfg));
  mix(static_cast<uint64_t>(k.batch));
  return h;
}

TaskKey TaskDurations::key(TaskKind kind, const RequestShape* shape, const Layout& layout, int32_t batch) {
  TaskKey k;
  k.kind = kind;
  k.batch = batch;
  if (shape != nullptr) {
    k.tokens = shape->tokens;
    k.guidance = shape->guidance();
  }
  k.layout = layout;
  return k;
}

double TaskDurations::predictedNs(const RequestCost& cost, TaskKind kind, int degree, int32_t num_steps) {
  if (!cost.known) return 0;
  double s = 0;
  switch (kind) {
    case TaskKind::kEncode: s = cost.encode_s; break;
    case TaskKind::kDenoise: s = cost.stepSeconds(degree) * stepsOf(kind, num_steps); break;
    case TaskKind::kMigrate: s = cost.migrate_s; break;
    case TaskKind::kDecode: s = cost.decodeSeconds(degree); break;
    default: return 0;  // free, reinit, shutdown: nothing the cost model prices
  }
  return std::isfinite(s) && s > 0 ? s * kNsPerSecond : 0;
}

void TaskDurations::record(const TaskKey& key, int32_t num_steps, double duration_ns) {
  const int idx = kindIndex(key.kind);
  if (idx < 0 || idx >= kNumKinds || !(duration_ns > 0)) return;
  const double per_step = duration_ns / stepsOf(key.kind, num_steps);
  last_per_step_ns_[idx] = per_step;
  ++records_;
  auto it = by_key_.find(key);
  if (it != by_key_.end()) {
    it->second.per_step_ns = kPreviousWeight * it->second.per_step_ns + kSampleWeight * per_step;
    it->second.measured = records_;
    return;
  }
  if (by_key_.size() >= kMaxKeys) {
    auto oldest = std::min_element(by_key_.begin(), by_key_.end(),
                                   [](const auto& a, const auto& b) { return a.second.measured < b.second.measured; });
    by_key_.erase(oldest);
  }
  by_key_.emplace(key, Entry{per_step, records_});  // the first measurement of a key is taken as it is
}

double TaskDurations::estimateNs(const TaskKey& key, int32_t num_steps, double predicted_ns) const {
  const int32_t steps = stepsOf(key.kind, num_steps);
  auto it = by_key_.find(key);
  if (it != by_key_.end()) return it->second.per_step_ns * steps;
  if (predicted_ns > 0) return predicted_ns;
  const int idx = kindIndex(key.kind);
  if (idx < 0 || idx >= kNumKinds) return 0;
  return last_per_step_ns_[idx] * steps;
}

}  // namespace runtime
}  // namespace gfdit
