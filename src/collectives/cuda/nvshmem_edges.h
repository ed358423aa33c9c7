// One-sided puts with signal over NVSHMEM, for edges that cross nodes (CUDA IPC only reaches one node).
// Compiled in when CMake finds NVSHMEM (cmake/nvshmem.cmake); otherwise create() refuses.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gfdit/store.h"

namespace gfdit {
namespace cuda {

/// NVSHMEM with one PE per rank: a symmetric heap, and one signal word per peer (signals[p], in every
/// PE's symmetric memory, counts p's puts to it; values only grow, as edge sequence numbers do).
class NvshmemEdges {
 public:
  /// Bootstraps NVSHMEM through `store`: rank 0 draws a unique id (nvshmemx_get_uniqueid) and publishes it
  /// under key_prefix, every rank initialises with it (NVSHMEMX_INIT_WITH_UNIQUEID). Collective; at most
  /// one per process (NVSHMEM is process-global). Throws kInvalidUsage when NVSHMEM is not compiled in.
  static std::unique_ptr<NvshmemEdges> create(int rank, int world_size, int device, Store& store,
                                              const std::string& key_prefix, std::chrono::milliseconds timeout);
  virtual ~NvshmemEdges() = default;

  /// Symmetric allocation (nvshmem_malloc: collective, same size on every rank).
  virtual void* symmetricAlloc(size_t bytes) = 0;
  /// Collective free of symmetricAlloc's memory.
  virtual void symmetricFree(void* ptr) = 0;
  /// Enqueues on `stream`: `bytes` from src (device memory) into the symmetric address `dst` on `peer`, then
  /// peer's signals[self] = value (NVSHMEM_SIGNAL_SET, ordered after the data by NVSHMEM).
  virtual void putWithSignal(int peer, void* dst, const void* src, size_t bytes, uint64_t value, void* stream) = 0;
  /// Enqueues on `stream` a bounded wait for signals[peer] >= value (ld.acquire.sys on this PE's word).
  virtual void waitSignal(int peer, uint64_t value, void* stream) = 0;
  /// Throws what a wait recorded (kTimeout naming the peer and value), as CudaTransport::checkErrors.
  virtual void checkErrors() = 0;
};

}  // namespace cuda
}  // namespace gfdit
