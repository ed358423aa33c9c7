// gfdit._C: the C++ core, bound thinly.
#include "bindings.h"

#ifdef GFDIT_WITH_CUDA
#include "gfdit/cuda.h"
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "gfdit C++ core: group-free collectives";
  gfdit::python::register_errors(m);
  gfdit::python::register_world(m);
  gfdit::python::register_build_info(m);
  gfdit::python::register_layout(m);  // before cost and runtime: their bindings take its types
  gfdit::python::register_cost(m);
  gfdit::python::register_runtime(m);
  gfdit::python::register_relay(m);  // before engine: EngineLoop.set_remote takes its RemoteWorkers
  gfdit::python::register_engine(m);
  gfdit::python::register_simulator(m);
  gfdit::python::register_settings(m);
#ifdef GFDIT_WITH_CUDA
  gfdit::cuda::enable();  // worlds may have a device transport (gfdit.init(device=...))
#endif
}
