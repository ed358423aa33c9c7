// gfdit._C.runtime: the control plane for Python: the engine loop (gfdit.Engine's core), the rings a worker
// uses, outputs, policies (Python policies subclass _C.runtime.Policy), request checks and the simulator.
// Blocking calls release the GIL; a Python policy takes it only while it decides.
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>

#include "bindings.h"
#include "gfdit/control.h"
#include "gfdit/cost.h"
#include "gfdit/engine_loop.h"
#include "gfdit/error.h"
#include "gfdit/runtime.h"
#include "gfdit/simulator.h"

namespace py = pybind11;

namespace gfdit {
namespace python {
namespace {

using namespace gfdit::runtime;

class PyPolicy : public Policy {
 public:
  std::string name() const override { PYBIND11_OVERRIDE_PURE(std::string, Policy, name); }
  std::vector<Decision> schedule(const SchedulerView& view) override {
    PYBIND11_OVERRIDE_PURE(std::vector<Decision>, Policy, schedule, view);
  }
  LayoutFamily layouts() const override { PYBIND11_OVERRIDE(LayoutFamily, Policy, layouts); }
};

// A policy object owned by Python, called from the control thread: takes the GIL for each call and turns
// Python exceptions into gfdit errors there, so nothing Python-owned outlives the GIL scope.
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

std::shared_ptr<Policy> policyFrom(const py::object& policy) {
  if (py::isinstance<py::str>(policy)) return makePolicy(policy.cast<std::string>());
  GFDIT_CHECK(py::isinstance<Policy>(policy))
      << "a policy is a name ('fcfs', 'srtf', 'edf', 'priority', 'static:D') or a gfdit.Policy object";
  auto sp = policy.cast<std::shared_ptr<Policy>>();
  if (dynamic_cast<PyPolicy*>(sp.get()) == nullptr) return sp;  // a built-in: no GIL needed
  return std::make_shared<HeldPolicy>(policy);
}

std::chrono::microseconds micros(double seconds) {
  GFDIT_CHECK(std::isfinite(seconds) && seconds >= 0) << "timeout " << seconds;
  return std::chrono::microseconds(static_cast<int64_t>(std::min(seconds, 1e9) * 1e6));
}

std::vector<int> ranksOf(const TaskDescriptor& t) { return std::vector<int>(t.ranks, t.ranks + t.num_ranks); }

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
  d["policy_ns"] = s.control.policy_ns;
  d["control_cpu_ns"] = s.control_cpu_ns;
  d["loop_wakeups"] = s.loop_wakeups;
  d["alive"] = s.alive;
  d["num_requests"] = s.num_requests;
  d["tasks_in_flight"] = s.tasks_in_flight;
  d["recovering"] = s.recovering;
  return d;
}

}  // namespace

void register_runtime(py::module_& m) {
  py::module_ r = m.def_submodule("runtime", "trajectory runtime: control plane, rings, simulator");
  r.def("now_ns", &nowNs, "Monotonic nanoseconds, comparable across the processes of a machine.");

  py::enum_<TaskKind>(r, "TaskKind")
      .value("ENCODE", TaskKind::kEncode)
      .value("DENOISE", TaskKind::kDenoise)
      .value("MIGRATE", TaskKind::kMigrate)
      .value("DECODE", TaskKind::kDecode)
      .value("FREE", TaskKind::kFree)
      .value("SHUTDOWN", TaskKind::kShutdown)
      .value("REINIT", TaskKind::kReinit);

  py::enum_<TaskError>(r, "TaskError")
      .value("OK", TaskError::kOk)
      .value("INVALID_REQUEST", TaskError::kInvalidRequest)
      .value("MODEL_ERROR", TaskError::kModelError)
      .value("COMM_ERROR", TaskError::kCommError)
      .value("WORKER_DIED", TaskError::kWorkerDied)
      .value("TIMEOUT", TaskError::kTimeout)
      .value("STATE_LOST", TaskError::kStateLost);

  py::enum_<RequestState>(r, "RequestState")
      .value("QUEUED", RequestState::kQueued)
      .value("ENCODING", RequestState::kEncoding)
      .value("DENOISING", RequestState::kDenoising)
      .value("DECODING", RequestState::kDecoding)
      .value("DONE", RequestState::kDone)
      .value("FAILED", RequestState::kFailed)
      .value("CANCELLED", RequestState::kCancelled);

  py::class_<Layout>(r, "Layout")
      .def(py::init([](int u, int ring, int mode, int placement, int cfg) {
             GFDIT_CHECK(cfg == 1 || cfg == 2) << "Layout: cfg must be 1 or 2, got " << cfg;
             Layout l;
             l.ulysses = u;
             l.ring = ring;
             l.mode = mode;
             l.placement = placement;
             l.cfg = cfg;
             return l;
           }),
           py::arg("ulysses") = 1, py::arg("ring") = 1, py::arg("mode") = 0, py::arg("placement") = 0,
           py::arg("cfg") = 1)
      .def_readwrite("ulysses", &Layout::ulysses)
      .def_readwrite("ring", &Layout::ring)
      .def_readwrite("mode", &Layout::mode)
      .def_readwrite("placement", &Layout::placement)
      .def_readwrite("cfg", &Layout::cfg, "1: the guidance passes in turn; 2: CFG-parallel (one pass per half)")
      .def("degree", &Layout::degree, "Ranks the layout spans: ulysses * ring * cfg.")
      .def("pass_degree", &Layout::passDegree, "Ranks one transformer pass spans: ulysses * ring.")
      .def(py::self == py::self)
      .def("__repr__", [](const Layout& l) {
        return "Layout(ulysses=" + std::to_string(l.ulysses) + ", ring=" + std::to_string(l.ring) +
               ", mode=" + std::to_string(l.mode) + ", placement=" + std::to_string(l.placement) +
               ", cfg=" + std::to_string(l.cfg) + ")";
      });

  // ---- what a worker uses ----
  py::class_<TaskDescriptor>(r, "TaskDescriptor")
      .def(py::init<>())
      .def_readonly("task_id", &TaskDescriptor::task_id)
      .def_readonly("request_id", &TaskDescriptor::request_id)
      .def_property_readonly("kind", [](const TaskDescriptor& t) { return static_cast<TaskKind>(t.kind); })
      .def_readonly("step_begin", &TaskDescriptor::step_begin)
      .def_readonly("num_steps", &TaskDescriptor::num_steps)
      .def_readonly("src_rank", &TaskDescriptor::src_rank)
      .def_readonly("layout", &TaskDescriptor::layout)
      .def_readonly("dispatch_ns", &TaskDescriptor::dispatch_ns)
      .def_property_readonly("ranks", &ranksOf);
  r.attr("MAX_PAYLOAD_BYTES") = kMaxPayloadBytes;

  py::class_<OutputRef>(r, "OutputRef")
      .def(py::init<>())
      .def_property_readonly("name", &refName)
      .def_property_readonly("dtype", [](const OutputRef& o) { return static_cast<DType>(o.dtype); })
      .def_property_readonly("shape", &refShape)
      .def_readonly("bytes", &OutputRef::bytes);

  py::class_<Completion>(r, "Completion")
      .def(py::init<>())
      .def_readwrite("task_id", &Completion::task_id)
      .def_readwrite("request_id", &Completion::request_id)
      .def_property(
          "kind", [](const Completion& c) { return static_cast<TaskKind>(c.kind); },
          [](Completion& c, TaskKind k) { c.kind = static_cast<uint32_t>(k); })
      .def_readwrite("rank", &Completion::rank)
      .def_property(
          "error", [](const Completion& c) { return static_cast<TaskError>(c.error); },
          [](Completion& c, TaskError e) { c.error = static_cast<int32_t>(e); })
      .def_property_readonly("ok", &Completion::ok)
      .def_readwrite("step_end", &Completion::step_end)
      .def_readwrite("dispatch_ns", &Completion::dispatch_ns)
      .def_readwrite("start_ns", &Completion::start_ns)
      .def_readwrite("end_ns", &Completion::end_ns)
      .def_readwrite("post_ns", &Completion::post_ns)
      .def_readonly("output", &Completion::output)
      .def_property(
          "message", [](const Completion& c) { return std::string(c.message, c.message_bytes); },
          [](Completion& c, const std::string& s) {
            size_t n = std::min(s.size(), sizeof(c.message));  // long messages are cut, not refused
            std::memcpy(c.message, s.data(), n);
            c.message_bytes = static_cast<uint32_t>(n);
          })
      .def(
          "set_output",
          [](Completion& c, const std::string& name, const py::buffer& buf) {
            py::buffer_info info = buf.request();
            GFDIT_CHECK(info.ndim >= 0 && info.ndim <= 6) << "an output has at most 6 dimensions";
            ssize_t expect = info.itemsize;
            for (ssize_t k = info.ndim - 1; k >= 0; --k) {
              GFDIT_CHECK(info.shape[k] <= 1 || info.strides[k] == expect) << "the output must be contiguous";
              expect *= info.shape[k];
            }
            DType dt = dtypeOfFormat(info.format, static_cast<size_t>(info.itemsize));
            size_t bytes = static_cast<size_t>(info.size * info.itemsize);
            {
              py::gil_scoped_release nogil;
              writeOutput(name, info.ptr, bytes, c.output);
            }
            c.output.dtype = static_cast<int32_t>(dt);
            c.output.ndim = static_cast<int32_t>(info.ndim);
            for (ssize_t k = 0; k < info.ndim; ++k) c.output.shape[k] = info.shape[k];
          },
          py::arg("name"), py::arg("array"),
          "Writes a contiguous array into a new shared-memory object `name` and points the completion at it.");

  py::class_<QueueSet, std::shared_ptr<QueueSet>>(r, "QueueSet")
      .def_static(
          "create", [](int n, uint32_t bytes) { return std::shared_ptr<QueueSet>(QueueSet::create(n, bytes)); },
          py::arg("num_workers"), py::arg("ring_bytes") = 1u << 20)
      .def_static("attach", [](const std::string& name) { return std::shared_ptr<QueueSet>(QueueSet::attach(name)); })
      .def_property_readonly("name", &QueueSet::name)
      .def_property_readonly("num_workers", &QueueSet::numWorkers)
      .def("unlink_name", &QueueSet::unlinkName)
      .def(
          "pop_task",
          [](QueueSet& q, int w, double timeout_s) -> py::object {
            TaskDescriptor t;
            std::string payload;
            bool ok;
            {
              py::gil_scoped_release nogil;
              ok = q.popTask(w, t, payload, micros(timeout_s));
            }
            if (!ok) return py::none();
            return py::make_tuple(t, py::bytes(payload));
          },
          py::arg("worker"), py::arg("timeout_s"), "(TaskDescriptor, payload bytes), or None on timeout.")
      .def(
          "push_completion",
          [](QueueSet& q, int w, const Completion& c, double timeout_s, bool wake) {
            return q.pushCompletion(w, c, micros(timeout_s), wake);
          },
          py::arg("worker"), py::arg("completion"), py::arg("timeout_s") = 10.0, py::arg("wake") = true,
          py::call_guard<py::gil_scoped_release>())
      .def("pending_tasks", &QueueSet::pendingTasks, py::arg("worker"), "Tasks waiting in a worker's ring.")
      .def(
          "wake_control", [](QueueSet& q) { ringDoorbell(q.controlBell()); },
          "Rings the control plane's bell (a worker about to idle after quiet completions).")
      .def(
          "push_task",
          [](QueueSet& q, int w, const TaskDescriptor& t, const std::string& payload, double timeout_s) {
            TaskDescriptor d = t;
            d.payload_bytes = static_cast<uint32_t>(payload.size());
            return q.pushTask(w, d, payload, micros(timeout_s));
          },
          py::arg("worker"), py::arg("task"), py::arg("payload") = "", py::arg("timeout_s") = 10.0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "try_pop_completion",
          [](QueueSet& q, int w) -> std::optional<Completion> {
            Completion c;
            if (!q.tryPopCompletion(w, c)) return std::nullopt;
            return c;
          },
          py::arg("worker"))
      .def("request_abort", &QueueSet::requestAbort,
           "Makes the collectives of every world watching this set fail (see World.watch_abort).")
      .def("abort_address", [](QueueSet& q) { return reinterpret_cast<uintptr_t>(q.abortWord()); });

  // ---- outputs ----
  py::class_<MappedOutput, std::shared_ptr<MappedOutput>>(r, "MappedOutput", py::buffer_protocol())
      .def_property_readonly("bytes", &MappedOutput::bytes)
      .def_buffer([](MappedOutput& o) {
        return py::buffer_info(const_cast<void*>(o.data()), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<ssize_t>(o.bytes())}, {1}, /*readonly=*/false);
      });
  r.def("open_output", &MappedOutput::open, py::arg("ref"),
        "Maps an output a worker wrote (writable, private to this process) and removes its name.");
  r.def("discard_output", &discardOutput, py::arg("ref"));
  r.def("output_prefix", &outputPrefix, py::arg("queue_name"));
  r.def("unlink_outputs", &unlinkOutputs, py::arg("prefix"));
  r.def("world_shm_prefix", &worldShmPrefix, py::arg("queue_name"));

