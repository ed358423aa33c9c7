// The worker's half of the ring protocol (see gfdit/worker_loop.h).
//
// NOTE [worker loop]
// What a worker does besides running its model, all of it here so that the worker itself (Python) only
// calls the model:
// - The hello. The first completion a worker posts has task_id 0 and carries the ModelInfo of what it loaded
//   (or, failed, the reason); the engine checks requests against it (EngineLoop::awaitWorkers).
// - Tasks it answers by itself, without the model: a probe (a FREE of request 0: an empty round trip that
//   the engine times) completes at once; a denoise task for a state this worker does not hold at the task's
//   first step (for a batch: any member's, at its own first step), and a decode or a gather of a state it does not
//   hold, fail with kStateLost (the control plane then recovers from a holder); a denoise, migrate or gather task
//   while the collectives world is broken (a collective failed and no REINIT has re-created the world yet) fails
//   with kCommError at once instead of blocking on peers that are gone.
// - Step cache counts. progress() adds up how many steps and passes of the task in progress reused the request's
//   step cache; a denoise task's completion reports them (a batch's other requests' in its payload:
//   BatchCacheCounts).
// - What it holds. The loop knows the step of every state the worker holds (progress(), an encode's
//   completion, a free), and every completion reports it as step_end (-1: none), so that after a failure the
//   control plane resumes from the most advanced copy (NOTE [holders] in src/runtime/control.cpp).
// - Errors. A failure's ErrorCode alone decides its TaskError (taskErrorOf): Timeout and RemoteError mean the
//   world is unusable (kCommError: recover, and until a REINIT the world is broken), InvalidUsage a request
//   that cannot run (kInvalidRequest: fail it), anything else the model's error (kModelError: fail it). The
//   text travels as the completion's payload, cut at kMaxMessageBytes with a note of how much was cut.
// - Quiet completions (NOTE [quiet completions] in src/runtime/rings.cpp): a completion that leaves at least
//   two tasks queued, or a free, does not ring the control plane's bell; the bell is rung before the worker
//   waits for more work, so no completion goes unseen.
// - The engine's end: SHUTDOWN, or the parent process gone, ends next().
#include "gfdit/worker_loop.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>
#include <tuple>

#include "gfdit/clock.h"
#include "gfdit/outputs.h"

