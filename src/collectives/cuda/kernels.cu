// The CUDA transport's kernels: one op kernel (bounded waits, a copy body, signals) and one reduction
// kernel of the same shape; see NOTE [cuda transport handshake] in device_region.h.
//
// NOTE [op kernels]
// Every operation of the transport that runs on SMs is one launch with three phases:
//   1. waits: in every block, warp 0's lanes each take some of the op's waits and poll them
//      (ld.acquire.sys) until satisfied, the transport's timeout passes (%globaltimer), this rank failed,
//      or the rank waited on failed; __syncthreads_and then tells the block whether all were satisfied.
//      Each block acquires for itself, so its threads' later reads see what the signaller released (the
//      block barrier orders them after lane k's acquire) and no block needs another's progress.
//   2. body: the block's share of the copy (SM vector loop, or TMA bulk copies on sm_90) or reduction,
//      unless phase 1 failed, in which case it does nothing.
//   3. finish: __syncthreads, then thread 0 adds one to this rank's `arrivals` counter (fetch_add,
//      acq_rel at device scope: this block's accesses happen before it, and the last block's acquire
//      sees every block's). The block that gets `last_arrival` (the host knows the counter's value
//      before each launch: launches of one transport run one after another, see begin()) checks that
//      this rank has not failed (a skipped body always sets `failed` before arriving), fences at system
//      scope, checks the `failed` words of the ranks whose bytes were read (NOTE [cuda transport
//      handshake]), and stores the signals with st.release.sys.
// No kernel traps or waits without a bound; a failure is a record, and later operations do nothing.
#include <cuda_runtime.h>
#include <cuda/atomic>

#include <cstddef>
#include <cstdint>

#include "cuda_check.h"
#include "device_region.h"
#include "edge.h"
#include "kernels.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GFDIT_TMA_BODY 1
#endif

