// The CPU shared-memory backend of the group-free collectives: world setup, the symmetric heap, the
// progress engine every collective runs on, and the collectives themselves.
#include "gfdit/world.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "copy.h"
#include "edge.h"
#include "gfdit/error.h"
#include "reduce.h"

namespace gfdit {

using edge::InEdge;
using edge::MessageDesc;
using edge::OutEdge;
using edge::RegionHeader;
using Clock = std::chrono::steady_clock;

namespace {

// Collective kinds carried in MessageDesc::op, so a receiver notices a peer that runs another one.
enum Kind : uint32_t {
  kAllGather = 1,
  kAllToAll = 2,
  kReduceScatter = 3,
  kAllReduceOneShot = 4,
  kAllReduceScatter = 5,
  kAllReduceGather = 6,
  kBroadcast = 7,
  kSendRecv = 8,
  kBarrier = 9,
};

const char* kindName(uint32_t op) {
  switch (op >> 16) {
    case kAllGather: return "all_gather";
    case kAllToAll: return "all_to_all";
    case kReduceScatter: return "reduce_scatter";
    case kAllReduceOneShot:
    case kAllReduceScatter:
    case kAllReduceGather: return "all_reduce";
    case kBroadcast: return "broadcast";
    case kSendRecv: return "send/recv";
    case kBarrier: return "barrier";
  }
  return "unknown";
}

std::string describeOp(uint32_t op) {
  std::ostringstream os;
  os << kindName(op) << "(" << dtypeName(static_cast<DType>((op >> 8) & 0xff)) << ")";
  return os.str();
}

size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

int futexWait(uint32_t* word, uint32_t expected, std::chrono::microseconds timeout) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  // Not FUTEX_PRIVATE: the word is in memory shared between processes.
  return static_cast<int>(syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0));
}

void futexWakeAll(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0); }

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A process that exited but was not reaped yet still answers kill(pid, 0): read its state.
bool processAlive(pid_t pid) {
  if (pid <= 0) return true;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

std::string randomShmName() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid()));
  std::ostringstream os;
  os << "/gfdit-" << std::hex << gen() << gen();
  return os.str();
}

std::atomic<uint64_t> g_world_generation{0};

}  // namespace

// One mapped region: this rank's own or a peer's.
struct MappedRegion {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  RegionHeader* header = nullptr;
  InEdge* in_edges = nullptr;
  OutEdge* out_edges = nullptr;
  uint8_t* staging = nullptr;
  uint8_t* heap = nullptr;
  pid_t pid = 0;
};

// Per-peer state of the collective being run.
struct SendState {
  bool active = false;
  bool zero_copy = false;
  BufferView view;
  uint64_t total = 0;
  uint64_t published = 0;
  uint64_t num_published = 0;  // messages, so that an empty stream still sends one
  uint64_t last_seq = 0;
};

struct RecvState {
  bool active = false;
  BufferView view;
  uint64_t total = 0;
  uint64_t consumed = 0;
  uint64_t num_consumed = 0;
  // Reductions hold a message until every round it covers is reduced.
  bool has_msg = false;
  MessageDesc msg{};
  uint64_t msg_seq = 0;
};

// What one collective instance moves. Indexed by group member.
struct Plan {
  uint32_t op = 0;
  bool shared_send = false;  // send_views[j] are all the same bytes: stage once, publish to all
  SendState send[kMaxRanks];
  RecvState recv[kMaxRanks];
  // Reduction (ordered by member index so every rank gets the same bits).
  bool reduce = false;
  bool ordered_reduce = false;  // every rank reduces the same data: member order, so the bits agree
  DType dtype = DType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  const uint8_t* own_contrib = nullptr;
  uint8_t* reduce_out = nullptr;
  uint64_t reduce_total = 0;
  uint64_t reduce_done = 0;
};

struct World::Impl {
  int rank = 0;
  int size = 0;
  WorldOptions options;
  std::vector<MappedRegion> regions;
  MappedRegion* self = nullptr;
  std::string shm_name;
  size_t slot_bytes = 0;
  size_t num_slots = 0;
  int spin_us = 0;
  int yield_us = 0;
  CopySelector copier;

  // Edge counters, indexed by peer rank. See NOTE [edge sequence numbers].
  uint64_t send_seq[kMaxRanks] = {};
  uint64_t recv_seq[kMaxRanks] = {};
  uint64_t instance[kMaxRanks] = {};
  uint64_t puts_sent[kMaxRanks] = {};
  uint64_t puts_seen[kMaxRanks] = {};

  // Outbound staging ring: slot k may be rewritten once every peer that was sent from it acked the
  // recorded seq (slot_need[k * kMaxRanks + peer], 0 = nothing outstanding).
  uint64_t ring_next = 0;
  std::vector<uint64_t> slot_need;
  std::vector<uint64_t> slot_peers;  // bitmask of peers with something outstanding per slot

  std::vector<uint8_t> acc;      // reduction accumulator, one round
  std::vector<uint8_t> scratch;  // one-shot all-reduce result
  Plan plan;

  std::mutex call_mu;  // one collective at a time per world
  std::mutex heap_mu;
  std::map<size_t, size_t> heap_free;  // offset -> bytes
  std::map<size_t, size_t> heap_used;  // offset -> bytes
  size_t heap_used_bytes = 0;

  bool broken = false;
  std::string broken_reason;
  std::atomic<uint32_t> message_tag{0};  // see NOTE [message tags]
  const uint64_t* abort_word = nullptr;
  uint64_t abort_base = 0;

  void checkAbort() {
    if (abort_word != nullptr && __atomic_load_n(abort_word, __ATOMIC_ACQUIRE) != abort_base) {
      fail(ErrorCode::kRemoteError, "gfdit: rank " + std::to_string(rank) + ": collective aborted by the engine");
    }
  }
  WorldStats stats;

  ~Impl() {
    for (auto& r : regions) {
      if (r.base != nullptr) ::munmap(r.base, r.bytes);
    }
    if (!shm_name.empty()) ::shm_unlink(shm_name.c_str());  // only if setup failed before unlinking
  }

  // ---- waiting ----

