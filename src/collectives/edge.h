// The edge protocol's shared-memory layout and signal operations, for host and device code.
//
// NOTE [edge sequence numbers]
// Every ordered pair of ranks (i, j) is an edge. Rank i numbers the messages it publishes to j with
// seq = 1, 2, 3, ... and j consumes them in the same order, so both ends agree on every number without
// talking about it. A message is a descriptor (where the bytes are, which collective instance and which
// part of its stream they are) written into one of two descriptor slots of the edge, slot seq % 2, and
// made visible by storing signal = seq with release ordering. The receiver waits for signal >= seq with
// acquire ordering, copies the bytes out (or reduces them), then stores ack = seq with release ordering.
// The sender reuses descriptor slot seq % 2, and any staging memory the message pointed to, only after
// ack >= seq - 2 (resp. ack >= seq): a fast rank runs one message ahead on an edge while a slow peer
// finishes the previous one. Counters only grow (64 bit) and are never reset.
//
// NOTE [message tags]
// A descriptor also carries the sender's message tag (World::setMessageTag, 0 unless a caller sets one),
// and the receiver refuses a message whose tag differs from its own, as it refuses one of another
// collective kind or size. A layer that runs several collectives per call (gfdit.attention) labels them
// with a fingerprint of what it believes the call is, so that members that disagree about the call fail
// on the first message that crosses between them instead of exchanging bytes of another shape. Every
// message of every collective carries the tag: no extra message, nothing for the receiver to wait for.
//
// NOTE [failure broadcast]
// A rank whose world breaks (timeout, mismatch, dead peer, abort) writes why into its region header and
// then sets `failed` with release ordering. A peer blocked in a collective of a group that contains it
// reads the flag (acquire) when it checks liveness, and fails too, quoting the reason, instead of waiting
// for its timeout: a rank that stopped in the middle of a collective never sends what its peers wait for.
//
// Where each word lives: the signal and the descriptors of edge i->j live in j's region (the receiver
// polls its own memory); the ack of edge i->j lives in i's region (the sender polls its own memory). So
// every rank only ever waits on words of its own region, and one futex doorbell per region suffices to
// block (NOTE [doorbell]).
//
// The doorbell every rank blocks on is NOTE [doorbell] in src/core/doorbell.h.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
#define GFDIT_DEVICE_COMPILE 1
#endif

#if defined(__CUDACC__)
#define GFDIT_HOST_DEVICE __host__ __device__
#else
#define GFDIT_HOST_DEVICE
#endif

namespace gfdit {
namespace edge {

constexpr uint64_t kRegionMagic = 0x6766646974524547ull;  // "gfditREG"
constexpr uint32_t kLayoutVersion = 3;
constexpr size_t kCacheLine = 64;
constexpr size_t kHeapAlign = 256;
constexpr size_t kFailReasonBytes = 512;  // RegionHeader::fail_reason, NUL-terminated

/// Where a message's bytes are, in the sender's region, and what they are.
struct MessageDesc {
  uint64_t instance;       // collective instance on this edge, counted by both ends
  uint32_t op;             // collective kind, dtype and reduce op (see opCode)
  uint32_t flags;          // kFlagZeroCopy, ...
  uint64_t total_bytes;    // bytes of the whole stream this message belongs to
  uint64_t stream_offset;  // position of this message in the stream
  uint64_t bytes;          // bytes in this message
  uint64_t region_offset;  // where the bytes start, from the start of the sender's region
  uint32_t rows;           // strided source: rows of row_bytes, stride apart (rows == 0: contiguous)
  uint32_t tag;            // the sender's message tag, see NOTE [message tags]
  uint64_t row_bytes;
  uint64_t stride;
};

constexpr uint32_t kFlagZeroCopy = 1;

/// Edge peer->self, in self's region.
struct alignas(kCacheLine) InEdge {
  alignas(kCacheLine) uint64_t signal;      // last seq published by the peer (release/acquire)
  alignas(kCacheLine) uint64_t put_signal;  // puts from the peer that have landed (release/acquire)
  alignas(kCacheLine) MessageDesc desc[2];  // slot seq % 2
};

/// Edge self->peer, in self's region: the peer's acknowledgements.
struct alignas(kCacheLine) OutEdge {
  uint64_t ack;  // last seq the peer consumed (release/acquire)
};

/// Start of every region.
struct alignas(kCacheLine) RegionHeader {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t world_size;
  int32_t pid;
  uint64_t total_bytes;
  uint64_t in_edges_offset;
  uint64_t out_edges_offset;
  uint64_t staging_offset;
  uint64_t slot_bytes;
  uint64_t num_slots;
  uint64_t heap_offset;
  uint64_t heap_bytes;
  alignas(kCacheLine) uint32_t doorbell;     // futex word, see NOTE [doorbell]
  alignas(kCacheLine) uint32_t num_waiters;  // ranks blocked on doorbell (only the owner blocks)
  alignas(kCacheLine) uint64_t failed;       // 1 once this rank's world broke (release/acquire):
                                             // see NOTE [failure broadcast]
  char fail_reason[kFailReasonBytes];        // why, written before `failed`
  alignas(kCacheLine) uint64_t heartbeat;    // incremented by the owner every few ms (NOTE [liveness])
  uint64_t pid_ns;                           // the owner's pid namespace (its pid means something only there)
};

// Signal operations. The name says the memory ordering; host code uses the GCC atomic builtins on
// plain words in shared memory, device code the PTX system-scope forms, so both sides speak the same
// protocol on the same layout.

/// Publishes v: every store before it is visible to whoever acquires v.
GFDIT_HOST_DEVICE inline void storeRelease(uint64_t* word, uint64_t v) {
#if defined(GFDIT_DEVICE_COMPILE)
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(word), "l"(v) : "memory");
#else
  __atomic_store_n(word, v, __ATOMIC_RELEASE);
#endif
}

/// Reads a published value: stores made before its release are visible after this.
GFDIT_HOST_DEVICE inline uint64_t loadAcquire(const uint64_t* word) {
#if defined(GFDIT_DEVICE_COMPILE)
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(word) : "memory");
  return v;
#else
  return __atomic_load_n(word, __ATOMIC_ACQUIRE);
#endif
}

/// Reads without ordering (polling before an acquire, or a word only this rank writes).
GFDIT_HOST_DEVICE inline uint64_t loadRelaxed(const uint64_t* word) {
#if defined(GFDIT_DEVICE_COMPILE)
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(word) : "memory");
  return v;
#else
  return __atomic_load_n(word, __ATOMIC_RELAXED);
#endif
}

#if defined(__CUDACC__)
// Device-only forms used by the CUDA transport (src/collectives/cuda/); a host-only build does not see them.

/// Orders every earlier memory access of this thread, and what it observed, before every later one at
/// system scope (fence.sc.sys): other processes and devices see the earlier writes first.
__device__ inline void fenceSystem() { asm volatile("fence.sc.sys;" ::: "memory"); }

/// Nanoseconds of the GPU's global timer (%globaltimer): the clock of bounded device waits.
__device__ inline uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

/// Packs what a receiver checks about a message: collective kind, dtype, reduce op.
GFDIT_HOST_DEVICE inline uint32_t opCode(uint32_t kind, uint32_t dtype, uint32_t reduce_op) {
  return (kind << 16) | (dtype << 8) | reduce_op;
}

}  // namespace edge
}  // namespace gfdit
