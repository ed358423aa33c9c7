// The worker's half of the ring protocol: what a worker process runs between the engine's rings and its
// model. A worker (gfdit.serving.worker, or a C++ program) attaches, says hello, then repeatedly takes the
// next task, runs it and reports how it went; everything else of the protocol is here (NOTE [worker loop]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "gfdit/error.h"
#include "gfdit/messages.h"
#include "gfdit/rings.h"
#include "gfdit/types.h"

namespace gfdit {
namespace runtime {

/// One task as a worker runs it: the descriptor's fields, with the typed payload of its kind.
struct WorkerTask {
  TaskKind kind = TaskKind::kFree;
  uint64_t task_id = 0;
  uint64_t request_id = 0;
  int32_t step_begin = 0;  ///< kDenoise: the first step; kMigrate: the step the state is at
  int32_t num_steps = 0;   ///< kDenoise
  int32_t src_rank = -1;   ///< kMigrate: the worker that holds the state
  Layout layout;
  std::vector<int> ranks;  ///< the group (worker ids), in order
  int64_t dispatch_ns = 0;
  int64_t start_ns = 0;       ///< when the worker took it
  GenerationRequest request;  ///< kEncode (every field set)
  /// kDenoise of a batch (TaskDescriptor::batch > 1): the other requests it steps with request_id, and the step
  /// each starts at; every member runs num_steps steps.
  BatchMembers batch;
  ReinitPlan reinit;  ///< kReinit
};

/// The TaskError a failure of this code reports: a collective that failed (Timeout, RemoteError) needs
/// recovery, a bad request (InvalidUsage) fails its request, anything else is the model's error.
TaskError taskErrorOf(ErrorCode code);

/// One worker's end of the engine's rings (a QueueSet made by an EngineLoop in the parent process).
class WorkerLoop {
 public:
  /// Attaches worker `worker`'s rings of the queue set `queue_name` (or, `queue_fd` >= 0, of the set open at that
  /// descriptor, which the loop takes: a replacement started after the name was removed); the engine is this
  /// process's parent.
  WorkerLoop(const std::string& queue_name, int worker, int queue_fd = -1);
  ~WorkerLoop();

  int worker() const { return worker_; }
  /// The WorldOptions::shm_prefix this worker gives its collectives world (worldShmPrefix).
  const std::string& worldShmPrefix() const { return world_shm_prefix_; }
  /// The engine's abort word, for World::watchAbort.
  uint64_t* abortWord() { return queues_->abortWord(); }

  /// Says that the model is ready, and what it is (the hello: NOTE [typed messages]). Once, before next().
  void hello(const ModelInfo& info);
  /// Says that the model could not be loaded; the engine stops with `message`.
  void helloFailed(const std::string& message);

  /// The next task to run, waiting while none is queued (checking every `poll_s` seconds that the engine
  /// lives); nullopt once the engine said to stop, or is gone. Tasks the loop answers by itself never come
  /// out (NOTE [worker loop]).
  std::optional<WorkerTask> next(double poll_s);
  /// The worker's copy of `request_id`'s state is at `step` now (after each denoising step, and when a
  /// migration brought it). A batched step reports each member. `cached_steps` and `cached_passes`: of the steps
  /// just run, those whose every pass reused the step cache and the passes that did (NOTE [step caches]); the
  /// task's completion carries their sums.
  void progress(uint64_t request_id, int32_t step, int32_t cached_steps = 0, int32_t cached_passes = 0);
  /// `task` ran.
  void complete(const WorkerTask& task);
  /// `task` (a decode) ran and produced `bytes` bytes at `data` of `dtype` and `shape`: they go into a new
  /// shared-memory object the completion names (NOTE [outputs] in gfdit/outputs.h).
  void complete(const WorkerTask& task, const void* data, size_t bytes, DType dtype, const std::vector<int64_t>& shape);
  /// `task` failed with an error of `code` (taskErrorOf decides what the control plane does); `message` is
  /// for people.
  void fail(const WorkerTask& task, ErrorCode code, const std::string& message);

  /// The step this worker's copy of `request_id` is at, or -1 when it holds none.
  int32_t heldStep(uint64_t request_id) const;
  /// Whether a collective failed since the world was last (re-)created.
  bool worldBroken() const { return broken_; }

 private:
  void post(const WorkerTask& task, TaskError error, const std::string& message, const OutputRef* output);
  std::optional<std::string> refusal(const WorkerTask& task, TaskError* error) const;

  std::unique_ptr<QueueSet> queues_;
  int worker_ = 0;
  int parent_ = 0;
  std::string output_prefix_;
  std::string world_shm_prefix_;
  std::unordered_map<uint64_t, int32_t> held_;  // request -> the step of this worker's copy of its state
  // request -> (cached steps, cached passes) of the task in progress (progress(); post() reports and clears them)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> cached_;
  bool broken_ = false;       // a collective failed; REINIT re-creates the world
  bool unannounced_ = false;  // a quiet completion was posted and no bell rung since
  bool said_hello_ = false;
};

}  // namespace runtime
}  // namespace gfdit
