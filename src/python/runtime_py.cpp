// gfdit._C runtime: task descriptors, shared-memory queues, the scheduler and policies (Python policies
// subclass _C.Policy). Blocking queue operations release the GIL.
#include <pybind11/stl.h>

#include <cstring>

#include "bindings.h"
#include "gfdit/error.h"
#include "gfdit/runtime.h"

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
};

// A Policy owned by Python: the scheduler holds it through this adapter and keeps the object alive.
class HeldPolicy : public Policy {
 public:
  explicit HeldPolicy(py::object obj) : obj_(std::move(obj)), policy_(obj_.cast<Policy*>()) {}
  ~HeldPolicy() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }
  std::string name() const override { return policy_->name(); }
  std::vector<Decision> schedule(const SchedulerView& view) override { return policy_->schedule(view); }

 private:
  py::object obj_;
  Policy* policy_;
};

std::chrono::microseconds micros(double seconds) {
  return std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

std::vector<int> ranksOf(const TaskDescriptor& t) { return std::vector<int>(t.ranks, t.ranks + t.num_ranks); }

}  // namespace

void register_runtime(py::module_& m) {
  py::module_ r = m.def_submodule("runtime", "trajectory runtime control plane");
  r.def("now_ns", &nowNs, "Monotonic nanoseconds, comparable across the processes of a machine.");

  py::enum_<TaskKind>(r, "TaskKind")
      .value("ENCODE", TaskKind::kEncode)
      .value("DENOISE", TaskKind::kDenoise)
      .value("MIGRATE", TaskKind::kMigrate)
      .value("DECODE", TaskKind::kDecode)
      .value("FREE", TaskKind::kFree)
      .value("SHUTDOWN", TaskKind::kShutdown)
      .value("REINIT", TaskKind::kReinit);

  py::enum_<RequestState>(r, "RequestState")
      .value("QUEUED", RequestState::kQueued)
      .value("ENCODING", RequestState::kEncoding)
      .value("DENOISING", RequestState::kDenoising)
      .value("DECODING", RequestState::kDecoding)
      .value("DONE", RequestState::kDone)
      .value("FAILED", RequestState::kFailed)
      .value("CANCELLED", RequestState::kCancelled);

  py::class_<Layout>(r, "Layout")
      .def(py::init([](int u, int ring, int mode, int placement) {
             Layout l;
             l.ulysses = u;
             l.ring = ring;
             l.mode = mode;
             l.placement = placement;
             return l;
           }),
           py::arg("ulysses") = 1, py::arg("ring") = 1, py::arg("mode") = 0, py::arg("placement") = 0)
      .def_readwrite("ulysses", &Layout::ulysses)
      .def_readwrite("ring", &Layout::ring)
      .def_readwrite("mode", &Layout::mode)
      .def_readwrite("placement", &Layout::placement)
      .def("__repr__", [](const Layout& l) {
        return "Layout(ulysses=" + std::to_string(l.ulysses) + ", ring=" + std::to_string(l.ring) +
               ", mode=" + std::to_string(l.mode) + ", placement=" + std::to_string(l.placement) + ")";
      });

  py::class_<TaskDescriptor>(r, "TaskDescriptor")
      .def(py::init<>())
      .def_readwrite("task_id", &TaskDescriptor::task_id)
      .def_readwrite("request_id", &TaskDescriptor::request_id)
      .def_property(
          "kind", [](const TaskDescriptor& t) { return static_cast<TaskKind>(t.kind); },
          [](TaskDescriptor& t, TaskKind k) { t.kind = static_cast<uint32_t>(k); })
      .def_readwrite("step_begin", &TaskDescriptor::step_begin)
      .def_readwrite("num_steps", &TaskDescriptor::num_steps)
      .def_readwrite("src_rank", &TaskDescriptor::src_rank)
      .def_readwrite("layout", &TaskDescriptor::layout)
      .def_readwrite("dispatch_ns", &TaskDescriptor::dispatch_ns)
      .def_property("ranks", &ranksOf,
                    [](TaskDescriptor& t, const std::vector<int>& ranks) {
                      GFDIT_CHECK(!ranks.empty() && ranks.size() <= static_cast<size_t>(kMaxRanks))
                          << "a task needs 1.." << kMaxRanks << " ranks";
                      t.num_ranks = static_cast<int32_t>(ranks.size());
                      for (size_t i = 0; i < ranks.size(); ++i) t.ranks[i] = static_cast<int16_t>(ranks[i]);
                    })
      .def_property(
          "payload", [](const TaskDescriptor& t) { return py::bytes(t.payload, t.payload_bytes); },
          [](TaskDescriptor& t, const py::bytes& b) {
            std::string s = b;
            GFDIT_CHECK(s.size() <= kPayloadBytes)
                << "task payload of " << s.size() << " bytes exceeds " << kPayloadBytes;
            std::memcpy(t.payload, s.data(), s.size());
            t.payload_bytes = static_cast<uint32_t>(s.size());
          });
  r.attr("PAYLOAD_BYTES") = kPayloadBytes;

  py::class_<Completion>(r, "Completion")
      .def(py::init<>())
      .def_readwrite("task_id", &Completion::task_id)
      .def_readwrite("request_id", &Completion::request_id)
      .def_property(
          "kind", [](const Completion& c) { return static_cast<TaskKind>(c.kind); },
          [](Completion& c, TaskKind k) { c.kind = static_cast<uint32_t>(k); })
      .def_readwrite("rank", &Completion::rank)
      .def_property(
          "ok", [](const Completion& c) { return c.ok != 0; }, [](Completion& c, bool ok) { c.ok = ok ? 1 : 0; })
      .def_readwrite("step_end", &Completion::step_end)
      .def_readwrite("dispatch_ns", &Completion::dispatch_ns)
      .def_readwrite("start_ns", &Completion::start_ns)
      .def_readwrite("end_ns", &Completion::end_ns)
      .def_readwrite("post_ns", &Completion::post_ns)
      .def_property(
          "message", [](const Completion& c) { return std::string(c.message, c.message_bytes); },
          [](Completion& c, const std::string& s) {
            size_t n = std::min(s.size(), sizeof(c.message));  // long messages are cut, not refused
            std::memcpy(c.message, s.data(), n);
            c.message_bytes = static_cast<uint32_t>(n);
          });

  py::class_<QueueSet, std::shared_ptr<QueueSet>>(r, "QueueSet")
      .def_static("create", [](int n, uint32_t cap) { return std::shared_ptr<QueueSet>(QueueSet::create(n, cap)); },
                  py::arg("num_workers"), py::arg("capacity") = 256)
      .def_static("attach", [](const std::string& name) { return std::shared_ptr<QueueSet>(QueueSet::attach(name)); })
      .def_property_readonly("name", &QueueSet::name)
      .def_property_readonly("num_workers", &QueueSet::numWorkers)
      .def("unlink_name", &QueueSet::unlinkName)
      .def(
          "push_task",
          [](QueueSet& q, int w, const TaskDescriptor& t, double timeout_s) {
            GFDIT_CHECK(w >= 0 && w < q.numWorkers()) << "worker " << w;
            return q.dispatch(w).push(&t, micros(timeout_s));
          },
          py::arg("worker"), py::arg("task"), py::arg("timeout_s") = 10.0, py::call_guard<py::gil_scoped_release>())
      .def(
          "pop_task",
          [](QueueSet& q, int w, double timeout_s) -> std::optional<TaskDescriptor> {
            GFDIT_CHECK(w >= 0 && w < q.numWorkers()) << "worker " << w;
            TaskDescriptor t;
            if (!q.dispatch(w).pop(&t, micros(timeout_s))) return std::nullopt;
            return t;
          },
          py::arg("worker"), py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def(
          "push_completion",
          [](QueueSet& q, const Completion& c, double timeout_s) { return q.completion().push(&c, micros(timeout_s)); },
          py::arg("completion"), py::arg("timeout_s") = 10.0, py::call_guard<py::gil_scoped_release>())
      .def(
          "pop_completion",
          [](QueueSet& q, double timeout_s) -> std::optional<Completion> {
            Completion c;
            if (!q.completion().pop(&c, micros(timeout_s))) return std::nullopt;
            return c;
          },
          py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>())
      .def("pending_tasks", [](QueueSet& q, int w) { return q.dispatch(w).size(); })
      .def("request_abort", &QueueSet::requestAbort,
           "Makes the collectives of every world watching this set fail (see World.watch_abort).")
      .def("abort_address", [](QueueSet& q) { return reinterpret_cast<uintptr_t>(q.abortWord()); });

  py::class_<Transition>(r, "Transition")
      .def_readonly("state", &Transition::state)
      .def_readonly("step", &Transition::step)
      .def_readonly("t_ns", &Transition::t_ns);

  py::class_<RequestRecord>(r, "RequestRecord")
      .def(py::init<>())
      .def_readwrite("id", &RequestRecord::id)
      .def_readonly("state", &RequestRecord::state)
      .def_readwrite("step", &RequestRecord::step)
      .def_readwrite("num_steps", &RequestRecord::num_steps)
      .def_readwrite("arrival_ns", &RequestRecord::arrival_ns)
      .def_readwrite("deadline_ns", &RequestRecord::deadline_ns)
      .def_readwrite("cost_per_step", &RequestRecord::cost_per_step)
      .def_readwrite("max_degree", &RequestRecord::max_degree)
      .def_readwrite("ranks", &RequestRecord::ranks)
      .def_readwrite("layout", &RequestRecord::layout)
      .def_readwrite("busy", &RequestRecord::busy)
      .def_readonly("reason", &RequestRecord::reason)
      .def_readonly("transitions", &RequestRecord::transitions);

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
      .def_readwrite("num_steps", &Decision::num_steps);

  py::class_<SchedulerView>(r, "SchedulerView")
      .def_readonly("now_ns", &SchedulerView::now_ns)
      .def_readonly("world_size", &SchedulerView::world_size)
      .def_readonly("free_ranks", &SchedulerView::free_ranks)
      .def_property_readonly("ready",
                             [](const SchedulerView& v) {
                               py::list out;
                               for (const auto* p : v.ready) out.append(py::cast(p, py::return_value_policy::reference));
                               return out;
                             })
      .def_property_readonly("running", [](const SchedulerView& v) {
        py::list out;
        for (const auto* p : v.running) out.append(py::cast(p, py::return_value_policy::reference));
        return out;
      });

  py::class_<Policy, PyPolicy>(r, "Policy")
      .def(py::init<>())
      .def("name", &Policy::name)
      .def("schedule", &Policy::schedule);

  py::class_<Scheduler>(r, "Scheduler")
      .def(py::init([](int world_size, py::object policy) {
             if (py::isinstance<py::str>(policy)) {
               return std::make_unique<Scheduler>(world_size, makePolicy(policy.cast<std::string>()));
             }
             GFDIT_CHECK(py::isinstance<Policy>(policy))
                 << "a policy is a name ('fcfs', 'static:D') or a gfdit policy object";
             return std::make_unique<Scheduler>(world_size, std::make_unique<HeldPolicy>(policy));
           }),
           py::arg("world_size"), py::arg("policy"))
      .def("add_request", &Scheduler::addRequest)
      .def("transition", &Scheduler::transition, py::arg("id"), py::arg("state"), py::arg("step") = -1,
           py::arg("reason") = "")
      .def("set_busy", &Scheduler::setBusy)
      .def("occupy", &Scheduler::occupy)
      .def("release", &Scheduler::release)
      .def("schedule", &Scheduler::schedule)
      .def("request", &Scheduler::mutableRequest, py::return_value_policy::reference_internal)
      .def("has", &Scheduler::has)
      .def("erase", &Scheduler::erase)
      .def("request_ids", &Scheduler::requestIds)
      .def_property_readonly("rank_busy", &Scheduler::rankBusy)
      .def_property_readonly("policy_name", [](Scheduler& s) { return s.policy().name(); })
      .def_property_readonly("world_size", &Scheduler::worldSize);
}

}  // namespace python
}  // namespace gfdit
