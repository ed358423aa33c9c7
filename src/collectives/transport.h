// The seam between the edge protocol and the memory it moves bytes in: a Transport.
//
// NOTE [transports]
// The protocol engine (protocol.h) decides *what* moves: sequence numbers, descriptor slots, staging rounds,
// reductions in member order. It talks to the peers through the host region (descriptors, signals and acks
// in POSIX shared memory, NOTE [edge sequence numbers]) whatever the tensors are. A Transport decides *how*
// the bytes move and where they live: the staging ring and the heap of a collective's data are the
// transport's. The engine calls a transport in protocol order:
//
//   sender                                      receiver
//   stage(slot, src, prior)   (slot's earlier    consume(dst, peer bytes, peer, seq)
//                              receivers done)   reduce(out, contributions, arrivals) + consumed(peer, seq)
//   publish(peer, seq)        (bytes complete)
//   awaitConsumed(peer, seq)  (zero-copy: before the collective ends)
//
// A host transport (CpuTransport: memcpy / streaming stores) finishes each operation before it returns,
// so publish, consumed and awaitConsumed have nothing to do: the host handshake (signal after the copy,
// ack after the read) already orders everything. A device transport enqueues each operation on the
// collective's stream and returns at once; the host handshake then only says where the bytes are and that
// the peer has *enqueued* its side, so the transport adds the device-side half of the same handshake:
// publish stores `ready = seq` into the receiver's memory after the staging copy (release, system scope),
// consume waits for `ready >= seq` before it reads and stores `consumed = seq` into the sender's memory
// after it (release), and stage waits for `consumed >= seq` of every earlier message that used the slot
// before it overwrites it. The numbers are the edge's message numbers, so the device words only grow, as the
// host ones do. Device waits are bounded (a stuck peer is reported by checkErrors, not a hung stream).
//
// Both ends of a collective use the same kind of transport: the kind is part of the descriptor's op code,
// so a rank that passes host tensors to a peer that passes device tensors fails the mismatch check.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "copy.h"
#include "gfdit/types.h"
#include "heap.h"

namespace gfdit {

/// Which transport moves a collective's bytes (carried in the descriptor's op code).
enum class TransportKind : uint32_t { kCpu = 0, kCuda = 1 };

/// Name of a transport kind ("cpu", "cuda").
const char* transportKindName(TransportKind kind);

/// A message whose receiver must be done reading a staging slot before it is written again.
struct SlotUse {
  int peer = -1;
  uint64_t seq = 0;
};

/// How the protocol engine moves bytes; see NOTE [transports].
class Transport {
 public:
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;

  // ---- memory: the staging ring and the heap of this transport, and the peers' as mapped here ----

  /// Start of this rank's data area; descriptors carry offsets from it (MessageDesc::region_offset).
  virtual uint8_t* base() const = 0;
  /// Start of a peer's data area as mapped into this process.
  virtual uint8_t* peerBase(int peer) const = 0;
  /// Bytes of one staging slot and number of slots.
  virtual size_t slotBytes() const = 0;
  virtual size_t numSlots() const = 0;
  /// Start of staging slot k (in this rank's data area).
  virtual uint8_t* slot(size_t k) const = 0;
  /// This rank's heap: its start and its allocator (offsets from heapBase(); the World allocates in it and
  /// keeps symmetric allocations at the same offset on every member, NOTE [symmetric allocation]).
  virtual uint8_t* heapBase() const = 0;
  virtual size_t heapCapacity() const = 0;
  virtual core::HeapAllocator& heap() = 0;
  /// Whether [p, p + bytes) lies in this rank's heap (such bytes are sent without staging).
  bool inHeap(const void* p, size_t bytes) const {
    auto* b = static_cast<const uint8_t*>(p);
    return b >= heapBase() && b + bytes <= heapBase() + heapCapacity();
  }
  /// A buffer of at least `bytes` in this transport's memory, valid until the next call (one-shot results).
  virtual uint8_t* scratch(size_t bytes) = 0;

  // ---- a collective ----

