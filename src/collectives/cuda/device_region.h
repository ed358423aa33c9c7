// The CUDA transport's device region and the plain records its kernels take, for host and device code.
//
// NOTE [cuda transport handshake]
// Each rank owns one device allocation (cudaMalloc, exported with a legacy CUDA IPC handle and opened by
// every peer): a signal area (DeviceSignals), the outbound staging ring and the heap. The host protocol
// (NOTE [edge sequence numbers], descriptors in the host region) says where a message's bytes are and
// that the peer has *enqueued* its side; these device words say that the peer's stream has *done* it.
// They carry the edge's own message numbers, so they only grow, as the host counters do:
//
//   sender stream (rank i)                         receiver stream (rank j)
//   stage:   wait  i.consumed[j] >= s'  (acquire)  consume: wait  j.ready[i] >= s         (acquire)
//            (s': each earlier message that used            copy  i's bytes -> dst
//             the slot), then copy src -> slot              store i.consumed[j] = s        (release)
//   publish: store j.ready[i] = s         (release) reduce:  wait  j.ready[i] >= s, reduce,
//   awaitConsumed: wait i.consumed[j] >= s (acquire)        then consumed: i.consumed[j] = s (release)
//
// Every word is written by exactly one rank's stream and polled only by its owner: `ready[p]` of rank j is
// written by p, `consumed[p]` of rank i is written by p, so each stream polls its own memory and writes
// into its peers'. Stores are st.release.sys after a fence.sc.sys that follows the data writes (the
// writes of the kernel's other blocks reach the signalling thread through an acq_rel counter, see
// NOTE [op kernels]); polls are ld.acquire.sys. A stream's operations run in enqueue order, so a signal
// enqueued after a copy (a copy-engine memcpy, or another kernel) is stored after that copy completed.
//
// Failure: `failed` is set (atomicCAS at system scope, then a system fence) by the first of this rank's
// kernels that gives up a bounded wait, which also fills the host-mapped ErrorRecord. Every later
// operation of this rank checks it and does nothing (no copy, no signal); every wait also polls the
// `failed` word of the rank it waits on, so a peer's failure ends the wait at once (kPeerFailed) instead
// of at its timeout, and a reader checks the sender's `failed` after reading and before it signals
// `consumed`: a sender that gave up on a slot may overwrite it (a copy-engine memcpy cannot be skipped),
// and by then its `failed` is visible (message passing: the sender's fence between the two writes, the
// reader's fence between its reads and the check), so bytes it may have torn are reported, not used.
#pragma once

#include <cstddef>
#include <cstdint>

#include "edge.h"
#include "gfdit/types.h"

