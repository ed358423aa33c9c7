// gfdit._C.runtime's real-time parts: the engine loop (gfdit.Engine's core: requests in, progress and results
// out) and the worker loop (a worker's end of the rings). Blocking calls release the GIL; a Python policy takes
// it only while it decides.
#include <pybind11/stl.h>

#include "bindings.h"
#include "errors_py.h"
#include "gfdit/clock.h"
#include "gfdit/cost.h"
#include "gfdit/engine_loop.h"
#include "gfdit/error.h"
#include "gfdit/worker_loop.h"
#include "runtime_py.h"

namespace py = pybind11;

namespace gfdit {
namespace python {

using namespace gfdit::runtime;

void register_engine(py::module_& m) {
  py::module_ r = m.def_submodule("runtime");  // made by register_runtime

  // ---- the worker's loop (NOTE [worker loop]) ----
  py::class_<WorkerTask>(r, "WorkerTask", "One task as a worker runs it.")
      .def_readonly("kind", &WorkerTask::kind)
      .def_readonly("task_id", &WorkerTask::task_id)
      .def_readonly("request_id", &WorkerTask::request_id)
      .def_readonly("step_begin", &WorkerTask::step_begin)
      .def_readonly("num_steps", &WorkerTask::num_steps)
      .def_readonly("src_rank", &WorkerTask::src_rank)
      .def_readonly("layout", &WorkerTask::layout)
      .def_readonly("ranks", &WorkerTask::ranks)
      .def_readonly("dispatch_ns", &WorkerTask::dispatch_ns)
      .def_readonly("request", &WorkerTask::request, "ENCODE: the request, every field set")
      .def_property_readonly(
          "batch",
          [](const WorkerTask& t) {
            std::vector<std::pair<uint64_t, int32_t>> out;
            for (size_t i = 0; i < t.batch.request_ids.size(); ++i) {
              out.emplace_back(t.batch.request_ids[i], t.batch.step_begins[i]);
            }
            return out;
          },
          "DENOISE of a batch: the other requests it steps with request_id, each with the step it starts at")
      .def_property_readonly(
          "epoch", [](const WorkerTask& t) { return t.reinit.epoch; }, "REINIT: the new world's epoch")
      .def_property_readonly(
          "workers", [](const WorkerTask& t) { return t.reinit.workers; },
          "REINIT: the workers of the new world, in rank order");

  py::class_<WorkerLoop>(r, "WorkerLoop", "A worker's end of the engine's rings (include/gfdit/worker_loop.h).")
      .def(py::init<const std::string&, int, int>(), py::arg("queue_name"), py::arg("worker"), py::arg("queue_fd") = -1)
      .def_property_readonly("worker", &WorkerLoop::worker)
      .def_property_readonly("world_shm_prefix", &WorkerLoop::worldShmPrefix)
      .def_property_readonly("abort_address", [](WorkerLoop& l) { return reinterpret_cast<uintptr_t>(l.abortWord()); })
      .def("hello", &WorkerLoop::hello, py::arg("info"), py::call_guard<py::gil_scoped_release>())
      .def("hello_failed", &WorkerLoop::helloFailed, py::arg("message"), py::call_guard<py::gil_scoped_release>())
      .def("next", &WorkerLoop::next, py::arg("poll_s"), py::call_guard<py::gil_scoped_release>(),
           "The next task to run, or None once the engine said to stop or is gone.")
      .def("progress", &WorkerLoop::progress, py::arg("request_id"), py::arg("step"), py::arg("cached_steps") = 0,
           py::arg("cached_passes") = 0)
      .def(
          "complete",
          [](WorkerLoop& l, const WorkerTask& t, const py::object& output) {
            if (output.is_none()) {
              py::gil_scoped_release nogil;
              l.complete(t);
              return;
            }
            py::buffer_info info = output.cast<py::buffer>().request();
            GFDIT_CHECK(info.ndim >= 0 && info.ndim <= 6).param("output") << "an output has at most 6 dimensions";
            ssize_t expect = info.itemsize;
            for (ssize_t k = info.ndim - 1; k >= 0; --k) {
              GFDIT_CHECK(info.shape[k] <= 1 || info.strides[k] == expect).param("output")
                  << "the output must be contiguous";
              expect *= info.shape[k];
            }
            DType dt = dtypeOfFormat(info.format, static_cast<size_t>(info.itemsize));
            std::vector<int64_t> shape(info.shape.begin(), info.shape.end());
            size_t bytes = static_cast<size_t>(info.size * info.itemsize);
            py::gil_scoped_release nogil;
            l.complete(t, info.ptr, bytes, dt, shape);
          },
          py::arg("task"), py::arg("output") = py::none(),
          "The task ran; a DECODE task's output (a contiguous array) goes into shared memory.")
      .def(
          "fail",
          [](WorkerLoop& l, const WorkerTask& t, const py::object& exc) {
            // the exception's class decides its code (NOTE [worker loop]); the text is "Type: message"
            ErrorCode code = errorCodeOf(exc);
            std::string text = py::str(py::type::of(exc).attr("__name__")).cast<std::string>() + ": " +
                               py::str(exc).cast<std::string>();
            py::gil_scoped_release nogil;
            l.fail(t, code, text);
          },
          py::arg("task"), py::arg("error"), "The task failed with this exception.")
      .def("held_step", &WorkerLoop::heldStep, py::arg("request_id"))
      .def_property_readonly("world_broken", &WorkerLoop::worldBroken);
  r.def(
      "task_error_of", [](const py::object& exc) { return taskErrorOf(errorCodeOf(exc)); }, py::arg("error"),
      "The TaskError a worker reports for this exception.");
  r.attr("MAX_PAYLOAD_BYTES") = kMaxPayloadBytes;
  r.attr("LIVENESS_INTERVAL_S") = kLivenessIntervalS;

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

  py::class_<RequestProgress>(r, "RequestProgress", "A change of a request's state, step or ranks.")
      .def_readonly("id", &RequestProgress::id)
      .def_readonly("state", &RequestProgress::state)
      .def_readonly("step", &RequestProgress::step)
      .def_readonly("num_steps", &RequestProgress::num_steps)
      .def_readonly("running", &RequestProgress::running)
      .def_readonly("ranks", &RequestProgress::ranks)
      .def_readonly("t_ns", &RequestProgress::t_ns);

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
      .def("await_workers", &EngineLoop::awaitWorkers, py::arg("pids"), py::arg("timeout_s"),
           py::call_guard<py::gil_scoped_release>(), "Waits for every worker's hello; returns the ModelInfo.")
      .def_property("limits", &EngineLoop::limits, &EngineLoop::setLimits, "What submit checks requests against.")
      .def("start", &EngineLoop::start)
      .def(
          "submit",
          [](EngineLoop& e, GenerationRequest& q) {
            py::gil_scoped_release nogil;
            return e.submit(q);
          },
          py::arg("request"),
          "Checks the request (its unset fields take the model's defaults, in place) and queues it; its id.")
      .def(
          "submit_group",
          [](EngineLoop& e, std::vector<GenerationRequest> qs) {
            std::vector<uint64_t> ids;
            {
              py::gil_scoped_release nogil;
              ids = e.submitGroup(qs);
            }
            return py::make_tuple(ids, qs);
          },
          py::arg("requests"),
          "Checks every request (none is queued if one fails), then queues them as one group (the n images of one "
          "job; the policies batch them where that pays); (their ids, the requests with defaults filled in).")
      .def(
          "check", [](const EngineLoop& e, GenerationRequest& q) { e.check(q); }, py::arg("request"),
          "What submit checks, alone: fills the request's unset fields, or raises as submit would.")
      .def("cancel", &EngineLoop::cancel, py::call_guard<py::gil_scoped_release>())
      .def(
          "wait_updates",
          [](EngineLoop& e, double timeout_s) {
            EngineUpdates u;
            {
              py::gil_scoped_release nogil;
              u = e.waitUpdates(timeout_s);
            }
            return py::make_tuple(std::move(u.progress), std::move(u.results));
          },
          py::arg("timeout_s"), "(progress, results) since the last call; waits up to timeout_s for one.")
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
      .def_property_readonly("closed", &EngineLoop::closed)
      .def("set_replacing", &EngineLoop::setReplacing, py::arg("on"), py::arg("reason") = std::string(),
           py::call_guard<py::gil_scoped_release>(),
           "Whether dead workers will be replaced (then the last one's death keeps the requests waiting).")
      .def_property_readonly("queue_fd", &EngineLoop::queueFd,
                             "A descriptor of the rings' region, for a replacement worker to inherit.")
      .def("prepare_replacement", &EngineLoop::prepareReplacement, py::arg("worker"),
           py::call_guard<py::gil_scoped_release>(), "Readies a dead worker's rings for its replacement.")
      .def("set_worker_pid", &EngineLoop::setWorkerPid, py::arg("worker"), py::arg("pid"),
           py::call_guard<py::gil_scoped_release>())
      .def("set_remote", &EngineLoop::setRemote, py::arg("worker"), py::arg("host"),
           py::call_guard<py::gil_scoped_release>(),
           "The worker runs on another host behind this relay (a NodeRelay): liveness, kill and abort go through it.")
      .def("take_replacement_error", &EngineLoop::takeReplacementError, py::arg("worker"),
           py::call_guard<py::gil_scoped_release>(),
           "Why the worker's latest replacement was refused at its hello ('' if it was not).");
}

}  // namespace python
}  // namespace gfdit