  /// Before the engine's first operation of a collective; `stream` is the device stream it enqueues on
  /// (nullptr for host transports). Reports errors a device found since the last collective.
  virtual void begin(void* stream) = 0;
  /// After the last operation of a collective.
  virtual void end() = 0;

  /// Copies within this rank (an own block of a collective).
  virtual void copyLocal(const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off,
                         size_t bytes) = 0;
  /// Writes `bytes` of src (from src_off) into `slot`, after every message in `prior` was read.
  virtual void stage(uint8_t* slot, const BufferView& src, size_t src_off, size_t bytes, const SlotUse* prior,
                     int num_prior) = 0;
  /// The bytes of message `seq` to `peer` (staged, or in the heap) are complete.
  virtual void publish(int peer, uint64_t seq) = 0;
  /// Copies `bytes` of the peer's message `seq` (src, in the peer's data area) into dst at dst_off, then
  /// marks the message read.
  virtual void consume(const BufferView& dst, size_t dst_off, const BufferView& src, size_t src_off, size_t bytes,
                       int peer, uint64_t seq) = 0;
  /// out[0, count) = the n contributions reduced (contribs[j]: member j's elements), after the messages in
  /// `arrivals` are complete. Starts from contribs[first] (out may be that very block: in place) and applies
  /// the others in member order; with `acc` through the accumulator type (float32 for 16-bit floats), which
  /// also allows any `out`. Every rank that reduces the same block must pass the same `first` and `acc`, so
  /// that the bits agree. The engine marks fully reduced messages with `consumed`.
  virtual void reduce(uint8_t* out, const uint8_t* const* contribs, int n, int first, size_t count, DType dtype,
                      ReduceOp op, bool acc, const SlotUse* arrivals, int num_arrivals) = 0;
  /// The receiver is done with message `seq` from `peer` (reductions; consume marks its own).
  virtual void consumed(int peer, uint64_t seq) = 0;
  /// The sender does not finish the collective before `peer` read message `seq` (zero-copy sends).
  virtual void awaitConsumed(int peer, uint64_t seq) = 0;
  /// The engine is about to wait for its peers: a transport that holds back its last operation to fuse it
  /// with what follows (the CUDA transport fuses a staging copy with its publishes) enqueues it now, so a
  /// peer's device is not kept waiting while this host sleeps. end() flushes too; host transports hold
  /// nothing.
  virtual void flush() {}

  /// One-sided, outside any collective (a device transport; host puts go through the host region): copies
  /// `bytes` from src into the peer's heap at `remote_heap_offset`, then adds one to the peer's count of puts
  /// from this rank (release, after the bytes); waitPuts waits until `count` more puts from `peer` landed.
  virtual void putWithSignal(int peer, size_t remote_heap_offset, const void* src, size_t bytes);
  virtual void waitPuts(int peer, uint64_t count);

  /// Throws what the transport found asynchronously (a device wait that timed out), else nothing.
  virtual void checkErrors() {}
  /// Stops this transport's pending work after the world broke, so that peers waiting on it fail too.
  virtual void abort() {}
  /// Changes the bound on the transport's own waits.
  virtual void setTimeout(std::chrono::milliseconds) {}

  /// A description for errors and build_info ("cpu memcpy/stream", "cuda sm<=64K,ce").
  virtual std::string describe() const = 0;
};

class Store;

/// What a device transport is made from (World::create passes its rendezvous and options).
struct DeviceTransportArgs {
  int rank = 0;
  int world_size = 1;
  int device = 0;
  Store* store = nullptr;
  std::string key_prefix;  ///< the world's store prefix; the transport appends its own keys
  std::chrono::milliseconds timeout{0};
  size_t heap_bytes = 0;
};

/// Makes the device transport of a world.
using DeviceTransportFactory = std::unique_ptr<Transport> (*)(const DeviceTransportArgs& args);
/// Registers the factory World::create uses when WorldOptions::device >= 0 (the CUDA library does, in
/// gfdit::cuda::enable()).
void registerDeviceTransport(DeviceTransportFactory factory);

}  // namespace gfdit
