// gfdit::cuda::enable(): the CUDA transport as the world's device transport.
#include <cstdlib>
#include <string>

#include "cuda_transport.h"
#include "gfdit/cuda.h"
#include "gfdit/settings.h"
#include "transport.h"

namespace gfdit {
namespace cuda {
namespace {

std::unique_ptr<Transport> makeForWorld(const DeviceTransportArgs& a) {
  CudaTransportOptions o;
  o.timeout = a.timeout;
  // The device heap: GFDIT_CUDA_HEAP_BYTES, else the size of the host heap.
  o.heap_bytes = settings::cudaHeapBytes(a.heap_bytes);
  return makeCudaTransport(a.rank, a.world_size, a.device, *a.store, a.key_prefix, o);
}

}  // namespace

void enable() { registerDeviceTransport(&makeForWorld); }

}  // namespace cuda
}  // namespace gfdit
