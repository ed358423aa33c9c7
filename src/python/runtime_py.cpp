// gfdit._C.runtime, its plain parts: the enums of requests and tasks, the typed messages (a generation request,
// a worker's hello), outputs, request records, decisions and policies (Python policies subclass
// _C.runtime.Policy), request limits and checks. The engine loop and the worker loop: engine_py.cpp; the
// simulator: simulator_py.cpp.
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "bindings.h"
#include "errors_py.h"
#include "gfdit/control.h"
#include "gfdit/cost.h"
#include "gfdit/error.h"
#include "gfdit/limits.h"
#include "gfdit/messages.h"
#include "gfdit/outputs.h"
#include "gfdit/planning.h"
#include "gfdit/policy.h"
#include "gfdit/request.h"
#include "layout_py.h"
#include "runtime_py.h"

namespace py = pybind11;

namespace gfdit {
namespace python {
namespace {

using namespace gfdit::runtime;

// ---- GenerationRequest from Python: each field's type, checked once, here (its values: checkRequest) ----

std::string typeName(const py::handle& v) { return py::str(py::type::of(v).attr("__name__")).cast<std::string>(); }

bool isInt(const py::handle& v) { return PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr()); }

bool isNumber(const py::handle& v) { return isInt(v) || PyFloat_Check(v.ptr()); }

std::string stringField(const py::handle& v, const char* name) {
  GFDIT_CHECK(PyUnicode_Check(v.ptr())).param(name) << name << " must be a string, got " << typeName(v);
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(v.ptr(), &size);
  if (utf8 == nullptr) PyErr_Clear();  // a lone surrogate ("\ud800", which JSON allows) has no UTF-8
  GFDIT_CHECK(utf8 != nullptr).param(name)
      << name << " must be Unicode text: a \\uD800-\\uDFFF escape stands only in a surrogate pair";
  return std::string(utf8, static_cast<size_t>(size));
}

// lo <= v < hi for a Python int v, the bounds in decimal (the value may not fit a C++ integer at all)
bool inRange(const py::handle& v, const char* lo, const char* hi) {
  py::object as_int = py::module_::import("builtins").attr("int");
  return v.attr("__ge__")(as_int(lo)).cast<bool>() && v.attr("__lt__")(as_int(hi)).cast<bool>();
}

template <typename T>
T intField(const py::handle& v, const char* name, const char* lo, const char* hi, const char* what) {
  GFDIT_CHECK(isInt(v) && inRange(v, lo, hi)).param(name)
      << name << " must be " << what << ", got " << typeName(v) << " " << py::repr(v).cast<std::string>();
  return v.cast<T>();
}

std::optional<int32_t> optionalInt(const py::handle& v, const char* name) {
  if (v.is_none()) return std::nullopt;
  return intField<int32_t>(v, name, "-2147483648", "2147483648", "an integer (or None: the model's default)");
}

std::optional<double> optionalNumber(const py::handle& v, const char* name) {
  if (v.is_none()) return std::nullopt;
  GFDIT_CHECK(isNumber(v)).param(name) << name << " must be a number (or None), got " << typeName(v);
  return v.cast<double>();
}

GenerationRequest requestFrom(const py::object& prompt, const py::object& negative_prompt, const py::object& height,
                              const py::object& width, const py::object& num_frames,
                              const py::object& num_inference_steps, const py::object& guidance_scale,
                              const py::object& guidance_scale_2, const py::object& seed, const py::object& priority,
                              const py::object& deadline_s, const py::object& cache) {
  GenerationRequest q;
  q.prompt = stringField(prompt, "prompt");
  if (!negative_prompt.is_none()) q.negative_prompt = stringField(negative_prompt, "negative_prompt");
  q.height = optionalInt(height, "height");
  q.width = optionalInt(width, "width");
  q.num_frames = optionalInt(num_frames, "num_frames");
  q.num_inference_steps = optionalInt(num_inference_steps, "num_inference_steps");
  q.guidance_scale = optionalNumber(guidance_scale, "guidance_scale");
  q.guidance_scale_2 = optionalNumber(guidance_scale_2, "guidance_scale_2");
  q.seed = intField<uint64_t>(seed, "seed", "0", "18446744073709551616", "an integer in [0, 2^64)");
  q.priority = intField<int32_t>(priority, "priority", "-2147483648", "2147483648", "a 32-bit integer");
  q.deadline_s = optionalNumber(deadline_s, "deadline_s");
  q.cache = cacheSpecArg(cache);
  return q;
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
      .value("REINIT", TaskKind::kReinit)
      .value("GATHER", TaskKind::kGather);

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

  // Layout, LayoutMode and Placement: src/python/layout_py.cpp (register_layout runs first)

  // ---- the typed messages (NOTE [typed messages]) ----
  py::class_<GenerationRequest>(r, "GenerationRequest",
                                "A generation request as the engine checks it; unset fields (None) take the "
                                "model's defaults at submit.")
      .def(py::init(&requestFrom), py::kw_only(), py::arg("prompt"), py::arg("negative_prompt") = py::none(),
           py::arg("height") = py::none(), py::arg("width") = py::none(), py::arg("num_frames") = py::none(),
           py::arg("num_inference_steps") = py::none(), py::arg("guidance_scale") = py::none(),
           py::arg("guidance_scale_2") = py::none(), py::arg("seed") = 0, py::arg("priority") = 0,
           py::arg("deadline_s") = py::none(), py::arg("cache") = py::none(),
           "Each field is checked for its type here (gfdit.InvalidUsage naming it); its value at submit. cache: a "
           "CacheSpec, its text (\"fbcache:0.08,warmup=8\") or None.")
      .def_readonly("prompt", &GenerationRequest::prompt)
      .def_readonly("negative_prompt", &GenerationRequest::negative_prompt)
      .def_readonly("height", &GenerationRequest::height)
      .def_readonly("width", &GenerationRequest::width)
      .def_readonly("num_frames", &GenerationRequest::num_frames)
      .def_readonly("num_inference_steps", &GenerationRequest::num_inference_steps)
      .def_readonly("guidance_scale", &GenerationRequest::guidance_scale)
      .def_readonly("guidance_scale_2", &GenerationRequest::guidance_scale_2)
      .def_readonly("seed", &GenerationRequest::seed)
      .def_readonly("priority", &GenerationRequest::priority)
      .def_readonly("deadline_s", &GenerationRequest::deadline_s)
      .def_readonly("cache", &GenerationRequest::cache, "the step cache (a CacheSpec; kind \"none\" when off)");

  py::class_<ModelDefaults>(r, "ModelDefaults", "A model's serving defaults.")
      .def(py::init([](int32_t h, int32_t w, int32_t f, int32_t steps, double g) {
             ModelDefaults d;
             d.height = h;
             d.width = w;
             d.num_frames = f;
             d.num_steps = steps;
             d.guidance_scale = g;
             return d;
           }),
           py::kw_only(), py::arg("height"), py::arg("width"), py::arg("num_frames"), py::arg("num_steps"),
           py::arg("guidance_scale"))
      .def_readonly("height", &ModelDefaults::height)
      .def_readonly("width", &ModelDefaults::width)
      .def_readonly("num_frames", &ModelDefaults::num_frames)
      .def_readonly("num_steps", &ModelDefaults::num_steps)
      .def_readonly("guidance_scale", &ModelDefaults::guidance_scale);

  py::class_<ModelInfo>(r, "ModelInfo", "What a worker reports of the model it loaded (its hello).")
      .def(py::init<>())
      .def_readwrite("name", &ModelInfo::name)
      .def_readwrite("heads", &ModelInfo::heads)
      .def_readwrite("is_video", &ModelInfo::is_video)
      .def_readwrite("patch_t", &ModelInfo::patch_t)
      .def_readwrite("patch_s", &ModelInfo::patch_s)
      .def_readwrite("vae_stride_s", &ModelInfo::vae_stride_s)
      .def_readwrite("vae_stride_t", &ModelInfo::vae_stride_t)
      .def_readwrite("two_experts", &ModelInfo::two_experts)
      .def_property(
          "cache_kinds",
          [](const ModelInfo& m) {
            std::vector<std::string> names;
            for (CacheKind k : {CacheKind::kFbCache, CacheKind::kTeaCache}) {
              if (m.cache_kinds & cacheKindBit(k)) names.push_back(cacheKindName(k));
            }
            return names;
          },
          [](ModelInfo& m, const std::vector<std::string>& names) {
            uint32_t kinds = 0;
            for (const std::string& n : names) {
              const CacheKind k = cacheKindFromName(n);
              if (k != CacheKind::kNone) kinds |= cacheKindBit(k);
            }
            m.cache_kinds = kinds;
          },
          "the step caches the model implements, by name (\"fbcache\", \"teacache\")")
      .def_readwrite("defaults", &ModelInfo::defaults)
      .def("__repr__", [](const ModelInfo& m) {
        return "ModelInfo(name='" + m.name + "', heads=" + std::to_string(m.heads) +
               ", is_video=" + (m.is_video ? "True" : "False") + ")";
      });

  py::class_<OutputRef>(r, "OutputRef")
      .def(py::init<>())
      .def_property_readonly("name", &refName)
      .def_property_readonly("dtype", [](const OutputRef& o) { return static_cast<DType>(o.dtype); })
      .def_property_readonly("shape", &refShape)
      .def_readonly("bytes", &OutputRef::bytes);

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
      .def_readonly("error", &StageRecord::error)
      .def_readonly("regroup", &StageRecord::regroup,
                    "a denoise task on another set of ranks than the request's previous one (NOTE [regroups])")
      .def_readonly("batch", &StageRecord::batch,
                    "requests the task stepped in one batched forward, this one included (NOTE [batches])")
      .def_readonly("cached_steps", &StageRecord::cached_steps,
                    "steps of the task whose every pass reused the step cache (NOTE [step caches])")
      .def_readonly("cached_passes", &StageRecord::cached_passes, "transformer passes of the task that reused it");

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
      .def_readonly("decode_degree", &RequestCost::decode_degree)
      .def("decode_at", &RequestCost::decodeSeconds, py::arg("degree"),
           "Seconds of the decode split over `degree` ranks (decode_s where that degree was not predicted).")
      .def("step_s", &RequestCost::stepSeconds, py::arg("degree"),
           "Seconds of one step on a group of `degree` ranks, the mean over the request's steps of what its step "
           "cache is expected to leave of them; inf where not predicted or not allowed.")
      .def("steps_s", &RequestCost::stepsSeconds, py::arg("degree"), py::arg("begin"), py::arg("count"),
           "Seconds of steps [begin, begin + count) on `degree` ranks: warm-up steps in full, the others the "
           "expected mix of full and cached steps (NOTE [step caches]).")
      .def(
          "full_step_s",
          [](const RequestCost& c, int d) {
            return d >= 1 && d <= kMaxRanks ? c.full_step_s[d] : std::numeric_limits<double>::infinity();
          },
          py::arg("degree"), "Seconds of a step that computes every block.")
      .def(
          "cached_step_s",
          [](const RequestCost& c, int d) {
            return d >= 1 && d <= kMaxRanks ? c.cached_step_s[d] : std::numeric_limits<double>::infinity();
          },
          py::arg("degree"), "Seconds of a step whose passes all reuse the step cache (the full step without one).")
      .def_readonly("cache", &RequestCost::cache)
      .def_readonly("cache_share", &RequestCost::cache_share,
                    "expected share of the steps past the warm-up that reuse the cache")
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
      .def_property_readonly("latent_rows", [](const RequestRecord& q) { return q.shape.latent_rows; })
      .def_property_readonly("guidance_scale", [](const RequestRecord& q) { return q.shape.guidance_scale; })
      .def_property_readonly(
          "cache", [](const RequestRecord& q) { return q.shape.cache; }, "its step cache (a CacheSpec)")
      .def_readonly("max_degree", &RequestRecord::max_degree)
      .def_readonly("num_heads", &RequestRecord::num_heads)
      .def_readonly("ranks", &RequestRecord::ranks)
      .def_readonly("layout", &RequestRecord::layout)
      .def_readonly("busy", &RequestRecord::busy)
      .def_readonly("steps_in_flight", &RequestRecord::steps_in_flight)
      .def_readonly("attempts", &RequestRecord::attempts)
      .def_readonly("decision_end_ns", &RequestRecord::decision_end_ns)
      .def_readonly("batch_leader", &RequestRecord::batch_leader,
                    "busy: the request whose batch it runs in (its own id when it leads one), else 0")
      .def_readonly("batch_size", &RequestRecord::batch_size)
      .def_readonly("group", &RequestRecord::group,
                    "submitted together with the other requests of this group (Engine.submit_batch); 0: none")
      .def_readonly("cost", &RequestRecord::cost)
      .def_property_readonly("steps_left", &RequestRecord::stepsLeft)
      .def("remaining_s", &RequestRecord::remainingSeconds, py::arg("degree"),
           "Predicted seconds to its end on `degree` ranks (0 without a cost model).")
      .def("__repr__", [](const RequestRecord& q) {
        return "RequestRecord(id=" + std::to_string(q.id) + ", state=" + requestStateName(q.state) +
               ", step=" + std::to_string(q.step) + "/" + std::to_string(q.num_steps) + ")";
      });

  py::class_<Decision>(r, "Decision")
      .def(py::init([](uint64_t id, std::vector<int> ranks, Layout layout, int steps, int decode_degree,
                       std::vector<uint64_t> batch, cost::Stage stage) {
             Decision d;
             d.request_id = id;
             d.ranks = std::move(ranks);
             d.layout = layout;
             d.num_steps = steps;
             d.decode_degree = decode_degree;
             d.batch = std::move(batch);
             d.stage = stage;
             return d;
           }),
           py::arg("request_id"), py::arg("ranks"), py::arg("layout") = Layout(), py::arg("num_steps") = 1,
           py::arg("decode_degree") = 0, py::arg("batch") = std::vector<uint64_t>(),
           py::arg("stage") = cost::Stage::kDenoise)
      .def_readwrite("request_id", &Decision::request_id)
      .def_readwrite("ranks", &Decision::ranks)
      .def_readwrite("layout", &Decision::layout)
      .def_readwrite("num_steps", &Decision::num_steps)
      .def_readwrite("dispatch_ahead", &Decision::dispatch_ahead)
      .def_readwrite("decode_degree", &Decision::decode_degree,
                     "Ranks the decode splits over after these steps: 0, the cost model's choice.")
      .def_readwrite("stage", &Decision::stage,
                     "What it runs: Stage.DENOISE (its steps, after its encode when it has not started), Stage.ENCODE "
                     "(the encode alone) or Stage.DECODE (the decode, for a policy that places decodes); NOTE [stages]")
      .def_readwrite("batch", &Decision::batch,
                     "Other ready requests of the same shape and guidance that run these steps with it, one batched "
                     "forward per step (NOTE [batches])");

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
      .def("layouts", &Policy::layouts)
      .def(
          "places_decodes", &Policy::placesDecodes,
          "Whether it places decodes itself (Decision.stage = Stage.DECODE): a request whose steps are done then waits "
          "for its decision instead of decoding on its holders at once.");
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
      .def_static(
          "of_loaded",
          [](const std::string& model, const ModelInfo& info) {
            return RequestLimits::of(cost::modelArch(model), info);
          },
          py::arg("model"), py::arg("info"),
          "The limits of a loaded model: its registry entry's, with the strides its workers reported.")
      .def_readwrite("vae_stride_s", &RequestLimits::vae_stride_s)
      .def_readwrite("patch_s", &RequestLimits::patch_s)
      .def_readwrite("temporal_stride", &RequestLimits::temporal_stride)
      .def_readwrite("patch_t", &RequestLimits::patch_t)
      .def_readwrite("is_video", &RequestLimits::is_video)
      .def_readwrite("max_steps", &RequestLimits::max_steps)
      .def_readwrite("max_pixels", &RequestLimits::max_pixels)
      .def_readwrite("max_frames", &RequestLimits::max_frames)
      .def_readwrite("max_tokens", &RequestLimits::max_tokens)
      .def_readwrite("cache_kinds", &RequestLimits::cache_kinds, "the step caches the model implements, as bits")
      .def(
          "check",
          [](const RequestLimits& lim, int h, int w, int f, int steps, double g, py::handle cache) {
            RequestShape s = shapeOf(h, w, f, steps, g);
            s.cache = cacheSpecArg(cache);
            checkRequest(s, lim);
            return s.tokens;
          },
          py::arg("height"), py::arg("width"), py::arg("num_frames"), py::arg("num_steps"),
          py::arg("guidance_scale") = 1.0, py::arg("cache") = py::none(),
          "Checks a request; returns its tokens or raises InvalidUsage naming the field.")
      .def("tokens", &RequestLimits::tokens);
  r.def(
      "check_request",
      [](const std::string& model, int h, int w, int f, int steps, double g, py::handle cache) {
        RequestShape s = shapeOf(h, w, f, steps, g);
        s.cache = cacheSpecArg(cache);
        checkRequest(s, RequestLimits::of(cost::modelArch(model)));
        return s.tokens;
      },
      py::arg("model"), py::arg("height"), py::arg("width"), py::arg("num_frames"), py::arg("num_steps"),
      py::arg("guidance_scale") = 1.0, py::arg("cache") = py::none(),
      "Checks a request against a known model's limits; returns its tokens or raises InvalidUsage naming the field.");
}

}  // namespace python
}  // namespace gfdit
