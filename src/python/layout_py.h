// Python values that stand for a layout's mode or placement (the bound enum or its name) or a step cache (a
// CacheSpec, its text or None). For the bindings whose arguments are one of them (gfdit._C.runtime, gfdit._C.cost).
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
/// The step cache `value` stands for: None (off), a CacheSpec (checked), or its text (CacheSpec::parse); anything
/// else throws InvalidUsage naming "cache".
CacheSpec cacheSpecArg(pybind11::handle value);
/// The cache kind `value` stands for: a CacheKind or its name; anything else throws InvalidUsage about `param`.
CacheKind cacheKindArg(pybind11::handle value, const char* param);

}  // namespace python
}  // namespace gfdit
