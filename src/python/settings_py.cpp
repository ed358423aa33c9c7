// gfdit._C.settings: the registry of settings (gfdit/settings.h) for Python: every GFDIT_* variable with its
// default, type, meaning and current value, and get(name) for the Python package's own readers.
#include <pybind11/stl.h>

#include <string>

#include "bindings.h"
#include "gfdit/settings.h"

namespace py = pybind11;

namespace gfdit {
namespace python {

void register_settings(py::module_& m) {
  py::module_ s = m.def_submodule("settings", "Every GFDIT_* environment variable gfdit reads: one registry.");
  s.def(
      "entries",
      [] {
        py::list out;
        for (const settings::Setting& e : settings::all()) {
          py::dict d;
          d["name"] = e.name;
          d["default"] = e.default_value;
          d["type"] = e.type;
          d["meaning"] = e.meaning;
          const char* v = settings::lookup(e.name);
          d["value"] = v != nullptr ? py::object(py::str(v)) : py::object(py::none());
          out.append(d);
        }
        return out;
      },
      "The registry in order: a dict {name, default, type, meaning, value} per setting, value the environment's "
      "(None while unset).");
  s.def("get", &settings::get, py::arg("name"),
        "The environment's value of a registered setting, else its default (as a string); InvalidUsage for a "
        "name the registry does not hold.");
}

}  // namespace python
}  // namespace gfdit
