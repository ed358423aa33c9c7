// gfdit._C.runtime's simulator: the control plane on a simulated executor and a virtual clock (NOTE [simulated
// execution] in src/runtime/simulator.cpp). run() releases the GIL; a Python policy takes it while it decides.
#include <pybind11/stl.h>

#include <cmath>

#include "bindings.h"
#include "gfdit/cost.h"
#include "gfdit/error.h"
#include "gfdit/simulator.h"
#include "layout_py.h"
#include "runtime_py.h"

namespace py = pybind11;

namespace gfdit {
namespace python {

using namespace gfdit::runtime;

void register_simulator(py::module_& m) {
  py::module_ r = m.def_submodule("runtime");  // made by register_runtime

  // ---- the simulator ----
  py::class_<SimRequest>(r, "SimRequest")
      .def(py::init([](uint64_t id, double arrival_s, int h, int w, int f, int steps, std::optional<double> g,
                       std::optional<double> deadline_s, int priority, py::handle cache) {
             SimRequest q;
             q.id = id;
             q.arrival_s = arrival_s;
             q.shape = shapeOf(h, w, f, steps, g ? *g : -1.0);  // no guidance: the model's default
             q.deadline_s = deadline_s ? *deadline_s : std::nan("");
             q.priority = priority;
             q.shape.cache = cacheSpecArg(cache);
             return q;
           }),
           py::kw_only(), py::arg("id"), py::arg("arrival_s"), py::arg("height"), py::arg("width"),
           py::arg("num_frames") = 1, py::arg("num_steps") = 0, py::arg("guidance_scale") = py::none(),
           py::arg("deadline_s") = py::none(), py::arg("priority") = 0, py::arg("cache") = py::none())
      .def_readonly("id", &SimRequest::id)
      .def_readonly("arrival_s", &SimRequest::arrival_s);

  py::class_<SimOutcome>(r, "SimOutcome")
      .def_readonly("id", &SimOutcome::id)
      .def_readonly("arrival_s", &SimOutcome::arrival_s)
      .def_readonly("finish_s", &SimOutcome::finish_s)
      .def_property_readonly("deadline_s",
                             [](const SimOutcome& o) -> py::object {
                               if (std::isnan(o.deadline_s)) return py::none();
                               return py::float_(o.deadline_s);
                             })
      .def_property_readonly("state", [](const SimOutcome& o) { return std::string(requestStateName(o.state)); })
      .def_readonly("priority", &SimOutcome::priority)
      .def_readonly("first_start_s", &SimOutcome::first_start_s);

  py::class_<SimResult>(r, "SimResult")
      .def_readonly("requests", &SimResult::requests)
      .def_property_readonly(
          "intervals",
          [](const SimResult& s) {
            py::list out;
            for (const auto& iv : s.intervals) {
              out.append(py::make_tuple(iv.rank, iv.request_id, taskKindName(iv.kind), iv.start_s, iv.end_s));
            }
            return out;
          })
      .def_readonly("busy_rank_s", &SimResult::busy_rank_s)
      .def_readonly("num_ranks", &SimResult::num_ranks)
      .def_readonly("makespan_s", &SimResult::makespan_s)
      .def_readonly("num_tasks", &SimResult::num_tasks)
      .def_readonly("wall_s", &SimResult::wall_s)
      .def_readonly("cache_passes", &SimResult::cache_passes, "passes of the steps of requests with a step cache")
      .def_readonly("cached_passes", &SimResult::cached_passes, "those of them that reused it (drawn)")
      .def_property_readonly("stats", [](const SimResult& s) {
        EngineStats e;
        e.control = s.stats;
        return statsDict(e);
      });

  py::class_<Simulator>(r, "Simulator")
      .def(py::init([](std::shared_ptr<cost::CostModel> cost, const cost::Cluster& cluster, const py::object& policy,
                       int max_inflight_steps, bool record_intervals, double dispatch_s, double completion_s,
                       double regroup_s, int num_cores, bool lookahead, double collective_efficiency,
                       bool regroup_every_change, uint64_t cache_seed) {
             GFDIT_CHECK(collective_efficiency > 0 && collective_efficiency <= 1.5)
                 << "collective_efficiency " << collective_efficiency << " outside (0, 1.5]";
             SimOptions o;
             o.collective_efficiency = collective_efficiency;
             o.max_inflight_steps = max_inflight_steps;
             o.record_intervals = record_intervals;
             o.dispatch_s = dispatch_s;
             o.completion_s = completion_s;
             o.regroup_s = regroup_s;
             o.regroup_every_change = regroup_every_change;
             o.num_cores = num_cores;
             o.lookahead = lookahead;
             o.cache_seed = cache_seed;
             return std::make_unique<Simulator>(std::move(cost), cluster, policyFrom(policy), o);
           }),
           py::arg("cost_model"), py::arg("cluster"), py::arg("policy"), py::arg("max_inflight_steps") = 2,
           py::arg("record_intervals") = false, py::arg("dispatch_s") = 0.0, py::arg("completion_s") = 0.0,
           py::arg("regroup_s") = -1.0, py::arg("num_cores") = -1, py::arg("lookahead") = true,
           py::arg("collective_efficiency") = 1.0, py::arg("regroup_every_change") = false, py::arg("cache_seed") = 0)
      .def("run", &Simulator::run, py::arg("requests"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace python
}  // namespace gfdit
