// Launchers of the CUDA transport's kernels (kernels.cu). Host code passes plain records (device_region.h)
// and a stream; kernel bodies stay in kernels.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device_region.h"

namespace gfdit {
namespace cuda {

/// Threads of an SM copy / reduction block, and of a TMA block (one warp: lane 0 drives the bulk copies).
constexpr int kSmThreads = 512;
constexpr int kTmaThreads = 32;
/// TMA bulk copies go global -> shared -> global in chunks of kTmaChunkBytes, kTmaStages in flight per block.
constexpr uint32_t kTmaChunkBytes = 16384;
constexpr int kTmaStages = 4;
constexpr size_t kTmaSmemBytes = size_t{kTmaChunkBytes} * kTmaStages;

/// One op kernel on `stream`: every block waits (NOTE [op kernels]), copies its share of `copy` (if
/// copy.path != kNone), and the last block to finish stores the signals. h.last_arrival must be the
/// arrivals counter's value before this launch plus blocks - 1. Returns the launch's error.
cudaError_t launchOp(const OpHeader& h, const DeviceWait* waits, const DeviceSignal* signals, const DeviceCopy& copy,
                     int blocks, cudaStream_t stream);
/// Like launchOp with a reduction as the body.
cudaError_t launchReduce(const OpHeader& h, const DeviceWait* waits, const DeviceSignal* signals,
                         const DeviceReduce& reduce, int blocks, cudaStream_t stream);
/// Once per process and device (the current one), before the first launch: lets the op kernels use the TMA
/// stages' dynamic shared memory and checks that every kernel variant takes the block size it is launched
/// with. Throws gfdit::Error (kSystemError) otherwise.
void prepareKernels();
/// Whether the op kernel image that runs on the current device has the TMA body (compiled for sm_90 or
/// newer, on a device of compute capability 9.0 or newer); elsewhere a TMA copy runs the SM body.
bool tmaKernelActive();
/// Blocks of an SM copy of `bytes` (at most max_blocks) and of a TMA copy.
int smCopyBlocks(uint64_t bytes, int max_blocks);
int tmaCopyBlocks(uint64_t bytes, int max_blocks);

}  // namespace cuda
}  // namespace gfdit
