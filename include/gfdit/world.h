// The group-free collectives world: one setup per process, then collectives on any group.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gfdit/group.h"
#include "gfdit/store.h"
#include "gfdit/types.h"

namespace gfdit {

// NOTE [group-free collectives]
// World::create is the only step that communicates to set up: every rank maps every peer's shared
// region once. Afterwards a Group is a plain list of ranks and a collective synchronises only on the
// edges (ordered rank pairs) it uses, through per-edge sequence numbers. Any mix of overlapping groups
// is correct as long as every pair of ranks meets the collective instances they share in the same order
// (a pair that disagrees is reported, naming both instances). Deadlock-freedom needs more: every rank must
// run its collectives in an order consistent with one global order of all instances. Pairwise agreement
// alone allows a cycle (A runs X then Y, B runs Y then Z, C runs Z then X, where X = {A, C}, Y = {A, B},
// Z = {B, C}: each waits for the next). The runtime's single dispatch order provides the global order. The
// protocol itself is described at NOTE [edge sequence numbers] in src/collectives/edge.h.

/// Settings of a world; zero means "choose a default".
struct WorldOptions {
  /// Bound on every wait of a collective.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// Bytes of this rank's symmetric heap (tensors that collectives send without staging).
  size_t heap_bytes = size_t{64} << 20;
  /// Bytes of one staging slot: larger messages are chunked into slots and pipelined.
  size_t slot_bytes = 0;
  /// Number of staging slots in this rank's outbound ring.
  size_t num_slots = 0;
  /// How long a wait spins before it blocks, in microseconds (negative: automatic).
  int spin_us = -1;
  /// Prefix of the store keys, so several worlds can share a store.
  std::string key_prefix = "gfdit";
  /// Prefix of this rank's shared-memory object's name (letters, digits, '-', '_'). The name exists only
  /// until every peer mapped the object; a process killed before then leaves it, so a supervisor gives its
  /// ranks a prefix of their own and removes what is left under it afterwards (gfdit::runtime::unlinkOutputs).
  std::string shm_prefix = "gfdit";
  /// The CUDA device of this rank's device transport (collectives on device pointers with a stream), or -1
  /// for host memory only. Needs the CUDA library (gfdit::cuda; call gfdit::cuda::enable() once, which the
  /// Python module does).
  int device = -1;
};

/// Whether a device transport is available to World::create (the CUDA library enabled it).
bool hasDeviceTransport();

/// Counters of what a world did (for tests and benchmarks).
struct WorldStats {
  uint64_t messages_sent = 0;    ///< edge messages published
  uint64_t zero_copy_sends = 0;  ///< messages read by the peer straight from the sender's heap
  uint64_t staged_bytes = 0;     ///< bytes copied into staging
  uint64_t blocking_waits = 0;   ///< waits that gave up spinning and blocked
  uint64_t collectives = 0;      ///< collective instances run with peers (send and recv count one each)
  uint64_t all_gathers = 0;      ///< of which all_gather
  /// Bytes of the protocol's frames sent to ranks of other hosts (network edges; keep-alive beats not counted).
  uint64_t net_bytes_sent = 0;
  /// Bytes of the protocol's frames received from ranks of other hosts (keep-alive beats not counted).
  uint64_t net_bytes_received = 0;
};

/// One rank's view of the world: its region, every peer's region, and the collectives.
class World {
 public:
  /// Rendezvous with the other ranks through `store` and map every region. Collective over all ranks.
  static std::unique_ptr<World> create(int rank, int world_size, Store& store, const WorldOptions& options = {});
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  /// This process's rank.
  int rank() const;
  /// Number of ranks.
  int size() const;
  /// Options in force (defaults filled in).
  const WorldOptions& options() const;
  /// Changes the bound on waits.
  void setTimeout(std::chrono::milliseconds timeout);
  /// A group of the given ranks (local, see Group::create).
  Group newGroup(const int* ranks, int num_ranks) const;
  /// All ranks in order.
  Group worldGroup() const;
  /// Counters since creation.
  WorldStats stats() const;
  /// Labels the messages of the collectives that follow; a receiver refuses a message whose tag differs
  /// from its own (Error kRemoteError naming both tags). 0 is the default.
  void setMessageTag(uint32_t tag);
  /// The tag set by setMessageTag.
  uint32_t messageTag() const;
  /// False once an error broke this world (every later collective refuses); a peer waiting on a broken
  /// rank fails too, quoting its error.
  bool usable() const;
  /// Makes every wait fail with Error(kRemoteError) once *word differs from its value now (an engine
  /// aborting its workers' collectives to recover from a failure). The word must outlive the world.
  void watchAbort(const uint64_t* word);