  void notify(int peer) {
    RegionHeader* h = regions[peer].header;
    __atomic_fetch_add(&h->doorbell, 1u, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->num_waiters, __ATOMIC_SEQ_CST) != 0) futexWakeAll(&h->doorbell);
  }

  uint32_t doorbell() const { return __atomic_load_n(&self->header->doorbell, __ATOMIC_SEQ_CST); }

  // Waits until the doorbell moves away from `seen`, at most `slice`. Spins first, then yields the core
  // (a peer may be waiting for it when ranks outnumber cores), then blocks on the futex.
  void waitDoorbell(uint32_t seen, Clock::duration slice) {
    uint32_t* word = &self->header->doorbell;
    auto start = Clock::now();
    auto spin_end = start + std::chrono::microseconds(spin_us);
    for (int i = 0;; ++i) {
      if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen) return;
      cpuRelax();
      if ((i & 63) == 63) {
        if (Clock::now() >= spin_end) break;
      }
    }
    auto yield_end = Clock::now() + std::chrono::microseconds(yield_us);
    while (Clock::now() < yield_end) {
      if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen) return;
      sched_yield();
    }
    ++stats.blocking_waits;
    __atomic_fetch_add(&self->header->num_waiters, 1u, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(word, __ATOMIC_SEQ_CST) == seen) {
      auto left = std::chrono::duration_cast<std::chrono::microseconds>(slice - (Clock::now() - start));
      if (left.count() > 0) futexWait(word, seen, left);
    }
    __atomic_fetch_sub(&self->header->num_waiters, 1u, __ATOMIC_SEQ_CST);
  }

  [[noreturn]] void fail(ErrorCode code, const std::string& message) {
    broken = true;
    broken_reason = message;
    broadcastFailure(message);
    throw Error(code, message);
  }

  // see NOTE [failure broadcast]: the reason first, then the flag (release), then every peer's doorbell.
  void broadcastFailure(const std::string& message) {
    RegionHeader* h = self->header;
    if (edge::loadAcquire(&h->failed) != 0) return;  // the first reason stays
    size_t len = std::min(message.size(), edge::kFailReasonBytes - 1);
    std::memcpy(h->fail_reason, message.data(), len);
    h->fail_reason[len] = '\0';
    edge::storeRelease(&h->failed, 1);
    for (int p = 0; p < size; ++p) {
      if (p != rank) notify(p);
    }
  }

  // The reason a peer's world broke, or "" while it is fine (acquire: the reason was written before).
  std::string peerFailure(int peer) const {
    const RegionHeader* h = regions[peer].header;
    if (edge::loadAcquire(&h->failed) == 0) return "";
    char buf[edge::kFailReasonBytes];
    std::memcpy(buf, h->fail_reason, sizeof(buf));
    buf[sizeof(buf) - 1] = '\0';
    return buf;
  }

  // ---- staging ring ----

  bool slotFree(size_t k) const {
    uint64_t mask = slot_peers[k];
    while (mask != 0) {
      int peer = __builtin_ctzll(mask);
      mask &= mask - 1;
      if (edge::loadAcquire(&self->out_edges[peer].ack) < slot_need[k * kMaxRanks + peer]) return false;
    }
    return true;
  }

  // The next slot of the ring if it is free, else -1. Slots are taken in FIFO order.
  long tryTakeSlot() {
    size_t k = ring_next % num_slots;
    if (slot_peers[k] != 0) {
      if (!slotFree(k)) return -1;
      slot_peers[k] = 0;
    }
    ++ring_next;
    return static_cast<long>(k);
  }

  void recordSlotUse(size_t k, int peer, uint64_t seq) {
    slot_need[k * kMaxRanks + peer] = seq;
    slot_peers[k] |= uint64_t{1} << peer;
  }

  uint8_t* slotPtr(size_t k) const { return self->staging + k * slot_bytes; }

  // ---- messages ----

  bool descRoom(int peer) const {
    uint64_t seq = send_seq[peer] + 1;
    return seq <= 2 || edge::loadAcquire(&self->out_edges[peer].ack) >= seq - 2;
  }

  uint64_t publish(int peer, const MessageDesc& desc) {
    uint64_t seq = ++send_seq[peer];
    InEdge& e = regions[peer].in_edges[rank];
    e.desc[seq % 2] = desc;
    edge::storeRelease(&e.signal, seq);  // release: the descriptor and the staged bytes before it
    notify(peer);
    ++stats.messages_sent;
    return seq;
  }

  MessageDesc baseDesc(int peer, const SendState& s) const {
    MessageDesc d{};
    d.instance = instance[peer];
    d.op = plan.op;
    d.tag = message_tag.load(std::memory_order_relaxed);
    d.total_bytes = s.total;
    return d;
  }

  bool viewInHeap(const BufferView& v) const {
    if (v.bytes() == 0) return false;
    size_t extent = (v.rows - 1) * v.stride + v.row_bytes;
    return isInHeap(v.ptr, extent);
  }

  bool isInHeap(const void* p, size_t bytes) const {
    auto* b = static_cast<const uint8_t*>(p);
    const uint8_t* h = self->heap;
    return b >= h && b + bytes <= h + self->header->heap_bytes;
  }

  bool sendDone(const SendState& s) const { return s.num_published > 0 && s.published == s.total; }

  // Publishes the next message of peer member j if the edge and the ring allow. Returns whether it did.
  bool publishOne(int j, int peer) {
    SendState& s = plan.send[j];
    if (sendDone(s) || !descRoom(peer)) return false;
    MessageDesc d = baseDesc(peer, s);
    if (s.zero_copy) {
      // The peer reads straight from the heap; the collective waits for its ack before returning.
      d.flags = edge::kFlagZeroCopy;
      d.bytes = s.total;
      d.region_offset = static_cast<uint64_t>(static_cast<uint8_t*>(s.view.ptr) - self->base);
      if (!s.view.isContiguous()) {
        d.rows = static_cast<uint32_t>(s.view.rows);
        d.row_bytes = s.view.row_bytes;
        d.stride = s.view.stride;
      }
      s.last_seq = publish(peer, d);
      s.published = s.total;
      ++stats.zero_copy_sends;
    } else {
      size_t chunk = std::min<uint64_t>(slot_bytes, s.total - s.published);
      if (chunk > 0) {
        long k = tryTakeSlot();
        if (k < 0) return false;
        copyView(copier, BufferView::contiguous(slotPtr(k), chunk), 0, s.view, s.published, chunk);
        stats.staged_bytes += chunk;
        d.region_offset = static_cast<uint64_t>(slotPtr(k) - self->base);
        d.stream_offset = s.published;
        d.bytes = chunk;
        s.last_seq = publish(peer, d);
        recordSlotUse(static_cast<size_t>(k), peer, s.last_seq);
      } else {
        s.last_seq = publish(peer, d);  // empty stream: one empty message keeps both ends in step
      }
      s.published += chunk;
    }
    ++s.num_published;
    return true;
  }

  // Per-peer sends go out round by round: message k to every peer before message k + 1 to any.
  // NOTE [staging rounds]: a reduction consumes round k only once every member's round-k message has
  // arrived, so a rank whose ring filled up with round k + 1 messages while round k was still unsent to
  // some peer could wait forever on slots its peers cannot release. Sending in rounds, with at least
  // world_size - 1 slots, means the slowest rank only ever waits on slots of earlier rounds, which every
  // receiver can finish.
  bool progressSends(const Group& g) {
    int n = g.size(), me = g.selfIdx();
    bool moved = false;
    while (true) {
      uint64_t round = UINT64_MAX;
      for (int j = 0; j < n; ++j) {
        const SendState& s = plan.send[j];
        if (j != me && s.active && !sendDone(s)) round = std::min(round, s.num_published);
      }
      if (round == UINT64_MAX) return moved;
      bool any = false;
      for (int step = 1; step < n; ++step) {  // start after ourselves so ranks spread over peers
        int j = (me + step) % n;
        SendState& s = plan.send[j];
        if (s.active && !sendDone(s) && s.num_published == round) any |= publishOne(j, g.rankAt(j));
      }
      if (!any) return moved;
      moved = true;
    }
  }

  // A shared send tracks its progress in the state of the first member that is not this rank; the other
  // members' states only keep the sequence number of their last message (for zero-copy acks).
  static int sharedIdx(int me) { return me == 0 ? 1 : 0; }

  // Shared send: one staged copy of each chunk, published to every peer.
  bool progressSharedSend(const Group& g) {
    int n = g.size(), me = g.selfIdx();
    SendState& s0 = plan.send[sharedIdx(me)];
    bool moved = false;
    while (!sendDone(s0)) {
      for (int j = 0; j < n; ++j) {
        if (j != me && !descRoom(g.rankAt(j))) return moved;
      }
      MessageDesc d{};
      d.op = plan.op;
      d.tag = message_tag.load(std::memory_order_relaxed);
      d.total_bytes = s0.total;
      long k = -1;
      size_t chunk = 0;
      if (s0.zero_copy) {
        d.flags = edge::kFlagZeroCopy;
        d.bytes = s0.total;
        d.region_offset = static_cast<uint64_t>(static_cast<uint8_t*>(s0.view.ptr) - self->base);
        if (!s0.view.isContiguous()) {
          d.rows = static_cast<uint32_t>(s0.view.rows);
          d.row_bytes = s0.view.row_bytes;
          d.stride = s0.view.stride;
        }
        chunk = s0.total - s0.published;
        stats.zero_copy_sends += n - 1;
      } else {
        chunk = std::min<uint64_t>(slot_bytes, s0.total - s0.published);
        if (chunk > 0) {
          k = tryTakeSlot();
          if (k < 0) return moved;
          copyView(copier, BufferView::contiguous(slotPtr(k), chunk), 0, s0.view, s0.published, chunk);
          stats.staged_bytes += chunk;
          d.region_offset = static_cast<uint64_t>(slotPtr(k) - self->base);
        }
        d.stream_offset = s0.published;
        d.bytes = chunk;
      }
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        int peer = g.rankAt(j);
        d.instance = instance[peer];
        uint64_t seq = publish(peer, d);
        plan.send[j].last_seq = seq;
        if (k >= 0) recordSlotUse(static_cast<size_t>(k), peer, seq);
      }
      s0.published += chunk;
      ++s0.num_published;
      moved = true;
    }
    return moved;
  }

  // Checks a received descriptor against what this rank expects; a mismatch is the peer disagreeing.
  void validate(int peer, const MessageDesc& d, const RecvState& r, uint64_t seq) {
    uint32_t tag = message_tag.load(std::memory_order_relaxed);
    if (d.tag != tag) {  // see NOTE [message tags]
      std::ostringstream os;
      os << "gfdit: message tag mismatch on edge " << peer << "->" << rank << " (message " << seq << "): rank " << peer
         << " sent tag 0x" << std::hex << d.tag << std::dec << " in instance " << d.instance << " " << describeOp(d.op)
         << ", but rank " << rank << " expects tag 0x" << std::hex << tag << std::dec << " in instance "
         << instance[peer] << " " << describeOp(plan.op);
      fail(ErrorCode::kRemoteError, os.str());
    }
    if (d.instance != instance[peer] || d.op != plan.op || d.total_bytes != r.total) {
      std::ostringstream os;
      os << "gfdit: collective mismatch on edge " << peer << "->" << rank << " (message " << seq << "): rank " << peer
         << " is in instance " << d.instance << " " << describeOp(d.op) << " with " << d.total_bytes
         << " bytes for rank " << rank << ", but rank " << rank << " is in instance " << instance[peer] << " "
         << describeOp(plan.op) << " expecting " << r.total << " bytes from rank " << peer;
      fail(ErrorCode::kRemoteError, os.str());
    }
  }

  BufferView sourceView(int peer, const MessageDesc& d) const {
    uint8_t* p = regions[peer].base + d.region_offset;
    if (d.rows == 0) {
      bool zc = (d.flags & edge::kFlagZeroCopy) != 0;
      return BufferView::contiguous(p, zc ? d.total_bytes : d.bytes);
    }
    return BufferView::strided(p, d.rows, d.row_bytes, d.stride);
  }

  void ack(int peer, uint64_t seq) {
    // release: our reads of the peer's bytes are done before the peer may overwrite them.
    edge::storeRelease(&regions[peer].out_edges[rank].ack, seq);
    notify(peer);
  }

  bool recvDone(const RecvState& r) const { return r.num_consumed > 0 && r.consumed == r.total; }

  // Copies whatever peer member j has published. Returns whether anything moved.
  bool progressRecv(int j, int peer) {
    RecvState& r = plan.recv[j];
    bool moved = false;
    InEdge& e = self->in_edges[peer];
    while (!recvDone(r)) {
      uint64_t seq = recv_seq[peer] + 1;
      if (edge::loadAcquire(&e.signal) < seq) break;
      MessageDesc d = e.desc[seq % 2];
      validate(peer, d, r, seq);
      if (d.stream_offset != r.consumed) {
        fail(ErrorCode::kInternal,
             "gfdit: message out of order on edge " + std::to_string(peer) + "->" + std::to_string(rank));
      }
      bool zc = (d.flags & edge::kFlagZeroCopy) != 0;
      copyView(copier, r.view, d.stream_offset, sourceView(peer, d), zc ? d.stream_offset : 0, d.bytes);
      r.consumed += d.bytes;
      ++r.num_consumed;
      recv_seq[peer] = seq;
      ack(peer, seq);
      moved = true;
    }
    return moved;
  }

  // Reduces the next rounds whose contributions have all arrived, in member order.
  bool progressReduce(const Group& g) {
    int n = g.size(), me = g.selfIdx();
    size_t esize = dtypeSize(plan.dtype);
    size_t round_bytes = slot_bytes;  // staged messages are exactly one slot: rounds line up with them
    bool moved = false;
    while (plan.reduce_done < plan.reduce_total || (plan.reduce_total == 0 && !reduceEmptyDone(g))) {
      uint64_t a = plan.reduce_done;
      uint64_t b = std::min<uint64_t>(a + round_bytes, plan.reduce_total);
      // Every peer's message covering [a, b) must be here.
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        int peer = g.rankAt(j);
        RecvState& r = plan.recv[j];
        if (!r.has_msg) {
          uint64_t seq = recv_seq[peer] + 1;
          if (edge::loadAcquire(&self->in_edges[peer].signal) < seq) return moved;
          r.msg = self->in_edges[peer].desc[seq % 2];
          validate(peer, r.msg, r, seq);
          r.msg_seq = seq;
          r.has_msg = true;
          recv_seq[peer] = seq;
        }
        if (r.msg.stream_offset > a || r.msg.stream_offset + r.msg.bytes < b) {
          fail(ErrorCode::kInternal, "gfdit: reduction message does not cover its round on edge " +
                                         std::to_string(peer) + "->" + std::to_string(rank));
        }
      }
      size_t count = (b - a) / esize;
      auto contribution = [&](int j) -> const uint8_t* {
        if (j == me) return plan.own_contrib + a;
        const RecvState& r = plan.recv[j];
        bool zc = (r.msg.flags & edge::kFlagZeroCopy) != 0;
        return regions[g.rankAt(j)].base + r.msg.region_offset + (zc ? a : a - r.msg.stream_offset);
      };
      if (plan.ordered_reduce || reduce::accElemSize(plan.dtype) != esize) {
        // Member order, through the accumulator (float32 for 16-bit floats).
        reduce::accInit(acc.data(), contribution(0), count, plan.dtype);
        for (int j = 1; j < n; ++j) reduce::accApply(acc.data(), contribution(j), count, plan.dtype, plan.reduce_op);
        reduce::accStore(plan.reduce_out + a, acc.data(), count, plan.dtype);
      } else {
        // Straight into the output: only this rank computes this block, so any fixed order gives every
        // rank the same bits after the gather. Start from our own block (in place: it is there already).
        uint8_t* out = plan.reduce_out + a;
        if (out != contribution(me)) std::memcpy(out, contribution(me), b - a);
        for (int j = 0; j < n; ++j) {
          if (j != me) reduce::accApply(out, contribution(j), count, plan.dtype, plan.reduce_op);
        }
      }
      plan.reduce_done = b;
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        RecvState& r = plan.recv[j];
        if (r.msg.stream_offset + r.msg.bytes <= b) {
          r.has_msg = false;
          r.consumed = r.msg.stream_offset + r.msg.bytes;
          ++r.num_consumed;
          ack(g.rankAt(j), r.msg_seq);
        }
      }
      moved = true;
      if (plan.reduce_total == 0) break;
    }
    return moved;
  }

  bool reduceEmptyDone(const Group& g) const {
    for (int j = 0; j < g.size(); ++j) {
      if (j != g.selfIdx() && plan.recv[j].num_consumed == 0) return false;
    }
    return true;
  }

  // ---- the engine ----

  // Runs the plan to completion: every send published (zero-copy ones acknowledged), every receive
  // consumed. Waits only when nothing can move; see NOTE [doorbell].
  void run(const Group& g) {
    checkAbort();
    int n = g.size(), me = g.selfIdx();
    ++stats.collectives;
    if ((plan.op >> 16) == kAllGather) ++stats.all_gathers;
    for (int j = 0; j < n; ++j) {
      if (j != me) ++instance[g.rankAt(j)];
    }
    if (plan.shared_send) {
      SendState& s0 = plan.send[sharedIdx(me)];
      s0.zero_copy = viewInHeap(s0.view);
    } else {
      for (int j = 0; j < n; ++j) {
        if (plan.send[j].active) plan.send[j].zero_copy = viewInHeap(plan.send[j].view);
      }
    }
    auto last_progress = Clock::now();
    auto last_liveness = last_progress;
    auto timeout = options.timeout;
    while (true) {
      uint32_t bell = doorbell();
      bool moved = false;
      bool done = true;
      if (plan.shared_send && n > 1) {
        moved |= progressSharedSend(g);
        done &= sendDone(plan.send[sharedIdx(me)]);
      }
      if (!plan.shared_send) {
        moved |= progressSends(g);
        for (int j = 0; j < n; ++j) {
          if (j != me && plan.send[j].active) done &= sendDone(plan.send[j]);
        }
      }
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        int peer = g.rankAt(j);
        if (!plan.reduce && plan.recv[j].active) {
          moved |= progressRecv(j, peer);
          done &= recvDone(plan.recv[j]);
        }
      }
      if (plan.reduce) {
        moved |= progressReduce(g);
        done &= plan.reduce_done == plan.reduce_total && reduceEmptyDone(g);
      }
      if (done) done = zeroCopyAcked(g);
      if (done) return;
      auto now = Clock::now();
      if (moved) {
        last_progress = now;
        continue;
      }
      if (now - last_progress > timeout) failTimeout(g, now - last_progress);
      if (now - last_liveness > std::chrono::milliseconds(100)) {
        checkAbort();
        checkPeersAlive(g);
        last_liveness = now;
      }
      waitDoorbell(bell, std::chrono::milliseconds(50));
    }
  }

  bool zeroCopyAcked(const Group& g) const {
    int n = g.size(), me = g.selfIdx();
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      const SendState& s = plan.send[plan.shared_send ? sharedIdx(me) : j];
      if (!s.active) continue;
      if (s.zero_copy && edge::loadAcquire(&self->out_edges[g.rankAt(j)].ack) < plan.send[j].last_seq) return false;
    }
    return true;
  }

  // Names the first edge this rank is stuck on.
  std::string stuckOn(const Group& g) const {
    int n = g.size(), me = g.selfIdx();
    std::ostringstream os;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      int peer = g.rankAt(j);
      const RecvState& r = plan.recv[j];
      bool waiting_recv = plan.reduce ? !r.has_msg && (plan.reduce_done < plan.reduce_total || r.num_consumed == 0)
                                      : r.active && !recvDone(r);
      if (waiting_recv) {
        os << "a message from rank " << peer << " on edge " << peer << "->" << rank << " (" << describeOp(plan.op)
           << " instance " << instance[peer] << ", message " << recv_seq[peer] + 1 << ")";
        return os.str();
      }
    }
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      int peer = g.rankAt(j);
      uint64_t acked = edge::loadAcquire(&self->out_edges[peer].ack);
      if (acked < send_seq[peer]) {
        os << "rank " << peer << " to acknowledge message " << send_seq[peer] << " on edge " << rank << "->" << peer
           << " (" << describeOp(plan.op) << " instance " << instance[peer] << ", acknowledged " << acked << ")";
        return os.str();
      }
    }
    return "peers of group " + g.toString();
  }

  [[noreturn]] void failTimeout(const Group& g, Clock::duration waited) {
    std::ostringstream os;
    os << "gfdit: timeout after " << std::chrono::duration<double>(waited).count() << " s: rank " << rank
       << " waited for " << stuckOn(g);
    fail(ErrorCode::kTimeout, os.str());
  }

  void checkPeersAlive(const Group& g) {
    for (int j = 0; j < g.size(); ++j) {
      int peer = g.rankAt(j);
      if (peer == rank) continue;
      checkPeerFailed(peer, [&] { return stuckOn(g); });
      if (processAlive(regions[peer].pid)) continue;
      std::ostringstream os;
      os << "gfdit: rank " << peer << " (pid " << regions[peer].pid << ") has died; rank " << rank
         << " was waiting for " << stuckOn(g);
      fail(ErrorCode::kRemoteError, os.str());
    }
  }

  // see NOTE [failure broadcast]
  template <typename Describe>
  void checkPeerFailed(int peer, Describe waiting_for) {
    std::string why = peerFailure(peer);
    if (why.empty()) return;
    std::ostringstream os;
    os << "gfdit: rank " << peer << " failed, so rank " << rank << " stops waiting for " << waiting_for() << "; rank "
       << peer << "'s error: " << why;
    fail(ErrorCode::kRemoteError, os.str());
  }

  void resetPlan(uint32_t op, int n) {
    plan.op = op;
    plan.shared_send = false;
    plan.reduce = false;
    plan.ordered_reduce = false;
    plan.reduce_done = plan.reduce_total = 0;
    for (int j = 0; j < n; ++j) {
      plan.send[j] = SendState{};
      plan.recv[j] = RecvState{};
    }
  }

  void checkUsable() const {
    if (broken) {
      throw Error(ErrorCode::kInvalidUsage,
                  "gfdit: the world is unusable after an earlier error; destroy it and init again. The error was: " +
                      broken_reason);
    }
  }

  // ---- heap ----

  void* heapAlloc(size_t bytes) {
    std::lock_guard<std::mutex> lock(heap_mu);
    size_t need = alignUp(std::max<size_t>(bytes, 1), edge::kHeapAlign);
    for (auto it = heap_free.begin(); it != heap_free.end(); ++it) {
      if (it->second < need) continue;
      size_t off = it->first, len = it->second;
      heap_free.erase(it);
      if (len > need) heap_free.emplace(off + need, len - need);
      heap_used.emplace(off, need);
      heap_used_bytes += need;
      return self->heap + off;
    }
    std::ostringstream os;
    os << "gfdit: symmetric heap exhausted: " << bytes << " bytes requested, " << heap_used_bytes << " of "
       << self->header->heap_bytes << " in use (raise heap_bytes at init)";
    throw Error(ErrorCode::kInvalidUsage, os.str());
  }

  void heapFree(void* ptr) {
    std::lock_guard<std::mutex> lock(heap_mu);
    size_t off = static_cast<size_t>(static_cast<uint8_t*>(ptr) - self->heap);
    auto it = heap_used.find(off);
    GFDIT_CHECK(it != heap_used.end()) << "gfdit: heapFree of a pointer not from heapAlloc";
    size_t len = it->second;
    heap_used.erase(it);
    heap_used_bytes -= len;
    auto next = heap_free.lower_bound(off);
    if (next != heap_free.end() && next->first == off + len) {  // merge with the following block
      len += next->second;
      next = heap_free.erase(next);
    }
    if (next != heap_free.begin()) {  // merge with the preceding block
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        prev->second += len;
        return;
      }
    }
    heap_free.emplace(off, len);
  }
};

