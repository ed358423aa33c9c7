#include "protocol.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "gfdit/settings.h"
#include "gfdit/types.h"
#include "reduce.h"

namespace gfdit {
namespace protocol {

using edge::InEdge;
using edge::MessageDesc;
using edge::RegionHeader;
using Clock = std::chrono::steady_clock;

namespace {

// How long a wait on remote peers alone reads their sockets at least before it blocks (see waitDoorbell).
constexpr std::chrono::microseconds kRemotePoll{200};

const char* kindName(uint32_t op) {
  switch (kindOf(op)) {
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

}  // namespace

std::string describeOp(uint32_t op) {
  std::ostringstream os;
  os << kindName(op) << "(" << dtypeName(static_cast<DType>((op >> 8) & 0xff));
  auto transport = static_cast<TransportKind>((op >> 24) & 0xff);
  if (transport != TransportKind::kCpu) os << ", " << transportKindName(transport);
  os << ")";
  return os.str();
}

core::SpinPolicy hostSpinPolicy(int world_size, int cores, int spin_us) {
  // A rank per core: spin up to 1 ms (a 256 KiB chunk from memory takes ~30 us to copy), adapted to the
  // host's load (NOTE [adaptive spin]). More ranks than cores: a spinning rank steals the core its peer
  // needs, so spin briefly and yield the core before blocking.
  using std::chrono::microseconds;
  bool own_core = world_size <= cores;
  bool fixed = spin_us >= 0 || settings::waitsFixed();
  if (spin_us < 0) spin_us = settings::spinUs(own_core);
  core::Backoff most{microseconds(spin_us), microseconds(settings::yieldUs(own_core))};
  if (fixed || !own_core) return core::SpinPolicy(most);
  return core::SpinPolicy(most, microseconds(settings::spinUs(false)));
}

HostRegion HostRegion::at(uint8_t* base) {
  HostRegion r;
  r.base = base;
  r.header = reinterpret_cast<RegionHeader*>(base);
  r.in_edges = reinterpret_cast<InEdge*>(base + r.header->in_edges_offset);
  r.out_edges = reinterpret_cast<edge::OutEdge*>(base + r.header->out_edges_offset);
  return r;
}

Engine::Engine(int rank, std::vector<HostRegion> regions, std::chrono::milliseconds timeout,
               const core::SpinPolicy& spin)
    : rank_(rank), regions_(std::move(regions)), timeout_(timeout), spin_(spin) {
  liveness_.resize(regions_.size());
}

void Engine::watchAbort(const uint64_t* word) {
  abort_word_ = word;
  abort_base_ = word != nullptr ? __atomic_load_n(word, __ATOMIC_ACQUIRE) : 0;
}

void Engine::checkAbort() {
  if (abort_word_ != nullptr && __atomic_load_n(abort_word_, __ATOMIC_ACQUIRE) != abort_base_) {
    fail(ErrorCode::kRemoteError, "gfdit: rank " + std::to_string(rank_) + ": collective aborted by the engine");
  }
}

void Engine::checkUsable() const {
  if (broken_) {
    throw Error(ErrorCode::kInvalidUsage,
                "gfdit: the world is unusable after an earlier error; destroy it and init again. The error was: " +
                    broken_reason_);
  }
}

// ---- waiting ----

void Engine::notify(int peer) {
  if (isRemote(peer)) return;  // its network thread rings its bell when the store lands (NOTE [network edges])
  RegionHeader* h = regions_[peer].header;
  core::ringBell(&h->doorbell, &h->num_waiters);
}

// Whether every other member of g is a remote peer (its messages come over the network alone).
bool Engine::onlyRemotePeers(const Group& g) const {
  if (remote_ == nullptr) return false;
  for (int j = 0; j < g.size(); ++j) {
    if (j != g.selfIdx() && !isRemote(g.rankAt(j))) return false;
  }
  return true;
}

void Engine::waitDoorbell(uint32_t seen, std::chrono::nanoseconds slice, bool remote_only) {
  RegionHeader* h = self().header;
  if (remote_ == nullptr) {
    if (core::waitBell(&h->doorbell, &h->num_waiters, seen, spin_, slice)) ++stats_.blocking_waits;
    return;
  }
  // With network edges the spin reads the sockets too (NOTE [network edges]): a message from another host then
  // lands on this thread instead of waking a connection's thread that wakes this one. The same budget as
  // core::waitBell (NOTE [adaptive spin]), observed once per wait that is not over at once; a wait on remote
  // peers alone goes on reading for kRemotePoll at least, yielding its core between reads (an answer from another
  // host takes a round trip of the network, tens of microseconds, and a blocked thread costs a wake-up more on
  // top of it). Then a wait on remote peers alone blocks on their sockets, so that the bytes wake this thread;
  // any other blocks on the doorbell, which the connections' threads ring for what they read.
  remote_->flush();  // what a remote peer may be waiting for goes before this rank waits
  for (uint64_t m = awaiting_acks_; m != 0; m &= m - 1) remote_->want(__builtin_ctzll(m));
  awaiting_acks_ = 0;
  struct Reading {  // a wait on remote peers alone: this thread reads their bytes, nobody else need wake for them
    RemoteEdges* edges;
    explicit Reading(RemoteEdges* e) : edges(e) {
      if (edges != nullptr) edges->reading(true);
    }
    ~Reading() {
      if (edges != nullptr) edges->reading(false);
    }
  } reading(remote_only ? remote_ : nullptr);
  auto start = Clock::now();
  core::Backoff backoff = spin_.current();
  bool observed = !spin_.adaptive();
  while (true) {
    if (core::readBell(&h->doorbell) != seen || remote_->poll()) return;
    auto now = Clock::now();
    if (!observed) {
      spin_.observe(core::preemptionsSinceLastLook(), now);
      backoff = spin_.current();
      observed = true;
    }
    const auto polling = remote_only ? std::max<Clock::duration>(backoff.spin + backoff.yield, kRemotePoll)
                                     : Clock::duration(backoff.spin + backoff.yield);
    if (now - start >= polling) break;
    if (now - start >= backoff.spin) sched_yield();
  }
  ++stats_.blocking_waits;
  const auto left = slice - (Clock::now() - start);
  if (remote_only && remote_->wait(&h->doorbell, seen, left)) return;
  core::blockOnBell(&h->doorbell, &h->num_waiters, seen, left);
}

void Engine::fail(ErrorCode code, const std::string& message) {
  broken_ = true;
  broken_reason_ = message;
  broadcastFailure(message);
  if (on_failure_) {
    try {
      on_failure_();
    } catch (...) {  // the first error is the one to report
    }
  }
  throw Error(code, message);
}

// see NOTE [failure broadcast]: the reason first, then the flag (release), then every peer's doorbell.
void Engine::broadcastFailure(const std::string& message) {
  RegionHeader* h = self().header;
  if (edge::loadAcquire(&h->failed) != 0) return;  // the first reason stays
  size_t len = std::min(message.size(), edge::kFailReasonBytes - 1);
  std::memcpy(h->fail_reason, message.data(), len);
  h->fail_reason[len] = '\0';
  edge::storeRelease(&h->failed, 1);
  for (int p = 0; p < size(); ++p) {
    if (p != rank_) notify(p);
  }
  if (remote_ != nullptr) remote_->broadcastFailure(message);
}

// The reason a peer's world broke, or "" while it is fine (acquire: the reason was written before).
std::string Engine::peerFailure(int peer) const {
  const RegionHeader* h = regions_[peer].header;
  if (edge::loadAcquire(&h->failed) == 0) return "";
  char buf[edge::kFailReasonBytes];
  std::memcpy(buf, h->fail_reason, sizeof(buf));
  buf[sizeof(buf) - 1] = '\0';
  return buf;
}

// A peer that failed (NOTE [failure broadcast]) or died (NOTE [liveness]) ends the wait.
template <typename Describe>
void Engine::checkPeer(int peer, Clock::time_point now, Describe waiting_for) {
  std::string why = peerFailure(peer);
  if (!why.empty()) {
    std::ostringstream os;
    os << "gfdit: rank " << peer << " failed, so rank " << rank_ << " stops waiting for " << waiting_for() << "; rank "
       << peer << "'s error: " << why;
    fail(ErrorCode::kRemoteError, os.str());
  }
  core::PeerLiveness& l = liveness_[peer];
  if (!l.alive(now)) {
    std::ostringstream os;
    os << "gfdit: rank " << peer;
    if (static_cast<size_t>(peer) < hosts_.size()) os << " on " << hosts_[peer];
    os << " (pid " << l.pid() << ") has died (" << l.reason() << "); rank " << rank_ << " was waiting for "
       << waiting_for();
    fail(ErrorCode::kRemoteError, os.str());
  }
}

void Engine::checkPeersAlive(const Group& g) {
  auto now = Clock::now();
  for (int j = 0; j < g.size(); ++j) {
    int peer = g.rankAt(j);
    if (peer != rank_) checkPeer(peer, now, [&] { return stuckOn(g); });
  }
}

// Names the first edge this rank is stuck on.
std::string Engine::stuckOn(const Group& g) const {
  const Plan& plan = plan_;
  int n = g.size(), me = g.selfIdx();
  std::ostringstream os;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    int peer = g.rankAt(j);
    const RecvState& r = plan.recv[j];
    bool waiting_recv = plan.reduce ? !r.has_msg && (plan.reduce_done < plan.reduce_total || r.num_consumed == 0)
                                    : r.active && !recvDone(r);
    if (waiting_recv) {
      os << "a message from rank " << peer << " on edge " << peer << "->" << rank_ << " (" << describeOp(plan.op)
         << " instance " << instance_[peer] << ", message " << recv_seq_[peer] + 1 << ")";
      return os.str();
    }
  }
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    int peer = g.rankAt(j);
    uint64_t acked = edge::loadAcquire(&self().out_edges[peer].ack);
    if (acked < send_seq_[peer]) {
      os << "rank " << peer << " to acknowledge message " << send_seq_[peer] << " on edge " << rank_ << "->" << peer
         << " (" << describeOp(plan.op) << " instance " << instance_[peer] << ", acknowledged " << acked << ")";
      return os.str();
    }
  }
  return "peers of group " + g.toString();
}

void Engine::failTimeout(const Group& g, Clock::duration waited) {
  std::ostringstream os;
  os << "gfdit: timeout after " << std::chrono::duration<double>(waited).count() << " s: rank " << rank_
     << " waited for " << stuckOn(g);
  fail(ErrorCode::kTimeout, os.str());
}

// ---- staging ring ----

StagingRing& Engine::ring() { return rings_[static_cast<size_t>(plan_.transport->kind())]; }

bool Engine::slotFree(size_t k) {
  StagingRing& r = ring();
  uint64_t mask = r.peers[k];
  bool free = true;
  while (mask != 0) {
    int peer = __builtin_ctzll(mask);
    mask &= mask - 1;
    if (edge::loadAcquire(&self().out_edges[peer].ack) < r.need[k * kMaxRanks + peer]) {
      awaitAck(peer);
      free = false;
    }
  }
  return free;
}

// This rank cannot go on before `peer` acknowledges: a remote peer is asked for it before this rank waits (NOTE
// [network edges]: it may hold its acknowledgements back until then).
void Engine::awaitAck(int peer) {
  if (isRemote(peer)) awaiting_acks_ |= uint64_t{1} << peer;
}

// The next slot of the ring if it is free, else -1. Slots are taken in FIFO order. A slot's earlier receivers
// have all acknowledged on the host; which messages they were stays recorded (priorUses) until the slot is
// written again, so that a device transport can also wait for their device-side reads (NOTE [transports]).
long Engine::tryTakeSlot() {
  StagingRing& r = ring();
  size_t k = r.next % plan_.transport->numSlots();
  if (r.peers[k] != 0 && !slotFree(k)) return -1;
  ++r.next;
  return static_cast<long>(k);
}

int Engine::priorUses(size_t k, SlotUse* out) {
  StagingRing& r = ring();
  int num = 0;
  uint64_t mask = r.peers[k];
  while (mask != 0) {
    int peer = __builtin_ctzll(mask);
    mask &= mask - 1;
    out[num++] = SlotUse{peer, r.need[k * kMaxRanks + peer]};
  }
  r.peers[k] = 0;
  return num;
}

void Engine::recordSlotUse(size_t k, int peer, uint64_t seq) {
  StagingRing& r = ring();
  r.need[k * kMaxRanks + peer] = seq;
  r.peers[k] |= uint64_t{1} << peer;
}

// ---- messages ----

bool Engine::descRoom(int peer) {
  uint64_t seq = send_seq_[peer] + 1;
  if (seq <= 2 || edge::loadAcquire(&self().out_edges[peer].ack) >= seq - 2) return true;
  awaitAck(peer);
  return false;
}

uint64_t Engine::publish(int peer, const MessageDesc& desc) {
  uint64_t seq = ++send_seq_[peer];
  if (isRemote(peer)) {  // the bytes the peer will read, then the descriptor and the signal (NOTE [network edges])
    size_t span = desc.rows == 0 ? desc.bytes : (desc.rows - 1) * desc.stride + desc.row_bytes;
    plan_.transport->publish(peer, seq);
    remote_->publish(peer, seq, desc, self().base + desc.region_offset, span);
    ++stats_.messages_sent;
    return seq;
  }
  InEdge& e = regions_[peer].in_edges[rank_];
  e.desc[seq % 2] = desc;
  // The transport first: a device transport enqueues "bytes complete" before the peer can learn of them.
  plan_.transport->publish(peer, seq);
  edge::storeRelease(&e.signal, seq);  // release: the descriptor and the staged bytes before it
  notify(peer);
  ++stats_.messages_sent;
  return seq;
}

MessageDesc Engine::baseDesc(int peer, const SendState& s) const {
  MessageDesc d{};
  d.instance = instance_[peer];
  d.op = plan_.op;
  d.tag = message_tag_.load(std::memory_order_relaxed);
  d.total_bytes = s.total;
  return d;
}

bool Engine::viewInHeap(const BufferView& v) const {
  if (v.bytes() == 0) return false;
  size_t extent = (v.rows - 1) * v.stride + v.row_bytes;
  return plan_.transport->inHeap(v.ptr, extent);
}

// Publishes the next message of peer member j if the edge and the ring allow. Returns whether it did.
bool Engine::publishOne(int j, int peer) {
  SendState& s = plan_.send[j];
  Transport& t = *plan_.transport;
  if (sendDone(s) || !descRoom(peer)) return false;
  MessageDesc d = baseDesc(peer, s);
  if (s.zero_copy) {
    // The peer reads straight from the heap; the collective waits for its ack before returning.
    d.flags = edge::kFlagZeroCopy;
    d.bytes = s.total;
    d.region_offset = static_cast<uint64_t>(static_cast<uint8_t*>(s.view.ptr) - t.base());
    if (!s.view.isContiguous()) {
      d.rows = static_cast<uint32_t>(s.view.rows);
      d.row_bytes = s.view.row_bytes;
      d.stride = s.view.stride;
    }
    s.last_seq = publish(peer, d);
    s.published = s.total;
    ++stats_.zero_copy_sends;
  } else {
    size_t chunk = std::min<uint64_t>(t.slotBytes(), s.total - s.published);
    if (chunk > 0) {
      long k = tryTakeSlot();
      if (k < 0) return false;
      SlotUse prior[kMaxRanks];
      int num_prior = priorUses(static_cast<size_t>(k), prior);
      uint8_t* slot = t.slot(static_cast<size_t>(k));
      t.stage(slot, s.view, s.published, chunk, prior, num_prior);
      stats_.staged_bytes += chunk;
      d.region_offset = static_cast<uint64_t>(slot - t.base());
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
//
// NOTE [staging rounds]
// A reduction consumes round k only once every member's round-k message has arrived, so a rank whose ring
// filled up with round k + 1 messages while round k was still unsent to some peer could wait forever on
// slots its peers cannot release. Sending in rounds, with at least world_size - 1 slots, means the slowest
// rank only ever waits on slots of earlier rounds, which every receiver can finish.
bool Engine::progressSends(const Group& g) {
  int n = g.size(), me = g.selfIdx();
  bool moved = false;
  while (true) {
    uint64_t round = UINT64_MAX;
    for (int j = 0; j < n; ++j) {
      const SendState& s = plan_.send[j];
      if (j != me && s.active && !sendDone(s)) round = std::min(round, s.num_published);
    }
    if (round == UINT64_MAX) return moved;
    bool any = false;
    for (int step = 1; step < n; ++step) {  // start after ourselves so ranks spread over peers
      int j = (me + step) % n;
      SendState& s = plan_.send[j];
      if (s.active && !sendDone(s) && s.num_published == round) any |= publishOne(j, g.rankAt(j));
    }
    if (!any) return moved;
    moved = true;
  }
}

// Shared send: one staged copy of each chunk, published to every peer. Its progress lives in the state of the
// first member that is not this rank; the other members' states only keep the sequence number of their last
// message (for zero-copy acks).
bool Engine::progressSharedSend(const Group& g) {
  int n = g.size(), me = g.selfIdx();
  Transport& t = *plan_.transport;
  SendState& s0 = plan_.send[sharedIdx(me)];
  bool moved = false;
  while (!sendDone(s0)) {
    for (int j = 0; j < n; ++j) {
      if (j != me && !descRoom(g.rankAt(j))) return moved;
    }
    MessageDesc d{};
    d.op = plan_.op;
    d.tag = message_tag_.load(std::memory_order_relaxed);
    d.total_bytes = s0.total;
    long k = -1;
    size_t chunk = 0;
    if (s0.zero_copy) {
      d.flags = edge::kFlagZeroCopy;
      d.bytes = s0.total;
      d.region_offset = static_cast<uint64_t>(static_cast<uint8_t*>(s0.view.ptr) - t.base());
      if (!s0.view.isContiguous()) {
        d.rows = static_cast<uint32_t>(s0.view.rows);
        d.row_bytes = s0.view.row_bytes;
        d.stride = s0.view.stride;
      }
      chunk = s0.total - s0.published;
      stats_.zero_copy_sends += n - 1;
    } else {
      chunk = std::min<uint64_t>(t.slotBytes(), s0.total - s0.published);
      if (chunk > 0) {
        k = tryTakeSlot();
        if (k < 0) return moved;
        SlotUse prior[kMaxRanks];
        int num_prior = priorUses(static_cast<size_t>(k), prior);
        uint8_t* slot = t.slot(static_cast<size_t>(k));
        t.stage(slot, s0.view, s0.published, chunk, prior, num_prior);
        stats_.staged_bytes += chunk;
        d.region_offset = static_cast<uint64_t>(slot - t.base());
      }
      d.stream_offset = s0.published;
      d.bytes = chunk;
    }
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      int peer = g.rankAt(j);
      d.instance = instance_[peer];
      uint64_t seq = publish(peer, d);
      plan_.send[j].last_seq = seq;
      if (k >= 0) recordSlotUse(static_cast<size_t>(k), peer, seq);
    }
    s0.published += chunk;
    ++s0.num_published;
    moved = true;
  }
  return moved;
}

// Checks a received descriptor against what this rank expects; a mismatch is the peer disagreeing.
void Engine::validate(int peer, const MessageDesc& d, const RecvState& r, uint64_t seq) {
  uint32_t tag = message_tag_.load(std::memory_order_relaxed);
  if (d.tag != tag) {  // see NOTE [message tags]
    std::ostringstream os;
    os << "gfdit: message tag mismatch on edge " << peer << "->" << rank_ << " (message " << seq << "): rank " << peer
       << " sent tag 0x" << std::hex << d.tag << std::dec << " in instance " << d.instance << " " << describeOp(d.op)
       << ", but rank " << rank_ << " expects tag 0x" << std::hex << tag << std::dec << " in instance "
       << instance_[peer] << " " << describeOp(plan_.op);
    fail(ErrorCode::kRemoteError, os.str());
  }
  if (d.instance != instance_[peer] || d.op != plan_.op || d.total_bytes != r.total) {
    std::ostringstream os;
    os << "gfdit: collective mismatch on edge " << peer << "->" << rank_ << " (message " << seq << "): rank " << peer
       << " is in instance " << d.instance << " " << describeOp(d.op) << " with " << d.total_bytes << " bytes for rank "
       << rank_ << ", but rank " << rank_ << " is in instance " << instance_[peer] << " " << describeOp(plan_.op)
       << " expecting " << r.total << " bytes from rank " << peer;
    fail(ErrorCode::kRemoteError, os.str());
  }
}

BufferView Engine::sourceView(int peer, const MessageDesc& d) const {
  uint8_t* p = plan_.transport->peerBase(peer) + d.region_offset;
  if (d.rows == 0) {
    bool zc = (d.flags & edge::kFlagZeroCopy) != 0;
    return BufferView::contiguous(p, zc ? d.total_bytes : d.bytes);
  }
  return BufferView::strided(p, d.rows, d.row_bytes, d.stride);
}

void Engine::ack(int peer, uint64_t seq, bool zero_copy) {
  if (isRemote(peer)) {  // the peer's bytes were copied here before its signal: nothing of it is read after
    remote_->ack(peer, seq, zero_copy);  // a zero-copy sender waits for it; others learn it with the next frame
    return;
  }
  // release: our reads of the peer's bytes are done (or, on a device transport, enqueued behind a device-side
  // wait) before the peer may overwrite them.
  edge::storeRelease(&regions_[peer].out_edges[rank_].ack, seq);
  notify(peer);
}

// Copies whatever peer member j has published. Returns whether anything moved.
bool Engine::progressRecv(int j, int peer) {
  RecvState& r = plan_.recv[j];
  bool moved = false;
  InEdge& e = self().in_edges[peer];
  while (!recvDone(r)) {
    uint64_t seq = recv_seq_[peer] + 1;
    if (edge::loadAcquire(&e.signal) < seq) break;
    MessageDesc d = e.desc[seq % 2];
    validate(peer, d, r, seq);
    if (d.stream_offset != r.consumed) {
      fail(ErrorCode::kInternal,
           "gfdit: message out of order on edge " + std::to_string(peer) + "->" + std::to_string(rank_));
    }
    bool zc = (d.flags & edge::kFlagZeroCopy) != 0;
    plan_.transport->consume(r.view, d.stream_offset, sourceView(peer, d), zc ? d.stream_offset : 0, d.bytes, peer,
                             seq);
    r.consumed += d.bytes;
    ++r.num_consumed;
    recv_seq_[peer] = seq;
    ack(peer, seq, zc);
    moved = true;
  }
  return moved;
}

// Reduces the next rounds whose contributions have all arrived, in member order.
bool Engine::progressReduce(const Group& g) {
  Plan& plan = plan_;
  Transport& t = *plan.transport;
  int n = g.size(), me = g.selfIdx();
  size_t esize = dtypeSize(plan.dtype);
  size_t round_bytes = t.slotBytes();  // staged messages are exactly one slot: rounds line up with them
  bool moved = false;
  while (plan.reduce_done < plan.reduce_total || (plan.reduce_total == 0 && !reduceEmptyDone(g))) {
    uint64_t a = plan.reduce_done;
    uint64_t b = std::min<uint64_t>(a + round_bytes, plan.reduce_total);
    // Every peer's message covering [a, b) must be here.
    SlotUse arrivals[kMaxRanks];
    int num_arrivals = 0;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      int peer = g.rankAt(j);
      RecvState& r = plan.recv[j];
      if (!r.has_msg) {
        uint64_t seq = recv_seq_[peer] + 1;
        if (edge::loadAcquire(&self().in_edges[peer].signal) < seq) return moved;
        r.msg = self().in_edges[peer].desc[seq % 2];
        validate(peer, r.msg, r, seq);
        r.msg_seq = seq;
        r.has_msg = true;
        recv_seq_[peer] = seq;
      }
      if (r.msg.stream_offset > a || r.msg.stream_offset + r.msg.bytes < b) {
        fail(ErrorCode::kInternal, "gfdit: reduction message does not cover its round on edge " + std::to_string(peer) +
                                       "->" + std::to_string(rank_));
      }
      arrivals[num_arrivals++] = SlotUse{peer, r.msg_seq};
    }
    size_t count = (b - a) / esize;
    const uint8_t* contribs[kMaxRanks];
    for (int j = 0; j < n; ++j) {
      if (j == me) {
        contribs[j] = plan.own_contrib + a;
        continue;
      }
      const RecvState& r = plan.recv[j];
      bool zc = (r.msg.flags & edge::kFlagZeroCopy) != 0;
      contribs[j] = t.peerBase(g.rankAt(j)) + r.msg.region_offset + (zc ? a : a - r.msg.stream_offset);
    }
    // Member order through the accumulator when every rank reduces the same data (the bits must agree) or the
    // type accumulates wider (float32 for 16-bit floats); else straight into the output starting from our own
    // block (in place: it is there already), since only this rank computes this block.
    bool acc = plan.ordered_reduce || reduce::accElemSize(plan.dtype) != esize;
    t.reduce(plan.reduce_out + a, contribs, n, acc ? 0 : me, count, plan.dtype, plan.reduce_op, acc, arrivals,
             num_arrivals);
    plan.reduce_done = b;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      RecvState& r = plan.recv[j];
      if (r.msg.stream_offset + r.msg.bytes <= b) {
        r.has_msg = false;
        r.consumed = r.msg.stream_offset + r.msg.bytes;
        ++r.num_consumed;
        t.consumed(g.rankAt(j), r.msg_seq);
        ack(g.rankAt(j), r.msg_seq, (r.msg.flags & edge::kFlagZeroCopy) != 0);
      }
    }
    moved = true;
    if (plan.reduce_total == 0) break;
  }
  return moved;
}

bool Engine::reduceEmptyDone(const Group& g) const {
  for (int j = 0; j < g.size(); ++j) {
    if (j != g.selfIdx() && plan_.recv[j].num_consumed == 0) return false;
  }
  return true;
}

bool Engine::zeroCopyAcked(const Group& g) const {
  int n = g.size(), me = g.selfIdx();
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    const SendState& s = plan_.send[plan_.shared_send ? sharedIdx(me) : j];
    if (!s.active) continue;
    if (s.zero_copy && edge::loadAcquire(&self().out_edges[g.rankAt(j)].ack) < plan_.send[j].last_seq) return false;
  }
  return true;
}

// ---- a collective ----

Plan& Engine::start(Kind kind, int n, Transport& t, void* stream, DType dtype, ReduceOp op) {
  Plan& plan = plan_;
  plan.op = opCode(kind, t.kind(), dtype, op);
  plan.transport = &t;
  plan.shared_send = false;
  plan.reduce = false;
  plan.ordered_reduce = false;
  plan.dtype = dtype;
  plan.reduce_op = op;
  plan.reduce_done = plan.reduce_total = 0;
  for (int j = 0; j < n; ++j) {
    plan.send[j] = SendState{};
    plan.recv[j] = RecvState{};
  }
  StagingRing& r = ring();
  if (r.peers.size() != t.numSlots()) r.reset(t.numSlots());
  t.begin(stream);
  return plan;
}

void Engine::finish() {
  if (plan_.transport == nullptr) return;
  Transport* t = plan_.transport;
  plan_.transport = nullptr;
  try {
    t->end();
  } catch (const Error& e) {
    if (!broken_) fail(e.code(), e.what());
    throw;
  }
}

void Engine::abandon() noexcept {
  try {
    finish();
  } catch (const std::exception& e) {
    // Unwinding from another error (or a collective that ran no messages): the first error is the one the caller
    // sees; this one breaks the world so that the next call reports it instead of running on a transport in an
    // unknown state.
    breakQuietly(std::string("gfdit: ending a collective failed: ") + e.what());
  }
}

void Engine::breakQuietly(const std::string& message) noexcept {
  if (broken_) return;
  try {
    broken_reason_ = message;
    broken_ = true;
    broadcastFailure(message);
  } catch (...) {
    broken_ = true;
  }
}

void Engine::run(const Group& g) {
  checkAbort();
  // From here on the edge counters move: whatever fails (a transport refusing a copy, a device launch, memory)
  // leaves this rank out of step with its peers, so it breaks the world and tells them instead of letting them
  // wait out their timeout.
  try {
    runPlan(g);
  } catch (const Error& e) {
    if (!broken_) fail(e.code(), e.what());
    throw;
  } catch (const std::exception& e) {
    if (!broken_) fail(ErrorCode::kSystemError, std::string("gfdit: ") + e.what());
    throw;
  }
}

void Engine::runPlan(const Group& g) {
  Plan& plan = plan_;
  int n = g.size(), me = g.selfIdx();
  ++stats_.collectives;
  if (kindOf(plan.op) == kAllGather) ++stats_.all_gathers;
  for (int j = 0; j < n; ++j) {
    if (j != me) ++instance_[g.rankAt(j)];
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
  const bool remote_only = onlyRemotePeers(g);
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
    if (done) break;
    auto now = Clock::now();
    if (moved) {
      last_progress = now;
      continue;
    }
    if (now - last_progress > timeout_) failTimeout(g, now - last_progress);
    if (now - last_liveness > core::kPeerCheckPeriod) {
      checkAbort();
      checkPeersAlive(g);
      last_liveness = now;
    }
    plan.transport->flush();  // nothing held back while this rank sleeps (a peer's device may wait for it)
    waitDoorbell(bell, std::chrono::milliseconds(50), remote_only);
  }
  // Zero-copy sends: the peers acknowledged on the host; a device transport also waits for their reads.
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    const SendState& s = plan.send[plan.shared_send ? sharedIdx(me) : j];
    if (s.active && s.zero_copy) plan.transport->awaitConsumed(g.rankAt(j), plan.send[j].last_seq);
  }
}

