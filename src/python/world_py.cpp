// gfdit._C.World, Group and HeapBlock. Tensors arrive as (address, bytes) from the Python layer,
// which checks them once (python/gfdit/comm/world.py). Blocking calls release the GIL.
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <vector>

#include "bindings.h"
#include "gfdit/error.h"
#include "gfdit/world.h"

namespace py = pybind11;

namespace gfdit {
namespace python {
namespace {

// A Python object with set(key, value) and get(key) (torch.distributed.Store and friends).
class PyStore : public Store {
 public:
  explicit PyStore(py::object obj) : obj_(std::move(obj)) {}
  void set(const std::string& key, const std::string& value) override {
    py::gil_scoped_acquire gil;
    obj_.attr("set")(key, py::bytes(value));
  }
  std::string get(const std::string& key) override {
    py::gil_scoped_acquire gil;
    py::object v = obj_.attr("get")(key);
    if (py::isinstance<py::bytes>(v)) return v.cast<std::string>();
    return py::str(v).cast<std::string>();
  }

 private:
  py::object obj_;
};

// A block of the symmetric heap, exported through the buffer protocol; it keeps its world alive.
struct HeapBlock {
  std::shared_ptr<World> world;
  void* ptr = nullptr;
  size_t bytes = 0;
  bool device = false;  // in the device heap: no buffer protocol, __cuda_array_interface__ instead
  ~HeapBlock() {
    if (ptr != nullptr) world->heapFree(ptr);
  }
};

void* asPtr(uintptr_t address) { return reinterpret_cast<void*>(address); }

// 0: host memory, done on return; else a cudaStream_t the collective is enqueued on (NOTE [transports]).
void* asStream(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

std::shared_ptr<HeapBlock> makeBlock(const std::shared_ptr<World>& w, void* ptr, size_t bytes, bool device) {
  auto b = std::make_shared<HeapBlock>();
  b->world = w;
  b->ptr = ptr;
  b->bytes = bytes;
  b->device = device;
  return b;
}

std::vector<BufferView> toViews(const std::vector<std::tuple<uintptr_t, size_t, size_t, size_t>>& specs) {
  std::vector<BufferView> views;
  views.reserve(specs.size());
  for (const auto& s : specs) {
    views.push_back(BufferView::strided(asPtr(std::get<0>(s)), std::get<1>(s), std::get<2>(s), std::get<3>(s)));
  }
  return views;
}

}  // namespace

void register_world(py::module_& m) {
  m.def("has_device_transport", &hasDeviceTransport,
        "Whether worlds can have a device transport (a CUDA build, enabled).");
  py::enum_<DType>(m, "DType")
      .value("float32", DType::kFloat32)
      .value("float16", DType::kFloat16)
      .value("bfloat16", DType::kBFloat16)
      .value("int32", DType::kInt32)
      .value("int64", DType::kInt64)
      .value("uint8", DType::kUInt8)
      .value("float64", DType::kFloat64);
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("sum", ReduceOp::kSum)
      .value("max", ReduceOp::kMax)
      .value("min", ReduceOp::kMin)
      .value("prod", ReduceOp::kProd);

  py::class_<Group>(m, "Group")
      .def_property_readonly("ranks",
                             [](const Group& g) {
                               std::vector<int> r(g.size());
                               for (int i = 0; i < g.size(); ++i) r[i] = g.rankAt(i);
                               return r;
                             })
      .def("size", &Group::size, "Number of members.")
      .def("rank", &Group::selfIdx, "Index of the calling rank in the group, or -1 when it is not a member.")
      .def_property_readonly("is_member", &Group::isMember, "Whether the calling rank is a member.")
      .def("rank_at", &Group::rankAt, "Global rank of member idx.")
      .def("index_of", &Group::indexOf, "Index of a global rank, or -1.")
      .def("__len__", &Group::size)
      .def("__repr__", [](const Group& g) { return "Group(" + g.toString() + ")"; });

  py::class_<HeapBlock, std::shared_ptr<HeapBlock>>(m, "HeapBlock", py::buffer_protocol())
      .def_readonly("bytes", &HeapBlock::bytes)
      .def_property_readonly("address", [](const HeapBlock& b) { return reinterpret_cast<uintptr_t>(b.ptr); })
      .def_readonly("device", &HeapBlock::device)
      .def_property_readonly("__cuda_array_interface__",
                             [](const HeapBlock& b) -> py::object {
                               if (!b.device) throw py::attribute_error("a host heap block");
                               py::dict d;
                               d["shape"] = py::make_tuple(b.bytes);
                               d["typestr"] = "|u1";
                               d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(b.ptr), false);
                               d["version"] = 3;
                               d["strides"] = py::none();
                               return std::move(d);
                             })
      .def_buffer([](HeapBlock& b) {
        GFDIT_CHECK(!b.device) << "gfdit: a device heap block has no host buffer (use __cuda_array_interface__)";
        return py::buffer_info(b.ptr, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.bytes)}, {1});
      });

