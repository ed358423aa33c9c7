// gfdit._C.build_info(): what this build can do; gfdit._C.measure_copy_table(): the device's copy paths.
#include <cstdlib>
#include <set>

#include "bindings.h"
#include "copy.h"
#include "gfdit/error.h"
#include "gfdit/settings.h"
#include "gfdit/world.h"

#ifdef GFDIT_WITH_CUDA
#include "cuda/cuda_transport.h"
#endif

namespace py = pybind11;

namespace gfdit {
namespace python {

namespace {

// The paths of a table, in table order, each once.
py::list pathsOf(const CopySelector& sel) {
  py::list out;
  std::set<std::string> seen;
  for (const auto& e : sel.entries()) {
    std::string name = copyPathName(e.second);
    if (seen.insert(name).second) out.append(name);
  }
  return out;
}

}  // namespace

void register_build_info(py::module_& m) {
  m.def("build_info", []() {
    py::dict info;
    info["version"] = std::string(version());
    py::list backends;
    backends.append("cpu-shm");
    py::dict tables;
    try {
      const char* env = settings::copyTable();
      CopySelector cpu = env != nullptr && *env != '\0' ? CopySelector::parse(env) : CopySelector();
      tables["cpu"] = cpu.toString();
      info["cpu_copy_paths"] = pathsOf(cpu);
    } catch (const Error& e) {
      tables["cpu"] = std::string("invalid: ") + e.what();
      info["cpu_copy_paths"] = py::list();
    }
#ifdef GFDIT_WITH_CUDA
    cuda::BuildFeatures f = cuda::buildFeatures();
    int devices = cuda::deviceCount();
    info["cuda"] = true;
    info["cuda_version"] = f.cuda_version;
    info["cuda_architectures"] = f.architectures;
    info["cuda_runtime_version"] = cuda::runtimeVersion();
    info["cuda_devices"] = devices;
    info["tma"] = f.tma;
    // Whether TMA copies run on device 0: its kernel image is sm_90 or newer (no CUDA context is created;
    // a transport checks the image that actually loaded).
    bool tma_active = devices > 0 && cuda::tmaExpectedOnDevice(0);
    info["tma_active"] = tma_active;
    backends.append("cuda-ipc");
    try {
      CopySelector dev = cuda::resolveCopyTable("", tma_active);
      tables["cuda"] = dev.toString();
      info["cuda_copy_paths"] = pathsOf(dev);
    } catch (const Error& e) {
      tables["cuda"] = std::string("invalid: ") + e.what();
      info["cuda_copy_paths"] = py::list();
    }
    tables["cuda_default"] = std::string(cuda::defaultCopyTable());
    info["nvshmem"] = f.nvshmem;
    info["nvshmem_version"] = f.nvshmem ? py::object(py::str(f.nvshmem_version)) : py::object(py::none());
    if (f.nvshmem) backends.append("nvshmem");
#else
    info["cuda"] = false;
    info["cuda_version"] = py::none();
    info["cuda_architectures"] = py::none();
    info["cuda_runtime_version"] = py::none();
    info["cuda_devices"] = 0;
    info["tma"] = false;
    info["tma_active"] = false;
    info["cuda_copy_paths"] = py::list();
    info["nvshmem"] = false;
    info["nvshmem_version"] = py::none();
#endif
    info["copy_tables"] = tables;
    info["backends"] = backends;
    info["max_ranks"] = kMaxRanks;
    return info;
  });

  m.def(
      "measure_copy_table",
      [](int device, size_t min_bytes, size_t max_bytes, int iterations) {
#ifdef GFDIT_WITH_CUDA
        cuda::CopyMeasurement r;
        {
          py::gil_scoped_release release;
          r = cuda::measureCopyTable(device, min_bytes, max_bytes, iterations);
        }
        py::dict out;
        out["device"] = r.device;
        out["device_name"] = r.device_name;
        out["table"] = r.table;
        py::list rows;
        for (const auto& t : r.timings) {
          py::dict row;
          row["bytes"] = t.bytes;
          row["sm_us"] = t.sm_us >= 0 ? py::object(py::float_(t.sm_us)) : py::object(py::none());
          row["tma_us"] = t.tma_us >= 0 ? py::object(py::float_(t.tma_us)) : py::object(py::none());
          row["ce_us"] = t.ce_us >= 0 ? py::object(py::float_(t.ce_us)) : py::object(py::none());
          row["best"] = std::string(copyPathName(t.best));
          rows.append(row);
        }
        out["timings"] = rows;
        return out;
#else
        (void)device;
        (void)min_bytes;
        (void)max_bytes;
        (void)iterations;
        throw Error(ErrorCode::kInvalidUsage, "gfdit: this build has no CUDA: no copy paths to measure");
        return py::dict();
#endif
      },
      py::arg("device") = 0, py::arg("min_bytes") = size_t{4} << 10, py::arg("max_bytes") = size_t{256} << 20,
      py::arg("iterations") = 20,
      "Times the CUDA copy paths (sm, tma, ce) on `device` at sizes min_bytes * 4^k up to max_bytes and returns "
      "the fastest per size as a copy table (GFDIT_CUDA_COPY_TABLE's format).");
}

}  // namespace python
}  // namespace gfdit
