#include "launcher.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_check.h"
#include "kernels.h"

namespace gfdit {
namespace cuda {

DeviceView deviceView(void* p, uint64_t bytes) { return DeviceView{static_cast<uint8_t*>(p), 1, bytes, bytes}; }

DeviceView deviceView(const BufferView& v) {
  return DeviceView{static_cast<uint8_t*>(v.ptr), v.rows, v.row_bytes, v.stride};
}

namespace {

bool contiguous(const DeviceView& v) { return v.rows <= 1 || v.stride == v.row_bytes; }

// A copy that the copy engine does as one call: both sides contiguous (cudaMemcpyAsync), or the copied
// range is whole rows of the same length on both sides (cudaMemcpy2DAsync; a contiguous side is rows of
// that length back to back).
struct CeShape {
  bool ok = false;
  bool flat = false;
  uint8_t* dst = nullptr;
  const uint8_t* src = nullptr;
  size_t dpitch = 0, spitch = 0, width = 0, height = 0;
};

CeShape ceShape(const CopySpec& c) {
  CeShape s;
  bool dc = contiguous(c.dst), sc = contiguous(c.src);
  if (dc && sc) {
    s.ok = s.flat = true;
    s.dst = c.dst.ptr + c.dst_off;
    s.src = c.src.ptr + c.src_off;
    return s;
  }
  uint64_t row = !dc ? c.dst.row_bytes : c.src.row_bytes;
  if (row == 0 || c.bytes % row != 0) return s;
  if (!dc && (c.dst_off % row != 0)) return s;
  if (!sc && (c.src.row_bytes != row || c.src_off % row != 0)) return s;
  s.ok = true;
  s.width = row;
  s.height = c.bytes / row;
  s.dst = dc ? c.dst.ptr + c.dst_off : c.dst.ptr + (c.dst_off / row) * c.dst.stride;
  s.dpitch = dc ? row : c.dst.stride;
  s.src = sc ? c.src.ptr + c.src_off : c.src.ptr + (c.src_off / row) * c.src.stride;
  s.spitch = sc ? row : c.src.stride;
  return s;
}

bool tmaFits(const CopySpec& c) {
  if (!contiguous(c.dst) || !contiguous(c.src)) return false;
  auto d = reinterpret_cast<uintptr_t>(c.dst.ptr + c.dst_off), s = reinterpret_cast<uintptr_t>(c.src.ptr + c.src_off);
  return ((d | s) & 15) == 0;
}

DeviceCopy kernelCopy(const CopySpec& c, KernelCopy path) {
  DeviceCopy k{};
  k.dst = c.dst;
  k.dst_off = c.dst_off;
  k.src = c.src;
  k.src_off = c.src_off;
  k.bytes = c.bytes;
  k.path = static_cast<uint32_t>(path);
  return k;
}

}  // namespace

CopyPath effectivePath(const CopySpec& c, CopyPath wanted, bool tma_active) {
  if (wanted == CopyPath::kCudaTma && (!tma_active || !tmaFits(c))) return CopyPath::kCudaSm;
  if (wanted == CopyPath::kCudaCe && !ceShape(c).ok) return CopyPath::kCudaSm;
  if (!isDevicePath(wanted)) return CopyPath::kCudaSm;
  return wanted;
}

OpLauncher::OpLauncher(DeviceSignals* own, ErrorRecord* record, int rank, uint64_t timeout_ns, int max_sm_blocks,
                       int max_tma_blocks, bool tma_active)
    : own_(own),
      record_(record),
      rank_(rank),
      timeout_ns_(timeout_ns),
      max_sm_blocks_(std::max(1, max_sm_blocks)),
      max_tma_blocks_(std::max(1, max_tma_blocks)),
      tma_active_(tma_active) {}

OpHeader OpLauncher::header(DeviceOp op, int num_waits, int num_signals, int blocks) const {
  OpHeader h{};
  h.own_failed = &own_->failed;
  h.record = record_;
  h.arrivals = &own_->arrivals;
  h.last_arrival = arrivals_ + static_cast<unsigned long long>(blocks) - 1;
  h.timeout_ns = timeout_ns_;
  h.op_index = op_index_;
  h.rank = rank_;
  h.op = static_cast<uint32_t>(op);
  h.num_waits = num_waits;
  h.num_signals = num_signals;
  return h;
}

void OpLauncher::launch(DeviceOp op, const DeviceWait* waits, int num_waits, const DeviceSignal* signals,
                        int num_signals, const DeviceCopy& copy, int blocks, cudaStream_t stream) {
  OpHeader h = header(op, num_waits, num_signals, blocks);
  GFDIT_CUDA_CHECK(launchOp(h, waits, signals, copy, blocks, stream));
  // Only a launch that was enqueued will add its blocks to the device counter.
  arrivals_ += static_cast<unsigned long long>(blocks);
}

int OpLauncher::leadingWaits(DeviceOp op, const std::vector<DeviceWait>& waits, cudaStream_t stream) {
  int n = static_cast<int>(waits.size());
  int done = 0;
  DeviceCopy none{};
  while (n - done > kMaxOpWaits) {
    launch(op, waits.data() + done, kMaxOpWaits, nullptr, 0, none, 1, stream);
    done += kMaxOpWaits;
  }
  return done;
}

void OpLauncher::trailingSignals(DeviceOp op, const std::vector<DeviceSignal>& signals, size_t from,
                                 cudaStream_t stream) {
  DeviceCopy none{};
  while (from < signals.size()) {
    int n = static_cast<int>(std::min<size_t>(kMaxOpSignals, signals.size() - from));
    launch(op, nullptr, 0, signals.data() + from, n, none, 1, stream);
    from += static_cast<size_t>(n);
  }
}

void OpLauncher::copyEngine(const CopySpec& c, cudaStream_t stream) {
  CeShape s = ceShape(c);
  GFDIT_CHECK_CODE(kInternal, s.ok) << "gfdit: copy-engine path for a copy it cannot do";
  // cudaMemcpyDefault: with unified addressing the runtime knows both sides (own or IPC-mapped memory).
  if (s.flat) {
    GFDIT_CUDA_CHECK(cudaMemcpyAsync(s.dst, s.src, c.bytes, cudaMemcpyDefault, stream));
  } else {
    GFDIT_CUDA_CHECK(cudaMemcpy2DAsync(s.dst, s.dpitch, s.src, s.spitch, s.width, s.height, cudaMemcpyDefault, stream));
  }
}

void OpLauncher::copyOp(DeviceOp op, const std::vector<DeviceWait>& waits, const CopySpec* copy, CopyPath path,
                        const std::vector<DeviceSignal>& signals, cudaStream_t stream) {
  ++op_index_;
  int first = leadingWaits(op, waits, stream);
  int nw = static_cast<int>(waits.size()) - first;
  const DeviceWait* w = waits.data() + first;
  int ns = static_cast<int>(std::min<size_t>(kMaxOpSignals, signals.size()));
  bool has_copy = copy != nullptr && copy->bytes > 0;
  CopyPath p = has_copy ? effectivePath(*copy, path, tma_active_) : CopyPath::kCudaSm;
  if (has_copy && p == CopyPath::kCudaCe) {
    // Stream order makes the memcpy start after the wait kernel ends and the signal kernel start after
    // the memcpy completed; the signal kernel's fence.sc.sys + st.release.sys then publish its bytes. A
    // memcpy cannot be skipped after a failed wait: see NOTE [cuda transport handshake] for why a reader
    // never uses bytes it may overwrite.
    DeviceCopy none{};
    if (nw > 0) launch(op, w, nw, nullptr, 0, none, 1, stream);
    copyEngine(*copy, stream);
    if (ns > 0) launch(op, nullptr, 0, signals.data(), ns, none, 1, stream);
  } else if (has_copy) {
    KernelCopy k = p == CopyPath::kCudaTma ? KernelCopy::kTma : KernelCopy::kSm;
    int blocks =
        k == KernelCopy::kTma ? tmaCopyBlocks(copy->bytes, max_tma_blocks_) : smCopyBlocks(copy->bytes, max_sm_blocks_);
    launch(op, w, nw, signals.data(), ns, kernelCopy(*copy, k), blocks, stream);
  } else if (nw > 0 || ns > 0) {
    DeviceCopy none{};
    launch(op, w, nw, signals.data(), ns, none, 1, stream);
  }
  trailingSignals(op, signals, static_cast<size_t>(ns), stream);
}

void OpLauncher::reduceOp(DeviceOp op, const std::vector<DeviceWait>& waits, const DeviceReduce& reduce,
                          const std::vector<DeviceSignal>& signals, cudaStream_t stream) {
  ++op_index_;
  int first = leadingWaits(op, waits, stream);
  int nw = static_cast<int>(waits.size()) - first;
  int ns = static_cast<int>(std::min<size_t>(kMaxOpSignals, signals.size()));
  uint64_t bytes = reduce.count * dtypeSize(static_cast<DType>(reduce.dtype));
  int blocks = smCopyBlocks(bytes, max_sm_blocks_);
  OpHeader h = header(op, nw, ns, blocks);
  GFDIT_CUDA_CHECK(launchReduce(h, waits.data() + first, signals.data(), reduce, blocks, stream));
  arrivals_ += static_cast<unsigned long long>(blocks);
  trailingSignals(op, signals, static_cast<size_t>(ns), stream);
}

}  // namespace cuda
}  // namespace gfdit
