// What the runtime's binding files share (see runtime_py.h).
#include "runtime_py.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>

#include "gfdit/error.h"

namespace py = pybind11;

namespace gfdit {
namespace python {

using namespace gfdit::runtime;

std::string PyPolicy::name() const { PYBIND11_OVERRIDE_PURE(std::string, Policy, name); }

std::vector<Decision> PyPolicy::schedule(const SchedulerView& view) {
  PYBIND11_OVERRIDE_PURE(std::vector<Decision>, Policy, schedule, view);
}

LayoutFamily PyPolicy::layouts() const { PYBIND11_OVERRIDE(LayoutFamily, Policy, layouts); }

bool PyPolicy::placesDecodes() const { PYBIND11_OVERRIDE_NAME(bool, Policy, "places_decodes", placesDecodes); }

namespace {

class HeldPolicy : public Policy {
 public:
  explicit HeldPolicy(py::object obj) : obj_(std::move(obj)), policy_(obj_.cast<Policy*>()) {}
  ~HeldPolicy() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }
  std::string name() const override {
    py::gil_scoped_acquire gil;
    try {
      return policy_->name();
    } catch (py::error_already_set& e) {
      throw Error(ErrorCode::kInvalidUsage, std::string("policy name() raised: ") + e.what());
    }
  }
  LayoutFamily layouts() const override {
    py::gil_scoped_acquire gil;
    try {
      return policy_->layouts();
    } catch (py::error_already_set& e) {
      throw Error(ErrorCode::kInvalidUsage, std::string("policy layouts() raised: ") + e.what());
    }
  }
  bool placesDecodes() const override {
    py::gil_scoped_acquire gil;
    try {
      return policy_->placesDecodes();
    } catch (py::error_already_set& e) {
      throw Error(ErrorCode::kInvalidUsage, std::string("policy places_decodes() raised: ") + e.what());
    }
  }
  std::vector<Decision> schedule(const SchedulerView& view) override {
    py::gil_scoped_acquire gil;
    try {
      return policy_->schedule(view);
    } catch (py::error_already_set& e) {
      throw Error(ErrorCode::kInvalidUsage, std::string("raised ") + e.what());
    } catch (py::cast_error& e) {
      throw Error(ErrorCode::kInvalidUsage,
                  std::string("returned something that is not a list of Decision: ") + e.what());
    }
  }

 private:
  py::object obj_;
  Policy* policy_;
};

}  // namespace

std::shared_ptr<Policy> policyFrom(const py::object& policy) {
  if (py::isinstance<py::str>(policy)) return makePolicy(policy.cast<std::string>());
  GFDIT_CHECK(py::isinstance<Policy>(policy))
      << "a policy is a name ('fcfs', 'srtf', 'edf', 'priority', 'static:D') or a gfdit.Policy object";
  auto sp = policy.cast<std::shared_ptr<Policy>>();
  if (dynamic_cast<PyPolicy*>(sp.get()) == nullptr) return sp;  // a built-in: no GIL needed
  return std::make_shared<HeldPolicy>(policy);
}

std::string refName(const OutputRef& r) { return std::string(r.name, strnlen(r.name, sizeof(r.name))); }

std::vector<int64_t> refShape(const OutputRef& r) {
  return std::vector<int64_t>(r.shape, r.shape + std::max(0, std::min(r.ndim, 6)));
}

DType dtypeOfFormat(const std::string& f, size_t itemsize) {
  if (f == "f" && itemsize == 4) return DType::kFloat32;
  if (f == "e" && itemsize == 2) return DType::kFloat16;
  if ((f == "i" || f == "l") && itemsize == 4) return DType::kInt32;
  if ((f == "l" || f == "q") && itemsize == 8) return DType::kInt64;
  if (f == "B" && itemsize == 1) return DType::kUInt8;
  GFDIT_THROW(kInvalidUsage) << "unsupported output element format '" << f << "' (" << itemsize << " bytes)";
}

RequestShape shapeOf(int height, int width, int num_frames, int num_steps, double guidance_scale) {
  RequestShape s;
  s.height = height;
  s.width = width;
  s.num_frames = num_frames;
  s.num_steps = num_steps;
  s.guidance_scale = guidance_scale;
  return s;
}

py::dict statsDict(const EngineStats& s) {
  py::dict d;
  d["submitted"] = s.control.submitted;
  d["finished"] = s.control.finished;
  d["tasks_dispatched"] = s.control.tasks_dispatched;
  d["tasks_completed"] = s.control.tasks_completed;
  d["policy_calls"] = s.control.policy_calls;
  d["lookahead_hits"] = s.control.lookahead_hits;
  d["regroups"] = s.control.regroups;
  d["migrations"] = s.control.migrations;
  d["recoveries"] = s.control.recoveries;
  d["task_timeouts"] = s.control.task_timeouts;
  d["refused_decisions"] = s.control.refused_decisions;
  d["batched_steps"] = s.control.batched_steps;
  d["worker_deaths"] = s.control.worker_deaths;
  d["replacements"] = s.control.replacements;
  d["cache_gathers"] = s.control.cache_gathers;
  d["policy_ns"] = s.control.policy_ns;
  d["control_cpu_ns"] = s.control_cpu_ns;
  d["loop_wakeups"] = s.loop_wakeups;
  d["alive"] = s.alive;
  d["joining"] = s.joining;
  d["num_requests"] = s.num_requests;
  d["tasks_in_flight"] = s.tasks_in_flight;
  d["recovering"] = s.recovering;
  return d;
}

}  // namespace python
}  // namespace gfdit