// ---- setup ----

namespace {

size_t envSize(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? static_cast<size_t>(std::stoull(v)) : fallback;
}

void mapRegion(MappedRegion& r, int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) GFDIT_THROW(kSystemError) << "gfdit: mmap of " << bytes << " bytes: " << std::strerror(errno);
  r.base = static_cast<uint8_t*>(p);
  r.bytes = bytes;
  r.header = reinterpret_cast<RegionHeader*>(r.base);
}

void bindLayout(MappedRegion& r) {
  RegionHeader* h = r.header;
  r.in_edges = reinterpret_cast<InEdge*>(r.base + h->in_edges_offset);
  r.out_edges = reinterpret_cast<OutEdge*>(r.base + h->out_edges_offset);
  r.staging = r.base + h->staging_offset;
  r.heap = r.base + h->heap_offset;
  r.pid = h->pid;
}

}  // namespace

std::unique_ptr<World> World::create(int rank, int world_size, Store& store, const WorldOptions& options) {
  GFDIT_CHECK(world_size >= 1 && world_size <= kMaxRanks)
      << "world size " << world_size << " is outside [1, " << kMaxRanks << "]";
  GFDIT_CHECK(rank >= 0 && rank < world_size) << "rank " << rank << " is outside [0, " << world_size << ")";
  GFDIT_CHECK(options.timeout.count() > 0) << "timeout must be positive";
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = world_size;
  impl->options = options;
  impl->slot_bytes = alignUp(options.slot_bytes ? options.slot_bytes : envSize("GFDIT_SLOT_BYTES", 256 << 10), 64);
  size_t default_slots = std::min<size_t>(128, std::max<size_t>(8, 4 * static_cast<size_t>(world_size - 1)));
  impl->num_slots = options.num_slots ? options.num_slots : envSize("GFDIT_NUM_SLOTS", default_slots);
  // see NOTE [staging rounds]: fewer than world_size - 1 slots could deadlock a reduction
  impl->num_slots = std::max<size_t>({impl->num_slots, static_cast<size_t>(world_size - 1), 2});
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  // A rank per core: spinning costs nobody and a futex round trip costs tens of microseconds, so spin
  // long (a 256 KiB chunk from memory takes ~30 us to copy). More ranks than cores: a spinning rank
  // steals the core its peer needs, so spin briefly and yield the core before blocking.
  bool own_core = static_cast<unsigned>(world_size) <= cores;
  impl->spin_us =
      options.spin_us >= 0 ? options.spin_us : static_cast<int>(envSize("GFDIT_SPIN_US", own_core ? 1000 : 2));
  impl->yield_us = static_cast<int>(envSize("GFDIT_YIELD_US", own_core ? 0 : 300));
  impl->options.slot_bytes = impl->slot_bytes;
  impl->options.num_slots = impl->num_slots;
  impl->options.spin_us = impl->spin_us;
  if (const char* table = std::getenv("GFDIT_COPY_TABLE")) impl->copier = CopySelector::parse(table);
  impl->slot_need.assign(impl->num_slots * kMaxRanks, 0);
  impl->slot_peers.assign(impl->num_slots, 0);
  impl->acc.resize(impl->slot_bytes * 2 + 64);

  // Layout of this rank's region.
  size_t off = alignUp(sizeof(RegionHeader), 4096);
  size_t in_edges_off = off;
  off = alignUp(off + sizeof(InEdge) * world_size, 4096);
  size_t out_edges_off = off;
  off = alignUp(off + sizeof(OutEdge) * world_size, 4096);
  size_t staging_off = off;
  off = alignUp(off + impl->slot_bytes * impl->num_slots, 4096);
  size_t heap_off = off;
  size_t heap_bytes = alignUp(options.heap_bytes, 4096);
  size_t total = heap_off + heap_bytes;

  // Create it under a random name, mode 0600.
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    impl->shm_name = randomShmName();
    fd = ::shm_open(impl->shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) {
      impl->shm_name.clear();
      GFDIT_THROW(kSystemError) << "gfdit: shm_open: " << std::strerror(errno);
    }
  }
  GFDIT_CHECK_CODE(kSystemError, fd >= 0) << "gfdit: could not create a shared-memory region";
  impl->regions.resize(world_size);
  MappedRegion& own = impl->regions[rank];
  try {
    if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
      GFDIT_THROW(kSystemError) << "gfdit: ftruncate to " << total << " bytes: " << std::strerror(errno);
    }
    mapRegion(own, fd, total);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  RegionHeader* h = own.header;  // fresh pages are zero: every counter starts at 0
  h->magic = edge::kRegionMagic;
  h->version = edge::kLayoutVersion;
  h->rank = rank;
  h->world_size = world_size;
  h->pid = static_cast<int32_t>(::getpid());
  h->total_bytes = total;
  h->in_edges_offset = in_edges_off;
  h->out_edges_offset = out_edges_off;
  h->staging_offset = staging_off;
  h->slot_bytes = impl->slot_bytes;
  h->num_slots = impl->num_slots;
  h->heap_offset = heap_off;
  h->heap_bytes = heap_bytes;
  bindLayout(own);
  impl->self = &own;
  impl->heap_free.emplace(0, heap_bytes);

  // Rendezvous: publish the name, map every peer, then unlink our name once every peer has mapped it.
  std::string prefix = options.key_prefix + "/" + std::to_string(g_world_generation.fetch_add(1)) + "/";
  store.set(prefix + "region/" + std::to_string(rank),
            impl->shm_name + " " + std::to_string(total) + " " + std::to_string(impl->slot_bytes));
  for (int p = 0; p < world_size; ++p) {
    if (p == rank) continue;
    std::istringstream is(store.get(prefix + "region/" + std::to_string(p)));
    std::string name;
    size_t bytes = 0, peer_slot = 0;
    is >> name >> bytes >> peer_slot;
    GFDIT_CHECK(peer_slot == impl->slot_bytes)
        << "gfdit: rank " << p << " uses staging slots of " << peer_slot << " bytes, rank " << rank << " of "
        << impl->slot_bytes << ": every rank needs the same slot size";
    int pfd = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (pfd < 0) GFDIT_THROW(kSystemError) << "gfdit: shm_open of rank " << p << "'s region: " << std::strerror(errno);
    try {
      mapRegion(impl->regions[p], pfd, bytes);
    } catch (...) {
      ::close(pfd);
      throw;
    }
    ::close(pfd);
    MappedRegion& r = impl->regions[p];
    GFDIT_CHECK(r.header->magic == edge::kRegionMagic && r.header->version == edge::kLayoutVersion &&
                r.header->world_size == world_size && r.header->rank == p)
        << "gfdit: rank " << p << "'s region does not match this build or world";
    bindLayout(r);
  }
  store.set(prefix + "mapped/" + std::to_string(rank), "1");
  for (int p = 0; p < world_size; ++p) {
    if (p != rank) store.get(prefix + "mapped/" + std::to_string(p));
  }
  ::shm_unlink(impl->shm_name.c_str());
  impl->shm_name.clear();
  return std::unique_ptr<World>(new World(std::move(impl)));
}