namespace gfdit {
namespace cuda {
namespace {

template <int W, int S>
struct OpArgs {
  OpHeader h;
  DeviceWait waits[W];
  DeviceSignal signals[S];
};

// NOTE [kernel parameter size]
// The kernels take their operation by value (no device allocation, no copy before the launch). Up to CUDA
// 12.0 a kernel's parameters were limited to 4096 bytes; CUDA 12.1 raised the limit to 32764 bytes (on Volta
// or newer, with a driver of CUDA 12.1 or newer; our targets are sm_80 and up). The large variant
// (kMaxOpWaits waits, kMaxOpSignals signals, and a DeviceCopy or DeviceReduce) needs more than 4 KB, so the
// build requires CUDA >= 12.1 (CMakeLists.txt disables the CUDA sources below that).
constexpr size_t kMaxKernelParamBytes = 32764;
static_assert(sizeof(OpArgs<kMaxOpWaits, kMaxOpSignals>) + sizeof(DeviceCopy) <= kMaxKernelParamBytes,
              "opKernel's parameters exceed CUDA's 32764-byte limit: see NOTE [kernel parameter size]");
static_assert(sizeof(OpArgs<kMaxOpWaits, kMaxOpSignals>) + sizeof(DeviceReduce) <= kMaxKernelParamBytes,
              "reduceKernel's parameters exceed CUDA's 32764-byte limit: see NOTE [kernel parameter size]");
#if defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ < 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ < 1))
static_assert(sizeof(OpArgs<kMaxOpWaits, kMaxOpSignals>) + sizeof(DeviceReduce) <= 4096,
              "this nvcc allows 4096 bytes of kernel parameters, the op kernels need more: use CUDA >= 12.1 "
              "(NOTE [kernel parameter size])");
#endif

// ---- failure ----

__device__ inline bool ownFailed(const OpHeader& h) { return edge::loadRelaxed(h.own_failed) != 0; }

// The first failure of this rank wins the CAS on its `failed` word (system scope: peers poll it) and fills
// the host-mapped record: the fields, a system fence, then state = 1, which the host reads with acquire.
__device__ void recordFailure(const OpHeader& h, DeviceFailure failure, uint32_t wait_kind, int peer, uint64_t seq,
                              uint64_t observed, uint64_t waited_ns) {
  auto* failed = reinterpret_cast<unsigned long long*>(h.own_failed);
  if (atomicCAS_system(failed, 0ull, 1ull) != 0ull) return;  // an earlier failure (or the host's abort) stays
  edge::fenceSystem();  // `failed` is visible before anything this rank writes later (a slot overwrite)
  volatile ErrorRecord* r = h.record;
  r->failure = static_cast<uint32_t>(failure);
  r->op = h.op;
  r->wait = wait_kind;
  r->rank = h.rank;
  r->peer = peer;
  r->seq = seq;
  r->observed = observed;
  r->waited_ns = waited_ns;
  r->timeout_ns = h.timeout_ns;
  r->op_index = h.op_index;
  edge::fenceSystem();  // the fields reach host memory before the state that says they are complete
  r->state = 1;
}

// Polls until *w.word >= w.target (acquire, system scope). False when it gives up: this rank failed
// (nothing recorded here), the waited-on rank failed, or the timeout passed (both recorded).
__device__ bool boundedWait(const OpHeader& h, const DeviceWait& w) {
  uint64_t v = edge::loadAcquire(w.word);
  if (v >= w.target) return true;
  const uint64_t start = edge::globalTimerNs();
  for (uint32_t i = 1;; ++i) {
    v = edge::loadAcquire(w.word);
    if (v >= w.target) return true;
    if ((i & 63) != 0) continue;
    if (ownFailed(h)) return false;
    uint64_t waited = edge::globalTimerNs() - start;
    if (w.peer_failed != nullptr && edge::loadRelaxed(w.peer_failed) != 0) {
      recordFailure(h, DeviceFailure::kPeerFailed, w.kind, w.peer, w.target, v, waited);
      return false;
    }
    if (waited > h.timeout_ns) {
      recordFailure(h, DeviceFailure::kTimeout, w.kind, w.peer, w.target, v, waited);
      return false;
    }
    if (i >= 4096) __nanosleep(200);  // a long wait: leave the memory system to others
  }
}

// Phase 1 of NOTE [op kernels]: true in every thread of the block iff all waits were satisfied.
template <int W, int S>
__device__ bool blockWaits(const OpArgs<W, S>& a) {
  bool ok = true;
  if (threadIdx.x < 32) {
    ok = !ownFailed(a.h);
    for (int k = threadIdx.x; ok && k < a.h.num_waits; k += 32) ok = boundedWait(a.h, a.waits[k]);
  }
  return __syncthreads_and(ok ? 1 : 0) != 0;
}

// Phase 3 of NOTE [op kernels].
template <int W, int S>
__device__ void blockFinish(const OpArgs<W, S>& a) {
  __syncthreads();  // every thread of this block finished its part of the body
  if (threadIdx.x != 0) return;
  ::cuda::atomic_ref<unsigned long long, ::cuda::thread_scope_device> arrivals(*a.h.arrivals);
  if (arrivals.fetch_add(1ull, ::cuda::memory_order_acq_rel) != a.h.last_arrival) return;
  if (a.h.num_signals == 0 || ownFailed(a.h)) return;  // a block skipped its part: signal nothing
  // Every block's writes (they happen before our acquire of the counter) are visible at system scope
  // before the checks and the signals below.
  edge::fenceSystem();
  for (int k = 0; k < a.h.num_signals; ++k) {
    const DeviceSignal& s = a.signals[k];
    if (s.peer_failed != nullptr && edge::loadAcquire(s.peer_failed) != 0) {
      // The sender of the bytes we read gave up and may have overwritten them while we read.
      recordFailure(a.h, DeviceFailure::kPeerFailed, s.kind, s.peer, s.value, 0, 0);
      return;
    }
  }
  for (int k = 0; k < a.h.num_signals; ++k) edge::storeRelease(a.signals[k].word, a.signals[k].value);
}

// ---- SM copy ----

__device__ inline bool isContiguous(const DeviceView& v) { return v.rows <= 1 || v.stride == v.row_bytes; }

// Address of payload byte `off` of a view (payload bytes count in row order).
__device__ inline uint8_t* viewAt(const DeviceView& v, uint64_t off) {
  if (isContiguous(v)) return v.ptr + off;
  return v.ptr + (off / v.row_bytes) * v.stride + off % v.row_bytes;
}

template <typename T>
__device__ inline void copyWords(uint8_t* d, const uint8_t* s, uint64_t n, uint64_t tid, uint64_t nthreads) {
  constexpr int kUnroll = 4;  // independent loads in flight per thread
  T* dw = reinterpret_cast<T*>(d);
  const T* sw = reinterpret_cast<const T*>(s);
  uint64_t words = n / sizeof(T);
  uint64_t i = tid;
  for (; i + (kUnroll - 1) * nthreads < words; i += kUnroll * nthreads) {
    T v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = sw[i + u * nthreads];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dw[i + u * nthreads] = v[u];
  }
  for (; i < words; i += nthreads) dw[i] = sw[i];
  for (uint64_t b = words * sizeof(T) + tid; b < n; b += nthreads) d[b] = s[b];
}

// A contiguous copy with the widest words both pointers allow after a common head.
__device__ void copyFlat(uint8_t* d, const uint8_t* s, uint64_t n, uint64_t tid, uint64_t nthreads) {
  uintptr_t mis = reinterpret_cast<uintptr_t>(d) ^ reinterpret_cast<uintptr_t>(s);
  int width = (mis & 15) == 0 ? 16 : (mis & 7) == 0 ? 8 : (mis & 3) == 0 ? 4 : 1;
  uint64_t head = (width - (reinterpret_cast<uintptr_t>(d) & (width - 1))) & (width - 1);
  if (head > n) head = n;
  for (uint64_t b = tid; b < head; b += nthreads) d[b] = s[b];
  d += head;
  s += head;
  n -= head;
  switch (width) {
    case 16: copyWords<uint4>(d, s, n, tid, nthreads); break;
    case 8: copyWords<uint2>(d, s, n, tid, nthreads); break;
    case 4: copyWords<uint32_t>(d, s, n, tid, nthreads); break;
    default: copyWords<uint8_t>(d, s, n, tid, nthreads); break;
  }
}

__device__ inline uint64_t lowBit(uint64_t x) { return x & (~x + 1); }

// Strided views: chunks of the largest power of two (at most 16) that divides every address, offset and
// row length involved, so that no chunk crosses a row on either side.
__device__ void copyStrided(const DeviceCopy& c, uint64_t tid, uint64_t nthreads) {
  uint64_t g = 16 | reinterpret_cast<uintptr_t>(c.dst.ptr) | reinterpret_cast<uintptr_t>(c.src.ptr) | c.dst_off |
               c.src_off | c.bytes;
  if (!isContiguous(c.dst)) g |= c.dst.row_bytes | c.dst.stride;
  if (!isContiguous(c.src)) g |= c.src.row_bytes | c.src.stride;
  uint64_t gran = lowBit(g);
  uint64_t chunks = c.bytes / gran;
  for (uint64_t i = tid; i < chunks; i += nthreads) {
    uint8_t* d = viewAt(c.dst, c.dst_off + i * gran);
    const uint8_t* s = viewAt(c.src, c.src_off + i * gran);
    switch (gran) {
      case 16: *reinterpret_cast<uint4*>(d) = *reinterpret_cast<const uint4*>(s); break;
      case 8: *reinterpret_cast<uint2*>(d) = *reinterpret_cast<const uint2*>(s); break;
      case 4: *reinterpret_cast<uint32_t*>(d) = *reinterpret_cast<const uint32_t*>(s); break;
      case 2: *reinterpret_cast<uint16_t*>(d) = *reinterpret_cast<const uint16_t*>(s); break;
      default: *d = *s; break;
    }
  }
}

__device__ void smCopy(const DeviceCopy& c) {
  uint64_t tid = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  uint64_t nthreads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  if (isContiguous(c.dst) && isContiguous(c.src)) {
    copyFlat(c.dst.ptr + c.dst_off, c.src.ptr + c.src_off, c.bytes, tid, nthreads);
  } else {
    copyStrided(c, tid, nthreads);
  }
}

// ---- TMA bulk copy (sm_90) ----

#if defined(GFDIT_TMA_BODY)
extern __shared__ __align__(128) uint8_t tma_stage_smem[];

__device__ inline uint32_t smemAddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Polls the mbarrier `bar` until its phase of parity `parity` completed (the chunk's bytes are in shared
// memory; try_wait has acquire semantics at CTA scope, so they are visible to this thread's next bulk store)
// or `budget_ns` passed. False on timeout; *waited_ns is the time spent.
__device__ bool tmaWaitChunk(uint32_t bar, uint32_t parity, uint64_t budget_ns, uint64_t* waited_ns) {
  const uint64_t start = edge::globalTimerNs();
  for (uint32_t done = 0, polls = 0; !done; ++polls) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    if (!done && (polls & 1023) == 1023 && edge::globalTimerNs() - start > budget_ns) {
      *waited_ns = edge::globalTimerNs() - start;
      return false;
    }
  }
  *waited_ns = edge::globalTimerNs() - start;
  return true;
}

// NOTE [tma proxies]
// cp.async.bulk reads and writes global memory through the async proxy; everything else in these kernels
// (the acquire loads of the waits, an SM copy's or a peer's ordinary stores into a slot, the signals' release
// stores) goes through the generic proxy, and PTX orders accesses of one proxy after the other's only across
// a proxy fence. So lane 0 issues fence.proxy.async.global after the block's waits (phase 1 acquires, the
// block barrier brings them to this thread) and before its first bulk copy: the bytes that a peer's release
// published, and the reads of earlier receivers that a `consumed` acquire ordered, come before the bulk
// loads and stores. After the last bulk store completed, the same fence orders the async-proxy writes before
// the generic-proxy release of phase 3.
//
// Lane 0 of each block moves its chunks global -> shared -> global with cp.async.bulk, kTmaStages chunks
// in flight: chunk it's load is issued kTmaStages - 1 iterations before its store. A stage is reloaded only
// after the store that last used it has finished reading shared memory (wait_group.read), and the block
// ends only after every store completed (wait_group 0) and the proxy fence above. A load that does not land
// within the timeout is recorded and ends the copy, but the block still waits (bounded) for the loads it
// issued: a bulk copy cannot be cancelled, and one that writes this block's shared memory after the block
// exited would write into the next block that the SM places there.
__device__ bool tmaCopyLane0(const OpHeader& h, uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  __shared__ __align__(8) uint64_t bars[kTmaStages];
  const uint64_t chunks = (bytes + kTmaChunkBytes - 1) / kTmaChunkBytes;
  const uint64_t first = blockIdx.x, step = gridDim.x;
  const uint64_t mine = first < chunks ? (chunks - first + step - 1) / step : 0;
  for (int s = 0; s < kTmaStages; ++s) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smemAddr(&bars[s])) : "memory");
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // the async proxy sees the init
  // see NOTE [tma proxies]: the block's acquires (and what they made visible) before any bulk access
  asm volatile("fence.proxy.async.global;" ::: "memory");
  bool ok = true;
  uint64_t issued = 0;  // loads issued so far (chunks 0 .. issued - 1 of this block)
  for (uint64_t it = 0; ok && it < mine + kTmaStages - 1; ++it) {
    if (it < mine) {
      int s = static_cast<int>(it % kTmaStages);
      if (it >= static_cast<uint64_t>(kTmaStages)) {
        // The most recent store used this stage (chunk it - kTmaStages): let it finish reading.
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      }
      uint64_t off = (first + it * step) * kTmaChunkBytes;
      uint32_t len = static_cast<uint32_t>(bytes - off < kTmaChunkBytes ? bytes - off : kTmaChunkBytes);
      uint32_t bar = smemAddr(&bars[s]);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(len) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                       smemAddr(tma_stage_smem + static_cast<size_t>(s) * kTmaChunkBytes)),
                   "l"(src + off), "r"(len), "r"(bar)
                   : "memory");
      issued = it + 1;
    }
    if (it + 1 >= static_cast<uint64_t>(kTmaStages)) {
      uint64_t j = it + 1 - kTmaStages;  // the chunk whose load went out kTmaStages - 1 iterations ago
      int s = static_cast<int>(j % kTmaStages);
      uint32_t parity = static_cast<uint32_t>((j / kTmaStages) & 1);
      uint64_t waited = 0;
      if (!tmaWaitChunk(smemAddr(&bars[s]), parity, h.timeout_ns, &waited)) {
        recordFailure(h, DeviceFailure::kTimeout, static_cast<uint32_t>(DeviceWaitKind::kBulkCopy), h.rank, j, 0,
                      waited);
        // Drain the loads still in flight (chunks j .. issued - 1: at most kTmaStages, one per stage), all of
        // them within one more timeout; past that the block exits anyway, there is nothing else to wait with.
        uint64_t budget = h.timeout_ns;
        for (uint64_t k = j; k < issued; ++k) {
          uint64_t spent = 0;
          bool landed = tmaWaitChunk(smemAddr(&bars[k % kTmaStages]), static_cast<uint32_t>((k / kTmaStages) & 1),
                                     budget, &spent);
          budget = spent < budget ? budget - spent : 0;
          if (!landed) break;
        }
        ok = false;
        break;
      }
      uint64_t off = (first + j * step) * kTmaChunkBytes;
      uint32_t len = static_cast<uint32_t>(bytes - off < kTmaChunkBytes ? bytes - off : kTmaChunkBytes);
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + off),
                   "r"(smemAddr(tma_stage_smem + static_cast<size_t>(s) * kTmaChunkBytes)), "r"(len)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
  return ok;
}
#endif