  // ---- requests, decisions, policies ----
  py::class_<Transition>(r, "Transition")
      .def_readonly("state", &Transition::state)
      .def_readonly("step", &Transition::step)
      .def_readonly("t_ns", &Transition::t_ns);

  py::class_<StageRecord>(r, "StageRecord")
      .def_property_readonly("kind", [](const StageRecord& s) { return s.kind; })
      .def_readonly("ranks", &StageRecord::ranks)
      .def_readonly("layout", &StageRecord::layout)
      .def_readonly("step_begin", &StageRecord::step_begin)
      .def_readonly("num_steps", &StageRecord::num_steps)
      .def_readonly("dispatch_ns", &StageRecord::dispatch_ns)
      .def_readonly("start_ns", &StageRecord::start_ns)
      .def_readonly("end_ns", &StageRecord::end_ns)
      .def_readonly("error", &StageRecord::error);

  py::enum_<LayoutFamily>(r, "LayoutFamily")
      .value("AUTO", LayoutFamily::kAuto)
      .value("USP", LayoutFamily::kUsp)
      .value("SWIFT", LayoutFamily::kSwift)
      .value("TORUS", LayoutFamily::kTorus);

  py::class_<RequestCost>(r, "RequestCost")
      .def_readonly("known", &RequestCost::known)
      .def_readonly("encode_s", &RequestCost::encode_s)
      .def_readonly("decode_s", &RequestCost::decode_s)
      .def_readonly("migrate_s", &RequestCost::migrate_s)
      .def_readonly("max_ulysses", &RequestCost::max_ulysses)
      .def("step_s", &RequestCost::stepSeconds, py::arg("degree"),
           "Seconds of one step on a group of `degree` ranks; inf where not predicted or not allowed.")
      .def("layout", &RequestCost::layoutFor, py::arg("degree"), "The layout step_s(degree) assumes.")
      .def("__repr__", [](const RequestCost& c) {
        std::string s = "RequestCost(known=" + std::string(c.known ? "True" : "False") + ", step_s={";
        bool first = true;
        for (int d = 1; d <= kMaxRanks && c.known; ++d) {
          if (!std::isfinite(c.step_s[d])) continue;
          s += (first ? "" : ", ") + std::to_string(d) + ": " + std::to_string(c.step_s[d]);
          first = false;
        }
        return s + "})";
      });
  r.def(
      "best_layout",
      [](const cost::CostModel& cost, int h, int w, int f, int steps, double g, int degree, int num_nodes,
         LayoutFamily family) {
        RequestShape shape = shapeOf(h, w, f, steps, g);
        shape.tokens = cost.model().tokens(h, w, f);
        double s = 0;
        Layout l = bestLayout(cost, shape, degree, num_nodes, maxUlyssesDegree(cost.model().heads), family, &s);
        return py::make_tuple(l, s);
      },
      py::arg("cost_model"), py::arg("height"), py::arg("width"), py::arg("num_frames"), py::arg("num_steps"),
      py::arg("guidance_scale"), py::arg("degree"), py::arg("num_nodes") = 1, py::arg("family") = LayoutFamily::kAuto,
      "The fastest layout of `family` for one step on `degree` ranks over `num_nodes` nodes, and its seconds.");

