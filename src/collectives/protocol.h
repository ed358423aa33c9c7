// The protocol engine of the group-free collectives: edge sequence numbers, descriptor slots, staging rounds,
// reductions in member order, bounded waits, failure detection. It decides what moves and in which order;
// the bytes move through a Transport (NOTE [transports] in transport.h). The protocol's words (signals,
// acks, descriptors, doorbell, heartbeat) always live in the ranks' host regions (edge.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "doorbell.h"
#include "edge.h"
#include "gfdit/error.h"
#include "gfdit/group.h"
#include "gfdit/world.h"
#include "liveness.h"
#include "transport.h"

namespace gfdit {
namespace protocol {

/// Collective kinds carried in MessageDesc::op, so a receiver notices a peer that runs another one.
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

/// The op code of a message: collective kind, transport kind, dtype, reduce op (see edge::opCode).
inline uint32_t opCode(Kind kind, TransportKind transport, DType dtype = DType::kFloat32,
                       ReduceOp op = ReduceOp::kSum) {
  return edge::opCode(static_cast<uint32_t>(kind) | static_cast<uint32_t>(transport) << 8, static_cast<uint32_t>(dtype),
                      static_cast<uint32_t>(op));
}
inline Kind kindOf(uint32_t op) { return static_cast<Kind>((op >> 16) & 0xff); }

/// "all_gather(float32, cuda)".
std::string describeOp(uint32_t op);

/// What the engine writes into the regions of peers it cannot map (ranks of other hosts): those stores, and the
/// bytes such a peer reads, travel over the network instead (NOTE [network edges] in net_edges.h). Every call is
/// bounded by the world's timeout and throws naming the edge.
class RemoteEdges {
 public:
  virtual ~RemoteEdges() = default;
  /// Whether `peer`'s region here is a mirror (a remote peer).
  virtual bool remote(int peer) const = 0;
  /// Message `seq` to `peer`: its descriptor and the `span` bytes it describes, at `bytes` in this rank's region.
  virtual void publish(int peer, uint64_t seq, const edge::MessageDesc& desc, const uint8_t* bytes, size_t span) = 0;
  /// This rank consumed message `seq` from `peer`: the peer learns it with the next frame to it, before this rank
  /// waits (flush), or at once with `now` (the peer waits for it to finish: a zero-copy message).
  virtual void ack(int peer, uint64_t seq, bool now) = 0;
  /// Sends what was held back (acknowledgements) at once.
  virtual void flush() {}
  /// This rank waits for `peer`'s acknowledgement: the peer sends what it holds back, and from now on at once.
  virtual void want(int peer) { (void)peer; }
  /// `bytes` of src into `peer`'s heap at `heap_offset`, then its count of puts from this rank = `count`.
  virtual void put(int peer, uint64_t heap_offset, const void* src, size_t bytes, uint64_t count) = 0;
  /// This rank's world broke (NOTE [failure broadcast]): the reason to every remote peer.
  virtual void broadcastFailure(const std::string& reason) = 0;
  /// Applies what remote peers sent that has arrived, without blocking, on the calling thread (a waiting rank
  /// reads its edges itself); whether anything landed (its doorbell rang too).
  virtual bool poll() { return false; }
  /// The calling thread reads the remote edges itself (poll, wait) from now on (true), or no longer (false): a
  /// wait on remote peers alone, during which nobody else needs to be woken by their bytes.
  virtual void reading(bool on) { (void)on; }
  /// Blocks until bytes from a remote peer arrive (applied on the calling thread), `*bell` differs from `seen`,
  /// or `timeout` passed. For a wait on remote peers alone; false where it cannot wait so (another thread is
  /// reading a connection): the caller blocks on its doorbell instead.
  virtual bool wait(const uint32_t* bell, uint32_t seen, std::chrono::nanoseconds timeout) {
    (void)bell;
    (void)seen;
    (void)timeout;
    return false;
  }
  virtual void setTimeout(std::chrono::milliseconds) {}
};

/// One rank's host region as mapped here: where the protocol's words are.
struct HostRegion {
  uint8_t* base = nullptr;
  edge::RegionHeader* header = nullptr;
  edge::InEdge* in_edges = nullptr;
  edge::OutEdge* out_edges = nullptr;
  /// Binds the pointers from the header at `base`.
  static HostRegion at(uint8_t* base);
};

/// Per-peer state of the collective being run.
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
  edge::MessageDesc msg{};
  uint64_t msg_seq = 0;
};

/// What one collective instance moves. Indexed by group member.
struct Plan {
  uint32_t op = 0;
  Transport* transport = nullptr;
  bool shared_send = false;  // send[j] are all the same bytes: stage once, publish to all
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

/// The outbound staging ring of one transport: slot k may be rewritten once every peer that was sent from
/// it acknowledged the recorded message (need[k * kMaxRanks + peer]; 0 = nothing outstanding).
struct StagingRing {
  uint64_t next = 0;
  std::vector<uint64_t> need;
  std::vector<uint64_t> peers;  // bitmask of peers with something outstanding, per slot
  void reset(size_t num_slots) {
    next = 0;
    need.assign(num_slots * kMaxRanks, 0);
    peers.assign(num_slots, 0);
  }
};

/// How the waits of a host world of `world_size` ranks spin, on a host whose process may use `cores` cores,
/// given WorldOptions::spin_us (negative: automatic) and GFDIT_SPIN_US / GFDIT_YIELD_US (NOTE [adaptive
/// spin]): adaptive between 2 us and 1 ms, without yielding, where every rank has a core; fixed otherwise.
core::SpinPolicy hostSpinPolicy(int world_size, int cores, int spin_us);

/// The engine. One collective at a time (callers hold mutex()).
class Engine {
 public:
  Engine(int rank, std::vector<HostRegion> regions, std::chrono::milliseconds timeout, const core::SpinPolicy& spin);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(regions_.size()); }
  std::mutex& mutex() { return call_mu_; }
  const HostRegion& region(int r) const { return regions_[r]; }
  const HostRegion& self() const { return regions_[rank_]; }

