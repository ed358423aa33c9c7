// placeholder: gfdit._C.cost
#include "bindings.h"
namespace gfdit {
namespace python {
void register_cost(pybind11::module_& m) { m.def_submodule("cost", "cost model"); }
}  // namespace python
}  // namespace gfdit