namespace gfdit {
namespace cuda {

constexpr uint64_t kDeviceRegionMagic = 0x6766646974435544ull;  // "gfditCUD"
constexpr uint32_t kDeviceLayoutVersion = 1;
/// Signal words sit on lines of their own: every word has one writer, and a line written by a peer over
/// NVLink should not share a line (128 bytes, the L2 line of sm_80/sm_90) with a word another peer writes.
constexpr size_t kDeviceLine = 128;
/// Alignment of the staging area, every slot and the heap (TMA bulk copies need 16 bytes; pages are nicer).
constexpr size_t kDeviceAlign = 4096;

struct alignas(kDeviceLine) DeviceWord {
  uint64_t value;
};

/// Start of every rank's device region; see NOTE [cuda transport handshake].
struct DeviceSignals {
  alignas(kDeviceLine) uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t world_size;
  int32_t device;
  uint64_t total_bytes;
  uint64_t staging_offset;
  uint64_t slot_bytes;
  uint64_t num_slots;
  uint64_t heap_offset;
  uint64_t heap_bytes;
  alignas(kDeviceLine) uint64_t failed;              // nonzero once this rank's transport failed
  alignas(kDeviceLine) unsigned long long arrivals;  // blocks of this rank's op kernels that finished
  DeviceWord ready[kMaxRanks];                       // ready[p]: last message from p whose bytes are complete
  DeviceWord consumed[kMaxRanks];                    // consumed[p]: last message of ours that p finished reading
  DeviceWord put_signal[kMaxRanks];                  // put_signal[p]: one-sided puts from p that landed
};

/// Why a device operation gave up.
enum class DeviceFailure : uint32_t { kNone = 0, kTimeout = 1, kPeerFailed = 2 };
/// What a failed wait waited for.
/// (kReadCheck: not a wait but the check, before signalling `consumed`, that the sender had not failed.)
enum class DeviceWaitKind : uint32_t {
  kNone = 0,
  kReady = 1,
  kConsumed = 2,
  kPutSignal = 3,
  kBulkCopy = 4,
  kReadCheck = 5,
};
/// Which transport operation a kernel runs (for error records).
enum class DeviceOp : uint32_t {
  kNone = 0,
  kCopyLocal = 1,
  kStage = 2,
  kPublish = 3,
  kConsume = 4,
  kReduce = 5,
  kConsumed = 6,
  kAwaitConsumed = 7,
  kWaitSignal = 8,
  kPutSignal = 9,
};

/// The first failure of a transport, written by a kernel into host-mapped pinned memory: the fields
/// first, then a system fence, then `state = 1`; the host reads `state` with acquire, then the fields.
struct ErrorRecord {
  uint32_t state;     // 0: nothing recorded, 1: complete
  uint32_t failure;   // DeviceFailure
  uint32_t op;        // DeviceOp
  uint32_t wait;      // DeviceWaitKind
  int32_t rank;       // the rank whose kernel gave up
  int32_t peer;       // the other end of the edge
  uint64_t seq;       // the message number (or signal value) waited for
  uint64_t observed;  // the word's value when the wait gave up
  uint64_t waited_ns;
  uint64_t timeout_ns;
  uint64_t op_index;  // which operation of the transport (counted from 1)
};

/// A bounded wait for `*word >= target`; `peer_failed` (the waited-on rank's `failed`, or null) ends it.
struct DeviceWait {
  const uint64_t* word;
  uint64_t target;
  const uint64_t* peer_failed;
  int32_t peer;
  uint32_t kind;  // DeviceWaitKind
};

/// `*word = value` with release at system scope, after the op's body; if `peer_failed` (the failed word of
/// the rank whose bytes the body read) is set by then, nothing is signalled and kPeerFailed is recorded.
struct DeviceSignal {
  uint64_t* word;
  uint64_t value;
  const uint64_t* peer_failed;
  int32_t peer;
  uint32_t kind;  // DeviceWaitKind for the record (kReadCheck when peer_failed is set)
};

/// Bytes in device-accessible memory: rows of row_bytes, stride apart (contiguous: one row).
struct DeviceView {
  uint8_t* ptr;
  uint64_t rows;
  uint64_t row_bytes;
  uint64_t stride;
};

/// Which body a kernel copies with (CopyPath::kCudaSm / kCudaTma; the copy engine is not a kernel).
enum class KernelCopy : uint32_t { kNone = 0, kSm = 1, kTma = 2 };

/// `bytes` payload bytes from src (at payload offset src_off) to dst (at dst_off).
struct DeviceCopy {
  DeviceView dst;
  uint64_t dst_off;
  DeviceView src;
  uint64_t src_off;
  uint64_t bytes;
  uint32_t path;  // KernelCopy
  uint32_t pad;
};

/// What every op kernel needs besides its waits, body and signals.
struct OpHeader {
  uint64_t* own_failed;             // this rank's DeviceSignals::failed
  ErrorRecord* record;              // device pointer of the host-mapped record
  unsigned long long* arrivals;     // this rank's DeviceSignals::arrivals
  unsigned long long last_arrival;  // the value fetch_add returns to the kernel's last block
  uint64_t timeout_ns;
  uint64_t op_index;
  int32_t rank;
  uint32_t op;  // DeviceOp
  int32_t num_waits;
  int32_t num_signals;
};

/// Element-wise reduction of n contributions in member order (see Transport::reduce).
struct DeviceReduce {
  const uint8_t* contribs[kMaxRanks];
  uint8_t* out;
  uint64_t count;
  int32_t n;
  int32_t first;
  uint32_t dtype;  // DType
  uint32_t op;     // ReduceOp
};

/// Most waits and signals one kernel takes (a slot's earlier receivers, a shared send's peers).
constexpr int kMaxOpWaits = kMaxRanks;
constexpr int kMaxOpSignals = kMaxRanks;
/// The small kernel variant (most operations: one wait, one signal) passes fewer parameter bytes.
constexpr int kSmallOpWaits = 4;
constexpr int kSmallOpSignals = 4;

}  // namespace cuda
}  // namespace gfdit
