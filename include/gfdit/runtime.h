// The data path between the control plane and its workers: task descriptors, completions, and the
// shared-memory rings that carry them (one dispatch ring and one completion ring per worker).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gfdit/layout.h"
#include "gfdit/types.h"

namespace gfdit {
namespace core {
class SharedMemory;
}
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
};

/// Name of a task kind ("encode", "denoise", ...).
const char* taskKindName(TaskKind k);

/// Largest request payload (the request as JSON for the worker's encoder) a task can carry.
constexpr size_t kMaxPayloadBytes = 64 * 1024;

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

/// Where a decoded output lies: a POSIX shared-memory object the worker wrote (see NOTE [outputs]).
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
  int64_t dispatch_ns = 0;
  int64_t start_ns = 0;  ///< monotonic, when the worker took the task
  int64_t end_ns = 0;
  int64_t post_ns = 0;  ///< when the completion was written
  OutputRef output;     ///< kDecode
  uint32_t message_bytes = 0;
  char message[472] = {};  ///< for people: what failed (cut when longer)

  bool ok() const { return error == 0; }
};

/// Monotonic nanoseconds (CLOCK_MONOTONIC, the same in every process of the machine).
int64_t nowNs();

/// A futex word and its waiter count: producers ring it after publishing, consumers block on it.
struct Doorbell {
  uint32_t value;
  uint32_t waiters;
};

/// Wakes every waiter of `bell` (sequentially consistent bump, then FUTEX_WAKE if anyone waits).
void ringDoorbell(Doorbell* bell);
/// Blocks until `bell` differs from `seen` or `until_ns` (monotonic) passes; returns at once if it differs.
void waitDoorbell(Doorbell* bell, uint32_t seen, int64_t until_ns);

/// A single-producer single-consumer ring of variable-length messages in shared memory (NOTE [message
/// ring]). A producer that dies while writing leaves nothing visible, so it cannot wedge the ring.
class MessageRing {
 public:
  /// Bytes a ring with `capacity` data bytes (a multiple of 64) occupies.
  static size_t footprint(uint32_t capacity);
  /// Formats a ring in zeroed, 64-byte aligned `memory`; `data_bell` is rung on every push (the consumer
  /// waits on it; several rings may share one), the ring's own bell on every pop.
  static MessageRing create(void* memory, uint32_t capacity, Doorbell* data_bell);
  /// Uses a ring another process formatted.
  static MessageRing attach(void* memory, Doorbell* data_bell);

  MessageRing() = default;
  /// Appends one message made of two parts; false when it does not fit now. `wake`: ring the data bell (a
  /// consumer that will look anyway may be spared the wake-up, NOTE [quiet completions]).
  bool tryPush(const void* a, size_t a_bytes, const void* b = nullptr, size_t b_bytes = 0, bool wake = true);
  /// Appends, waiting while full at most `timeout`; false on timeout.
  bool push(const void* a, size_t a_bytes, const void* b, size_t b_bytes, std::chrono::microseconds timeout,
            bool wake = true);
  /// Messages in the ring (exact for its producer and its consumer, a hint for anyone else).
  uint64_t size() const;
  /// Takes the oldest message into `out` (resized); false when empty.
  bool tryPop(std::string& out);
  /// Takes the oldest message, waiting while empty at most `timeout`; false on timeout.
  bool pop(std::string& out, std::chrono::microseconds timeout);
  /// Whether no message waits (see size()).
  bool empty() const { return size() == 0; }
  /// Largest message the ring accepts.
  size_t maxMessage() const;

 private:
  struct Header;
  Header* header_ = nullptr;
  uint8_t* data_ = nullptr;
  Doorbell* data_bell_ = nullptr;
};