namespace gfdit {
namespace runtime {
namespace {

// A worker's completion ring is full this long only when the control plane is gone or wedged.
constexpr auto kPostTimeout = std::chrono::seconds(30);
// Completions of these kinds with this many tasks still queued behind them need not wake the control plane.
constexpr uint64_t kQuietWhenQueued = 2;

std::chrono::microseconds micros(double seconds) {
  GFDIT_CHECK(std::isfinite(seconds) && seconds >= 0).param("timeout_s") << "timeout " << seconds;
  return std::chrono::microseconds(static_cast<int64_t>(std::min(seconds, 1e9) * 1e6));
}

std::string cut(const std::string& message) {
  if (message.size() <= kMaxMessageBytes) return message;
  std::ostringstream os;
  os << " ... (" << message.size() - (kMaxMessageBytes - 64) << " more bytes cut)";
  return message.substr(0, kMaxMessageBytes - 64) + os.str();
}

}  // namespace

TaskError taskErrorOf(ErrorCode code) {
  switch (code) {
    case ErrorCode::kTimeout:
    case ErrorCode::kRemoteError: return TaskError::kCommError;
    case ErrorCode::kInvalidUsage: return TaskError::kInvalidRequest;
    case ErrorCode::kSystemError:
    case ErrorCode::kInternal: return TaskError::kModelError;
  }
  return TaskError::kModelError;
}

WorkerLoop::WorkerLoop(const std::string& queue_name, int worker, int queue_fd)
    : queues_(QueueSet::attach(queue_name, queue_fd)),
      worker_(worker),
      parent_(static_cast<int>(::getppid())),
      output_prefix_(outputPrefix(queue_name)),
      world_shm_prefix_(runtime::worldShmPrefix(queue_name)) {
  GFDIT_CHECK(worker >= 0 && worker < queues_->numWorkers()).param("worker")
      << "worker " << worker << " of a queue set of " << queues_->numWorkers();
}

WorkerLoop::~WorkerLoop() = default;

void WorkerLoop::hello(const ModelInfo& info) {
  GFDIT_CHECK(!said_hello_) << "a worker says hello once";
  said_hello_ = true;
  std::string payload = info.encode();
  Completion c;
  c.rank = worker_;
  c.payload_bytes = static_cast<uint32_t>(payload.size());
  c.start_ns = c.end_ns = c.post_ns = nowNs();
  GFDIT_CHECK_CODE(kTimeout, queues_->pushCompletion(worker_, c, kPostTimeout, true, payload))
      << "worker " << worker_ << ": the engine did not take its hello within 30 s";
}

void WorkerLoop::helloFailed(const std::string& message) {
  said_hello_ = true;
  std::string payload = cut(message);
  Completion c;
  c.rank = worker_;
  c.error = static_cast<int32_t>(TaskError::kModelError);
  c.payload_bytes = static_cast<uint32_t>(payload.size());
  c.start_ns = c.end_ns = c.post_ns = nowNs();
  queues_->pushCompletion(worker_, c, kPostTimeout, true, payload);  // the engine stops; nothing to do if not
}

int32_t WorkerLoop::heldStep(uint64_t request_id) const {
  auto it = held_.find(request_id);
  return it == held_.end() ? -1 : it->second;
}

void WorkerLoop::progress(uint64_t request_id, int32_t step, int32_t cached_steps, int32_t cached_passes) {
  held_[request_id] = step;
  if (cached_steps != 0 || cached_passes != 0) {
    auto& c = cached_[request_id];
    c.first += cached_steps;
    c.second += cached_passes;
  }
}

std::optional<std::string> WorkerLoop::refusal(const WorkerTask& t, TaskError* error) const {
  if (broken_ && (t.kind == TaskKind::kDenoise || t.kind == TaskKind::kMigrate || t.kind == TaskKind::kGather)) {
    *error = TaskError::kCommError;
    return std::string("RemoteError: the collectives world is down until the engine re-creates it");
  }
  if (t.kind == TaskKind::kDenoise || t.kind == TaskKind::kDecode || t.kind == TaskKind::kGather) {
    // every member of a batch (NOTE [batches] in src/runtime/control.cpp): the task runs all or none
    const size_t n = 1 + (t.kind == TaskKind::kDenoise ? t.batch.request_ids.size() : 0);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = i == 0 ? t.request_id : t.batch.request_ids[i - 1];
      const int32_t begin = i == 0 ? t.step_begin : t.batch.step_begins[i - 1];
      const int32_t step = heldStep(id);
      std::ostringstream os;
      if (step < 0) {
        os << "worker " << worker_ << " holds no state of request " << id;
      } else if (t.kind == TaskKind::kDenoise && step != begin) {
        os << "worker " << worker_ << " holds request " << id << " at step " << step << ", not " << begin;
      } else {
        continue;
      }
      *error = TaskError::kStateLost;
      return os.str();
    }
  }
  return std::nullopt;
}

std::optional<WorkerTask> WorkerLoop::next(double poll_s) {
  GFDIT_CHECK(said_hello_) << "next() before hello()";
  TaskDescriptor d;
  std::string payload;
  while (true) {
    if (unannounced_ && queues_->pendingTasks(worker_) == 0) {
      // about to wait for work: the control plane must have heard of every quiet completion
      ringDoorbell(queues_->controlBell());
      unannounced_ = false;
    }
    if (!queues_->popTask(worker_, d, payload, micros(poll_s))) {
      if (static_cast<int>(::getppid()) != parent_) return std::nullopt;  // the engine is gone
      continue;
    }
    WorkerTask t;
    t.kind = static_cast<TaskKind>(d.kind);
    t.task_id = d.task_id;
    t.request_id = d.request_id;
    t.step_begin = d.step_begin;
    t.num_steps = d.num_steps;
    t.src_rank = d.src_rank;
    t.layout = d.layout;
    t.ranks.assign(d.ranks, d.ranks + std::max(0, std::min<int32_t>(d.num_ranks, kMaxRanks)));
    t.dispatch_ns = d.dispatch_ns;
    t.start_ns = nowNs();
    if (t.kind == TaskKind::kShutdown) return std::nullopt;
    if (t.kind == TaskKind::kFree && t.request_id == 0) {  // a probe: someone waits for it
      post(t, TaskError::kOk, std::string(), nullptr);
      continue;
    }
    if (t.kind == TaskKind::kFree) held_.erase(t.request_id);
    if (t.kind == TaskKind::kEncode) t.request = GenerationRequest::decode(payload);
    if (t.kind == TaskKind::kReinit) t.reinit = ReinitPlan::decode(payload);
    if (t.kind == TaskKind::kDenoise && d.batch > 1) t.batch = BatchMembers::decode(payload);
    TaskError error = TaskError::kOk;
    if (std::optional<std::string> why = refusal(t, &error)) {
      post(t, error, *why, nullptr);
      continue;
    }
    return t;
  }
}

void WorkerLoop::complete(const WorkerTask& t) {
  if (t.kind == TaskKind::kEncode) held_[t.request_id] = 0;
  if (t.kind == TaskKind::kReinit) broken_ = false;
  post(t, TaskError::kOk, std::string(), nullptr);
}

void WorkerLoop::complete(const WorkerTask& t, const void* data, size_t bytes, DType dtype,
                          const std::vector<int64_t>& shape) {
  GFDIT_CHECK(shape.size() <= 6).param("output") << "an output has at most 6 dimensions, got " << shape.size();
  OutputRef ref;
  writeOutput(output_prefix_ + std::to_string(t.task_id) + "-" + std::to_string(worker_), data, bytes, ref);
  ref.dtype = static_cast<int32_t>(dtype);
  ref.ndim = static_cast<int32_t>(shape.size());
  for (size_t k = 0; k < shape.size(); ++k) ref.shape[k] = shape[k];
  post(t, TaskError::kOk, std::string(), &ref);
}

void WorkerLoop::fail(const WorkerTask& t, ErrorCode code, const std::string& message) {
  TaskError error = taskErrorOf(code);
  if (error == TaskError::kCommError) broken_ = true;  // until a REINIT re-creates the world
  post(t, error, message, nullptr);
}

void WorkerLoop::post(const WorkerTask& t, TaskError error, const std::string& message, const OutputRef* output) {
  std::string payload = cut(message);
  Completion c;
  if (t.kind == TaskKind::kDenoise) {  // the step cache's counts of the task's requests (NOTE [step caches])
    auto counts = [&](uint64_t id) {
      auto it = cached_.find(id);
      std::pair<int32_t, int32_t> v = it == cached_.end() ? std::make_pair(0, 0) : it->second;
      if (it != cached_.end()) cached_.erase(it);
      return v;
    };
    std::tie(c.cached_steps, c.cached_passes) = counts(t.request_id);
    if (!t.batch.request_ids.empty()) {
      BatchCacheCounts riders;
      for (uint64_t id : t.batch.request_ids) {
        auto v = counts(id);
        riders.cached_steps.push_back(v.first);
        riders.cached_passes.push_back(v.second);
      }
      if (error == TaskError::kOk) payload = riders.encode();
    }
  }
  c.task_id = t.task_id;
  c.request_id = t.request_id;
  c.kind = static_cast<uint32_t>(t.kind);
  c.rank = worker_;
  c.error = static_cast<int32_t>(error);
  c.step_end = heldStep(t.request_id);
  c.dispatch_ns = t.dispatch_ns;
  c.start_ns = t.start_ns;
  c.end_ns = nowNs();
  if (output != nullptr) c.output = *output;
  c.payload_bytes = static_cast<uint32_t>(payload.size());
  // see NOTE [quiet completions] in src/runtime/rings.cpp
  bool quiet = c.ok() && ((t.kind == TaskKind::kFree && t.request_id != 0) ||
                          ((t.kind == TaskKind::kEncode || t.kind == TaskKind::kDenoise ||
                            t.kind == TaskKind::kMigrate || t.kind == TaskKind::kGather) &&
                           queues_->pendingTasks(worker_) >= kQuietWhenQueued));
  c.post_ns = nowNs();
  GFDIT_CHECK_CODE(kTimeout, queues_->pushCompletion(worker_, c, kPostTimeout, !quiet, payload))
      << "worker " << worker_ << ": the control plane did not take a completion within 30 s";
  unannounced_ = quiet;
}

}  // namespace runtime
}  // namespace gfdit
