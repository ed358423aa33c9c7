// Python values that stand for a layout's mode or placement: the bound enum or its name. For the bindings
// whose arguments are a mode or a placement (gfdit._C.runtime.Layout, gfdit._C.cost).
#pragma once

#include <pybind11/pybind11.h>

#include "gfdit/layout.h"

namespace gfdit {
namespace python {

/// The mode `value` stands for: a LayoutMode or its name ("usp", "torus"); anything else throws InvalidUsage
/// about the parameter `param` listing the valid names.
LayoutMode layoutModeArg(pybind11::handle value, const char* param);
/// The placement `value` stands for: a Placement or its name ("auto", "ulysses-low", "ring-low"); anything
/// else throws InvalidUsage about the parameter `param` listing the valid names.
Placement placementArg(pybind11::handle value, const char* param);

}  // namespace python
}  // namespace gfdit