  /// The device of this world's device transport, or -1.
  int device() const;
  /// WorldOptions::device of a world that spans hosts, or -1. Such a world has no device transport (device() is
  /// -1): collectives take host pointers only, and the Python layer stages device tensors through host memory.
  int stagedDevice() const;
  /// The node rank `rank` runs on (0 .. numNodes - 1, in the order of first appearance): ranks whose hosts share
  /// memory share a node, unless GFDIT_NODE_IDS says otherwise.
  int nodeOf(int rank) const;
  /// The host name rank `rank` reported.
  const std::string& hostOf(int rank) const;
  /// Whether this rank talks to `rank` over the network (NOTE [network edges] in src/collectives/net_edges.h).
  bool remote(int rank) const;
  /// The TCP port this rank's network edges listen on, or -1 when every peer is in shared memory.
  int netPort() const;
  /// Reports an error a device transport found asynchronously (a bounded device-side wait that expired).
  void checkDevice();

  // Heaps: one per transport (host memory, and device memory with a device transport). `device` selects it.
  /// Allocates `bytes` from this rank's heap (256-byte aligned); throws when full. Offsets may differ between
  /// ranks (each allocates on its own); see symmetricAlloc for one offset on every member.
  void* heapAlloc(size_t bytes, bool device = false);
  /// Allocates `bytes` at the same heap offset on every member of `group`, or throws InvalidUsage on every
  /// member when their heaps have no common room. Collective over the group (NOTE [symmetric allocation]).
  void* symmetricAlloc(const Group& group, size_t bytes, bool device = false);
  /// Returns a block from heapAlloc or symmetricAlloc.
  void heapFree(void* ptr);
  /// Whether [ptr, ptr+bytes) lies in one of this rank's heaps.
  bool inHeap(const void* ptr, size_t bytes) const;
  /// Offset of ptr from the start of its heap (a symmetric block has the same offset on every member).
  size_t heapOffset(const void* ptr) const;
  /// Bytes of a heap in use.
  size_t heapUsed(bool device = false) const;

  // Collectives. `stream` nullptr: host pointers, done when the call returns. A stream (cudaStream_t):
  // device pointers, enqueued on the stream through the device transport; the call returns once the peers'
  // hosts have met it, before the device finishes (NOTE [transports]).
  /// out[i] = member i's `in` (bytes_per_rank each), in group order.
  void allGather(const Group& group, const void* in, void* out, size_t bytes_per_rank, void* stream = nullptr);
  /// General all-gather: member i's `in` lands in outs[i]; views may be strided and sizes may differ.
  void allGatherV(const Group& group, const BufferView& in, const BufferView* outs, void* stream = nullptr);
  /// Block i of `in` goes to member i; block j of `out` comes from member j.
  void allToAll(const Group& group, const void* in, void* out, size_t bytes_per_rank, void* stream = nullptr);
  /// General all-to-all: ins[i] goes to member i, outs[j] comes from member j; views may be strided.
  void allToAllV(const Group& group, const BufferView* ins, const BufferView* outs, void* stream = nullptr);
  /// out = op over members of block selfIdx of `in` (count_per_rank elements each). `out` is this rank's own
  /// block of `in` (in place) or does not overlap `in`.
  void reduceScatter(const Group& group, const void* in, void* out, size_t count_per_rank, DType dtype, ReduceOp op,
                     void* stream = nullptr);
  /// data = op over members of data, identical bits on every member.
  void allReduce(const Group& group, void* data, size_t count, DType dtype, ReduceOp op, void* stream = nullptr);
  /// data of global rank root is copied to every member.
  void broadcast(const Group& group, void* data, size_t bytes, int root_rank, void* stream = nullptr);
  /// Point-to-point send to global rank dst (matched by one recv there).
  void send(const void* data, size_t bytes, int dst_rank, void* stream = nullptr);
  /// Point-to-point receive from global rank src.
  void recv(void* data, size_t bytes, int src_rank, void* stream = nullptr);
  /// Returns once every member has entered the barrier (with a stream: the streams meet too).
  void barrier(const Group& group, void* stream = nullptr);

  /// One-sided: copies `bytes` from src into the peer's heap at `remote_heap_offset`, then signals the
  /// peer. The caller makes sure the destination is free (as with NVSHMEM put-with-signal). With a stream:
  /// device memory, the device heap, enqueued on the stream.
  void putWithSignal(int peer, const void* src, size_t bytes, size_t remote_heap_offset, void* stream = nullptr);
  /// Waits until `count` more puts from `peer` have landed in this rank's heap (with a stream: the stream
  /// waits, the host does not).
  void waitSignal(int peer, uint64_t count = 1, void* stream = nullptr);

  struct Impl;

 private:
  explicit World(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Version string of the library.
const char* version();

}  // namespace gfdit