  py::class_<RequestRecord>(r, "RequestRecord")
      .def_readonly("id", &RequestRecord::id)
      .def_readonly("state", &RequestRecord::state)
      .def_readonly("step", &RequestRecord::step)
      .def_readonly("num_steps", &RequestRecord::num_steps)
      .def_readonly("arrival_ns", &RequestRecord::arrival_ns)
      .def_readonly("deadline_ns", &RequestRecord::deadline_ns)
      .def_readonly("priority", &RequestRecord::priority)
      .def_property_readonly("height", [](const RequestRecord& q) { return q.shape.height; })
      .def_property_readonly("width", [](const RequestRecord& q) { return q.shape.width; })
      .def_property_readonly("num_frames", [](const RequestRecord& q) { return q.shape.num_frames; })
      .def_property_readonly("tokens", [](const RequestRecord& q) { return q.shape.tokens; })
      .def_property_readonly("guidance_scale", [](const RequestRecord& q) { return q.shape.guidance_scale; })
      .def_readonly("max_degree", &RequestRecord::max_degree)
      .def_readonly("num_heads", &RequestRecord::num_heads)
      .def_readonly("ranks", &RequestRecord::ranks)
      .def_readonly("layout", &RequestRecord::layout)
      .def_readonly("busy", &RequestRecord::busy)
      .def_readonly("steps_in_flight", &RequestRecord::steps_in_flight)
      .def_readonly("attempts", &RequestRecord::attempts)
      .def_readonly("decision_end_ns", &RequestRecord::decision_end_ns)
      .def_readonly("cost", &RequestRecord::cost)
      .def_property_readonly("steps_left", &RequestRecord::stepsLeft)
      .def("remaining_s", &RequestRecord::remainingSeconds, py::arg("degree"),
           "Predicted seconds to its end on `degree` ranks (0 without a cost model).")
      .def("__repr__", [](const RequestRecord& q) {
        return "RequestRecord(id=" + std::to_string(q.id) + ", state=" + requestStateName(q.state) +
               ", step=" + std::to_string(q.step) + "/" + std::to_string(q.num_steps) + ")";
      });

