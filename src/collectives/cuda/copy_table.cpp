// The device copy table: its built-in defaults, the override, and a measurement on the device at hand.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "cuda_check.h"
#include "cuda_transport.h"
#include "device_region.h"
#include "error_record.h"
#include "gfdit/settings.h"
#include "kernels.h"
#include "launcher.h"

namespace gfdit {
namespace cuda {

// The defaults are estimates from public figures, not measurements of this code; measureCopyTable
// (`gfdit profile --collectives`) replaces them with the device's own:
//  - up to 64 KiB, the SM kernel: a message is then latency-bound (64 KiB takes ~0.15 us at NVLink 4's
//    450 GB/s per direction, H100/H200 SXM datasheets), and the SM path is one fused launch (wait, copy,
//    signal) where the copy engine needs three stream operations (a wait kernel, the memcpy, a signal
//    kernel) at a few microseconds each (typical CUDA launch and cudaMemcpyAsync overheads on Hopper);
//  - up to 16 MiB, TMA bulk copies: one warp per block keeps 64 KiB in flight (4 stages of 16 KiB), so 16
//    blocks carry the link's bandwidth while leaving the other SMs to compute (DeepEP's intranode kernels
//    on Hopper reach near NVLink line rate with about 20 SMs using TMA); staged messages never exceed a
//    slot (4 MiB by default), so this covers every staged message;
//  - above, the copy engine: no SMs at all, and its ~10 us of extra fixed cost is under a fifth of a
//    16 MiB transfer at ~400 GB/s (what copy-engine peer copies reach of NVLink 4 in NVIDIA's
//    nvbandwidth measurements).
// Without TMA (no sm_90 image, or an older device) the tma entry becomes sm.
const char* defaultCopyTable() { return settings::cudaDefaultCopyTable(); }

CopySelector resolveCopyTable(const std::string& option, bool tma_available) {
  std::string spec = option;
  const char* source = "CudaTransportOptions::copy_table";
  if (spec.empty()) {
    const char* env = settings::cudaCopyTable();
    if (env != nullptr && *env != '\0') {
      spec = env;
      source = "GFDIT_CUDA_COPY_TABLE";
    } else {
      spec = defaultCopyTable();
      source = "the default table";
    }
  }
  CopySelector sel = CopySelector::parse(spec);
  GFDIT_CHECK(sel.isDevice()) << "gfdit: " << source << " '" << spec
                              << "' names host paths; a CUDA table takes sm, ce and tma";
  if (!tma_available) sel = sel.replaced(CopyPath::kCudaTma, CopyPath::kCudaSm);
  return sel;
}

namespace {

// Frees what the measurement allocated, however it ends.
struct MeasureResources {
  DeviceSignals* signals = nullptr;
  ErrorRecord* record = nullptr;
  uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~MeasureResources() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (src != nullptr) cudaFree(src);
    if (dst != nullptr) cudaFree(dst);
    if (signals != nullptr) cudaFree(signals);
    if (record != nullptr) cudaFreeHost(record);
    cudaGetLastError();
  }
};

}  // namespace

CopyMeasurement measureCopyTable(int device, size_t min_bytes, size_t max_bytes, int iterations) {
  GFDIT_CHECK(min_bytes > 0 && max_bytes >= min_bytes && iterations > 0)
      << "gfdit: measureCopyTable needs 0 < min_bytes <= max_bytes and iterations > 0";
  int count = deviceCount();
  GFDIT_CHECK_CODE(kSystemError, count > 0) << "gfdit: no CUDA device to measure copy paths on";
  GFDIT_CHECK(device >= 0 && device < count) << "gfdit: CUDA device " << device << " does not exist";
  GFDIT_CUDA_CHECK(cudaSetDevice(device));
  prepareKernels();
  bool tma = tmaKernelActive();
  CopyMeasurement m;
  m.device = device;
  cudaDeviceProp prop{};
  GFDIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  m.device_name = prop.name;

  MeasureResources res;
  void* p = nullptr;
  GFDIT_CUDA_CHECK(cudaMalloc(&p, sizeof(DeviceSignals)));
  res.signals = static_cast<DeviceSignals*>(p);
  GFDIT_CUDA_CHECK(cudaMemset(p, 0, sizeof(DeviceSignals)));
  GFDIT_CUDA_CHECK(cudaHostAlloc(&p, sizeof(ErrorRecord), cudaHostAllocMapped));
  res.record = static_cast<ErrorRecord*>(p);
  std::memset(res.record, 0, sizeof(ErrorRecord));
  void* record_dev = nullptr;
  GFDIT_CUDA_CHECK(cudaHostGetDevicePointer(&record_dev, res.record, 0));
  GFDIT_CUDA_CHECK(cudaMalloc(&p, max_bytes));
  res.src = static_cast<uint8_t*>(p);
  GFDIT_CUDA_CHECK(cudaMalloc(&p, max_bytes));
  res.dst = static_cast<uint8_t*>(p);
  GFDIT_CUDA_CHECK(cudaMemset(res.src, 0x5a, max_bytes));
  GFDIT_CUDA_CHECK(cudaStreamCreateWithFlags(&res.stream, cudaStreamNonBlocking));
  GFDIT_CUDA_CHECK(cudaEventCreate(&res.start));
  GFDIT_CUDA_CHECK(cudaEventCreate(&res.stop));
  int max_sm = settings::cudaCopyBlocksToMeasure();
  OpLauncher launcher(res.signals, static_cast<ErrorRecord*>(record_dev), 0, uint64_t{10} * 1000000000ull, max_sm, 16,
                      tma);

  uint64_t value = 0;
  // One message as the transport sends it: a wait that is already satisfied, the copy, a signal.
  auto message = [&](CopyPath path, size_t bytes) {
    std::vector<DeviceWait> waits{
        DeviceWait{&res.signals->consumed[0].value, 0, nullptr, 0, static_cast<uint32_t>(DeviceWaitKind::kConsumed)}};
    std::vector<DeviceSignal> signals{
        DeviceSignal{&res.signals->ready[0].value, ++value, nullptr, 0, static_cast<uint32_t>(DeviceWaitKind::kReady)}};
    CopySpec c;
    c.dst = deviceView(res.dst, bytes);
    c.src = deviceView(res.src, bytes);
    c.bytes = bytes;
    launcher.copyOp(DeviceOp::kCopyLocal, waits, &c, path, signals, res.stream);
  };
  auto time = [&](CopyPath path, size_t bytes) {
    for (int w = 0; w < 2; ++w) message(path, bytes);
    GFDIT_CUDA_CHECK(cudaEventRecord(res.start, res.stream));
    for (int it = 0; it < iterations; ++it) message(path, bytes);
    GFDIT_CUDA_CHECK(cudaEventRecord(res.stop, res.stream));
    GFDIT_CUDA_CHECK(cudaEventSynchronize(res.stop));
    float ms = 0;
    GFDIT_CUDA_CHECK(cudaEventElapsedTime(&ms, res.start, res.stop));
    return static_cast<double>(ms) * 1000.0 / iterations;
  };

  std::vector<std::pair<size_t, CopyPath>> entries;
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes = bytes > max_bytes / 4 ? max_bytes + 1 : bytes * 4) {
    CopyTiming t;
    t.bytes = bytes;
    t.sm_us = time(CopyPath::kCudaSm, bytes);
    if (tma) t.tma_us = time(CopyPath::kCudaTma, bytes);
    t.ce_us = time(CopyPath::kCudaCe, bytes);
    t.best = CopyPath::kCudaSm;
    double best = t.sm_us;
    if (t.tma_us >= 0 && t.tma_us < best) {
      best = t.tma_us;
      t.best = CopyPath::kCudaTma;
    }
    if (t.ce_us < best) t.best = CopyPath::kCudaCe;
    m.timings.push_back(t);
    if (!entries.empty() && entries.back().second == t.best) {
      entries.back().first = bytes;  // the run of sizes with this path reaches this size
    } else {
      entries.emplace_back(bytes, t.best);
    }
  }
  GFDIT_CUDA_CHECK(cudaStreamSynchronize(res.stream));
  if (__atomic_load_n(&res.record->state, __ATOMIC_ACQUIRE) != 0) {
    throw Error(errorCodeOf(*res.record), formatError(*res.record));
  }
  m.table = CopySelector::fromEntries(std::move(entries)).toString();
  return m;
}

}  // namespace cuda
}  // namespace gfdit