World::World(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
World::~World() = default;

int World::rank() const { return impl_->rank; }
int World::size() const { return impl_->size; }
const WorldOptions& World::options() const { return impl_->options; }
void World::setTimeout(std::chrono::milliseconds timeout) {
  GFDIT_CHECK(timeout.count() > 0) << "timeout must be positive";
  impl_->options.timeout = timeout;
}
Group World::newGroup(const int* ranks, int num_ranks) const {
  return Group::create(ranks, num_ranks, impl_->size, impl_->rank);
}
Group World::worldGroup() const { return Group::whole(impl_->size, impl_->rank); }
WorldStats World::stats() const { return impl_->stats; }
void World::setMessageTag(uint32_t tag) { impl_->message_tag.store(tag, std::memory_order_relaxed); }
uint32_t World::messageTag() const { return impl_->message_tag.load(std::memory_order_relaxed); }
bool World::usable() const { return !impl_->broken; }
void World::watchAbort(const uint64_t* word) {
  impl_->abort_word = word;
  impl_->abort_base = word != nullptr ? __atomic_load_n(word, __ATOMIC_ACQUIRE) : 0;
}

void* World::heapAlloc(size_t bytes) { return impl_->heapAlloc(bytes); }
void World::heapFree(void* ptr) { impl_->heapFree(ptr); }
bool World::inHeap(const void* ptr, size_t bytes) const { return impl_->isInHeap(ptr, bytes); }
size_t World::heapOffset(const void* ptr) const {
  GFDIT_CHECK(impl_->isInHeap(ptr, 1)) << "gfdit: pointer is not in the symmetric heap";
  return static_cast<size_t>(static_cast<const uint8_t*>(ptr) - impl_->self->heap);
}
size_t World::heapUsed() const {
  std::lock_guard<std::mutex> lock(impl_->heap_mu);
  return impl_->heap_used_bytes;
}

// ---- collectives ----

namespace {

void checkMember(const Group& g, int world_size, int rank) {
  GFDIT_CHECK(g.size() < 1 || g.isMember())
      << "gfdit: rank " << rank << " is not a member of group " << g.toString()
      << "; a non-member may describe a group but not take part in its collectives";
  GFDIT_CHECK(g.size() >= 1 && g.rankAt(g.selfIdx()) == rank)
      << "gfdit: group " << g.toString() << " was not formed by rank " << rank;
  GFDIT_CHECK(g.size() <= world_size) << "gfdit: group " << g.toString() << " is larger than the world";
}

}  // namespace

void World::allGather(const Group& group, const void* in, void* out, size_t bytes_per_rank) {
  BufferView outs[kMaxRanks];
  for (int j = 0; j < group.size(); ++j) {
    outs[j] = BufferView::contiguous(static_cast<uint8_t*>(out) + j * bytes_per_rank, bytes_per_rank);
  }
  allGatherV(group, BufferView::contiguous(const_cast<void*>(in), bytes_per_rank), outs);
}

void World::allGatherV(const Group& group, const BufferView& in, const BufferView* outs) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.call_mu);
  m.checkUsable();
  checkMember(group, m.size, m.rank);
  int n = group.size(), me = group.selfIdx();
  GFDIT_CHECK(outs[me].bytes() == in.bytes())
      << "gfdit: all_gather: this rank's output block has " << outs[me].bytes() << " bytes, input " << in.bytes();
  m.resetPlan(edge::opCode(kAllGather, 0, 0), n);
  m.plan.shared_send = true;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    m.plan.send[j].active = true;
    m.plan.send[j].view = in;
    m.plan.send[j].total = in.bytes();
    m.plan.recv[j].active = true;
    m.plan.recv[j].view = outs[j];
    m.plan.recv[j].total = outs[j].bytes();
  }
  // Our own block: skip when the input already is that block (in-place).
  if (in.ptr != outs[me].ptr || !in.isContiguous() || !outs[me].isContiguous()) {
    copyView(m.copier, outs[me], 0, in, 0, in.bytes());
  }
  if (n > 1) m.run(group);
}