  py::class_<Decision>(r, "Decision")
      .def(py::init([](uint64_t id, std::vector<int> ranks, Layout layout, int steps) {
             Decision d;
             d.request_id = id;
             d.ranks = std::move(ranks);
             d.layout = layout;
             d.num_steps = steps;
             return d;
           }),
           py::arg("request_id"), py::arg("ranks"), py::arg("layout") = Layout(), py::arg("num_steps") = 1)
      .def_readwrite("request_id", &Decision::request_id)
      .def_readwrite("ranks", &Decision::ranks)
      .def_readwrite("layout", &Decision::layout)
      .def_readwrite("num_steps", &Decision::num_steps)
      .def_readwrite("dispatch_ahead", &Decision::dispatch_ahead);

  auto recordList = [](const std::vector<const RequestRecord*>& v) {
    py::list out;
    for (const auto* p : v) out.append(py::cast(p, py::return_value_policy::reference));
    return out;
  };
  py::class_<SchedulerView>(r, "SchedulerView")
      .def_readonly("now_ns", &SchedulerView::now_ns)
      .def_readonly("world_size", &SchedulerView::world_size)
      .def_readonly("free_ranks", &SchedulerView::free_ranks)
      .def_readonly("node_of", &SchedulerView::node_of)
      .def_property_readonly("ready", [recordList](const SchedulerView& v) { return recordList(v.ready); })
      .def_property_readonly("running", [recordList](const SchedulerView& v) { return recordList(v.running); })
      .def_property_readonly("cost", [](const SchedulerView& v) -> py::object {
        if (v.cost == nullptr) return py::none();
        return py::cast(v.cost, py::return_value_policy::reference);
      });

