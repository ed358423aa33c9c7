// The trajectory runtime's control-plane pieces: task descriptors, shared-memory queues between the
// engine and its workers, the request state machine, and the scheduler core that asks a policy.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gfdit/layout.h"
#include "gfdit/types.h"

namespace gfdit {
namespace runtime {

/// What a worker is asked to do.
enum class TaskKind : uint32_t {
  kEncode = 1,    ///< run the text encoder and make the initial latent (every member of the group)
  kDenoise = 2,   ///< run num_steps denoising steps from step_begin on the group with the spec
  kMigrate = 3,   ///< the holder (src_rank) broadcasts the request's state to the group's new members
  kDecode = 4,    ///< decode the latent (on ranks[0]) and report the output
  kFree = 5,      ///< drop the request's state on this rank
  kShutdown = 6,  ///< leave the loop
  kReinit = 7,    ///< re-create the collectives world among the workers in the payload (after a death)
};

constexpr size_t kPayloadBytes = 640;

/// One task for one worker: fixed size, plain data, written into a shared-memory ring.
struct TaskDescriptor {
  uint64_t task_id = 0;
  uint64_t request_id = 0;
  uint32_t kind = 0;          ///< TaskKind
  int32_t step_begin = 0;     ///< first denoising step (kDenoise), or the step the state is at (kMigrate)
  int32_t num_steps = 0;      ///< denoising steps in this task
  int32_t num_ranks = 0;      ///< group size
  int32_t src_rank = -1;      ///< kMigrate: the member that holds the state
  int32_t reserved = 0;
  Layout layout;
  int16_t ranks[kMaxRanks] = {};  ///< the group, in order
  int64_t dispatch_ns = 0;        ///< steady-clock time the engine wrote it (latency measurement)
  uint32_t payload_bytes = 0;
  char payload[kPayloadBytes] = {};  ///< kEncode: the request as JSON
};

/// What a worker reports back.
struct Completion {
  uint64_t task_id = 0;
  uint64_t request_id = 0;
  uint32_t kind = 0;
  int32_t rank = -1;
  int32_t ok = 1;
  int32_t step_end = 0;   ///< kDenoise: steps completed after this task
  int64_t dispatch_ns = 0;
  int64_t start_ns = 0;   ///< steady clock, when the worker took the task
  int64_t end_ns = 0;
  int64_t post_ns = 0;    ///< when the completion was written
  uint32_t message_bytes = 0;
  char message[400] = {};  ///< error text when ok == 0
};

/// Monotonic nanoseconds (CLOCK_MONOTONIC, the same in every process of the machine).
int64_t nowNs();

/// A bounded lock-free multi-producer multi-consumer ring of fixed-size elements in shared memory.
/// Blocking operations spin briefly, then wait on a futex, and give up after a timeout.
class ShmQueue {
 public:
  /// Bytes a queue of `capacity` (a power of two) elements of `elem_bytes` occupies.
  static size_t footprint(uint32_t capacity, uint32_t elem_bytes);
  /// Formats a queue in `memory` (zeroed, `footprint` bytes, cache-line aligned).
  static ShmQueue create(void* memory, uint32_t capacity, uint32_t elem_bytes);
  /// Uses a queue another process formatted.
  static ShmQueue attach(void* memory);

  ShmQueue() = default;
  /// Appends an element; false when full.
  bool tryPush(const void* elem);
  /// Takes the oldest element; false when empty.
  bool tryPop(void* elem);
  /// Appends, waiting while full at most `timeout`; false on timeout.
  bool push(const void* elem, std::chrono::microseconds timeout);
  /// Takes the oldest, waiting while empty at most `timeout`; false on timeout.
  bool pop(void* elem, std::chrono::microseconds timeout);
  /// Elements in the queue (approximate under concurrency).
  uint64_t size() const;
  uint32_t capacity() const;

 private:
  struct Header;
  Header* header_ = nullptr;
  uint8_t* cells_ = nullptr;
};

/// The engine's queues: one dispatch queue per worker and one completion queue, in one shared region.
class QueueSet {
 public:
  /// Creates the region (random name, mode 0600); the name stays until unlinkName().
  static std::unique_ptr<QueueSet> create(int num_workers, uint32_t capacity = 256);
  /// Maps a region by name (a worker).
  static std::unique_ptr<QueueSet> attach(const std::string& name);
  ~QueueSet();

  /// The region's name, for attach().
  const std::string& name() const { return name_; }
  /// Removes the name (all processes mapped it): nothing is left in /dev/shm afterwards.
  void unlinkName();
  int numWorkers() const { return num_workers_; }
  ShmQueue& dispatch(int worker) { return dispatch_[worker]; }
  ShmQueue& completion() { return completion_; }
  /// A counter the engine bumps to abort every collective its workers are blocked in (World::watchAbort).
  uint64_t* abortWord();
  /// Bumps the abort counter.
  void requestAbort();

