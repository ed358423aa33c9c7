// gfdit._C.runtime's relays for workers on other hosts (NOTE [node agents] in src/runtime/relay.cpp): the engine's
// end (NodeRelay) and a node agent's (AgentRelay), with the messages of their hello. Calls that wait on the network
// release the GIL.
#include <pybind11/stl.h>

#include "bindings.h"
#include "gfdit/relay.h"

namespace py = pybind11;

namespace gfdit {
namespace python {

using namespace gfdit::runtime;

void register_relay(py::module_& m) {
  py::module_ r = m.def_submodule("runtime");  // made by register_runtime
  r.attr("NODE_PROTOCOL_VERSION") = kNodeProtocolVersion;
  r.attr("NODE_TIMEOUT_S") = kNodeTimeoutS;

  py::class_<NodeHello>(r, "NodeHello", "What a node agent says of itself when it connects to an engine.")
      .def(py::init<>())
      .def_readwrite("host", &NodeHello::host)
      .def_readwrite("num_workers", &NodeHello::num_workers)
      .def_readwrite("pid", &NodeHello::pid)
      .def("encode", [](const NodeHello& h) { return py::bytes(h.encode()); })
      .def_static("decode", [](const py::bytes& b) { return NodeHello::decode(std::string(b)); }, py::arg("data"));

  py::class_<NodeWelcome>(r, "NodeWelcome",
                          "The engine's answer to a node agent it takes: its workers and their start.")
      .def(py::init<>())
      .def_readwrite("node", &NodeWelcome::node)
      .def_readwrite("workers", &NodeWelcome::workers)
      .def_readwrite("joining", &NodeWelcome::joining,
                     "they replace workers of a lost node: they join the world at its next REINIT")
      .def_readwrite("world_size", &NodeWelcome::world_size)
      .def_readwrite("node_of", &NodeWelcome::node_of)
      .def_readwrite("model", &NodeWelcome::model)
      .def_readwrite("model_path", &NodeWelcome::model_path)
      .def_readwrite("store_host", &NodeWelcome::store_host)
      .def_readwrite("store_port", &NodeWelcome::store_port)
      .def_readwrite("timeout_s", &NodeWelcome::timeout_s)
      .def_readwrite("heap_bytes", &NodeWelcome::heap_bytes)
      .def_readwrite("threads", &NodeWelcome::threads)
      .def("encode", [](const NodeWelcome& w) { return py::bytes(w.encode()); })
      .def_static("decode", [](const py::bytes& b) { return NodeWelcome::decode(std::string(b)); }, py::arg("data"));

  py::class_<PendingNode>(r, "PendingNode", "A node agent that said a valid hello and waits for the engine's answer.")
      .def_readonly("id", &PendingNode::id)
      .def_readonly("hello", &PendingNode::hello)
      .def_readonly("address", &PendingNode::address);

  py::class_<NodeState>(r, "NodeState")
      .def_readonly("node", &NodeState::node)
      .def_readonly("host", &NodeState::host)
      .def_readonly("address", &NodeState::address)
      .def_readonly("workers", &NodeState::workers)
      .def_readonly("connected", &NodeState::connected)
      .def_readonly("why", &NodeState::why);

  py::class_<RemoteWorkerState>(r, "RemoteWorkerState", "A remote worker as its node agent last reported it.")
      .def_readonly("node", &RemoteWorkerState::node)
      .def_readonly("connected", &RemoteWorkerState::connected)
      .def_readonly("running", &RemoteWorkerState::running)
      .def_readonly("pid", &RemoteWorkerState::pid)
      .def_readonly("exit_code", &RemoteWorkerState::exit_code)
      .def_readonly("why", &RemoteWorkerState::why);

  py::class_<RemoteWorkers, std::shared_ptr<RemoteWorkers>>(
      r, "RemoteWorkers", "Workers on other hosts, as the engine loop sees them (EngineLoop.set_remote).");

  py::class_<NodeRelay, RemoteWorkers, std::shared_ptr<NodeRelay>>(
      r, "NodeRelay", "The engine's end of the node agents' connections (include/gfdit/relay.h).")
      .def(py::init<int, const std::string&, int, double>(), py::arg("num_workers"), py::arg("address"),
           py::arg("port"), py::arg("node_timeout_s") = kNodeTimeoutS, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("port", &NodeRelay::port)
      .def("accept", &NodeRelay::accept, py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
           "The next node agent that said a valid hello (a PendingNode), or None after timeout_s.")
      .def("admit", &NodeRelay::admit, py::arg("id"), py::arg("welcome"), py::call_guard<py::gil_scoped_release>(),
           "Takes a pending agent for the welcome's workers and sends it the welcome.")
      .def("refuse", &NodeRelay::refuse, py::arg("id"), py::arg("reason"), py::call_guard<py::gil_scoped_release>())
      .def("start", &NodeRelay::start, py::arg("queue_name"), py::call_guard<py::gil_scoped_release>(),
           "Relays between the admitted nodes and the engine's rings.")
      .def("start_worker", &NodeRelay::startWorker, py::arg("worker"), py::call_guard<py::gil_scoped_release>(),
           "Asks the worker's agent to start a new process for it (its rings here were reset).")
      .def("kill", &NodeRelay::kill, py::arg("worker"), py::call_guard<py::gil_scoped_release>())
      .def("worker_state", &NodeRelay::workerState, py::arg("worker"), py::call_guard<py::gil_scoped_release>())
      .def("nodes", &NodeRelay::nodes, py::call_guard<py::gil_scoped_release>())
      .def("refusals", &NodeRelay::refusals, py::call_guard<py::gil_scoped_release>(),
           "Why each refused connection was refused, oldest first.")
      .def("close", &NodeRelay::close, py::call_guard<py::gil_scoped_release>());

  py::class_<AgentRequest> req(r, "AgentRequest", "What the engine asks of a node agent.");
  py::enum_<AgentRequest::Kind>(req, "Kind")
      .value("KILL", AgentRequest::kKill)
      .value("START", AgentRequest::kStart)
      .value("END", AgentRequest::kEnd);
  req.def_readonly("kind", &AgentRequest::kind)
      .def_readonly("worker", &AgentRequest::worker)
      .def_readonly("reason", &AgentRequest::reason)
      .def_readonly("orderly", &AgentRequest::orderly);

  py::class_<AgentRelay>(r, "AgentRelay", "A node agent's end of its connection to the engine (include/gfdit/relay.h).")
      .def(py::init<const std::string&, int, const NodeHello&, double, double>(), py::arg("host"), py::arg("port"),
           py::arg("hello"), py::arg("timeout_s"), py::arg("node_timeout_s") = kNodeTimeoutS,
           py::call_guard<py::gil_scoped_release>(),
           "Connects and says hello; raises with the engine's reason when it refuses this node.")
      .def_property_readonly("welcome", &AgentRelay::welcome)
      .def_property_readonly("engine_address", &AgentRelay::engineAddress)
      .def("start", &AgentRelay::start, py::call_guard<py::gil_scoped_release>(),
           "Makes this host's rings and starts relaying; returns their name for the workers.")
      .def_property_readonly("queue_fd", &AgentRelay::queueFd)
      .def("next", &AgentRelay::next, py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
           "The engine's next request (an AgentRequest), or None after timeout_s.")
      .def("worker_died", &AgentRelay::workerDied, py::arg("worker"), py::arg("exit_code"), py::arg("why"),
           py::call_guard<py::gil_scoped_release>())
      .def("worker_started", &AgentRelay::workerStarted, py::arg("worker"), py::arg("pid"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("lost", &AgentRelay::lost)
      .def_property_readonly("why", &AgentRelay::why)
      .def("close", &AgentRelay::close, py::call_guard<py::gil_scoped_release>(),
           "Says goodbye and removes every name this node made in /dev/shm.");
}

}  // namespace python
}  // namespace gfdit
