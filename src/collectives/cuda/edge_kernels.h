// Launchers of the device side of the edge protocol (see NOTE [edge sequence numbers] in edge.h).
// Host code calls these with raw pointers and a stream; kernel bodies stay in edge_kernels.cu.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gfdit {
namespace cuda {

/// Number of CUDA devices visible (0 without a driver or GPU).
int deviceCount();
/// CUDA runtime version as 1000 * major + 10 * minor (0 if unknown).
int runtimeVersion();
/// SM copy of `bytes` from src to dst, then `*signal = value` with release at system scope.
/// All pointers must be device-accessible (device memory or IPC-mapped peer memory).
void launchPutWithSignal(void* dst, const void* src, size_t bytes, uint64_t* signal, uint64_t value, void* stream);
/// Blocks the stream until `*signal >= value` (acquire at system scope).
void launchWaitSignal(const uint64_t* signal, uint64_t value, void* stream);

}  // namespace cuda
}  // namespace gfdit