 private:
  QueueSet() = default;
  std::string name_;
  bool owner_ = false;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int num_workers_ = 0;
  std::vector<ShmQueue> dispatch_;
  ShmQueue completion_;
};

// ---- requests and their state machine ----

/// Where a request is. DENOISING carries the step in RequestRecord::step.
enum class RequestState : int32_t { kQueued, kEncoding, kDenoising, kDecoding, kDone, kFailed, kCancelled };

/// Name of a state ("QUEUED", ...).
const char* requestStateName(RequestState s);

/// One time-stamped transition.
struct Transition {
  RequestState state;
  int32_t step;
  int64_t t_ns;
};

/// What the scheduler knows of a request.
struct RequestRecord {
  uint64_t id = 0;
  RequestState state = RequestState::kQueued;
  int32_t step = 0;          ///< denoising steps completed
  int32_t num_steps = 0;     ///< total denoising steps
  int64_t arrival_ns = 0;
  int64_t deadline_ns = 0;   ///< 0: none
  double cost_per_step = 1;  ///< relative cost of one step at degree 1 (from the shape)
  int32_t max_degree = kMaxRanks;  ///< largest group the model allows (heads, sequence)
  std::vector<int> ranks;    ///< current group (ranks holding the state); empty before encode
  Layout layout;
  bool busy = false;         ///< a task of it is in flight
  int32_t steps_in_flight = 0;
  std::string reason;        ///< FAILED / CANCELLED
  std::vector<Transition> transitions;
};

/// A policy's answer for one request: run it on these ranks with this layout for `num_steps` steps.
struct Decision {
  uint64_t request_id = 0;
  std::vector<int> ranks;
  Layout layout;
  int32_t num_steps = 1;
};

/// What a policy sees.
struct SchedulerView {
  int64_t now_ns = 0;
  int world_size = 0;
  std::vector<int> free_ranks;                     ///< ranks with no task in flight
  std::vector<const RequestRecord*> ready;         ///< not busy, not finished, in arrival order
  std::vector<const RequestRecord*> running;       ///< busy
};

/// Decides, at each scheduling point, which ready requests run next and where.
class Policy {
 public:
  virtual ~Policy() = default;
  /// Name as the engine accepts it ("fcfs", "static:2").
  virtual std::string name() const = 0;
  /// Decisions for some ready requests; each uses distinct ranks from view.free_ranks.
  virtual std::vector<Decision> schedule(const SchedulerView& view) = 0;
};

/// "static:D": ranks split into fixed groups of D (0..D-1, D..2D-1, ...); a request keeps the group it
/// got first for its whole life; the baseline of fixed-degree serving systems.
std::unique_ptr<Policy> makeStaticPolicy(int degree);
/// "fcfs": arrival order; at every step boundary each waiting or running request gets ranks from those
/// free, the oldest first, so degrees and groups change while requests run.
std::unique_ptr<Policy> makeFcfsPolicy(int steps_per_decision = 1);
/// Parses "fcfs" or "static:D".
std::unique_ptr<Policy> makePolicy(const std::string& spec);

/// The request table and the state machine; asks a policy for decisions. Not thread-safe: the engine's
/// control loop owns it.
class Scheduler {
 public:
  Scheduler(int world_size, std::unique_ptr<Policy> policy);

  /// Registers a new request (QUEUED).
  void addRequest(const RequestRecord& record);
  /// Records a transition (time-stamped now).
  void transition(uint64_t id, RequestState state, int32_t step = -1, const std::string& reason = "");
  /// Marks ranks busy/free as tasks are dispatched and completed.
  void setBusy(uint64_t id, bool busy);
  void occupy(const std::vector<int>& ranks);
  void release(const std::vector<int>& ranks);
  /// Asks the policy; validates every decision (ranks free, distinct, layout fits) before returning it.
  std::vector<Decision> schedule();

  const RequestRecord& request(uint64_t id) const;
  RequestRecord& mutableRequest(uint64_t id);
  bool has(uint64_t id) const { return requests_.count(id) != 0; }
  std::vector<uint64_t> requestIds() const;
  void erase(uint64_t id) { requests_.erase(id); }
  const std::vector<bool>& rankBusy() const { return rank_busy_; }
  Policy& policy() { return *policy_; }
  int worldSize() const { return world_size_; }

 private:
  int world_size_;
  std::unique_ptr<Policy> policy_;
  std::map<uint64_t, RequestRecord> requests_;
  std::vector<bool> rank_busy_;
};

}  // namespace runtime
}  // namespace gfdit
