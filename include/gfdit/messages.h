// The messages that cross between the control plane and its workers, all of them, in one header: a task
// descriptor (and its payload) to a worker, a completion (and its payload) back, the reference to an output
// a worker left in shared memory, and the typed payloads: a generation request (an encode task), a reinit
// plan (a REINIT task), a worker's hello (the model it loaded) and the text of a failure.
//
// NOTE [typed messages]
// A descriptor and a completion are plain data of fixed size that the rings (rings.h) copy byte for byte.
// What varies in size travels as their payload, and every payload is one of the structs below, encoded by
// its encode() and read back by its decode(), which checks the message's tag (its kind and version), every
// length, and that nothing is left over: a truncated or foreign message fails loudly, never decodes into
// garbage, and is never cut silently. The bindings expose these structs field by field, so Python never
// parses a payload itself. A completion's payload is the hello (ModelInfo) for the first completion of a
// worker (task_id 0), the riders' step cache counts (BatchCacheCounts) for a batched DENOISE task that succeeded,
// else the failure's text (at most kMaxMessageBytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gfdit/layout.h"
#include "gfdit/step_cache.h"
#include "gfdit/types.h"

namespace gfdit {
namespace runtime {

/// What a worker is asked to do.
enum class TaskKind : uint32_t {
  kEncode = 1,    ///< run the text encoder and make the initial latent (every member of the group)
  kDenoise = 2,   ///< run num_steps denoising steps from step_begin on the group with the layout
  kMigrate = 3,   ///< the holder (src_rank) broadcasts the request's state to the group's new members
  kDecode = 4,    ///< decode the latent (on ranks[0]) and report the output
  kFree = 5,      ///< drop the request's state on this rank
  kShutdown = 6,  ///< leave the loop
  kReinit = 7,    ///< re-create the collectives world among the workers in the payload (after a death)
  /// the holders of the request's state exchange their shards of its step cache, so each holds it whole (NOTE
  /// [cache gathers] in src/runtime/control.cpp)
  kGather = 8,
};

/// Name of a task kind ("encode", "denoise", ...).
const char* taskKindName(TaskKind k);

/// Largest payload (an encoded GenerationRequest) a task can carry.
constexpr size_t kMaxPayloadBytes = 64 * 1024;
/// Largest failure text a completion carries; a longer one is cut and says how much was left out.
constexpr size_t kMaxMessageBytes = 16 * 1024;

/// One task for one worker: fixed size, plain data. A payload of `payload_bytes` follows it in the ring.
struct TaskDescriptor {
  uint64_t task_id = 0;
  uint64_t request_id = 0;
  uint32_t kind = 0;           ///< TaskKind
  int32_t step_begin = 0;      ///< first denoising step (kDenoise), or the step the state is at (kMigrate)
  int32_t num_steps = 0;       ///< denoising steps in this task
  int32_t num_ranks = 0;       ///< group size
  int32_t src_rank = -1;       ///< kMigrate: the member that holds the state
  uint32_t payload_bytes = 0;  ///< bytes that follow the descriptor in the ring
  /// kDenoise: the requests the task steps in one batched forward (NOTE [batches] in src/runtime/control.cpp):
  /// 1, or request_id and batch - 1 others, which its payload names (BatchMembers).
  int32_t batch = 1;
  Layout layout;
  int16_t ranks[kMaxRanks] = {};  ///< the group, in order
  int64_t dispatch_ns = 0;        ///< monotonic time the control plane wrote it (latency measurement)
};

/// Why a task failed; what the control plane does about it depends only on this code.
enum class TaskError : int32_t {
  kOk = 0,
  kInvalidRequest = 1,  ///< the request cannot run (bad size, bad prompt): fail the request
  kModelError = 2,      ///< the model raised: fail the request
  kCommError = 3,       ///< a collective failed (peer dead, timeout, abort): recover, then continue
  kWorkerDied = 4,      ///< set by the control plane for tasks pending on a dead worker: recover
  kTimeout = 5,         ///< set by the control plane when a task missed its deadline: recover
  kStateLost = 6,       ///< the worker does not hold the request's state: recover from a holder
};

/// Name of a task error ("ok", "invalid_request", ...).
const char* taskErrorName(TaskError e);

/// Where a decoded output lies: a POSIX shared-memory object the worker wrote (NOTE [outputs] in
/// gfdit/outputs.h).
struct OutputRef {
  char name[56] = {};  ///< shm name, "" when none
  int32_t dtype = 0;   ///< DType
  int32_t ndim = 0;
  int64_t shape[6] = {};
  uint64_t bytes = 0;
};

/// What a worker reports back for one task.
struct Completion {
  uint64_t task_id = 0;
  uint64_t request_id = 0;
  uint32_t kind = 0;     ///< TaskKind
  int32_t rank = -1;     ///< the worker
  int32_t error = 0;     ///< TaskError
  int32_t step_end = 0;  ///< kDenoise / kMigrate: steps the worker's state has completed
  /// kDenoise: steps of this task whose every transformer pass reused the request's step cache, and the passes
  /// that did (NOTE [step caches] in gfdit/step_cache.h); of the task's first request when it is a batch
  int32_t cached_steps = 0;
  int32_t cached_passes = 0;
  int64_t dispatch_ns = 0;
  int64_t start_ns = 0;  ///< monotonic, when the worker took the task
  int64_t end_ns = 0;
  int64_t post_ns = 0;         ///< when the completion was written
  OutputRef output;            ///< kDecode
  uint32_t payload_bytes = 0;  ///< bytes that follow the completion in the ring (NOTE [typed messages])

