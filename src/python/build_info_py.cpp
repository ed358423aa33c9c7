// gfdit._C.build_info(): what this build can do.
#include "bindings.h"
#include "gfdit/world.h"

#ifdef GFDIT_WITH_CUDA
#include "cuda/edge_kernels.h"
#endif

namespace py = pybind11;

namespace gfdit {
namespace python {

void register_build_info(py::module_& m) {
  m.def("build_info", []() {
    py::dict info;
    info["version"] = std::string(version());
    py::list backends;
    backends.append("cpu-shm");
#ifdef GFDIT_WITH_CUDA
    info["cuda"] = true;
    info["cuda_version"] = std::string(GFDIT_CUDA_VERSION);
    info["cuda_runtime_version"] = cuda::runtimeVersion();
    info["cuda_devices"] = cuda::deviceCount();
    backends.append("cuda-sm-copy");
#else
    info["cuda"] = false;
    info["cuda_version"] = py::none();
    info["cuda_runtime_version"] = py::none();
    info["cuda_devices"] = 0;
#endif
    // NVSHMEM (inter-node edges) is not compiled in yet.
    info["nvshmem"] = false;
    info["nvshmem_version"] = py::none();
    info["backends"] = backends;
    info["max_ranks"] = kMaxRanks;
    return info;
  });
}

}  // namespace python
}  // namespace gfdit