  void setTimeout(std::chrono::milliseconds t) { timeout_ = t; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void setMessageTag(uint32_t tag) { message_tag_.store(tag, std::memory_order_relaxed); }
  uint32_t messageTag() const { return message_tag_.load(std::memory_order_relaxed); }
  void watchAbort(const uint64_t* word);
  /// How peers' liveness is judged (NOTE [liveness]); one entry per rank (own ignored).
  void setLiveness(std::vector<core::PeerLiveness> peers) { liveness_ = std::move(peers); }
  /// Every rank's host (World::hostOf), named when a peer dies; empty: hosts are not named.
  void setHosts(std::vector<std::string> hosts) { hosts_ = std::move(hosts); }
  WorldStats stats() const { return stats_; }
  bool usable() const { return !broken_; }
  /// Throws InvalidUsage naming the earlier error when the world broke.
  void checkUsable() const;
  /// Breaks the world: records the reason, tells the peers (NOTE [failure broadcast]) and throws.
  [[noreturn]] void fail(ErrorCode code, const std::string& message);
  /// Throws if the runtime asked the collectives to abort.
  void checkAbort();
  /// Runs when the world breaks, before the error is thrown (a device transport stops its pending work).
  void setOnFailure(std::function<void()> f) { on_failure_ = std::move(f); }
  /// The edges to remote peers (owned by the world; nullptr: every peer in shared memory).
  void setRemote(RemoteEdges* remote) { remote_ = remote; }
  bool isRemote(int peer) const { return remote_ != nullptr && remote_->remote(peer); }

  /// Starts a collective of `kind` on a group of n on transport t (begun on `stream`): the plan to fill.
  Plan& start(Kind kind, int n, Transport& t, void* stream, DType dtype = DType::kFloat32,
              ReduceOp op = ReduceOp::kSum);
  /// Runs the started plan to completion: every send published (zero-copy ones read), every receive
  /// consumed. Waits only when nothing can move; see NOTE [doorbell].
  void run(const Group& g);
  /// Ends the started collective on its transport; what the transport reports breaks the world and is thrown.
  void finish();
  /// Ends the started collective if run did not (an error, or no messages), without throwing: what ending it
  /// reports breaks the world instead (the next call names it).
  void abandon() noexcept;

  // ---- one-sided (host transport) ----
  void putWithSignal(int peer, uint8_t* dst, const void* src, size_t bytes, const CopySelector& copier);
  /// A put to a remote peer's heap (NOTE [network edges]).
  void putRemote(int peer, uint64_t heap_offset, const void* src, size_t bytes);
  void waitSignal(int peer, uint64_t count);

 private:
  // waiting
  void notify(int peer);
  uint32_t doorbell() const { return core::readBell(&self().header->doorbell); }
  void waitDoorbell(uint32_t seen, std::chrono::nanoseconds slice, bool remote_only = false);
  bool onlyRemotePeers(const Group& g) const;
  void broadcastFailure(const std::string& message);
  void breakQuietly(const std::string& message) noexcept;
  void runPlan(const Group& g);
  std::string peerFailure(int peer) const;
  template <typename Describe>
  void checkPeer(int peer, std::chrono::steady_clock::time_point now, Describe waiting_for);
  void checkPeersAlive(const Group& g);
  [[noreturn]] void failTimeout(const Group& g, std::chrono::steady_clock::duration waited);
  std::string stuckOn(const Group& g) const;

  // staging ring of the plan's transport
  StagingRing& ring();
  bool slotFree(size_t k);
  long tryTakeSlot();
  void recordSlotUse(size_t k, int peer, uint64_t seq);
  int priorUses(size_t k, SlotUse* out);

  // messages
  bool descRoom(int peer);
  void awaitAck(int peer);
  uint64_t publish(int peer, const edge::MessageDesc& desc);
  edge::MessageDesc baseDesc(int peer, const SendState& s) const;
  bool viewInHeap(const BufferView& v) const;
  static bool sendDone(const SendState& s) { return s.num_published > 0 && s.published == s.total; }
  static bool recvDone(const RecvState& r) { return r.num_consumed > 0 && r.consumed == r.total; }
  static int sharedIdx(int me) { return me == 0 ? 1 : 0; }
  bool publishOne(int j, int peer);
  bool progressSends(const Group& g);
  bool progressSharedSend(const Group& g);
  void validate(int peer, const edge::MessageDesc& d, const RecvState& r, uint64_t seq);
  BufferView sourceView(int peer, const edge::MessageDesc& d) const;
  void ack(int peer, uint64_t seq, bool zero_copy);
  bool progressRecv(int j, int peer);
  bool progressReduce(const Group& g);
  bool reduceEmptyDone(const Group& g) const;
  bool zeroCopyAcked(const Group& g) const;

  int rank_;
  std::vector<HostRegion> regions_;
  std::chrono::milliseconds timeout_;
  core::SpinPolicy spin_;
  std::vector<core::PeerLiveness> liveness_;
  std::vector<std::string> hosts_;

  // Edge counters, indexed by peer rank. See NOTE [edge sequence numbers].
  uint64_t send_seq_[kMaxRanks] = {};
  uint64_t recv_seq_[kMaxRanks] = {};
  uint64_t instance_[kMaxRanks] = {};
  uint64_t puts_sent_[kMaxRanks] = {};
  uint64_t puts_seen_[kMaxRanks] = {};
  StagingRing rings_[2];  // by TransportKind

  Plan plan_;
  std::mutex call_mu_;
  std::atomic<bool> broken_{false};  // read by usable() without the call lock
  std::string broken_reason_;
  std::atomic<uint32_t> message_tag_{0};  // see NOTE [message tags]
  const uint64_t* abort_word_ = nullptr;
  uint64_t abort_base_ = 0;
  std::function<void()> on_failure_;
  RemoteEdges* remote_ = nullptr;
  uint64_t awaiting_acks_ = 0;  // remote peers whose acknowledgement this rank cannot go on without (awaitAck)
  WorldStats stats_;
};

}  // namespace protocol
}  // namespace gfdit
