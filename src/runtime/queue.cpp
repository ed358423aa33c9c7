// Shared-memory rings between the engine and its workers.
//
// NOTE [task ring]
// A bounded multi-producer multi-consumer ring in the style of Vyukov's: each cell carries a sequence
// word. A producer that reserved position p (by CAS on enqueue_pos) writes the element, then stores
// seq = p + 1 with release; a consumer that sees seq == p + 1 with acquire owns the element, reads it,
// then stores seq = p + capacity with release, handing the cell to the producer of the next lap.
// Waiting uses the doorbell pattern of NOTE [doorbell] in src/collectives/edge.h: every push and pop
// bumps the header's doorbell (sequentially consistent) and wakes a blocked waiter if there is one.
#include <fcntl.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>

#include "gfdit/error.h"
#include "gfdit/runtime.h"

namespace gfdit {
namespace runtime {
namespace {

constexpr uint64_t kQueueMagic = 0x6766646974515545ull;  // "gfditQUE"
constexpr uint64_t kSetMagic = 0x6766646974534554ull;    // "gfditSET"
constexpr size_t kLine = 64;

size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct ShmQueue::Header {
  uint64_t magic;
  uint32_t capacity;
  uint32_t elem_bytes;
  uint64_t cell_bytes;
  alignas(kLine) uint64_t enqueue_pos;
  alignas(kLine) uint64_t dequeue_pos;
  alignas(kLine) uint32_t doorbell;
  uint32_t num_waiters;
};

size_t ShmQueue::footprint(uint32_t capacity, uint32_t elem_bytes) {
  return alignUp(sizeof(Header), kLine) + capacity * alignUp(elem_bytes + 8, kLine);
}

ShmQueue ShmQueue::create(void* memory, uint32_t capacity, uint32_t elem_bytes) {
  GFDIT_CHECK(capacity >= 2 && (capacity & (capacity - 1)) == 0) << "queue capacity must be a power of two";
  ShmQueue q;
  q.header_ = static_cast<Header*>(memory);
  q.header_->capacity = capacity;
  q.header_->elem_bytes = elem_bytes;
  q.header_->cell_bytes = alignUp(elem_bytes + 8, kLine);
  q.cells_ = static_cast<uint8_t*>(memory) + alignUp(sizeof(Header), kLine);
  for (uint32_t i = 0; i < capacity; ++i) {
    __atomic_store_n(reinterpret_cast<uint64_t*>(q.cells_ + i * q.header_->cell_bytes), uint64_t{i}, __ATOMIC_RELAXED);
  }
  __atomic_store_n(&q.header_->magic, kQueueMagic, __ATOMIC_RELEASE);
  return q;
}

ShmQueue ShmQueue::attach(void* memory) {
  ShmQueue q;
  q.header_ = static_cast<Header*>(memory);
  GFDIT_CHECK(__atomic_load_n(&q.header_->magic, __ATOMIC_ACQUIRE) == kQueueMagic) << "not a gfdit queue";
  q.cells_ = static_cast<uint8_t*>(memory) + alignUp(sizeof(Header), kLine);
  return q;
}

uint32_t ShmQueue::capacity() const { return header_->capacity; }

uint64_t ShmQueue::size() const {
  uint64_t e = __atomic_load_n(&header_->enqueue_pos, __ATOMIC_ACQUIRE);
  uint64_t d = __atomic_load_n(&header_->dequeue_pos, __ATOMIC_ACQUIRE);
  return e > d ? e - d : 0;
}

namespace {

void ring(uint32_t* doorbell, uint32_t* waiters) {
  __atomic_fetch_add(doorbell, 1u, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(waiters, __ATOMIC_SEQ_CST) != 0) {
    syscall(SYS_futex, doorbell, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
  }
}

}  // namespace

bool ShmQueue::tryPush(const void* elem) {
  Header* h = header_;
  uint64_t mask = h->capacity - 1;
  uint64_t pos = __atomic_load_n(&h->enqueue_pos, __ATOMIC_RELAXED);
  while (true) {
    uint8_t* cell = cells_ + (pos & mask) * h->cell_bytes;
    uint64_t seq = __atomic_load_n(reinterpret_cast<uint64_t*>(cell), __ATOMIC_ACQUIRE);
    int64_t dif = static_cast<int64_t>(seq) - static_cast<int64_t>(pos);
    if (dif == 0) {
      if (__atomic_compare_exchange_n(&h->enqueue_pos, &pos, pos + 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        std::memcpy(cell + 8, elem, h->elem_bytes);
        // release: the element is visible to the consumer that acquires seq (see NOTE [task ring])
        __atomic_store_n(reinterpret_cast<uint64_t*>(cell), pos + 1, __ATOMIC_RELEASE);
        ring(&h->doorbell, &h->num_waiters);
        return true;
      }
    } else if (dif < 0) {
      return false;  // full
    } else {
      pos = __atomic_load_n(&h->enqueue_pos, __ATOMIC_RELAXED);
    }
  }
}

bool ShmQueue::tryPop(void* elem) {
  Header* h = header_;
  uint64_t mask = h->capacity - 1;
  uint64_t pos = __atomic_load_n(&h->dequeue_pos, __ATOMIC_RELAXED);
  while (true) {
    uint8_t* cell = cells_ + (pos & mask) * h->cell_bytes;
    uint64_t seq = __atomic_load_n(reinterpret_cast<uint64_t*>(cell), __ATOMIC_ACQUIRE);
    int64_t dif = static_cast<int64_t>(seq) - static_cast<int64_t>(pos + 1);
    if (dif == 0) {
      if (__atomic_compare_exchange_n(&h->dequeue_pos, &pos, pos + 1, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        std::memcpy(elem, cell + 8, h->elem_bytes);
        // release: our read is done before the producer of the next lap reuses the cell
        __atomic_store_n(reinterpret_cast<uint64_t*>(cell), pos + mask + 1, __ATOMIC_RELEASE);
        ring(&h->doorbell, &h->num_waiters);
        return true;
      }
    } else if (dif < 0) {
      return false;  // empty
    } else {
      pos = __atomic_load_n(&h->dequeue_pos, __ATOMIC_RELAXED);
    }
  }
}

namespace {

// Retries `attempt` until it succeeds or the timeout passes: spin ~20 us, then yield the core for up to
// ~1 ms (an idle worker or engine usually gets its next task or completion within that, and waking a
// process blocked in a futex costs tens of microseconds on a virtual machine), then block on the doorbell.
template <typename F>
bool waitFor(uint32_t* doorbell, uint32_t* waiters, std::chrono::microseconds timeout, F attempt) {
  int64_t start = nowNs();
  int64_t deadline = start + timeout.count() * 1000;
  int64_t spin_end = start + 20000;
  int64_t yield_end = start + 1000000;
  for (int i = 0;; ++i) {
    uint32_t bell = __atomic_load_n(doorbell, __ATOMIC_SEQ_CST);
    if (attempt()) return true;
    int64_t now = nowNs();
    if (now >= deadline) return false;
    if (now < spin_end) {
      cpuRelax();
      continue;
    }
    if (now < yield_end) {
      sched_yield();
      continue;
    }
    __atomic_fetch_add(waiters, 1u, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(doorbell, __ATOMIC_SEQ_CST) == bell) {
      int64_t left = std::min<int64_t>(deadline - now, 50000000);  // wake at least every 50 ms
      timespec ts{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
      syscall(SYS_futex, doorbell, FUTEX_WAIT, bell, &ts, nullptr, 0);
    }
    __atomic_fetch_sub(waiters, 1u, __ATOMIC_SEQ_CST);
  }
}

}  // namespace

bool ShmQueue::push(const void* elem, std::chrono::microseconds timeout) {
  return waitFor(&header_->doorbell, &header_->num_waiters, timeout, [&] { return tryPush(elem); });
}

bool ShmQueue::pop(void* elem, std::chrono::microseconds timeout) {
  return waitFor(&header_->doorbell, &header_->num_waiters, timeout, [&] { return tryPop(elem); });
}

// ---- QueueSet ----

namespace {

struct SetHeader {
  uint64_t magic;
  int32_t num_workers;
  uint32_t capacity;
  uint64_t total_bytes;
  uint64_t dispatch_bytes;  // footprint of one dispatch queue
  uint64_t completion_offset;
  alignas(64) uint64_t abort_epoch;  // see QueueSet::abortWord
};

std::string randomName() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid()));
  std::ostringstream os;
  os << "/gfdit-q-" << std::hex << gen() << gen();
  return os.str();
}

}  // namespace

std::unique_ptr<QueueSet> QueueSet::create(int num_workers, uint32_t capacity) {
  GFDIT_CHECK(num_workers >= 1 && num_workers <= kMaxRanks) << "workers: " << num_workers;
  size_t header = alignUp(sizeof(SetHeader), 4096);
  size_t dq = alignUp(ShmQueue::footprint(capacity, sizeof(TaskDescriptor)), 4096);
  size_t cq = alignUp(ShmQueue::footprint(capacity * 4, sizeof(Completion)), 4096);
  size_t total = header + dq * num_workers + cq;
  std::unique_ptr<QueueSet> set(new QueueSet());
  int fd = -1;
  for (int i = 0; i < 16 && fd < 0; ++i) {
    set->name_ = randomName();
    fd = ::shm_open(set->name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) GFDIT_THROW(kSystemError) << "shm_open: " << std::strerror(errno);
  }
  GFDIT_CHECK_CODE(kSystemError, fd >= 0) << "could not create the queue region";
  set->owner_ = true;
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
    ::close(fd);
    GFDIT_THROW(kSystemError) << "ftruncate: " << std::strerror(errno);
  }
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) GFDIT_THROW(kSystemError) << "mmap: " << std::strerror(errno);
  set->base_ = p;
  set->bytes_ = total;
  set->num_workers_ = num_workers;
  auto* h = static_cast<SetHeader*>(p);
  h->num_workers = num_workers;
  h->capacity = capacity;
  h->total_bytes = total;
  h->dispatch_bytes = dq;
  h->completion_offset = header + dq * num_workers;
  for (int w = 0; w < num_workers; ++w) {
    set->dispatch_.push_back(ShmQueue::create(static_cast<uint8_t*>(p) + header + dq * w, capacity,
                                              sizeof(TaskDescriptor)));
  }
  set->completion_ = ShmQueue::create(static_cast<uint8_t*>(p) + h->completion_offset, capacity * 4, sizeof(Completion));
  __atomic_store_n(&h->magic, kSetMagic, __ATOMIC_RELEASE);
  return set;
}

std::unique_ptr<QueueSet> QueueSet::attach(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) GFDIT_THROW(kSystemError) << "attach to queues '" << name << "': " << std::strerror(errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    GFDIT_THROW(kSystemError) << "fstat: " << std::strerror(errno);
  }
  size_t total = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) GFDIT_THROW(kSystemError) << "mmap: " << std::strerror(errno);
  std::unique_ptr<QueueSet> set(new QueueSet());
  set->name_ = name;
  set->base_ = p;
  set->bytes_ = total;
  auto* h = static_cast<SetHeader*>(p);
  GFDIT_CHECK(__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == kSetMagic) << "'" << name << "' is not a queue set";
  set->num_workers_ = h->num_workers;
  size_t header = alignUp(sizeof(SetHeader), 4096);
  for (int w = 0; w < h->num_workers; ++w) {
    set->dispatch_.push_back(ShmQueue::attach(static_cast<uint8_t*>(p) + header + h->dispatch_bytes * w));
  }
  set->completion_ = ShmQueue::attach(static_cast<uint8_t*>(p) + h->completion_offset);
  return set;
}

uint64_t* QueueSet::abortWord() { return &static_cast<SetHeader*>(base_)->abort_epoch; }

void QueueSet::requestAbort() { __atomic_fetch_add(abortWord(), uint64_t{1}, __ATOMIC_SEQ_CST); }

void QueueSet::unlinkName() {
  if (owner_ && !name_.empty()) {
    ::shm_unlink(name_.c_str());
    owner_ = false;
  }
}

QueueSet::~QueueSet() {
  unlinkName();
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

}  // namespace runtime
}  // namespace gfdit