  bool ok() const { return error == 0; }
};

/// A generation request as a caller states it and the engine checks it (checkRequest in gfdit/limits.h);
/// what an encode task carries to its workers. Unset fields take the model's defaults at the check, so a
/// worker always receives them set.
struct GenerationRequest {
  std::string prompt;
  std::optional<std::string> negative_prompt;
  std::optional<int32_t> height;
  std::optional<int32_t> width;
  std::optional<int32_t> num_frames;
  std::optional<int32_t> num_inference_steps;
  std::optional<double> guidance_scale;
  std::optional<double> guidance_scale_2;  ///< Wan 2.2's low-noise expert (WanPipeline's guidance_scale_2)
  uint64_t seed = 0;
  int32_t priority = 0;              ///< larger is more urgent
  std::optional<double> deadline_s;  ///< seconds after submit
  CacheSpec cache;                   ///< the step cache (CacheSpec::parse of the caller's text); off by default

  /// The message (NOTE [typed messages]).
  std::string encode() const;
  /// Reads a message encode() wrote; throws kInternal on a malformed one.
  static GenerationRequest decode(const std::string& bytes);
};

/// A model's serving defaults: what a request that leaves a field unset gets.
struct ModelDefaults {
  int32_t height = 0;
  int32_t width = 0;
  int32_t num_frames = 1;
  int32_t num_steps = 0;
  double guidance_scale = 1.0;
};

/// What a worker reports of the model it loaded, in its first completion (the hello): what requests are
/// checked against besides the registry's limits (RequestLimits::of).
struct ModelInfo {
  std::string name;       ///< the name it was loaded by ("tiny-wan", "wan2.1", ...)
  int32_t heads = 0;      ///< attention heads of the transformer
  bool is_video = false;  ///< takes num_frames > 1
  int32_t patch_t = 1;
  int32_t patch_s = 2;
  int32_t vae_stride_s = 8;  ///< height and width are multiples of vae_stride_s * patch_s
  int32_t vae_stride_t = 1;  ///< video: num_frames = vae_stride_t * k + 1
  bool two_experts = false;  ///< some steps run a second expert (Wan 2.2 A14B): takes guidance_scale_2
  uint32_t cache_kinds = 0;  ///< the step caches the model implements, a set of cacheKindBit
  ModelDefaults defaults;

  std::string encode() const;
  static ModelInfo decode(const std::string& bytes);
  bool operator==(const ModelInfo& o) const;
  bool operator!=(const ModelInfo& o) const { return !(*this == o); }
};

/// What a batched DENOISE task carries besides its descriptor (TaskDescriptor::batch > 1): the other requests
/// it steps, each with the step it starts at (the descriptor's request_id and step_begin are the first member).
struct BatchMembers {
  std::vector<uint64_t> request_ids;
  std::vector<int32_t> step_begins;

  std::string encode() const;
  static BatchMembers decode(const std::string& bytes);
};

/// What a worker's completion of a batched DENOISE task carries when it succeeded: the step cache counts of the
/// task's other requests, in BatchMembers' order (Completion::cached_steps and cached_passes are the first's).
struct BatchCacheCounts {
  std::vector<int32_t> cached_steps;
  std::vector<int32_t> cached_passes;

  std::string encode() const;
  static BatchCacheCounts decode(const std::string& bytes);
};

/// What a REINIT task carries: the epoch of the new world and the workers that make it up, in rank order.
struct ReinitPlan {
  uint64_t epoch = 0;
  std::vector<int32_t> workers;

  std::string encode() const;
  static ReinitPlan decode(const std::string& bytes);
};

}  // namespace runtime
}  // namespace gfdit
