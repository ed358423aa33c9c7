// The CUDA transport of the edge protocol: device staging ring and heap in one cudaMalloc region per rank,
// shared with every peer through CUDA IPC, operations enqueued on the collective's stream with the
// device-side half of the handshake (NOTE [transports] in transport.h, NOTE [cuda transport handshake] in
// device_region.h). This header is plain C++ (no CUDA headers): the world code includes it as is.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "copy.h"
#include "gfdit/store.h"
#include "transport.h"

namespace gfdit {

/// Settings of a CUDA transport; zero or empty means "choose a default" (the environment, then built in).
struct CudaTransportOptions {
  /// Bound on every device wait (the world's timeout).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// Bytes of one staging slot (GFDIT_CUDA_SLOT_BYTES, else 4 MiB), rounded up to 4 KiB.
  size_t slot_bytes = 0;
  /// Staging slots (GFDIT_CUDA_NUM_SLOTS, else 4 per peer between 8 and 64), never fewer than
  /// world_size - 1 (NOTE [staging rounds]) or 2.
  size_t num_slots = 0;
  /// Bytes of the device heap (zero-copy tensors); every rank must use the same size.
  size_t heap_bytes = size_t{256} << 20;
  /// Copy path by message size, in CopySelector::parse's format with device paths ("65536:sm,inf:ce");
  /// empty: GFDIT_CUDA_COPY_TABLE, else cuda::defaultCopyTable().
  std::string copy_table;
  /// Most blocks of an SM copy or reduction (GFDIT_CUDA_COPY_BLOCKS, else 32) and of a TMA copy (16).
  int max_sm_blocks = 0;
  int max_tma_blocks = 0;
};

/// A Transport whose bytes live in device memory; see NOTE [transports].
class CudaTransport : public Transport {
 public:
  /// The CUDA device of this rank.
  virtual int device() const = 0;
  /// Allocates `bytes` of this rank's device heap (first fit, 256-byte aligned): the same sequence of
  /// calls gives the same offsets on every rank. Throws kInvalidUsage when the heap is exhausted.
  virtual void* heapAlloc(size_t bytes) = 0;
  /// Returns a block of heapAlloc.
  virtual void heapFree(void* ptr) = 0;
  /// Offset of a heap pointer from the start of the heap (the same on every rank for symmetric tensors).
  virtual size_t heapOffset(const void* ptr) const = 0;
  /// Bytes of the heap.
  virtual size_t heapBytes() const = 0;
  /// Throws what a device operation recorded (kTimeout for a wait that timed out, kRemoteError when a
  /// peer's transport failed, naming edge, peer and message); every later call throws it again.
  virtual void checkErrors() = 0;
  /// Stops this rank's device operations: those in flight give up their waits, later ones do nothing,
  /// and peers waiting on this rank fail at once (their checkErrors reports it).
  virtual void abort() = 0;
  /// Changes the bound on device waits (for operations enqueued from now on).
  virtual void setTimeout(std::chrono::milliseconds timeout) = 0;
  /// The copy table in force (device paths; tma replaced by sm where this build or device has no TMA).
  virtual const CopySelector& copyTable() const = 0;
  /// Launches the operation held back for fusion (see flush in transport.h); end() does too.
  void flush() override = 0;
  /// Blocks the host until everything this transport enqueued has run (bounded by the device waits'
  /// timeout), then reports errors as checkErrors does.
  virtual void synchronize() = 0;
};

/// Creates rank `rank`'s CUDA transport on CUDA device `device`: allocates its region, publishes its IPC
/// handle under `key_prefix` in `store` and opens every peer's. Collective over all ranks. The CUDA
/// context is created here (after any fork), and `device` stays the calling thread's current device; the
/// transport's later calls that launch or allocate make `device` current for their duration and restore the
/// caller's. Every rank must pass the same sizes and table.
std::unique_ptr<CudaTransport> makeCudaTransport(int rank, int world_size, int device, Store& store,
                                                 const std::string& key_prefix,
                                                 const CudaTransportOptions& options = {});

namespace cuda {

/// Number of CUDA devices visible (0 without a driver or GPU). Initialises CUDA in this process: call it
/// in the process that will use CUDA, never in a parent before fork.
int deviceCount();
/// Why deviceCount() is 0 ("" when there are devices): CUDA's message, e.g. a driver older than this
/// runtime (which needs the driver of its CUDA major version) or no driver at all.
std::string deviceStatus();
/// CUDA runtime version as 1000 * major + 10 * minor (0 if unknown).
int runtimeVersion();

/// What this build compiled in.
struct BuildFeatures {
  std::string cuda_version;     // the toolkit's, e.g. "13.0.88"
  std::string architectures;    // CMAKE_CUDA_ARCHITECTURES, e.g. "90-real;80-virtual"
  bool tma = false;             // the op kernel has a TMA body (an sm_90 or newer target)
  bool nvshmem = false;         // NVSHMEM found at build time and compiled in
  std::string nvshmem_version;  // e.g. "3.8.0", empty without NVSHMEM
};
BuildFeatures buildFeatures();
/// The architecture of the kernel image the driver runs on a device of compute capability `cc` (10 * major
/// + minor) from targets `architectures` (CMake's form, ',' or ';' separated: "90-real", "80-virtual",
/// "86" = both): a SASS target of the same major and at most cc (the highest), else the highest PTX target
/// at most cc (compiled just in time); 0 when none runs there.
int imageArchFor(const std::string& architectures, int cc);
/// Whether TMA copies would run on `device` with this build: its image (imageArchFor) is sm_90 or newer.
/// Reads the device's compute capability only (no CUDA context is created); false without a device.
bool tmaExpectedOnDevice(int device);

/// The built-in device copy table (see copy_table.cpp for where its numbers come from).
const char* defaultCopyTable();
/// The device table in force: `option` if non-empty, else GFDIT_CUDA_COPY_TABLE if set, else the default;
/// refuses host paths; tma becomes sm unless `tma_available`.
CopySelector resolveCopyTable(const std::string& option, bool tma_available);

/// One size of a copy-path measurement: microseconds per message of each path (negative: not measured).
struct CopyTiming {
  size_t bytes = 0;
  double sm_us = -1;
  double tma_us = -1;
  double ce_us = -1;
  CopyPath best = CopyPath::kCudaSm;
};

/// What measureCopyTable found.
struct CopyMeasurement {
  int device = 0;
  std::string device_name;
  std::vector<CopyTiming> timings;
  std::string table;  // in CopySelector::parse's format
};

/// Times each copy path as the transport runs it (the SM and TMA paths one fused kernel with a wait and a
/// signal, the copy engine a wait kernel, cudaMemcpyAsync and a signal kernel) on device memory of
/// `device`, at sizes min_bytes, 4 * min_bytes, ... up to max_bytes, and returns the table of the fastest
/// path per size. Throws kSystemError without a device.
CopyMeasurement measureCopyTable(int device, size_t min_bytes = size_t{4} << 10, size_t max_bytes = size_t{256} << 20,
                                 int iterations = 20);

}  // namespace cuda
}  // namespace gfdit
