// Device side of the edge protocol: the same layout and signal operations as the CPU backend
// (edge.h compiled with GFDIT_DEVICE_COMPILE), an SM copy kernel for small messages.
#include <cuda_runtime.h>

#include <sstream>

#include "edge.h"
#include "edge_kernels.h"
#include "gfdit/error.h"

#define GFDIT_CUDA_CHECK(call)                                                      \
  do {                                                                              \
    cudaError_t gfdit_err_ = (call);                                                \
    if (gfdit_err_ != cudaSuccess) {                                                \
      GFDIT_THROW(kSystemError) << #call << ": " << cudaGetErrorString(gfdit_err_); \
    }                                                                               \
  } while (0)

namespace gfdit {
namespace cuda {
namespace {

// One block copies with 16-byte vectors where alignment allows, then the last thread publishes.
__global__ void putWithSignalKernel(uint8_t* dst, const uint8_t* src, size_t bytes, uint64_t* signal, uint64_t value) {
  size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  bool aligned = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0;
  size_t vec = aligned ? bytes / 16 : 0;
  for (size_t i = tid; i < vec; i += nthreads) {
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  }
  for (size_t i = vec * 16 + tid; i < bytes; i += nthreads) dst[i] = src[i];
  // Every thread's stores must be visible before the signal: a system-scope fence per thread, then
  // a grid-wide count so the last block to finish publishes.
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    __shared__ bool last;
    unsigned int* counter = reinterpret_cast<unsigned int*>(signal + 1);  // scratch word after the signal
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
    if (last) {
      *counter = 0;
      edge::storeRelease(signal, value);  // st.release.sys
    }
  }
}

__global__ void waitSignalKernel(const uint64_t* signal, uint64_t value) {
  while (edge::loadAcquire(signal) < value) {  // ld.acquire.sys
    __nanosleep(100);
  }
}

}  // namespace

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

int runtimeVersion() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return 0;
  return v;
}

void launchPutWithSignal(void* dst, const void* src, size_t bytes, uint64_t* signal, uint64_t value, void* stream) {
  int threads = 256;
  int blocks = static_cast<int>(std::min<size_t>(32, (bytes + threads * 16 - 1) / (threads * 16) + 1));
  putWithSignalKernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes, signal, value);
  GFDIT_CUDA_CHECK(cudaGetLastError());
}

void launchWaitSignal(const uint64_t* signal, uint64_t value, void* stream) {
  waitSignalKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(signal, value);
  GFDIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda
}  // namespace gfdit