// Contiguous, 16-byte aligned copies only (the host checks; anything else runs the SM body). The last
// bytes % 16 go through ordinary stores of block 0.
__device__ void tmaCopy(const OpHeader& h, const DeviceCopy& c) {
#if defined(GFDIT_TMA_BODY)
  uint8_t* dst = c.dst.ptr + c.dst_off;
  const uint8_t* src = c.src.ptr + c.src_off;
  bool usable = isContiguous(c.dst) && isContiguous(c.src) &&
                ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0;
  if (usable) {
    uint64_t bulk = c.bytes & ~uint64_t{15};
    if (threadIdx.x == 0 && bulk > 0) tmaCopyLane0(h, dst, src, bulk);
    if (blockIdx.x == 0) {
      for (uint64_t b = bulk + threadIdx.x; b < c.bytes; b += blockDim.x) dst[b] = src[b];
    }
    return;
  }
#endif
  smCopy(c);
}

// __launch_bounds__: the SM body runs kSmThreads threads per block (a TMA block runs kTmaThreads, fewer), so
// the compiler must keep registers within what kSmThreads threads can have; prepareKernels checks it. The
// minimum of 1 block per SM leaves the compiler the whole register file (65536 / kSmThreads per thread): with
// the block size alone ptxas 13.0 held opKernel to 40 registers and spilled, where 48 fit without spills.
template <int W, int S>
__global__ void __launch_bounds__(kSmThreads, 1) opKernel(OpArgs<W, S> a, DeviceCopy copy) {
  if (blockWaits(a) && copy.bytes > 0) {
    if (copy.path == static_cast<uint32_t>(KernelCopy::kTma)) {
      tmaCopy(a.h, copy);
    } else if (copy.path == static_cast<uint32_t>(KernelCopy::kSm)) {
      smCopy(copy);
    }
  }
  blockFinish(a);
}

