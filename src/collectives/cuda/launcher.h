// Turns one transport operation (waits, a copy or a reduction, signals) into stream work on the path the
// copy table picked: one op kernel for the SM and TMA paths, a wait kernel + cudaMemcpy(2D)Async + a signal
// kernel for the copy engine. Host only; used by the transport and by the copy-table measurement.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "copy.h"
#include "device_region.h"

namespace gfdit {
namespace cuda {

/// A copy of `bytes` payload bytes from src (at src_off) to dst (at dst_off), in device-accessible memory.
struct CopySpec {
  DeviceView dst{};
  uint64_t dst_off = 0;
  DeviceView src{};
  uint64_t src_off = 0;
  uint64_t bytes = 0;
};

/// A contiguous view of `bytes` at p.
DeviceView deviceView(void* p, uint64_t bytes);
/// A view from the engine's BufferView.
DeviceView deviceView(const BufferView& v);

/// The path a copy actually takes: `wanted` unless the copy does not fit it (TMA: contiguous and 16-byte
/// aligned on both sides; copy engine: contiguous, or whole rows of one row length), then the SM kernel.
CopyPath effectivePath(const CopySpec& c, CopyPath wanted, bool tma_active);

/// Enqueues operations of one rank; see NOTE [op kernels] in kernels.cu. Not thread-safe: one collective at
/// a time, as the world runs them.
class OpLauncher {
 public:
  /// `own`: this rank's DeviceSignals (device pointer); `record`: device pointer of the host-mapped record.
  OpLauncher(DeviceSignals* own, ErrorRecord* record, int rank, uint64_t timeout_ns, int max_sm_blocks,
             int max_tma_blocks, bool tma_active);

  void setTimeout(uint64_t timeout_ns) { timeout_ns_ = timeout_ns; }
  bool tmaActive() const { return tma_active_; }

  /// waits -> copy on `path` (if copy != nullptr and bytes > 0) -> signals, on stream.
  void copyOp(DeviceOp op, const std::vector<DeviceWait>& waits, const CopySpec* copy, CopyPath path,
              const std::vector<DeviceSignal>& signals, cudaStream_t stream);
  /// waits -> reduction -> signals, on stream.
  void reduceOp(DeviceOp op, const std::vector<DeviceWait>& waits, const DeviceReduce& reduce,
                const std::vector<DeviceSignal>& signals, cudaStream_t stream);
  /// Operations enqueued so far.
  uint64_t numOps() const { return op_index_; }

 private:
  OpHeader header(DeviceOp op, int num_waits, int num_signals, int blocks) const;
  void launch(DeviceOp op, const DeviceWait* waits, int num_waits, const DeviceSignal* signals, int num_signals,
              const DeviceCopy& copy, int blocks, cudaStream_t stream);
  // Waits beyond one kernel's capacity go into wait-only kernels before the operation.
  int leadingWaits(DeviceOp op, const std::vector<DeviceWait>& waits, cudaStream_t stream);
  void trailingSignals(DeviceOp op, const std::vector<DeviceSignal>& signals, size_t from, cudaStream_t stream);
  void copyEngine(const CopySpec& c, cudaStream_t stream);

  DeviceSignals* own_;
  ErrorRecord* record_;
  int rank_;
  uint64_t timeout_ns_;
  int max_sm_blocks_;
  int max_tma_blocks_;
  bool tma_active_;
  unsigned long long arrivals_ = 0;  // DeviceSignals::arrivals once every launch so far has run
  uint64_t op_index_ = 0;
};

}  // namespace cuda
}  // namespace gfdit
