// One register function per component; module.cpp only calls them.
#pragma once

#include <pybind11/pybind11.h>

namespace gfdit {
namespace python {

void register_errors(pybind11::module_& m);
void register_world(pybind11::module_& m);
void register_build_info(pybind11::module_& m);
void register_layout(pybind11::module_& m);
void register_runtime(pybind11::module_& m);
void register_engine(pybind11::module_& m);
void register_relay(pybind11::module_& m);
void register_simulator(pybind11::module_& m);
void register_cost(pybind11::module_& m);
void register_settings(pybind11::module_& m);

}  // namespace python
}  // namespace gfdit
