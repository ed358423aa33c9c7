// What the CUDA side of this build has and what the machine shows.
#include <cuda_runtime.h>

#include <sstream>
#include <string>

#include "cuda_transport.h"

#ifndef GFDIT_CUDA_VERSION
#define GFDIT_CUDA_VERSION ""
#endif
#ifndef GFDIT_CUDA_ARCHITECTURES
#define GFDIT_CUDA_ARCHITECTURES ""
#endif
#ifndef GFDIT_NVSHMEM_VERSION
#define GFDIT_NVSHMEM_VERSION ""
#endif

namespace gfdit {
namespace cuda {

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the "no driver" / "no device" error
    return 0;
  }
  return n;
}

std::string deviceStatus() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  }
  return n > 0 ? "" : "no CUDA device";
}

int runtimeVersion() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return 0;
  return v;
}

int imageArchFor(const std::string& architectures, int cc) {
  std::string list = architectures;
  for (char& c : list) {
    if (c == ';') c = ',';
  }
  std::istringstream is(list);
  std::string item;
  int best_sass = 0, best_ptx = 0;
  while (std::getline(is, item, ',')) {
    size_t digits = item.find_first_not_of("0123456789");
    if (digits == 0) continue;  // "native", "all": not knowable here
    int arch = std::stoi(item.substr(0, digits));
    std::string kind = digits == std::string::npos ? "" : item.substr(digits);
    bool sass = kind.empty() || kind == "-real";
    bool ptx = kind.empty() || kind == "-virtual";
    if (arch > cc) continue;
    if (sass && arch / 10 == cc / 10 && arch > best_sass) best_sass = arch;
    if (ptx && arch > best_ptx) best_ptx = arch;
  }
  return best_sass != 0 ? best_sass : best_ptx;
}

bool tmaExpectedOnDevice(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return buildFeatures().tma && imageArchFor(GFDIT_CUDA_ARCHITECTURES, major * 10 + minor) >= 90;
}

BuildFeatures buildFeatures() {
  BuildFeatures f;
  f.cuda_version = GFDIT_CUDA_VERSION;
  f.architectures = GFDIT_CUDA_ARCHITECTURES;
#if defined(GFDIT_TMA_COMPILED)
  f.tma = true;
#endif
#if defined(GFDIT_WITH_NVSHMEM)
  f.nvshmem = true;
  f.nvshmem_version = GFDIT_NVSHMEM_VERSION;
#endif
  return f;
}

}  // namespace cuda
}  // namespace gfdit