/// The engine's rings in one shared region: per worker a dispatch ring (control plane -> worker) and a
/// completion ring (worker -> control plane), the control plane's doorbell and the abort word.
class QueueSet {
 public:
  /// Creates the region (random name, mode 0600); the name stays until unlinkName().
  static std::unique_ptr<QueueSet> create(int num_workers, uint32_t ring_bytes = 1u << 20);
  /// Maps a region by name (a worker).
  static std::unique_ptr<QueueSet> attach(const std::string& name);
  ~QueueSet();

  /// The region's name, for attach().
  const std::string& name() const;
  /// Removes the name (all processes mapped it): nothing is left in /dev/shm afterwards.
  void unlinkName();
  int numWorkers() const { return num_workers_; }
  MessageRing& dispatch(int worker) { return dispatch_[worker]; }
  MessageRing& completion(int worker) { return completion_[worker]; }
  /// Rung by workers after each completion and by the engine for its own events (submit, cancel).
  Doorbell* controlBell();
  /// A counter the engine bumps to abort every collective its workers are blocked in (World::watchAbort).
  uint64_t* abortWord();
  /// Bumps the abort counter.
  void requestAbort();

  /// Writes a task and its payload into `worker`'s dispatch ring (waits while full, at most `timeout`).
  bool pushTask(int worker, const TaskDescriptor& t, const std::string& payload, std::chrono::microseconds timeout);
  /// Takes `worker`'s next task; false on timeout.
  bool popTask(int worker, TaskDescriptor& t, std::string& payload, std::chrono::microseconds timeout);
  /// Writes a completion into `worker`'s completion ring; rings the control bell when `wake`.
  bool pushCompletion(int worker, const Completion& c, std::chrono::microseconds timeout, bool wake = true);
  /// Tasks waiting in `worker`'s dispatch ring.
  uint64_t pendingTasks(int worker) const { return dispatch_[worker].size(); }
  /// Takes a completion of `worker` if there is one.
  bool tryPopCompletion(int worker, Completion& c);

 private:
  QueueSet();
  uint8_t* base() const;
  std::unique_ptr<core::SharedMemory> shm_;
  int num_workers_ = 0;
  std::vector<MessageRing> dispatch_;
  std::vector<MessageRing> completion_;
};

// NOTE [outputs]
// A decoded output can be hundreds of MB, so it never travels through a ring: the worker writes it into a
// fresh POSIX shared-memory object named `<prefix><task>-<rank>` (prefix from outputPrefix of the queue
// set), and its completion carries the name, dtype and shape. The engine maps the object, unlinks the name
// at once and hands the mapping to the caller without a copy. Names that no completion delivered (a worker
// killed between writing and reporting) are removed by unlinkOutputs at recovery and shutdown.

/// The prefix of output names that belong to the queue set `queue_name`.
std::string outputPrefix(const std::string& queue_name);
/// The WorldOptions::shm_prefix of the workers of the queue set `queue_name`: a worker killed while its world
/// forms leaves its region's name (NOTE [group-free collectives] in gfdit/world.h), which the engine removes
/// at shutdown by this prefix (unlinkOutputs("/" + prefix + "-")).
std::string worldShmPrefix(const std::string& queue_name);
/// Writes `bytes` from `data` into a new shm object `name` (mode 0600); fills `ref` except dtype/shape.
void writeOutput(const std::string& name, const void* data, size_t bytes, OutputRef& ref);
/// A mapped output: the bytes, writable and no longer shared with anyone; unmapped when destroyed.
class MappedOutput {
 public:
  /// Maps `ref`'s object and unlinks its name.
  static std::shared_ptr<MappedOutput> open(const OutputRef& ref);
  ~MappedOutput();
  const void* data() const;
  size_t bytes() const;

 private:
  MappedOutput();
  std::unique_ptr<core::SharedMemory> shm_;
};
/// Unlinks the shm object of `ref` without mapping it (an output nobody will read).
void discardOutput(const OutputRef& ref);
/// Unlinks every shm object whose name starts with `prefix`; returns how many.
int unlinkOutputs(const std::string& prefix);

}  // namespace runtime
}  // namespace gfdit