// ---- reductions: the arithmetic of src/collectives/reduce.cpp, bit for bit ----
// NaN payloads aside: where a sum or product meets a NaN, the device's add and mul return the canonical NaN
// (0x7fffffff in float32) while the host's x86 arithmetic returns the NaN operand; either is a NaN, as torch's
// own CUDA reductions give. max and min below return an operand, so they keep its payload on both.

__device__ inline float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return __uint_as_float(bits);
}

__device__ inline uint16_t floatToHalf(float f) {
  uint32_t x = __float_as_uint(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);
  if (abs < 0x38800000u) {
    float scaled = __fmul_rn(__uint_as_float(abs), 16777216.0f);  // exact: a power-of-two scale
    uint32_t q = static_cast<uint32_t>(scaled);
    float rem = __fsub_rn(scaled, static_cast<float>(q));
    if (rem > 0.5f || (rem == 0.5f && (q & 1))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t mant = abs & 0x7fffff;
  uint32_t h = exp << 10 | mant >> 13;
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

__device__ inline float bf16ToFloat(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

__device__ inline uint16_t floatToBf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

// The explicit _rn intrinsics keep nvcc from contracting a product and a sum into one FMA, which would
// round differently from the host.
__device__ inline float addOf(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double addOf(double a, double b) { return __dadd_rn(a, b); }
__device__ inline int32_t addOf(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}
__device__ inline int64_t addOf(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
__device__ inline uint8_t addOf(uint8_t a, uint8_t b) { return static_cast<uint8_t>(a + b); }
__device__ inline float mulOf(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mulOf(double a, double b) { return __dmul_rn(a, b); }
__device__ inline int32_t mulOf(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
}
__device__ inline int64_t mulOf(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
__device__ inline uint8_t mulOf(uint8_t a, uint8_t b) {
  return static_cast<uint8_t>(static_cast<unsigned>(a) * static_cast<unsigned>(b));
}

// max and min propagate NaN (a NaN on either side wins), as reduce.cpp and torch do.
template <typename A>
__device__ inline A applyOp(A a, A b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return addOf(a, b);
    case ReduceOp::kMax: return (a > b || a != a) ? a : b;
    case ReduceOp::kMin: return (a < b || a != a) ? a : b;
    case ReduceOp::kProd: return mulOf(a, b);
  }
  return a;
}

// Storage type S in memory, accumulator type A in registers.
template <typename S, typename A>
struct Elem {
  static __device__ A widen(S s) { return s; }
  static __device__ S narrow(A a) { return a; }
};
struct HalfElem {
  static __device__ float widen(uint16_t s) { return halfToFloat(s); }
  static __device__ uint16_t narrow(float a) { return floatToHalf(a); }
};
struct Bf16Elem {
  static __device__ float widen(uint16_t s) { return bf16ToFloat(s); }
  static __device__ uint16_t narrow(float a) { return floatToBf16(a); }
};

// out[i] = contribs[first][i], then every other contribution applied in member order, through A: the
// same order and rounding as reduce::accInit / accApply / accStore. Whole 16-byte vectors where every
// pointer allows it, element by element otherwise and for the tail. In place (out == contribs[first]) is
// fine: each thread reads its elements before it writes them.
template <typename S, typename A, typename E>
__device__ void reduceBody(const DeviceReduce& r, ReduceOp op) {
  constexpr int kVec = 16 / sizeof(S);
  union Vec {
    uint4 u;
    S s[kVec];
  };
  uint64_t tid = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  uint64_t nthreads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uintptr_t bits = reinterpret_cast<uintptr_t>(r.out);
  for (int j = 0; j < r.n; ++j) bits |= reinterpret_cast<uintptr_t>(r.contribs[j]);
  uint64_t nvec = (bits & 15) == 0 ? r.count / kVec : 0;
  for (uint64_t v = tid; v < nvec; v += nthreads) {
    Vec x;
    x.u = reinterpret_cast<const uint4*>(r.contribs[r.first])[v];
    A acc[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] = E::widen(x.s[e]);
    for (int j = 0; j < r.n; ++j) {
      if (j == r.first) continue;
      Vec y;
      y.u = reinterpret_cast<const uint4*>(r.contribs[j])[v];
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] = applyOp<A>(acc[e], E::widen(y.s[e]), op);
    }
    Vec o;
#pragma unroll
    for (int e = 0; e < kVec; ++e) o.s[e] = E::narrow(acc[e]);
    reinterpret_cast<uint4*>(r.out)[v] = o.u;
  }
  for (uint64_t i = nvec * kVec + tid; i < r.count; i += nthreads) {
    A acc = E::widen(reinterpret_cast<const S*>(r.contribs[r.first])[i]);
    for (int j = 0; j < r.n; ++j) {
      if (j != r.first) acc = applyOp<A>(acc, E::widen(reinterpret_cast<const S*>(r.contribs[j])[i]), op);
    }
    reinterpret_cast<S*>(r.out)[i] = E::narrow(acc);
  }
}

__device__ void reduceAny(const DeviceReduce& r) {
  ReduceOp op = static_cast<ReduceOp>(r.op);
  switch (static_cast<DType>(r.dtype)) {
    case DType::kFloat32: return reduceBody<float, float, Elem<float, float>>(r, op);
    case DType::kFloat16: return reduceBody<uint16_t, float, HalfElem>(r, op);
    case DType::kBFloat16: return reduceBody<uint16_t, float, Bf16Elem>(r, op);
    case DType::kInt32: return reduceBody<int32_t, int32_t, Elem<int32_t, int32_t>>(r, op);
    case DType::kInt64: return reduceBody<int64_t, int64_t, Elem<int64_t, int64_t>>(r, op);
    case DType::kUInt8: return reduceBody<uint8_t, uint8_t, Elem<uint8_t, uint8_t>>(r, op);
    case DType::kFloat64: return reduceBody<double, double, Elem<double, double>>(r, op);
  }
}

// __launch_bounds__: as opKernel's.
template <int W, int S>
__global__ void __launch_bounds__(kSmThreads, 1) reduceKernel(OpArgs<W, S> a, DeviceReduce r) {
  if (blockWaits(a)) reduceAny(r);
  blockFinish(a);
}

template <int W, int S>
OpArgs<W, S> packArgs(const OpHeader& h, const DeviceWait* waits, const DeviceSignal* signals) {
  OpArgs<W, S> a{};
  a.h = h;
  for (int k = 0; k < h.num_waits; ++k) a.waits[k] = waits[k];
  for (int k = 0; k < h.num_signals; ++k) a.signals[k] = signals[k];
  return a;
}

bool fitsSmall(const OpHeader& h) { return h.num_waits <= kSmallOpWaits && h.num_signals <= kSmallOpSignals; }

}  // namespace

cudaError_t launchOp(const OpHeader& h, const DeviceWait* waits, const DeviceSignal* signals, const DeviceCopy& copy,
                     int blocks, cudaStream_t stream) {
  if (h.num_waits < 0 || h.num_waits > kMaxOpWaits || h.num_signals < 0 || h.num_signals > kMaxOpSignals ||
      blocks < 1) {
    return cudaErrorInvalidValue;
  }
  bool tma = copy.path == static_cast<uint32_t>(KernelCopy::kTma) && copy.bytes > 0;
  int threads = copy.path == static_cast<uint32_t>(KernelCopy::kSm) && copy.bytes > 0 ? kSmThreads : kTmaThreads;
  size_t smem = tma ? kTmaSmemBytes : 0;
  if (fitsSmall(h)) {
    opKernel<kSmallOpWaits, kSmallOpSignals>
        <<<blocks, threads, smem, stream>>>(packArgs<kSmallOpWaits, kSmallOpSignals>(h, waits, signals), copy);
  } else {
    opKernel<kMaxOpWaits, kMaxOpSignals>
        <<<blocks, threads, smem, stream>>>(packArgs<kMaxOpWaits, kMaxOpSignals>(h, waits, signals), copy);
  }
  return cudaGetLastError();
}

cudaError_t launchReduce(const OpHeader& h, const DeviceWait* waits, const DeviceSignal* signals,
                         const DeviceReduce& reduce, int blocks, cudaStream_t stream) {
  if (h.num_waits < 0 || h.num_waits > kMaxOpWaits || h.num_signals < 0 || h.num_signals > kMaxOpSignals ||
      blocks < 1 || reduce.n < 1 || reduce.n > kMaxRanks || reduce.first < 0 || reduce.first >= reduce.n) {
    return cudaErrorInvalidValue;
  }
  if (fitsSmall(h)) {
    reduceKernel<kSmallOpWaits, kSmallOpSignals>
        <<<blocks, kSmThreads, 0, stream>>>(packArgs<kSmallOpWaits, kSmallOpSignals>(h, waits, signals), reduce);
  } else {
    reduceKernel<kMaxOpWaits, kMaxOpSignals>
        <<<blocks, kSmThreads, 0, stream>>>(packArgs<kMaxOpWaits, kMaxOpSignals>(h, waits, signals), reduce);
  }
  return cudaGetLastError();
}

namespace {

// Every kernel variant that launchOp / launchReduce use must take the block size they launch it with: a
// launch of more threads than the image allows fails with cudaErrorInvalidValue (or "too many resources"),
// and it would do so in the middle of a collective, after peers already waited on it.
template <typename Kernel>
void checkBlockSize(Kernel kernel, const char* name, int threads) {
  cudaFuncAttributes attr{};
  GFDIT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  GFDIT_CHECK_CODE(kSystemError, attr.maxThreadsPerBlock >= threads)
      << "gfdit: the CUDA transport's " << name << " runs at most " << attr.maxThreadsPerBlock
      << " threads per block on this device (" << attr.numRegs << " registers per thread, image sm_"
      << attr.binaryVersion << " / compute_" << attr.ptxVersion << "), it is launched with " << threads
      << ": rebuild for this device (CMAKE_CUDA_ARCHITECTURES)";
}

}  // namespace

void prepareKernels() {
  GFDIT_CUDA_CHECK(cudaFuncSetAttribute(opKernel<kSmallOpWaits, kSmallOpSignals>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kTmaSmemBytes)));
  GFDIT_CUDA_CHECK(cudaFuncSetAttribute(opKernel<kMaxOpWaits, kMaxOpSignals>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kTmaSmemBytes)));
  constexpr int kMostThreads = kSmThreads > kTmaThreads ? kSmThreads : kTmaThreads;
  checkBlockSize(opKernel<kSmallOpWaits, kSmallOpSignals>, "op kernel (small)", kMostThreads);
  checkBlockSize(opKernel<kMaxOpWaits, kMaxOpSignals>, "op kernel (large)", kMostThreads);
  checkBlockSize(reduceKernel<kSmallOpWaits, kSmallOpSignals>, "reduction kernel (small)", kSmThreads);
  checkBlockSize(reduceKernel<kMaxOpWaits, kMaxOpSignals>, "reduction kernel (large)", kSmThreads);
}

bool tmaKernelActive() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, opKernel<kSmallOpWaits, kSmallOpSignals>) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // ptxVersion is the virtual architecture the running image was compiled from (90 for sm_90 SASS, 80
  // for the compute_80 PTX that the driver compiles for newer devices): only >= 90 has the TMA body.
  return major >= 9 && attr.ptxVersion >= 90;
}

int smCopyBlocks(uint64_t bytes, int max_blocks) {
  // One block per 64 KiB (512 threads x 16 bytes x 4 unrolled loads x 2 rounds), at most max_blocks.
  uint64_t want = (bytes + (64u << 10) - 1) / (64u << 10);
  if (want < 1) want = 1;
  return static_cast<int>(want < static_cast<uint64_t>(max_blocks) ? want : max_blocks);
}

int tmaCopyBlocks(uint64_t bytes, int max_blocks) {
  // Each block keeps kTmaStages chunks in flight; use a block per kTmaStages chunks up to max_blocks.
  uint64_t per_block = uint64_t{kTmaChunkBytes} * kTmaStages;
  uint64_t want = (bytes + per_block - 1) / per_block;
  if (want < 1) want = 1;
  return static_cast<int>(want < static_cast<uint64_t>(max_blocks) ? want : max_blocks);
}

}  // namespace cuda
}  // namespace gfdit
