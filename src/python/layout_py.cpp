// gfdit._C.runtime's layout types: the parallel layout of a step (Layout), its mode (LayoutMode) and its
// placement (Placement), with the names gfdit.ParallelSpec uses. Bound first (module.cpp), so that every other
// binding can take and return them.
#include "layout_py.h"

#include <pybind11/operators.h>

#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

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

CacheKind cacheKindArg(py::handle value, const char* param) {
  return enumArg<CacheKind>(value, param, &cacheKindFromName, &cacheKindName);
}

CacheSpec cacheSpecArg(py::handle value) {
  if (value.is_none()) return CacheSpec();
  if (py::isinstance<py::str>(value)) return CacheSpec::parse(value.cast<std::string>());
  if (py::isinstance<CacheSpec>(value)) {
    CacheSpec s = value.cast<CacheSpec>();
    s.check();
    return s;
  }
  GFDIT_THROW(kInvalidUsage).param("cache")
      << "cache must be a str (\"fbcache:0.08,warmup=8,max_skip=-1\"), a CacheSpec or None, got "
      << py::repr(value).cast<std::string>();
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

  // ---- step caches (NOTE [step caches] in gfdit/step_cache.h) ----
  py::enum_<CacheKind>(r, "CacheKind", "which step cache a request uses")
      .value("NONE", CacheKind::kNone)
      .value("FBCACHE", CacheKind::kFbCache)
      .value("TEACACHE", CacheKind::kTeaCache);
  r.def("cache_kind_name", &cacheKindName, py::arg("kind"), "name of a cache kind: none, fbcache, teacache");
  r.def("cache_kind_from_name", &cacheKindFromName, py::arg("name"),
        "the kind of a name; others raise InvalidUsage naming cache");
  py::class_<CacheSpec>(r, "CacheSpec", "a request's step cache and its settings")
      .def(py::init([](py::object kind, std::optional<double> threshold, std::optional<int32_t> warmup,
                       std::optional<int32_t> max_skip) {
             CacheSpec s = CacheSpec::defaults(cacheKindArg(kind, "cache"));
             if (threshold) s.threshold = *threshold;
             if (warmup) s.warmup = *warmup;
             if (max_skip) s.max_skip = *max_skip;
             s.check();
             return s;
           }),
           py::arg("kind") = CacheKind::kNone, py::arg("threshold") = py::none(), py::arg("warmup") = py::none(),
           py::arg("max_skip") = py::none(),
           "kind: a CacheKind or its name; unset settings take the kind's defaults; bad values raise InvalidUsage "
           "naming cache")
      .def_static("parse", &CacheSpec::parse, py::arg("text"),
                  "Reads 'kind[:threshold][,warmup=N][,max_skip=M]' ('' or 'none': off); bad text raises "
                  "InvalidUsage naming cache.")
      .def_static("defaults", &CacheSpec::defaults, py::arg("kind"), "The published defaults of a kind.")
      .def_property_readonly(
          "kind", [](const CacheSpec& s) { return std::string(cacheKindName(s.kind)); },
          "\"none\", \"fbcache\" or \"teacache\"")
      .def_property_readonly(
          "cache_kind", [](const CacheSpec& s) { return s.kind; }, "the kind as a CacheKind")
      .def_readonly("threshold", &CacheSpec::threshold)
      .def_readonly("warmup", &CacheSpec::warmup)
      .def_readonly("max_skip", &CacheSpec::max_skip, "-1: no limit")
      .def("on", &CacheSpec::on, "Whether a cache is on.")
      .def("always_full", &CacheSpec::alwaysFull, py::arg("step"), py::arg("num_steps"),
           "Whether step `step` of `num_steps` always runs in full (warm-up; teacache's last step).")
      .def("__str__", &CacheSpec::str)
      .def("__repr__", [](const CacheSpec& s) { return "CacheSpec('" + s.str() + "')"; })
      .def(py::self == py::self)
      .def(py::pickle([](const CacheSpec& s) { return s.str(); },
                      [](const std::string& text) { return CacheSpec::parse(text); }));
  py::class_<SkipCurve>(r, "SkipCurve", "how often a pass past its warm-up reuses a step cache, by threshold")
      .def(py::init([](py::object kind, std::vector<std::pair<double, double>> points, std::string source) {
             SkipCurve c;
             c.kind = cacheKindArg(kind, "kind");
             std::sort(points.begin(), points.end());
             for (const auto& [x, y] : points) {
               GFDIT_CHECK(std::isfinite(x) && x > 0 && std::isfinite(y) && y >= 0 && y <= 1).param("points")
                   << "SkipCurve: a point (threshold, probability) needs threshold > 0 and probability in [0, 1], "
                      "got ("
                   << x << ", " << y << ")";
             }
             c.points = std::move(points);
             c.source = std::move(source);
             return c;
           }),
           py::arg("kind"), py::arg("points"), py::arg("source") = "")
      .def_property_readonly("kind", [](const SkipCurve& c) { return c.kind; })
      .def_readonly("points", &SkipCurve::points)
      .def_readonly("source", &SkipCurve::source)
      .def("at", &SkipCurve::at, py::arg("threshold"), "The probability at `threshold`.")
      .def("__repr__", [](const SkipCurve& c) {
        return std::string("SkipCurve(") + cacheKindName(c.kind) + ", " + std::to_string(c.points.size()) + " points)";
      });
  r.def("cached_share", &cachedShare, py::arg("p"), py::arg("max_skip"),
        "The long-run share of eligible steps that reuse a cache hit with probability p, at most max_skip in a row.");
}

}  // namespace python
}  // namespace gfdit
