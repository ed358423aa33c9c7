// Shared-memory rings between the control plane and its workers (see gfdit/rings.h).
//
// NOTE [message ring]
// One producer, one consumer, variable-length messages. Positions `head` (consumer) and `tail` (producer)
// count bytes and only grow; the data area is a circle of `capacity` bytes. A message is a frame: an 8-byte
// header (length, kind) and the bytes, padded to 8. A frame never wraps: when it does not fit before the
// end, the producer writes a padding header and starts at offset 0. The producer writes the frame, then
// stores tail with release; the consumer loads tail with acquire, reads the frame, then stores head with
// release (the producer loads head with acquire before reusing the bytes). A producer that dies while
// writing never published its tail, so the consumer sees nothing of the frame and the ring stays usable.
// Waiting uses NOTE [doorbell] in src/core/doorbell.h: a push rings the data bell (which several rings
// may share: all completion rings ring the control plane's one bell), a pop rings the ring's space bell.
//
// NOTE [quiet completions]
// Waking the control thread costs about 20 us of CPU when the cores are busy with workers (a futex wake
// that preempts a running process, on a virtual machine). A worker therefore posts without ringing the bell
// the completion of a successful encode, denoising step or migration when at least two more tasks wait in
// its dispatch ring (it
// has work for a while, and the control plane reads the completion with the next one that does ring), and
// of a FREE (nothing waits for it). No task waits for such a completion: everything in those rings was
// dispatched to all its members already (NOTE [dispatch order]). And before a worker waits for work it rings
// the bell if it posted a quiet completion since it last rang, so the control plane never sleeps on news
// from an idle worker. Failures and every other kind always ring.
#include <sched.h>

#include <algorithm>
#include <cstring>

#include "doorbell.h"
#include "gfdit/clock.h"
#include "gfdit/error.h"
#include "gfdit/rings.h"
#include "shm.h"

