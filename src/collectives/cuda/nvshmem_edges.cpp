#include "nvshmem_edges.h"

#include "gfdit/error.h"

#if defined(GFDIT_WITH_NVSHMEM)
#include <cuda_runtime.h>
#include <host/nvshmemx_api.h>
#include <nvshmem_host.h>

#include <cstring>
#include <vector>

#include "cuda_check.h"
#include "device_region.h"
#include "error_record.h"
#include "ipc.h"
#include "launcher.h"
#endif

namespace gfdit {
namespace cuda {

#if defined(GFDIT_WITH_NVSHMEM)
namespace {

class NvshmemEdgesImpl final : public NvshmemEdges {
 public:
  NvshmemEdgesImpl(int rank, int world_size) : rank_(rank), size_(world_size) {}

  ~NvshmemEdgesImpl() override {
    if (signals_ != nullptr) nvshmem_free(signals_);
    if (initialised_) nvshmemx_hostlib_finalize();
    if (local_ != nullptr) cudaFree(local_);
    if (record_ != nullptr) cudaFreeHost(record_);
    cudaGetLastError();
  }

  void setup(int device, Store& store, const std::string& key_prefix, std::chrono::milliseconds timeout) {
    GFDIT_CUDA_CHECK(cudaSetDevice(device));
    nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
    std::string key = key_prefix + "/nvshmem-uid";
    if (rank_ == 0) {
      GFDIT_CHECK_CODE(kSystemError, nvshmemx_get_uniqueid(&id) == 0) << "gfdit: nvshmemx_get_uniqueid failed";
      store.set(key, hexEncode(&id, sizeof(id)));
    } else {
      hexDecode(store.get(key), &id, sizeof(id));
    }
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    GFDIT_CHECK_CODE(kSystemError, nvshmemx_set_attr_uniqueid_args(rank_, size_, &id, &attr) == 0)
        << "gfdit: nvshmemx_set_attr_uniqueid_args failed";
    // The host library's own initialisation: nothing here calls NVSHMEM from device code, so the device
    // library (libnvshmem_device.a, which needs relocatable device code) is not linked.
    GFDIT_CHECK_CODE(kSystemError, nvshmemx_hostlib_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) == 0)
        << "gfdit: nvshmemx_hostlib_init_attr failed";
    initialised_ = true;
    GFDIT_CHECK_CODE(kSystemError, nvshmem_my_pe() == rank_ && nvshmem_n_pes() == size_)
        << "gfdit: NVSHMEM gave PE " << nvshmem_my_pe() << " of " << nvshmem_n_pes() << " to rank " << rank_ << " of "
        << size_;
    signals_ = static_cast<uint64_t*>(nvshmem_calloc(static_cast<size_t>(size_), sizeof(uint64_t)));
    GFDIT_CHECK_CODE(kSystemError, signals_ != nullptr) << "gfdit: nvshmem_calloc of the signal words failed";
    // The bounded waits' own failure state and record (local memory: nothing here is shared).
    void* p = nullptr;
    GFDIT_CUDA_CHECK(cudaMalloc(&p, sizeof(DeviceSignals)));
    local_ = static_cast<DeviceSignals*>(p);
    GFDIT_CUDA_CHECK(cudaMemset(p, 0, sizeof(DeviceSignals)));
    GFDIT_CUDA_CHECK(cudaHostAlloc(&p, sizeof(ErrorRecord), cudaHostAllocMapped));
    record_ = static_cast<ErrorRecord*>(p);
    std::memset(record_, 0, sizeof(ErrorRecord));
    void* record_dev = nullptr;
    GFDIT_CUDA_CHECK(cudaHostGetDevicePointer(&record_dev, p, 0));
    launcher_ = std::make_unique<OpLauncher>(local_, static_cast<ErrorRecord*>(record_dev), rank_,
                                             static_cast<uint64_t>(timeout.count()) * 1000000ull, 1, 1, false);
    nvshmem_barrier_all();  // every PE's signal words exist before anyone puts
  }

  void* symmetricAlloc(size_t bytes) override {
    void* p = nvshmem_malloc(bytes);
    GFDIT_CHECK(p != nullptr || bytes == 0) << "gfdit: nvshmem_malloc of " << bytes << " bytes failed";
    return p;
  }

  void symmetricFree(void* ptr) override { nvshmem_free(ptr); }

  void putWithSignal(int peer, void* dst, const void* src, size_t bytes, uint64_t value, void* stream) override {
    GFDIT_CHECK(peer >= 0 && peer < size_ && peer != rank_) << "gfdit: put to rank " << peer;
    // NVSHMEM orders the signal update after the data at the target (put-with-signal semantics).
    nvshmemx_putmem_signal_on_stream(dst, src, bytes, &signals_[rank_], value, NVSHMEM_SIGNAL_SET, peer,
                                     static_cast<cudaStream_t>(stream));
    GFDIT_CUDA_CHECK(cudaGetLastError());
  }

  void waitSignal(int peer, uint64_t value, void* stream) override {
    GFDIT_CHECK(peer >= 0 && peer < size_ && peer != rank_) << "gfdit: wait for rank " << peer;
    // signals_ is a symmetric address; on this PE it is an ordinary device pointer to our own word.
    std::vector<DeviceWait> waits{
        DeviceWait{&signals_[peer], value, nullptr, peer, static_cast<uint32_t>(DeviceWaitKind::kPutSignal)}};
    launcher_->copyOp(DeviceOp::kWaitSignal, waits, nullptr, CopyPath::kCudaSm, {}, static_cast<cudaStream_t>(stream));
  }

  void checkErrors() override {
    if (__atomic_load_n(&record_->state, __ATOMIC_ACQUIRE) != 0) {
      ErrorRecord r;
      std::memcpy(&r, record_, sizeof(r));
      throw Error(errorCodeOf(r), formatError(r));
    }
  }

 private:
  int rank_;
  int size_;
  bool initialised_ = false;
  uint64_t* signals_ = nullptr;
  DeviceSignals* local_ = nullptr;
  ErrorRecord* record_ = nullptr;
  std::unique_ptr<OpLauncher> launcher_;
};

}  // namespace

std::unique_ptr<NvshmemEdges> NvshmemEdges::create(int rank, int world_size, int device, Store& store,
                                                   const std::string& key_prefix, std::chrono::milliseconds timeout) {
  GFDIT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size) << "rank " << rank << " of " << world_size;
  auto e = std::make_unique<NvshmemEdgesImpl>(rank, world_size);
  e->setup(device, store, key_prefix, timeout);
  return e;
}

#else

std::unique_ptr<NvshmemEdges> NvshmemEdges::create(int, int, int, Store&, const std::string&,
                                                   std::chrono::milliseconds) {
  GFDIT_THROW(kInvalidUsage) << "gfdit: this build has no NVSHMEM (install nvidia-nvshmem-cu13, or point "
                                "GFDIT_NVSHMEM_ROOT at an NVSHMEM install, and rebuild)";
}

#endif

}  // namespace cuda
}  // namespace gfdit