  py::class_<Policy, PyPolicy, std::shared_ptr<Policy>>(r, "Policy")
      .def(py::init<>())
      .def("name", &Policy::name)
      .def("schedule", &Policy::schedule)
      .def("layouts", &Policy::layouts);
  r.def(
      "make_policy", [](const std::string& name) { return std::shared_ptr<Policy>(makePolicy(name)); }, py::arg("name"),
      "A built-in policy by name; unknown names raise InvalidUsage listing the built-in ones.");
  r.def("policy_names", &policyNames);
  r.def("max_ulysses_degree", &maxUlyssesDegree, py::arg("heads"),
        "The largest Ulysses degree a model of `heads` heads allows: the heads (uneven splits allowed), <= 64.");
  r.def("plain_layout", &plainLayout, py::arg("degree"), py::arg("num_heads"),
        "The layout policies use without a cost model: Ulysses over gcd(degree, heads), Ring for the rest.");

  py::class_<RequestLimits>(r, "RequestLimits")
      .def(py::init<>())
      .def_static(
          "of", [](const std::string& model) { return RequestLimits::of(cost::modelArch(model)); }, py::arg("model"),
          "The limits of a known model.")
      .def_readwrite("vae_stride_s", &RequestLimits::vae_stride_s)
      .def_readwrite("patch_s", &RequestLimits::patch_s)
      .def_readwrite("temporal_stride", &RequestLimits::temporal_stride)
      .def_readwrite("patch_t", &RequestLimits::patch_t)
      .def_readwrite("is_video", &RequestLimits::is_video)
      .def_readwrite("max_steps", &RequestLimits::max_steps)
      .def_readwrite("max_pixels", &RequestLimits::max_pixels)
      .def_readwrite("max_frames", &RequestLimits::max_frames)
      .def_readwrite("max_tokens", &RequestLimits::max_tokens)
      .def_readwrite("max_payload_bytes", &RequestLimits::max_payload_bytes)
      .def(
          "check",
          [](const RequestLimits& lim, int h, int w, int f, int steps, double g) {
            RequestShape s = shapeOf(h, w, f, steps, g);
            checkRequest(s, lim);
            return s.tokens;
          },
          py::arg("height"), py::arg("width"), py::arg("num_frames"), py::arg("num_steps"),
          py::arg("guidance_scale") = 1.0,
          "Checks a request; returns its tokens or raises InvalidUsage naming the field.")
      .def("tokens", &RequestLimits::tokens);
  r.def(
      "check_request",
      [](const std::string& model, int h, int w, int f, int steps, double g) {
        RequestShape s = shapeOf(h, w, f, steps, g);
        checkRequest(s, RequestLimits::of(cost::modelArch(model)));
        return s.tokens;
      },
      py::arg("model"), py::arg("height"), py::arg("width"), py::arg("num_frames"), py::arg("num_steps"),
      py::arg("guidance_scale") = 1.0,
      "Checks a request against a known model's limits; returns its tokens or raises InvalidUsage naming the field.");

