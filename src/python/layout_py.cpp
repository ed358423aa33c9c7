// gfdit._C.runtime's layout types: the parallel layout of a step (Layout), its mode (LayoutMode) and its
// placement (Placement), with the names gfdit.ParallelSpec uses. Bound first (module.cpp), so that every other
// binding can take and return them.
#include "layout_py.h"

#include <pybind11/operators.h>

#include <string>

#include "bindings.h"
#include "gfdit/error.h"
#include "gfdit/layout.h"

namespace py = pybind11;

namespace gfdit {
namespace python {

namespace {

// `value` as E: the enum itself, or a name `from_name` knows; the error names `param`.
template <typename E>
E enumArg(py::handle value, const char* param, E (*from_name)(const std::string&), const char* (*name_of)(E)) {
  if (py::isinstance<E>(value)) return value.cast<E>();
  if (py::isinstance<py::str>(value)) {
    try {
      return from_name(value.cast<std::string>());
    } catch (const Error& e) {
      throw Error(e.code(), e.message(), param, e.where());  // the same error, about `param`
    }
  }
  const py::object type = py::type::of(py::cast(E{}));  // the bound enum (py::type::of<E> takes classes only)
  std::string names;
  for (const auto& item : type.attr("__members__").cast<py::dict>()) {
    names += (names.empty() ? "" : ", ") + std::string(name_of(item.second.cast<E>()));
  }
  GFDIT_THROW(kInvalidUsage).param(param)
      << param << " must be a " << type.attr("__name__").cast<std::string>() << " or its name (" << names << "), got "
      << py::repr(value).cast<std::string>();
}

std::string layoutRepr(const Layout& l) {
  return "Layout(ulysses=" + std::to_string(l.ulysses) + ", ring=" + std::to_string(l.ring) + ", mode='" +
         layoutModeName(l.mode) + "', placement='" + placementName(l.placement) + "', cfg=" + std::to_string(l.cfg) +
         ")";
}

}  // namespace

LayoutMode layoutModeArg(py::handle value, const char* param) {
  return enumArg<LayoutMode>(value, param, &layoutModeFromName, &layoutModeName);
}

Placement placementArg(py::handle value, const char* param) {
  return enumArg<Placement>(value, param, &placementFromName, &placementName);
}

void register_layout(py::module_& m) {
  // gfdit._C.runtime is created here, before register_runtime, whose def_submodule("runtime") then returns
  // this same module (pybind11 finds it in sys.modules) and adds the rest of the runtime to it.
  py::module_ r = m.def_submodule("runtime");

  py::enum_<LayoutMode>(r, "LayoutMode", "how one transformer pass splits attention over its members")
      .value("USP", LayoutMode::kUsp)
      .value("TORUS", LayoutMode::kTorus);
  py::enum_<Placement>(r, "Placement", "which axis of the ulysses x ring grid consecutive members form")
      .value("AUTO", Placement::kAuto)
      .value("ULYSSES_LOW", Placement::kUlyssesLow)
      .value("RING_LOW", Placement::kRingLow);
  r.def("layout_mode_name", &layoutModeName, py::arg("mode"), "name of a mode: usp, torus");
  r.def("layout_mode_from_name", &layoutModeFromName, py::arg("name"),
        "the mode of a name; others raise InvalidUsage listing the valid ones");
  r.def("placement_name", &placementName, py::arg("placement"), "name of a placement: auto, ulysses-low, ring-low");
  r.def("placement_from_name", &placementFromName, py::arg("name"),
        "the placement of a name; others raise InvalidUsage listing the valid ones");

  py::class_<Layout>(r, "Layout", "parallel layout of a step: ulysses x ring per pass, mode, placement, cfg")
      .def(py::init([](int32_t ulysses, int32_t ring, py::object mode, py::object placement, int32_t cfg) {
             GFDIT_CHECK(cfg == 1 || cfg == 2).param("cfg") << "Layout: cfg must be 1 or 2, got " << cfg;
             Layout l;
             l.ulysses = ulysses;
             l.ring = ring;
             l.mode = layoutModeArg(mode, "mode");
             l.placement = placementArg(placement, "placement");
             l.cfg = cfg;
             return l;
           }),
           py::arg("ulysses") = 1, py::arg("ring") = 1, py::arg("mode") = LayoutMode::kUsp,
           py::arg("placement") = Placement::kAuto, py::arg("cfg") = 1,
           "mode and placement: the enum or its name (\"torus\", \"ring-low\")")
      .def_readwrite("ulysses", &Layout::ulysses)
      .def_readwrite("ring", &Layout::ring)
      .def_property(
          "mode", [](const Layout& l) { return l.mode; },
          [](Layout& l, py::handle v) { l.mode = layoutModeArg(v, "mode"); }, "a LayoutMode (set: it or its name)")
      .def_property(
          "placement", [](const Layout& l) { return l.placement; },
          [](Layout& l, py::handle v) { l.placement = placementArg(v, "placement"); },
          "a Placement (set: it or its name)")
      .def_readwrite("cfg", &Layout::cfg, "1: the guidance passes in turn; 2: CFG-parallel (one pass per half)")
      .def("degree", &Layout::degree, "Ranks the layout spans: ulysses * ring * cfg.")
      .def("pass_degree", &Layout::passDegree, "Ranks one transformer pass spans: ulysses * ring.")
      .def(py::self == py::self)
      .def("__repr__", &layoutRepr);
}

}  // namespace python
}  // namespace gfdit
