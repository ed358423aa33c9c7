// How long tasks take, as the control plane measured them: one moving average per kind of task, request
// shape and layout (NOTE [task durations]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "gfdit/layout.h"
#include "gfdit/messages.h"
#include "gfdit/request.h"

namespace gfdit {
namespace runtime {

// NOTE [task durations]
// How long a task takes depends on its kind, on the request's shape (its tokens, and whether guidance
// doubles the passes of a step) and on the layout it runs with: one average per kind would give a small
// image's step the length of the long video step that ran before it. So the control plane keeps a moving
// average per (kind, tokens, guidance, layout, batch). A denoise task's estimate is per step, times the task's
// num_steps. A key with no measurement yet falls back, in order, to
//  1. the cost model's prediction for the request (RequestRecord::cost, when the control plane has a model
//     that prices the stage): the caller passes it to estimateNs;
//  2. the most recent measurement of a task of that kind (per step for denoise), whatever its shape: the
//     machine's pace now is a better guess than nothing, and the key learns its own from its first task;
//  3. 0: unknown (a task is then expected to end when it starts).
// Expected completions and task deadlines use the whole chain (NOTE [expected completions] in control.cpp);
// how many steps go ahead (NOTE [lookahead]) counts measured time only (measuredNs: 1 skipped), so that a
// prediction that is too short never commits a group to many steps of an unmeasured shape.

/// What a duration is measured for: the kind of task, the request's shape and the layout it runs with.
struct TaskKey {
  TaskKind kind = TaskKind::kFree;
  int64_t tokens = 0;     ///< the request's image/video tokens (0: a task of no request)
  bool guidance = false;  ///< two transformer passes per step
  Layout layout;          ///< as dispatched (encode, migrate, decode and free go with the plain layout)
  int32_t batch = 1;      ///< requests a denoise task steps together (NOTE [batches] in control.cpp)

  bool operator==(const TaskKey& o) const {
    return kind == o.kind && tokens == o.tokens && guidance == o.guidance && layout == o.layout && batch == o.batch;
  }
};

/// Moving averages of task durations by TaskKey, with the fallbacks of NOTE [task durations].
class TaskDurations {
 public:
  /// Keys kept at most; past it the entry measured least recently is dropped (its kind's fallback remains).
  static constexpr size_t kMaxKeys = 4096;

  /// The key of a task of `kind` for a request of `shape` (nullptr: no request, a probe or a reinit).
  static TaskKey key(TaskKind kind, const RequestShape* shape, const Layout& layout, int32_t batch = 1);
  /// What `cost` predicts for a task of `kind` with `num_steps` steps on `degree` ranks, in ns; 0 when it
  /// predicts nothing for it (no cost model, a kind it does not price).
  static double predictedNs(const RequestCost& cost, TaskKind kind, int degree, int32_t num_steps);

  /// Records a task of `key` with `num_steps` steps that ran `duration_ns`.
  void record(const TaskKey& key, int32_t num_steps, double duration_ns);
  /// Expected ns of a task of `key` with `num_steps` steps: its key's average, else `predicted_ns` when
  /// positive, else the most recent measurement of its kind, else 0.
  double estimateNs(const TaskKey& key, int32_t num_steps, double predicted_ns) const;
  /// As estimateNs without a prediction: measured time only.
  double measuredNs(const TaskKey& key, int32_t num_steps) const { return estimateNs(key, num_steps, 0); }
  /// Keys with a measurement.
  size_t size() const { return by_key_.size(); }

 private:
  struct KeyHash {
    size_t operator()(const TaskKey& k) const;
  };
  struct Entry {
    double per_step_ns = 0;  ///< per step for denoise, per task for every other kind
    uint64_t measured = 0;   ///< when it was last measured (a count of records)
  };
  static constexpr int kNumKinds = 9;  ///< TaskKind values are 1 .. 8

  std::unordered_map<TaskKey, Entry, KeyHash> by_key_;
  double last_per_step_ns_[kNumKinds] = {};  ///< the most recent measurement of each kind
  uint64_t records_ = 0;
};

}  // namespace runtime
}  // namespace gfdit