void World::allToAll(const Group& group, const void* in, void* out, size_t bytes_per_rank) {
  BufferView ins[kMaxRanks], outs[kMaxRanks];
  for (int j = 0; j < group.size(); ++j) {
    ins[j] = BufferView::contiguous(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)) + j * bytes_per_rank,
                                    bytes_per_rank);
    outs[j] = BufferView::contiguous(static_cast<uint8_t*>(out) + j * bytes_per_rank, bytes_per_rank);
  }
  allToAllV(group, ins, outs);
}

void World::allToAllV(const Group& group, const BufferView* ins, const BufferView* outs) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.call_mu);
  m.checkUsable();
  checkMember(group, m.size, m.rank);
  int n = group.size(), me = group.selfIdx();
  GFDIT_CHECK(ins[me].bytes() == outs[me].bytes()) << "gfdit: all_to_all: this rank's own block has " << ins[me].bytes()
                                                   << " bytes in and " << outs[me].bytes() << " out";
  m.resetPlan(edge::opCode(kAllToAll, 0, 0), n);
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    m.plan.send[j].active = true;
    m.plan.send[j].view = ins[j];
    m.plan.send[j].total = ins[j].bytes();
    m.plan.recv[j].active = true;
    m.plan.recv[j].view = outs[j];
    m.plan.recv[j].total = outs[j].bytes();
  }
  copyView(m.copier, outs[me], 0, ins[me], 0, ins[me].bytes());
  if (n > 1) m.run(group);
}

