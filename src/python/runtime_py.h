// What the runtime's binding files share: a policy from Python (a name or a gfdit.Policy object), request
// shapes, the engine's counters as a dict, output references and timeouts.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gfdit/engine_loop.h"
#include "gfdit/messages.h"
#include "gfdit/policy.h"
#include "gfdit/request.h"
#include "gfdit/types.h"

namespace gfdit {
namespace python {

/// The trampoline that lets Python subclass gfdit._C.runtime.Policy.
class PyPolicy : public runtime::Policy {
 public:
  std::string name() const override;
  std::vector<runtime::Decision> schedule(const runtime::SchedulerView& view) override;
  runtime::LayoutFamily layouts() const override;
  bool placesDecodes() const override;
};

/// A built-in policy by name, or a Python policy object made safe to call from the control thread.
std::shared_ptr<runtime::Policy> policyFrom(const pybind11::object& policy);
/// A request's shape from its fields.
RequestShape shapeOf(int height, int width, int num_frames, int num_steps, double guidance_scale);
/// The engine loop's (or the simulator's) counters as a dict.
pybind11::dict statsDict(const runtime::EngineStats& s);
/// An output's shm name and shape.
std::string refName(const runtime::OutputRef& r);
std::vector<int64_t> refShape(const runtime::OutputRef& r);
/// The DType of a buffer's element format; InvalidUsage for one an output cannot have.
DType dtypeOfFormat(const std::string& format, size_t itemsize);

}  // namespace python
}  // namespace gfdit