  // ---- the engine loop ----
  py::class_<RequestResult>(r, "RequestResult")
      .def_readonly("id", &RequestResult::id)
      .def_readonly("state", &RequestResult::state)
      .def_readonly("reason", &RequestResult::reason)
      .def_readonly("stages", &RequestResult::stages)
      .def_readonly("transitions", &RequestResult::transitions)
      .def_readonly("output", &RequestResult::output)
      .def_readonly("arrival_ns", &RequestResult::arrival_ns)
      .def_readonly("deadline_ns", &RequestResult::deadline_ns)
      .def_readonly("priority", &RequestResult::priority);

  py::class_<ProbeSample>(r, "ProbeSample")
      .def_readonly("dispatch_ns", &ProbeSample::dispatch_ns)
      .def_readonly("start_ns", &ProbeSample::start_ns)
      .def_readonly("post_ns", &ProbeSample::post_ns)
      .def_readonly("seen_ns", &ProbeSample::seen_ns);

  py::class_<EngineLoop>(r, "EngineLoop")
      .def(py::init([](int num_workers, const py::object& policy, std::shared_ptr<cost::CostModel> cost,
                       int max_inflight_steps, double task_timeout_s, int max_attempts, uint32_t ring_bytes,
                       std::vector<int> node_of, bool lookahead) {
             EngineOptions o;
             o.num_workers = num_workers;
             o.ring_bytes = ring_bytes;
             o.control.max_inflight_steps = max_inflight_steps;
             o.control.task_timeout_s = task_timeout_s;
             o.control.max_attempts = max_attempts;
             o.control.node_of = std::move(node_of);
             o.control.lookahead = lookahead;
             return std::make_unique<EngineLoop>(o, policyFrom(policy), std::move(cost));
           }),
           py::arg("num_workers"), py::arg("policy"), py::arg("cost") = nullptr, py::arg("max_inflight_steps") = 2,
           py::arg("task_timeout_s") = 0.0, py::arg("max_attempts") = 3, py::arg("ring_bytes") = 1u << 20,
           py::arg("node_of") = std::vector<int>(), py::arg("lookahead") = true)
      .def_property_readonly("queue_name", &EngineLoop::queueName)
      .def_property_readonly("output_prefix", &EngineLoop::outputNamePrefix)
      .def_property_readonly("world_shm_prefix", &EngineLoop::worldShmPrefix)
      .def("await_workers", &EngineLoop::awaitWorkers, py::arg("pids"), py::arg("timeout_s"),
           py::call_guard<py::gil_scoped_release>())
      .def("start", &EngineLoop::start)
      .def(
          "submit",
          [](EngineLoop& e, int h, int w, int f, int steps, double g, int64_t tokens, double deadline_s, int priority,
             int max_degree, const py::bytes& payload, int num_heads) {
            RequestSpec s;
            s.shape = shapeOf(h, w, f, steps, g);
            s.shape.tokens = tokens;
            s.arrival_ns = nowNs();
            if (std::isfinite(deadline_s)) s.deadline_ns = s.arrival_ns + static_cast<int64_t>(deadline_s * 1e9);
            s.priority = priority;
            s.max_degree = max_degree;
            s.num_heads = num_heads;
            s.payload = payload;
            py::gil_scoped_release nogil;
            return e.submit(std::move(s));
          },
          py::arg("height"), py::arg("width"), py::arg("num_frames"), py::arg("num_steps"), py::arg("guidance_scale"),
          py::arg("tokens"), py::arg("deadline_s"), py::arg("priority"), py::arg("max_degree"), py::arg("payload"),
          py::arg("num_heads") = 0)
      .def("cancel", &EngineLoop::cancel, py::call_guard<py::gil_scoped_release>())
      .def("wait_results", &EngineLoop::waitResults, py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def(
          "status",
          [](EngineLoop& e, uint64_t id) -> py::object {
            RequestStatus s;
            {
              py::gil_scoped_release nogil;
              s = e.status(id);
            }
            if (!s.known) return py::none();
            py::dict d;
            d["state"] = s.state;
            d["step"] = s.step;
            d["num_steps"] = s.num_steps;
            d["ranks"] = s.ranks;
            return d;
          },
          py::arg("request_id"))
      .def("ping", &EngineLoop::ping, py::arg("worker"), py::arg("count"), py::arg("timeout_s"),
           py::call_guard<py::gil_scoped_release>())
      .def("stats",
           [](EngineLoop& e) {
             EngineStats s;
             {
               py::gil_scoped_release nogil;
               s = e.stats();
             }
             return statsDict(s);
           })
      .def("shutdown", &EngineLoop::shutdown, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("closed", &EngineLoop::closed);

  // ---- the simulator ----
  py::class_<SimRequest>(r, "SimRequest")
      .def(py::init([](uint64_t id, double arrival_s, int h, int w, int f, int steps, std::optional<double> g,
                       std::optional<double> deadline_s, int priority) {
             SimRequest q;
             q.id = id;
             q.arrival_s = arrival_s;
             q.shape = shapeOf(h, w, f, steps, g ? *g : -1.0);  // no guidance: the model's default
             q.deadline_s = deadline_s ? *deadline_s : std::nan("");
             q.priority = priority;
             return q;
           }),
           py::kw_only(), py::arg("id"), py::arg("arrival_s"), py::arg("height"), py::arg("width"),
           py::arg("num_frames") = 1, py::arg("num_steps") = 0, py::arg("guidance_scale") = py::none(),
           py::arg("deadline_s") = py::none(), py::arg("priority") = 0)
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
      .def_property_readonly("intervals",
                             [](const SimResult& s) {
                               py::list out;
                               for (const auto& iv : s.intervals) {
                                 out.append(py::make_tuple(
                                     iv.rank, iv.request_id,
                                     taskKindName(iv.kind) == std::string("denoise") ? "step" : taskKindName(iv.kind),
                                     iv.start_s, iv.end_s));
                               }
                               return out;
                             })
      .def_readonly("busy_rank_s", &SimResult::busy_rank_s)
      .def_readonly("num_ranks", &SimResult::num_ranks)
      .def_readonly("makespan_s", &SimResult::makespan_s)
      .def_readonly("num_tasks", &SimResult::num_tasks)
      .def_readonly("wall_s", &SimResult::wall_s)
      .def_property_readonly("stats", [](const SimResult& s) {
        EngineStats e;
        e.control = s.stats;
        return statsDict(e);
      });

  py::class_<Simulator>(r, "Simulator")
      .def(py::init([](std::shared_ptr<cost::CostModel> cost, const cost::Cluster& cluster, const py::object& policy,
                       int max_inflight_steps, bool record_intervals, double dispatch_s, double completion_s,
                       double regroup_s, int num_cores, bool lookahead, double collective_efficiency,
                       bool regroup_every_change) {
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
             return std::make_unique<Simulator>(std::move(cost), cluster, policyFrom(policy), o);
           }),
           py::arg("cost_model"), py::arg("cluster"), py::arg("policy"), py::arg("max_inflight_steps") = 2,
           py::arg("record_intervals") = false, py::arg("dispatch_s") = 0.0, py::arg("completion_s") = 0.0,
           py::arg("regroup_s") = -1.0, py::arg("num_cores") = -1, py::arg("lookahead") = true,
           py::arg("collective_efficiency") = 1.0, py::arg("regroup_every_change") = false)
      .def("run", &Simulator::run, py::arg("requests"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace python
}  // namespace gfdit