void World::reduceScatter(const Group& group, const void* in, void* out, size_t count_per_rank, DType dtype,
                          ReduceOp op) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.call_mu);
  m.checkUsable();
  checkMember(group, m.size, m.rank);
  int n = group.size(), me = group.selfIdx();
  size_t block = count_per_rank * dtypeSize(dtype);
  auto* base = const_cast<uint8_t*>(static_cast<const uint8_t*>(in));
  {
    // In place (out is this rank's own block of in) or apart: an output over another block would be overwritten
    // while peers still read that block.
    auto* o = static_cast<uint8_t*>(out);
    bool overlaps = block > 0 && o < base + n * block && base < o + block;
    GFDIT_CHECK(!overlaps || o == base + me * block)
        << "gfdit: reduce_scatter: the output overlaps the input other than as this rank's own block (member " << me
        << " of " << n << "); use a separate output or the block at offset " << me * block << " bytes";
  }
  m.resetPlan(edge::opCode(kReduceScatter, static_cast<uint32_t>(dtype), static_cast<uint32_t>(op)), n);
  m.plan.reduce = true;
  m.plan.dtype = dtype;
  m.plan.reduce_op = op;
  m.plan.own_contrib = base + me * block;
  m.plan.reduce_out = static_cast<uint8_t*>(out);
  m.plan.reduce_total = block;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    m.plan.send[j].active = true;
    m.plan.send[j].view = BufferView::contiguous(base + j * block, block);
    m.plan.send[j].total = block;
    m.plan.recv[j].active = true;
    m.plan.recv[j].total = block;
  }
  if (n == 1) {
    if (out != in) std::memmove(out, in, block);
    return;
  }
  m.run(group);
}

