// The rings between the control plane and its workers: futex doorbells, a single-producer single-consumer
// ring of variable-length messages in shared memory, and the engine's set of rings (one dispatch ring and
// one completion ring per worker) that carries the messages of messages.h.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "gfdit/messages.h"

namespace gfdit {
namespace core {
class SharedMemory;
}
namespace runtime {

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
/// ring] in src/runtime/rings.cpp). A producer that dies while writing leaves nothing visible, so it cannot
/// wedge the ring.
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
  /// consumer that will look anyway may be spared the wake-up, NOTE [quiet completions] in
  /// src/runtime/rings.cpp).
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
  /// Drops every message (the producer, when the consumer is gone for good and another takes its place).
  void clear();
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
  /// Maps a region by name (a worker), or, `fd` >= 0, the region open at `fd` (taken), whose name may be gone: a
  /// replacement worker started after the name was removed (NOTE [replacements] in src/runtime/control.cpp).
  static std::unique_ptr<QueueSet> attach(const std::string& name, int fd = -1);
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
  /// Writes a completion and its payload (c.payload_bytes of them: NOTE [typed messages]) into `worker`'s
  /// completion ring; rings the control bell when `wake`.
  bool pushCompletion(int worker, const Completion& c, std::chrono::microseconds timeout, bool wake = true,
                      const std::string& payload = std::string());
  /// Empties `worker`'s rings for a replacement (the old process is gone): its queued tasks are dropped and
  /// the completions it left are read and discarded. Called where the control plane runs, before the
  /// replacement starts.
  void resetWorker(int worker);
  /// Tasks waiting in `worker`'s dispatch ring.
  uint64_t pendingTasks(int worker) const { return dispatch_[worker].size(); }
  /// Takes a completion of `worker` if there is one, and its payload into `payload` when given.
  bool tryPopCompletion(int worker, Completion& c, std::string* payload = nullptr);

 private:
  QueueSet();
  uint8_t* base() const;
  std::unique_ptr<core::SharedMemory> shm_;
  int num_workers_ = 0;
  std::vector<MessageRing> dispatch_;
  std::vector<MessageRing> completion_;
};

/// Tasks on their way to workers, never waiting: a task whose worker's dispatch ring is full (or that has tasks
/// waiting before it) waits in that worker's backlog, in order, until flush() finds room (NOTE [control thread] in
/// src/runtime/engine_loop.cpp: the control plane never waits for a worker while it holds its lock).
class Dispatcher {
 public:
  explicit Dispatcher(QueueSet& queues);
  /// Into `worker`'s ring if it fits and nothing waits before it, else into its backlog.
  void push(int worker, const TaskDescriptor& t, const std::string& payload, int64_t now_ns);
  /// Moves backlogged tasks into the rings that have room. Returns the workers whose oldest waiting task has
  /// waited more than `stale_ns` (their backlogs are dropped: they are wedged, and the caller stops them).
  std::vector<int> flush(int64_t now_ns, int64_t stale_ns);
  /// Whether some task waits in a backlog.
  bool waiting() const;
  /// Tasks waiting in `worker`'s backlog.
  size_t backlog(int worker) const { return backlog_[worker].size(); }
  /// Drops `worker`'s backlog (it is gone).
  void clear(int worker) { backlog_[worker].clear(); }

 private:
  struct Pending {
    TaskDescriptor task;
    std::string payload;
    int64_t since_ns;
  };
  QueueSet& queues_;
  std::vector<std::deque<Pending>> backlog_;
};

}  // namespace runtime
}  // namespace gfdit