  py::class_<WorldStats>(m, "WorldStats")
      .def_readonly("messages_sent", &WorldStats::messages_sent)
      .def_readonly("zero_copy_sends", &WorldStats::zero_copy_sends)
      .def_readonly("staged_bytes", &WorldStats::staged_bytes)
      .def_readonly("blocking_waits", &WorldStats::blocking_waits)
      .def_readonly("collectives", &WorldStats::collectives)
      .def_readonly("all_gathers", &WorldStats::all_gathers)
      .def_readonly("net_bytes_sent", &WorldStats::net_bytes_sent)
      .def_readonly("net_bytes_received", &WorldStats::net_bytes_received);

  py::class_<World, std::shared_ptr<World>>(m, "World")
      .def_static(
          "create",
          [](int rank, int world_size, py::object store, double timeout_s, size_t heap_bytes, size_t slot_bytes,
             size_t num_slots, int spin_us, const std::string& key_prefix, int device, const std::string& shm_prefix) {
            WorldOptions o;
            GFDIT_CHECK(timeout_s > 0) << "timeout must be positive, got " << timeout_s;
            o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0 + 0.5));
            o.heap_bytes = heap_bytes;
            o.slot_bytes = slot_bytes;
            o.num_slots = num_slots;
            o.spin_us = spin_us;
            o.key_prefix = key_prefix;
            o.device = device;
            o.shm_prefix = shm_prefix;
            PyStore s(std::move(store));
            std::unique_ptr<World> w;
            {
              py::gil_scoped_release nogil;  // the store re-acquires it per call
              w = World::create(rank, world_size, s, o);
            }
            return std::shared_ptr<World>(std::move(w));
          },
          py::arg("rank"), py::arg("world_size"), py::arg("store"), py::arg("timeout_s"), py::arg("heap_bytes"),
          py::arg("slot_bytes") = 0, py::arg("num_slots") = 0, py::arg("spin_us") = -1, py::arg("key_prefix") = "gfdit",
          py::arg("device") = -1, py::arg("shm_prefix") = "gfdit")
      .def_property_readonly("device", &World::device, "The CUDA device of the device transport, or -1.")
      .def_property_readonly("staged_device", &World::stagedDevice,
                             "The device asked for by a world that spans hosts (staged through host memory), or -1.")
      .def("check", &World::checkDevice, py::call_guard<py::gil_scoped_release>(),
           "Raises an error a device transport found asynchronously (a device-side wait that expired).")
      .def_property_readonly("rank", &World::rank)
      .def_property_readonly("size", &World::size)
      .def("node_of", &World::nodeOf, py::arg("rank"),
           "The node `rank` runs on: ranks whose hosts share memory share one (GFDIT_NODE_IDS overrides).")
      .def("host_of", &World::hostOf, py::arg("rank"), "The host name `rank` reported.")
      .def("remote", &World::remote, py::arg("rank"),
           "Whether this rank talks to `rank` over the network (NOTE [network edges]).")
      .def_property_readonly("net_port", &World::netPort,
                             "The TCP port of this rank's network edges, or -1 when every peer shares its memory.")
      .def_property_readonly("timeout_s",
                             [](const World& w) { return static_cast<double>(w.options().timeout.count()) / 1000.0; })
      .def_property_readonly("slot_bytes", [](const World& w) { return w.options().slot_bytes; })
      .def_property_readonly("num_slots", [](const World& w) { return w.options().num_slots; })
      .def("set_timeout",
           [](World& w, double s) {
             GFDIT_CHECK(s > 0) << "timeout must be positive, got " << s;
             w.setTimeout(std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0 + 0.5)));
           })
      .def("stats", &World::stats)
      .def("set_message_tag", &World::setMessageTag, py::arg("tag"),
           "Labels the messages of the collectives that follow (see NOTE [message tags]); 0 is the default.")
      .def_property_readonly("message_tag", &World::messageTag)
      .def_property_readonly("usable", &World::usable, "False once an error broke this world.")
      .def(
          "watch_abort", [](World& w, uintptr_t address) { w.watchAbort(reinterpret_cast<const uint64_t*>(address)); },
          "Waits fail once the 64-bit word at `address` changes (the runtime's abort counter).")
      .def(
          "new_group",
          [](const World& w, const std::vector<int>& ranks) {
            return w.newGroup(ranks.data(), static_cast<int>(ranks.size()));
          },
          "A group of the given ranks: local, no communication.")
      .def("world_group", &World::worldGroup)
      .def(
          "heap_alloc",
          [](const std::shared_ptr<World>& w, size_t bytes, bool device) {
            return makeBlock(w, w->heapAlloc(bytes, device), bytes, device);
          },
          py::arg("bytes"), py::arg("device") = false)
      .def(
          "symmetric_alloc",
          [](const std::shared_ptr<World>& w, const Group& g, size_t bytes, bool device) {
            void* p = nullptr;
            {
              py::gil_scoped_release nogil;
              p = w->symmetricAlloc(g, bytes, device);
            }
            return makeBlock(w, p, bytes, device);
          },
          py::arg("group"), py::arg("bytes"), py::arg("device") = false,
          "A heap block at the same offset on every member of the group (collective; NOTE [symmetric allocation]).")
      .def("in_heap", [](const World& w, uintptr_t p, size_t n) { return w.inHeap(asPtr(p), n); })
      .def("heap_offset", [](const World& w, uintptr_t p) { return w.heapOffset(asPtr(p)); })
      .def("heap_used", &World::heapUsed, py::arg("device") = false)
      .def(
          "all_gather",
          [](World& w, const Group& g, uintptr_t in, uintptr_t out, size_t bytes, uintptr_t stream) {
            w.allGather(g, asPtr(in), asPtr(out), bytes, asStream(stream));
          },
          py::arg("group"), py::arg("inp"), py::arg("out"), py::arg("bytes"), py::arg("stream") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "all_gather_v",
          [](World& w, const Group& g, std::tuple<uintptr_t, size_t, size_t, size_t> in,
             const std::vector<std::tuple<uintptr_t, size_t, size_t, size_t>>& outs, uintptr_t stream) {
            GFDIT_CHECK(static_cast<int>(outs.size()) == g.size()) << "one output view per member";
            auto iv = toViews({in});
            auto ov = toViews(outs);
            w.allGatherV(g, iv[0], ov.data(), asStream(stream));
          },
          py::arg("group"), py::arg("inp"), py::arg("outs"), py::arg("stream") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "all_to_all",
          [](World& w, const Group& g, uintptr_t in, uintptr_t out, size_t bytes, uintptr_t stream) {
            w.allToAll(g, asPtr(in), asPtr(out), bytes, asStream(stream));
          },
          py::arg("group"), py::arg("inp"), py::arg("out"), py::arg("bytes"), py::arg("stream") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "all_to_all_v",
          [](World& w, const Group& g, const std::vector<std::tuple<uintptr_t, size_t, size_t, size_t>>& ins,
             const std::vector<std::tuple<uintptr_t, size_t, size_t, size_t>>& outs, uintptr_t stream) {
            GFDIT_CHECK(static_cast<int>(ins.size()) == g.size() && static_cast<int>(outs.size()) == g.size())
                << "one input and one output view per member";
            auto iv = toViews(ins);
            auto ov = toViews(outs);
            w.allToAllV(g, iv.data(), ov.data(), asStream(stream));
          },
          py::arg("group"), py::arg("ins"), py::arg("outs"), py::arg("stream") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "reduce_scatter",
          [](World& w, const Group& g, uintptr_t in, uintptr_t out, size_t count, DType dt, ReduceOp op,
             uintptr_t stream) { w.reduceScatter(g, asPtr(in), asPtr(out), count, dt, op, asStream(stream)); },
          py::arg("group"), py::arg("inp"), py::arg("out"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>())
      .def(
          "all_reduce",
          [](World& w, const Group& g, uintptr_t data, size_t count, DType dt, ReduceOp op, uintptr_t stream) {
            w.allReduce(g, asPtr(data), count, dt, op, asStream(stream));
          },
          py::arg("group"), py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("stream") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "broadcast",
          [](World& w, const Group& g, uintptr_t data, size_t bytes, int root, uintptr_t stream) {
            w.broadcast(g, asPtr(data), bytes, root, asStream(stream));
          },
          py::arg("group"), py::arg("data"), py::arg("bytes"), py::arg("root"), py::arg("stream") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "send",
          [](World& w, uintptr_t data, size_t bytes, int dst, uintptr_t stream) {
            w.send(asPtr(data), bytes, dst, asStream(stream));
          },
          py::arg("data"), py::arg("bytes"), py::arg("dst"), py::arg("stream") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "recv",
          [](World& w, uintptr_t data, size_t bytes, int src, uintptr_t stream) {
            w.recv(asPtr(data), bytes, src, asStream(stream));
          },
          py::arg("data"), py::arg("bytes"), py::arg("src"), py::arg("stream") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "barrier", [](World& w, const Group& g, uintptr_t stream) { w.barrier(g, asStream(stream)); },
          py::arg("group"), py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>())
      .def(
          "put_with_signal",
          [](World& w, int peer, uintptr_t src, size_t bytes, size_t offset, uintptr_t stream) {
            w.putWithSignal(peer, asPtr(src), bytes, offset, asStream(stream));
          },
          py::arg("peer"), py::arg("src"), py::arg("bytes"), py::arg("offset"), py::arg("stream") = 0,
          py::call_guard<py::gil_scoped_release>())
      .def(
          "wait_signal",
          [](World& w, int peer, uint64_t count, uintptr_t stream) { w.waitSignal(peer, count, asStream(stream)); },
          py::arg("peer"), py::arg("count") = 1, py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
}

}  // namespace python
}  // namespace gfdit