void World::allReduce(const Group& group, void* data, size_t count, DType dtype, ReduceOp op) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.call_mu);
  m.checkUsable();
  checkMember(group, m.size, m.rank);
  int n = group.size(), me = group.selfIdx();
  if (n == 1) return;
  size_t esize = dtypeSize(dtype);
  size_t bytes = count * esize;
  auto* base = static_cast<uint8_t*>(data);
  uint32_t d = static_cast<uint32_t>(dtype), o = static_cast<uint32_t>(op);
  if (bytes <= m.slot_bytes || count < static_cast<size_t>(n)) {
    // One shot: everyone reduces the whole buffer in member order, so every rank gets the same bits.
    // The result goes to scratch first: peers may still be reading `data`.
    if (m.scratch.size() < bytes) m.scratch.resize(bytes);
    m.resetPlan(edge::opCode(kAllReduceOneShot, d, o), n);
    m.plan.shared_send = true;
    m.plan.reduce = true;
    m.plan.ordered_reduce = true;
    m.plan.dtype = dtype;
    m.plan.reduce_op = op;
    m.plan.own_contrib = base;
    m.plan.reduce_out = m.scratch.data();
    m.plan.reduce_total = bytes;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      m.plan.send[j].active = true;
      m.plan.send[j].view = BufferView::contiguous(base, bytes);
      m.plan.send[j].total = bytes;
      m.plan.recv[j].active = true;
      m.plan.recv[j].total = bytes;
    }
    m.run(group);
    std::memcpy(data, m.scratch.data(), bytes);
    return;
  }
  // Reduce-scatter into our block in place, then all-gather the blocks. Blocks are element-aligned;
  // the last member takes the remainder.
  size_t per = count / n;
  auto block_off = [&](int j) { return static_cast<size_t>(j) * per * esize; };
  auto block_len = [&](int j) { return (j == n - 1 ? count - per * (n - 1) : per) * esize; };
  m.resetPlan(edge::opCode(kAllReduceScatter, d, o), n);
  m.plan.reduce = true;
  m.plan.dtype = dtype;
  m.plan.reduce_op = op;
  m.plan.own_contrib = base + block_off(me);
  m.plan.reduce_out = base + block_off(me);
  m.plan.reduce_total = block_len(me);
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    m.plan.send[j].active = true;
    m.plan.send[j].view = BufferView::contiguous(base + block_off(j), block_len(j));
    m.plan.send[j].total = block_len(j);
    m.plan.recv[j].active = true;
    m.plan.recv[j].total = block_len(me);
  }
  m.run(group);
  m.resetPlan(edge::opCode(kAllReduceGather, d, o), n);
  m.plan.shared_send = true;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    m.plan.send[j].active = true;
    m.plan.send[j].view = BufferView::contiguous(base + block_off(me), block_len(me));
    m.plan.send[j].total = block_len(me);
    m.plan.recv[j].active = true;
    m.plan.recv[j].view = BufferView::contiguous(base + block_off(j), block_len(j));
    m.plan.recv[j].total = block_len(j);
  }
  m.run(group);
}