// ---- one-sided ----

void Engine::putWithSignal(int peer, uint8_t* dst, const void* src, size_t bytes, const CopySelector& copier) {
  copier.copy(dst, src, bytes);
  // release: the bytes above are visible to whoever acquires the new count.
  edge::storeRelease(&regions_[peer].in_edges[rank_].put_signal, ++puts_sent_[peer]);
  notify(peer);
}

void Engine::putRemote(int peer, uint64_t heap_offset, const void* src, size_t bytes) {
  GFDIT_CHECK_CODE(kInternal, isRemote(peer)) << "putRemote to rank " << peer << ", which is in shared memory";
  remote_->put(peer, heap_offset, src, bytes, ++puts_sent_[peer]);
}

void Engine::waitSignal(int peer, uint64_t count) {
  uint64_t target = puts_seen_[peer] + count;
  const uint64_t* word = &self().in_edges[peer].put_signal;
  auto start = Clock::now();
  auto last_liveness = start;
  while (true) {
    uint32_t bell = doorbell();
    if (edge::loadAcquire(word) >= target) break;
    auto now = Clock::now();
    auto waiting_for = [&] {
      std::ostringstream os;
      os << "put " << target << " from rank " << peer << " on edge " << peer << "->" << rank_
         << " (landed: " << edge::loadAcquire(word) << ")";
      return os.str();
    };
    if (now - start > timeout_) {
      std::ostringstream os;
      os << "gfdit: timeout after " << std::chrono::duration<double>(now - start).count() << " s: rank " << rank_
         << " waited for " << waiting_for();
      fail(ErrorCode::kTimeout, os.str());
    }
    if (now - last_liveness > core::kPeerCheckPeriod) {
      checkAbort();
      checkPeer(peer, now, waiting_for);
      last_liveness = now;
    }
    waitDoorbell(bell, std::chrono::milliseconds(50), isRemote(peer));
  }
  puts_seen_[peer] = target;
}

}  // namespace protocol
}  // namespace gfdit