namespace gfdit {
namespace runtime {
namespace {

constexpr uint64_t kRingMagic = 0x6766646974524e47ull;  // "gfditRNG"
constexpr uint64_t kSetMagic = 0x6766646974534554ull;   // "gfditSET"
constexpr size_t kLine = 64;
constexpr uint32_t kPadFrame = 0xffffffffu;

size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct FrameHeader {
  uint32_t bytes;  // payload bytes, or kPadFrame
  uint32_t reserved;
};

}  // namespace

// The runtime's doorbells are the same futex doorbells as the world's (NOTE [doorbell] in src/core/doorbell.h).
void ringDoorbell(Doorbell* bell) { core::ringBell(&bell->value, &bell->waiters); }

void waitDoorbell(Doorbell* bell, uint32_t seen, int64_t until_ns) {
  core::blockOnBell(&bell->value, &bell->waiters, seen, std::chrono::nanoseconds(until_ns - nowNs()));
}

struct MessageRing::Header {
  uint64_t magic;
  uint32_t capacity;
  uint32_t reserved;
  alignas(kLine) uint64_t head;  // consumer position (bytes)
  uint64_t popped;               // messages taken
  alignas(kLine) uint64_t tail;  // producer position (bytes)
  uint64_t pushed;               // messages published
  alignas(kLine) Doorbell space_bell;
  Doorbell own_data_bell;
};

size_t MessageRing::footprint(uint32_t capacity) { return alignUp(sizeof(Header), kLine) + capacity; }

MessageRing MessageRing::create(void* memory, uint32_t capacity, Doorbell* data_bell) {
  GFDIT_CHECK(capacity >= 4096 && capacity % kLine == 0)
      << "ring capacity " << capacity << " (>= 4096, multiple of 64)";
  MessageRing q;
  q.header_ = static_cast<Header*>(memory);
  q.header_->capacity = capacity;
  q.data_ = static_cast<uint8_t*>(memory) + alignUp(sizeof(Header), kLine);
  q.data_bell_ = data_bell != nullptr ? data_bell : &q.header_->own_data_bell;
  __atomic_store_n(&q.header_->magic, kRingMagic, __ATOMIC_RELEASE);
  return q;
}

MessageRing MessageRing::attach(void* memory, Doorbell* data_bell) {
  MessageRing q;
  q.header_ = static_cast<Header*>(memory);
  GFDIT_CHECK(__atomic_load_n(&q.header_->magic, __ATOMIC_ACQUIRE) == kRingMagic) << "not a gfdit ring";
  q.data_ = static_cast<uint8_t*>(memory) + alignUp(sizeof(Header), kLine);
  q.data_bell_ = data_bell != nullptr ? data_bell : &q.header_->own_data_bell;
  return q;
}

size_t MessageRing::maxMessage() const { return header_->capacity / 2 - sizeof(FrameHeader); }

uint64_t MessageRing::size() const {
  uint64_t popped = __atomic_load_n(&header_->popped, __ATOMIC_ACQUIRE);
  uint64_t pushed = __atomic_load_n(&header_->pushed, __ATOMIC_ACQUIRE);
  return pushed > popped ? pushed - popped : 0;
}

bool MessageRing::tryPush(const void* a, size_t a_bytes, const void* b, size_t b_bytes, bool wake) {
  Header* h = header_;
  size_t n = a_bytes + b_bytes;
  GFDIT_CHECK(n <= maxMessage()) << "a message of " << n << " bytes exceeds the ring's " << maxMessage();
  uint64_t cap = h->capacity;
  uint64_t tail = __atomic_load_n(&h->tail, __ATOMIC_RELAXED);  // only this producer writes it
  uint64_t head = __atomic_load_n(&h->head, __ATOMIC_ACQUIRE);
  uint64_t frame = sizeof(FrameHeader) + alignUp(n, 8);
  uint64_t off = tail % cap;
  uint64_t pad = cap - off < frame ? cap - off : 0;
  if (cap - (tail - head) < pad + frame) return false;  // full
  if (pad != 0) {
    auto* fh = reinterpret_cast<FrameHeader*>(data_ + off);
    fh->bytes = kPadFrame;
    tail += pad;
    off = 0;
  }
  auto* fh = reinterpret_cast<FrameHeader*>(data_ + off);
  fh->bytes = static_cast<uint32_t>(n);
  fh->reserved = 0;
  if (a_bytes) std::memcpy(data_ + off + sizeof(FrameHeader), a, a_bytes);
  if (b_bytes) std::memcpy(data_ + off + sizeof(FrameHeader) + a_bytes, b, b_bytes);
  // release: the frame is written before the consumer can see the new tail (NOTE [message ring])
  __atomic_store_n(&h->tail, tail + frame, __ATOMIC_RELEASE);
  __atomic_fetch_add(&h->pushed, uint64_t{1}, __ATOMIC_RELEASE);  // a count for size(), not a signal
  if (wake) ringDoorbell(data_bell_);
  return true;
}

bool MessageRing::tryPop(std::string& out) {
  Header* h = header_;
  uint64_t cap = h->capacity;
  uint64_t head = __atomic_load_n(&h->head, __ATOMIC_RELAXED);
  uint64_t tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
  while (head != tail) {
    auto* fh = reinterpret_cast<const FrameHeader*>(data_ + head % cap);
    if (fh->bytes == kPadFrame) {
      head += cap - head % cap;
      continue;
    }
    out.assign(reinterpret_cast<const char*>(data_ + head % cap + sizeof(FrameHeader)), fh->bytes);
    // release: our read is done before the producer reuses the bytes
    __atomic_store_n(&h->head, head + sizeof(FrameHeader) + alignUp(fh->bytes, 8), __ATOMIC_RELEASE);
    __atomic_fetch_add(&h->popped, uint64_t{1}, __ATOMIC_RELEASE);
    ringDoorbell(&h->space_bell);
    return true;
  }
  if (head != __atomic_load_n(&h->head, __ATOMIC_RELAXED)) __atomic_store_n(&h->head, head, __ATOMIC_RELEASE);
  return false;
}

void MessageRing::clear() {
  Header* h = header_;
  // the consumer is gone: its position is the producer's to move (NOTE [message ring])
  __atomic_store_n(&h->head, __atomic_load_n(&h->tail, __ATOMIC_RELAXED), __ATOMIC_RELEASE);
  __atomic_store_n(&h->popped, __atomic_load_n(&h->pushed, __ATOMIC_RELAXED), __ATOMIC_RELEASE);
}

namespace {

// How a ring waits (waitFor): spin this long, then yield the core until kYieldNs have passed, then block
// on the doorbell, waking at least every kWakeSliceNs to look again.
constexpr int64_t kSpinNs = 20000;          // 20 us
constexpr int64_t kYieldNs = 1000000;       // 1 ms
constexpr int64_t kWakeSliceNs = 50000000;  // 50 ms

// Retries `attempt` until it succeeds or the timeout passes: spin ~20 us, then yield the core for up to
// ~1 ms (an idle worker usually gets its next task within that, and waking a process blocked in a futex
// costs tens of microseconds on a virtual machine), then block on the doorbell.
template <typename F>
bool waitFor(Doorbell* bell, std::chrono::microseconds timeout, F attempt) {
  int64_t start = nowNs();
  int64_t deadline = start + timeout.count() * 1000;
  int64_t spin_end = start + kSpinNs;
  int64_t yield_end = start + kYieldNs;
  while (true) {
    uint32_t seen = core::readBell(&bell->value);
    if (attempt()) return true;
    int64_t now = nowNs();
    if (now >= deadline) return false;
    if (now < spin_end) {
      core::cpuRelax();
      continue;
    }
    if (now < yield_end) {
      sched_yield();
      continue;
    }
    waitDoorbell(bell, seen, std::min(deadline, now + kWakeSliceNs));
  }
}

}  // namespace

bool MessageRing::push(const void* a, size_t a_bytes, const void* b, size_t b_bytes, std::chrono::microseconds timeout,
                       bool wake) {
  return waitFor(&header_->space_bell, timeout, [&] { return tryPush(a, a_bytes, b, b_bytes, wake); });
}

bool MessageRing::pop(std::string& out, std::chrono::microseconds timeout) {
  return waitFor(data_bell_, timeout, [&] { return tryPop(out); });
}

// ---- QueueSet ----

namespace {

struct SetHeader {
  uint64_t magic;
  int32_t num_workers;
  uint32_t ring_bytes;
  uint64_t total_bytes;
  uint64_t ring_footprint;
  alignas(64) uint64_t abort_epoch;  // see QueueSet::abortWord
  alignas(64) Doorbell control_bell;
};

size_t headerBytes() { return alignUp(sizeof(SetHeader), 4096); }

}  // namespace

QueueSet::QueueSet() = default;
QueueSet::~QueueSet() = default;
uint8_t* QueueSet::base() const { return shm_->data(); }
const std::string& QueueSet::name() const { return shm_->name(); }

std::unique_ptr<QueueSet> QueueSet::create(int num_workers, uint32_t ring_bytes) {
  GFDIT_CHECK(num_workers >= 1 && num_workers <= kMaxRanks) << "workers: " << num_workers;
  ring_bytes = static_cast<uint32_t>(alignUp(std::max<uint32_t>(ring_bytes, 2 * (kMaxPayloadBytes + 4096)), 4096));
  size_t rf = alignUp(MessageRing::footprint(ring_bytes), 4096);
  size_t total = headerBytes() + rf * 2 * num_workers;
  std::unique_ptr<QueueSet> set(new QueueSet());
  set->shm_ = std::make_unique<core::SharedMemory>(core::SharedMemory::createUnique("gfdit-q", total));
  set->num_workers_ = num_workers;
  auto* h = reinterpret_cast<SetHeader*>(set->base());
  h->num_workers = num_workers;
  h->ring_bytes = ring_bytes;
  h->total_bytes = total;
  h->ring_footprint = rf;
  auto* base = set->base() + headerBytes();
  for (int w = 0; w < num_workers; ++w) {
    set->dispatch_.push_back(MessageRing::create(base + rf * (2 * w), ring_bytes, nullptr));
    set->completion_.push_back(MessageRing::create(base + rf * (2 * w + 1), ring_bytes, &h->control_bell));
  }
  __atomic_store_n(&h->magic, kSetMagic, __ATOMIC_RELEASE);
  return set;
}

std::unique_ptr<QueueSet> QueueSet::attach(const std::string& name, int fd) {
  std::unique_ptr<QueueSet> set(new QueueSet());
  set->shm_ = std::make_unique<core::SharedMemory>(fd >= 0 ? core::SharedMemory::openFd(fd, name)
                                                           : core::SharedMemory::open(name));
  auto* h = reinterpret_cast<SetHeader*>(set->base());
  GFDIT_CHECK(set->shm_->size() >= headerBytes() && __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == kSetMagic)
      << "'" << name << "' is not a queue set";
  set->num_workers_ = h->num_workers;
  auto* base = set->base() + headerBytes();
  for (int w = 0; w < h->num_workers; ++w) {
    set->dispatch_.push_back(MessageRing::attach(base + h->ring_footprint * (2 * w), nullptr));
    set->completion_.push_back(MessageRing::attach(base + h->ring_footprint * (2 * w + 1), &h->control_bell));
  }
  return set;
}

Doorbell* QueueSet::controlBell() { return &reinterpret_cast<SetHeader*>(base())->control_bell; }

uint64_t* QueueSet::abortWord() { return &reinterpret_cast<SetHeader*>(base())->abort_epoch; }

void QueueSet::requestAbort() { __atomic_fetch_add(abortWord(), uint64_t{1}, __ATOMIC_SEQ_CST); }

bool QueueSet::pushTask(int worker, const TaskDescriptor& t, const std::string& payload,
                        std::chrono::microseconds timeout) {
  GFDIT_CHECK(worker >= 0 && worker < num_workers_) << "worker " << worker;
  GFDIT_CHECK(t.payload_bytes == payload.size())
      << "descriptor says " << t.payload_bytes << " payload bytes, got " << payload.size();
  return dispatch_[worker].push(&t, sizeof(t), payload.data(), payload.size(), timeout);
}

bool QueueSet::popTask(int worker, TaskDescriptor& t, std::string& payload, std::chrono::microseconds timeout) {
  GFDIT_CHECK(worker >= 0 && worker < num_workers_) << "worker " << worker;
  thread_local std::string scratch;
  if (!dispatch_[worker].pop(scratch, timeout)) return false;
  GFDIT_CHECK_CODE(kInternal, scratch.size() >= sizeof(t)) << "short task message";
  std::memcpy(&t, scratch.data(), sizeof(t));
  payload.assign(scratch.data() + sizeof(t), scratch.size() - sizeof(t));
  return true;
}

bool QueueSet::pushCompletion(int worker, const Completion& c, std::chrono::microseconds timeout, bool wake,
                              const std::string& payload) {
  GFDIT_CHECK(worker >= 0 && worker < num_workers_) << "worker " << worker;
  GFDIT_CHECK(c.payload_bytes == payload.size())
      << "completion says " << c.payload_bytes << " payload bytes, got " << payload.size();
  return completion_[worker].push(&c, sizeof(c), payload.data(), payload.size(), timeout, wake);
}

bool QueueSet::tryPopCompletion(int worker, Completion& c, std::string* payload) {
  thread_local std::string scratch;
  if (!completion_[worker].tryPop(scratch)) return false;
  GFDIT_CHECK_CODE(kInternal, scratch.size() >= sizeof(c)) << "short completion message";
  std::memcpy(&c, scratch.data(), sizeof(c));
  GFDIT_CHECK_CODE(kInternal, scratch.size() - sizeof(c) == c.payload_bytes)
      << "completion message of " << scratch.size() << " bytes for a payload of " << c.payload_bytes;
  if (payload != nullptr) payload->assign(scratch.data() + sizeof(c), c.payload_bytes);
  return true;
}

void QueueSet::resetWorker(int worker) {
  GFDIT_CHECK(worker >= 0 && worker < num_workers_) << "worker " << worker;
  dispatch_[worker].clear();
  std::string scratch;
  while (completion_[worker].tryPop(scratch)) {
  }
}

void QueueSet::unlinkName() { shm_->unlink(); }

// ---- Dispatcher ----

Dispatcher::Dispatcher(QueueSet& queues) : queues_(queues), backlog_(queues.numWorkers()) {}

void Dispatcher::push(int worker, const TaskDescriptor& t, const std::string& payload, int64_t now_ns) {
  GFDIT_CHECK(worker >= 0 && worker < queues_.numWorkers()) << "worker " << worker;
  std::deque<Pending>& b = backlog_[worker];
  if (b.empty() && queues_.pushTask(worker, t, payload, std::chrono::microseconds(0))) return;
  b.push_back(Pending{t, payload, now_ns});
}

std::vector<int> Dispatcher::flush(int64_t now_ns, int64_t stale_ns) {
  std::vector<int> wedged;
  for (int w = 0; w < static_cast<int>(backlog_.size()); ++w) {
    std::deque<Pending>& b = backlog_[w];
    while (!b.empty() && queues_.pushTask(w, b.front().task, b.front().payload, std::chrono::microseconds(0))) {
      b.pop_front();
    }
    if (!b.empty() && now_ns - b.front().since_ns > stale_ns) {
      wedged.push_back(w);
      b.clear();
    }
  }
  return wedged;
}

bool Dispatcher::waiting() const {
  for (const auto& b : backlog_) {
    if (!b.empty()) return true;
  }
  return false;
}

}  // namespace runtime
}  // namespace gfdit