void World::broadcast(const Group& group, void* data, size_t bytes, int root_rank) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.call_mu);
  m.checkUsable();
  checkMember(group, m.size, m.rank);
  int root = group.indexOf(root_rank);
  GFDIT_CHECK(root >= 0) << "gfdit: broadcast root " << root_rank << " is not in group " << group.toString();
  int n = group.size(), me = group.selfIdx();
  if (n == 1) return;
  m.resetPlan(edge::opCode(kBroadcast, 0, 0), n);
  if (me == root) {
    m.plan.shared_send = true;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      m.plan.send[j].active = true;
      m.plan.send[j].view = BufferView::contiguous(data, bytes);
      m.plan.send[j].total = bytes;
    }
  } else {
    m.plan.recv[root].active = true;
    m.plan.recv[root].view = BufferView::contiguous(data, bytes);
    m.plan.recv[root].total = bytes;
  }
  // Only the edges to the root carry messages; members that are neither root nor peer of this rank on
  // a message still count the instance (run() does), which keeps their edge counters in step.
  m.run(group);
}

void World::send(const void* data, size_t bytes, int dst_rank) {
  GFDIT_CHECK(dst_rank >= 0 && dst_rank < impl_->size && dst_rank != impl_->rank)
      << "gfdit: send to rank " << dst_rank << " from rank " << impl_->rank << " in a world of " << impl_->size;
  int ranks[2] = {impl_->rank, dst_rank};
  Group g = Group::create(ranks, 2, impl_->size, impl_->rank);
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.call_mu);
  m.checkUsable();
  m.resetPlan(edge::opCode(kSendRecv, 0, 0), 2);
  m.plan.send[1].active = true;
  m.plan.send[1].view = BufferView::contiguous(const_cast<void*>(data), bytes);
  m.plan.send[1].total = bytes;
  m.run(g);
}

void World::recv(void* data, size_t bytes, int src_rank) {
  GFDIT_CHECK(src_rank >= 0 && src_rank < impl_->size && src_rank != impl_->rank)
      << "gfdit: recv from rank " << src_rank << " on rank " << impl_->rank << " in a world of " << impl_->size;
  int ranks[2] = {impl_->rank, src_rank};
  Group g = Group::create(ranks, 2, impl_->size, impl_->rank);
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.call_mu);
  m.checkUsable();
  m.resetPlan(edge::opCode(kSendRecv, 0, 0), 2);
  m.plan.recv[1].active = true;
  m.plan.recv[1].view = BufferView::contiguous(data, bytes);
  m.plan.recv[1].total = bytes;
  m.run(g);
}

void World::barrier(const Group& group) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.call_mu);
  m.checkUsable();
  checkMember(group, m.size, m.rank);
  int n = group.size(), me = group.selfIdx();
  if (n == 1) return;
  m.resetPlan(edge::opCode(kBarrier, 0, 0), n);
  m.plan.shared_send = true;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    m.plan.send[j].active = true;
    m.plan.recv[j].active = true;
  }
  m.run(group);
}

void World::putWithSignal(int peer, const void* src, size_t bytes, size_t remote_heap_offset) {
  Impl& m = *impl_;
  GFDIT_CHECK(peer >= 0 && peer < m.size && peer != m.rank) << "gfdit: put to rank " << peer;
  MappedRegion& r = m.regions[peer];
  GFDIT_CHECK(remote_heap_offset + bytes <= r.header->heap_bytes)
      << "gfdit: put of " << bytes << " bytes at heap offset " << remote_heap_offset << " overruns rank " << peer
      << "'s heap of " << r.header->heap_bytes << " bytes";
  std::lock_guard<std::mutex> lock(m.call_mu);
  m.checkUsable();
  m.copier.copy(r.heap + remote_heap_offset, src, bytes);
  // release: the bytes above are visible to whoever acquires the new count.
  edge::storeRelease(&r.in_edges[m.rank].put_signal, ++m.puts_sent[peer]);
  m.notify(peer);
}

void World::waitSignal(int peer, uint64_t count) {
  Impl& m = *impl_;
  GFDIT_CHECK(peer >= 0 && peer < m.size && peer != m.rank) << "gfdit: wait for puts from rank " << peer;
  std::lock_guard<std::mutex> lock(m.call_mu);
  m.checkUsable();
  uint64_t target = m.puts_seen[peer] + count;
  const uint64_t* word = &m.self->in_edges[peer].put_signal;
  auto start = Clock::now();
  auto last_liveness = start;
  while (true) {
    uint32_t bell = m.doorbell();
    if (edge::loadAcquire(word) >= target) break;
    auto now = Clock::now();
    if (now - start > m.options.timeout) {
      std::ostringstream os;
      os << "gfdit: timeout after " << std::chrono::duration<double>(now - start).count() << " s: rank " << m.rank
         << " waited for put " << target << " from rank " << peer << " on edge " << peer << "->" << m.rank
         << " (landed: " << edge::loadAcquire(word) << ")";
      m.fail(ErrorCode::kTimeout, os.str());
    }
    if (now - last_liveness > std::chrono::milliseconds(100)) {
      m.checkAbort();
      m.checkPeerFailed(peer, [&] {
        return "put " + std::to_string(target) + " from rank " + std::to_string(peer) + " on edge " +
               std::to_string(peer) + "->" + std::to_string(m.rank);
      });
      if (!processAlive(m.regions[peer].pid)) {
        m.fail(ErrorCode::kRemoteError, "gfdit: rank " + std::to_string(peer) + " (pid " +
                                            std::to_string(m.regions[peer].pid) + ") has died; rank " +
                                            std::to_string(m.rank) + " was waiting for its put on edge " +
                                            std::to_string(peer) + "->" + std::to_string(m.rank));
      }
      last_liveness = now;
    }
    m.waitDoorbell(bell, std::chrono::milliseconds(50));
  }
  m.puts_seen[peer] = target;
}

}  // namespace gfdit
