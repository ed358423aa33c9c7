// The world: setup of every rank's host region and of the transports, the heaps, and each collective as a
// plan for the protocol engine (protocol.h), which moves its bytes through a transport (transport.h).
#include "gfdit/world.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cpu_transport.h"
#include "doorbell.h"
#include "edge.h"
#include "gfdit/error.h"
#include "gfdit/settings.h"
#include "heap.h"
#include "liveness.h"
#include "net_edges.h"
#include "protocol.h"
#include "shm.h"
#include "transport.h"

namespace gfdit {

using edge::InEdge;
using edge::OutEdge;
using edge::RegionHeader;
using protocol::Plan;

namespace {

std::atomic<DeviceTransportFactory> g_device_factory{nullptr};
// Longer bounds are clamped to this: a wait's elapsed time is compared in nanoseconds, which a bound of
// millions of years (or "infinity" from Python) would overflow.
constexpr std::chrono::milliseconds kMaxTimeout = std::chrono::hours(24 * 365 * 100);
// Worlds this process created under each key prefix: a prefix used again (a world created twice in a row by the
// same ranks) gets fresh keys, and a process's first world under a prefix agrees with every other process's
// first, whatever other worlds each created before (a replacement worker joining an engine's world: NOTE
// [replacements] in src/runtime/control.cpp).
std::mutex g_generations_mu;
std::map<std::string, uint64_t> g_generations;

uint64_t nextGeneration(const std::string& key_prefix) {
  std::lock_guard<std::mutex> lock(g_generations_mu);
  return g_generations[key_prefix]++;
}

size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// A remote peer's region as this rank sees it: private zero-filled memory of the same layout, which the network
// edges write (NOTE [network edges]); pages are taken as they are touched.
class Mirror {
 public:
  explicit Mirror(size_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    GFDIT_CHECK_CODE(kSystemError, p != MAP_FAILED) << "gfdit: cannot map " << bytes << " bytes for a remote region";
    data_ = static_cast<uint8_t*>(p);
  }
  ~Mirror() { ::munmap(data_, bytes_); }
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// The node labels GFDIT_NODE_IDS gives (one per rank), or none.
std::vector<std::string> nodeLabels(int world_size) {
  std::vector<std::string> out;
  const char* v = settings::nodeIds();
  if (v == nullptr) return out;
  std::string text(v);
  std::replace(text.begin(), text.end(), ',', ' ');
  std::istringstream is(text);
  for (std::string w; is >> w;) out.push_back(w);
  GFDIT_CHECK(static_cast<int>(out.size()) == world_size).param("GFDIT_NODE_IDS")
      << "GFDIT_NODE_IDS='" << v << "' names " << out.size() << " ranks; the world has " << world_size;
  return out;
}

// The bytes a view spans from its first to its last byte, [first, second).
std::pair<uintptr_t, uintptr_t> extent(const BufferView& v) {
  auto b = reinterpret_cast<uintptr_t>(v.ptr);
  if (v.bytes() == 0) return {b, b};
  return {b, b + (v.rows - 1) * v.stride + v.row_bytes};
}

bool overlaps(const BufferView& a, const BufferView& b) {
  auto [a0, a1] = extent(a);
  auto [b0, b1] = extent(b);
  return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1;
}

// An output block that overlaps an input block a peer may still read (zero copy, or staged chunk by chunk while
// this rank already receives) would be overwritten under it: refused. `ins` has n blocks, or 1 shared by all;
// the only overlap allowed is this rank's own output block being exactly its own input (in place).
void checkNoOverlap(const char* what, const BufferView* ins, int num_ins, const BufferView* outs, int n, int me) {
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int j = 0; j < num_ins; ++j) {
    auto [b, e] = extent(ins[j]);
    if (b == e) continue;
    lo = std::min(lo, b);
    hi = std::max(hi, e);
  }
  for (int i = 0; i < n; ++i) {
    auto [b, e] = extent(outs[i]);
    if (b == e || e <= lo || hi <= b) continue;  // apart from every input (the usual case: one test)
    for (int j = 0; j < num_ins; ++j) {
      const int block = num_ins == 1 ? me : j;
      if (i == me && block == me && ins[j].ptr == outs[i].ptr && ins[j].rows == outs[i].rows &&
          ins[j].row_bytes == outs[i].row_bytes && ins[j].stride == outs[i].stride) {
        continue;
      }
      GFDIT_CHECK(!overlaps(outs[i], ins[j]))
          << "gfdit: " << what << ": output block " << i << " overlaps input block " << block << " (member " << me
          << " of " << n << "); peers may still read the input while this rank writes the output: use a separate "
          << "output (in place is allowed only for this rank's own block)";
    }
  }
}

void checkMember(const Group& g, int world_size, int rank) {
  GFDIT_CHECK(g.size() < 1 || g.isMember())
      << "gfdit: rank " << rank << " is not a member of group " << g.toString()
      << "; a non-member may describe a group but not take part in its collectives";
  GFDIT_CHECK(g.size() >= 1 && g.rankAt(g.selfIdx()) == rank)
      << "gfdit: group " << g.toString() << " was not formed by rank " << rank;
  GFDIT_CHECK(g.size() <= world_size) << "gfdit: group " << g.toString() << " is larger than the world";
}

}  // namespace

void registerDeviceTransport(DeviceTransportFactory factory) { g_device_factory.store(factory); }
bool hasDeviceTransport() { return g_device_factory.load() != nullptr; }

const char* version() { return GFDIT_VERSION; }

struct World::Impl {
  int rank = 0;
  int size = 0;
  WorldOptions options;
  std::vector<core::SharedMemory> regions;  // every rank's host region, own included
  std::unique_ptr<core::Heartbeat> heartbeat;
  std::unique_ptr<protocol::Engine> engine;
  std::unique_ptr<CpuTransport> cpu;
  std::unique_ptr<Transport> device;
  std::vector<std::unique_ptr<Mirror>> mirrors;  // by rank: remote peers' regions as this rank sees them
  std::unique_ptr<net::NetEdges> net;            // destroyed first: its threads write into the mirrors
  std::vector<int> node_of;
  std::vector<std::string> hosts;
  int staged_device = -1;  // WorldOptions::device of a world across hosts (no device transport)

  Transport& transport(void* stream) {
    if (stream == nullptr) return *cpu;
    GFDIT_CHECK(device != nullptr) << "gfdit: a collective on a stream (device pointers) needs a world with a device "
                                   << "transport (WorldOptions::device; this world is host only)";
    return *device;
  }
  Transport& heapOf(bool on_device) {
    if (!on_device) return *cpu;
    GFDIT_CHECK(device != nullptr) << "gfdit: this world has no device heap (WorldOptions::device)";
    return *device;
  }
  // The transport whose heap holds [p, p + bytes), or nullptr.
  Transport* owner(const void* p, size_t bytes) const {
    if (cpu->inHeap(p, bytes)) return cpu.get();
    if (device != nullptr && device->inHeap(p, bytes)) return device.get();
    return nullptr;
  }
};

// One collective on the engine: starts the plan on a transport, ends it whatever happens.
class Collective {
 public:
  Collective(protocol::Engine& e, protocol::Kind kind, int n, Transport& t, void* stream, DType dtype = DType::kFloat32,
             ReduceOp op = ReduceOp::kSum)
      : engine_(e), plan(e.start(kind, n, t, stream, dtype, op)) {}
  ~Collective() { engine_.abandon(); }
  /// Ends the collective on its transport (after its last operation); throws what the transport reports.
  void finish() { engine_.finish(); }
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

 private:
  protocol::Engine& engine_;

 public:
  Plan& plan;
};

// ---- setup ----

std::unique_ptr<World> World::create(int rank, int world_size, Store& store, const WorldOptions& options) {
  GFDIT_CHECK(world_size >= 1 && world_size <= kMaxRanks)
      << "world size " << world_size << " is outside [1, " << kMaxRanks << "]";
  GFDIT_CHECK(rank >= 0 && rank < world_size) << "rank " << rank << " is outside [0, " << world_size << ")";
  GFDIT_CHECK(options.timeout.count() > 0) << "timeout must be positive";
  GFDIT_CHECK(!options.shm_prefix.empty() && options.shm_prefix.size() <= 64 &&
              std::all_of(options.shm_prefix.begin(), options.shm_prefix.end(),
                          [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; }))
      << "gfdit: shm_prefix '" << options.shm_prefix << "' must be 1-64 letters, digits, '-' or '_'";
  GFDIT_CHECK(options.device < 0 || hasDeviceTransport())
      << "gfdit: WorldOptions::device " << options.device
      << " asks for a device transport, but none is available (a build without CUDA, or gfdit::cuda::enable() "
         "was not called)";
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = world_size;
  impl->options = options;
  impl->options.timeout = std::min(options.timeout, kMaxTimeout);
  size_t slot_bytes = alignUp(options.slot_bytes ? options.slot_bytes : settings::slotBytes(), 64);
  size_t num_slots = options.num_slots ? options.num_slots : settings::numSlots(world_size);
  // see NOTE [staging rounds]: fewer than world_size - 1 slots could deadlock a reduction
  num_slots = std::max<size_t>({num_slots, static_cast<size_t>(world_size - 1), 2});
  core::SpinPolicy spin = protocol::hostSpinPolicy(world_size, core::usableCores(), options.spin_us);
  int spin_us = static_cast<int>(spin.current().spin.count());
  impl->options.slot_bytes = slot_bytes;
  impl->options.num_slots = num_slots;
  impl->options.spin_us = spin_us;
  CopySelector copier;
  if (const char* table = settings::copyTable()) copier = CopySelector::parse(table);
  GFDIT_CHECK(!copier.isDevice()) << "gfdit: GFDIT_COPY_TABLE names device copy paths (" << settings::copyTable()
                                  << "); the host transport takes the CPU ones (GFDIT_CUDA_COPY_TABLE is the device's)";

  // Layout of this rank's region.
  size_t off = alignUp(sizeof(RegionHeader), 4096);
  size_t in_edges_off = off;
  off = alignUp(off + sizeof(InEdge) * world_size, 4096);
  size_t out_edges_off = off;
  off = alignUp(off + sizeof(OutEdge) * world_size, 4096);
  size_t staging_off = off;
  off = alignUp(off + slot_bytes * num_slots, 4096);
  size_t heap_off = off;
  size_t heap_bytes = alignUp(options.heap_bytes, 4096);
  size_t total = heap_off + heap_bytes;

  // Created under a random name, mode 0600; removed again if setup fails before the unlink below.
  impl->regions.resize(world_size);
  impl->regions[rank] = core::SharedMemory::createUnique(impl->options.shm_prefix, total);
  auto* h = reinterpret_cast<RegionHeader*>(impl->regions[rank].data());  // fresh pages: every counter is 0
  h->magic = edge::kRegionMagic;
  h->version = edge::kLayoutVersion;
  h->rank = rank;
  h->world_size = world_size;
  h->pid = static_cast<int32_t>(::getpid());
  h->pid_ns = core::pidNamespace();
  h->total_bytes = total;
  h->in_edges_offset = in_edges_off;
  h->out_edges_offset = out_edges_off;
  h->staging_offset = staging_off;
  h->slot_bytes = slot_bytes;
  h->num_slots = num_slots;
  h->heap_offset = heap_off;
  h->heap_bytes = heap_bytes;
  impl->heartbeat = std::make_unique<core::Heartbeat>(&h->heartbeat);

  // Rendezvous: where every rank runs (NOTE [network edges]): ranks whose hosts share memory map each other's
  // regions; the others talk over the network, each through a mirror of the other's region. Node ids follow the
  // hosts (GFDIT_NODE_IDS stands in for them, and with GFDIT_NET_EDGES=nodes its nodes talk over the network too).
  std::string prefix = options.key_prefix + "/" + std::to_string(nextGeneration(options.key_prefix)) + "/";
  const std::vector<std::string> labels = nodeLabels(world_size);
  const bool by_node = settings::netEdgesByNode();
  GFDIT_CHECK(!by_node || !labels.empty()).param("GFDIT_NET_EDGES")
      << "GFDIT_NET_EDGES=nodes needs GFDIT_NODE_IDS: which ranks are on which node";
  store.set(prefix + "host/" + std::to_string(rank), net::hostKey() + " " + net::hostName());
  std::vector<std::string> keys(world_size);
  impl->hosts.resize(world_size);
  for (int p = 0; p < world_size; ++p) {
    std::istringstream is(p == rank ? net::hostKey() + " " + net::hostName()
                                    : store.get(prefix + "host/" + std::to_string(p)));
    is >> keys[p] >> impl->hosts[p];
  }
  impl->node_of.assign(world_size, 0);
  {
    std::vector<std::string> seen;
    for (int p = 0; p < world_size; ++p) {
      const std::string& node = labels.empty() ? keys[p] : labels[p];
      auto it = std::find(seen.begin(), seen.end(), node);
      impl->node_of[p] = static_cast<int>(it - seen.begin());
      if (it == seen.end()) seen.push_back(node);
    }
  }
  std::vector<bool> remote(world_size, false);
  bool any_remote = false;
  for (int p = 0; p < world_size; ++p) {
    remote[p] = p != rank && (keys[p] != keys[rank] || (by_node && impl->node_of[p] != impl->node_of[rank]));
    any_remote = any_remote || remote[p];
  }
  // A device world across hosts has no device transport (CUDA IPC maps only a host's own GPUs): its device
  // tensors go through host memory (NOTE [device tensors across hosts] in gfdit.comm.devices).
  if (any_remote && options.device >= 0) impl->staged_device = options.device;
  // nodes emulated on one host (GFDIT_NET_EDGES=nodes) talk over loopback; other hosts over an interface
  bool only_this_host = true;
  for (int p = 0; p < world_size; ++p) only_this_host = only_this_host && (!remote[p] || keys[p] == keys[rank]);
  const std::string address = net::listenAddress(only_this_host);
  if (any_remote) {
    impl->net = std::make_unique<net::NetEdges>(rank, world_size, prefix, address, impl->options.timeout, remote);
  }
  store.set(prefix + "region/" + std::to_string(rank),
            impl->regions[rank].name() + " " + std::to_string(total) + " " + std::to_string(slot_bytes) + " " +
                (impl->net != nullptr ? address + " " + std::to_string(impl->net->port()) : "- 0"));
  impl->mirrors.resize(world_size);
  std::vector<net::RemotePeer> remotes;
  for (int p = 0; p < world_size; ++p) {
    if (p == rank) continue;
    std::istringstream is(store.get(prefix + "region/" + std::to_string(p)));
    std::string name, peer_address;
    size_t bytes = 0, peer_slot = 0;
    int port = 0;
    is >> name >> bytes >> peer_slot >> peer_address >> port;
    GFDIT_CHECK(peer_slot == slot_bytes) << "gfdit: rank " << p << " uses staging slots of " << peer_slot
                                         << " bytes, rank " << rank << " of " << slot_bytes
                                         << ": every rank needs the same slot size";
    if (remote[p]) {
      GFDIT_CHECK(port > 0) << "gfdit: rank " << p << " (host " << impl->hosts[p] << ") cannot share memory with rank "
                            << rank << " (host " << impl->hosts[rank] << ") and has no network edges";
      GFDIT_CHECK(bytes == total) << "gfdit: rank " << p << "'s region is " << bytes << " bytes, rank " << rank << "'s "
                                  << total << ": ranks of other hosts need the same heap and slots";
      // the same layout as ours (every rank computes it from the same sizes), as the peer's header says it
      impl->mirrors[p] = std::make_unique<Mirror>(bytes);
      auto* mh = reinterpret_cast<RegionHeader*>(impl->mirrors[p]->data());
      *mh = *h;
      mh->rank = p;
      mh->pid = 0;  // a pid of another host means nothing here: liveness is the heartbeat (NOTE [liveness])
      mh->pid_ns = 0;
      mh->failed = 0;
      mh->heartbeat = 0;
      remotes.push_back({p, peer_address, port, impl->hosts[p]});
      continue;
    }
    impl->regions[p] = core::SharedMemory::open(name, bytes);
    auto* ph = reinterpret_cast<const RegionHeader*>(impl->regions[p].data());
    GFDIT_CHECK(ph->magic == edge::kRegionMagic && ph->version == edge::kLayoutVersion &&
                ph->world_size == world_size && ph->rank == p)
        << "gfdit: rank " << p << "'s region does not match this build or world";
  }
  store.set(prefix + "mapped/" + std::to_string(rank), "1");
  for (int p = 0; p < world_size; ++p) {
    if (p != rank) store.get(prefix + "mapped/" + std::to_string(p));
  }
  impl->regions[rank].unlink();

  std::vector<protocol::HostRegion> host;
  std::vector<uint8_t*> bases;
  std::vector<core::PeerLiveness> liveness(world_size);
  auto stale = core::heartbeatStaleBound();
  for (int p = 0; p < world_size; ++p) {
    uint8_t* base = remote[p] ? impl->mirrors[p]->data() : impl->regions[p].data();
    host.push_back(protocol::HostRegion::at(base));
    bases.push_back(base);
    const RegionHeader* ph = host.back().header;
    if (p != rank) liveness[p] = core::PeerLiveness(&ph->heartbeat, ph->pid, ph->pid_ns, stale);
  }
  if (impl->net != nullptr) impl->net->connect(remotes, host);
  impl->engine = std::make_unique<protocol::Engine>(rank, std::move(host), impl->options.timeout, spin);
  impl->engine->setLiveness(std::move(liveness));
  impl->engine->setHosts(impl->hosts);
  impl->engine->setRemote(impl->net.get());
  impl->cpu = std::make_unique<CpuTransport>(rank, std::move(bases), staging_off, slot_bytes, num_slots, heap_off,
                                             heap_bytes, copier);
  if (options.device >= 0 && impl->staged_device < 0) {
    DeviceTransportArgs args;
    args.rank = rank;
    args.world_size = world_size;
    args.device = options.device;
    args.store = &store;
    args.key_prefix = prefix + "device/";
    args.timeout = impl->options.timeout;
    args.heap_bytes = heap_bytes;
    impl->device = g_device_factory.load()(args);
    Transport* device = impl->device.get();
    impl->engine->setOnFailure([device] { device->abort(); });
  }
  return std::unique_ptr<World>(new World(std::move(impl)));
}

World::World(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
World::~World() = default;

int World::rank() const { return impl_->rank; }
int World::size() const { return impl_->size; }
const WorldOptions& World::options() const { return impl_->options; }
void World::setTimeout(std::chrono::milliseconds timeout) {
  GFDIT_CHECK(timeout.count() > 0) << "timeout must be positive";
  timeout = std::min(timeout, kMaxTimeout);
  std::lock_guard<std::mutex> lock(impl_->engine->mutex());  // not while a collective of another thread waits
  impl_->options.timeout = timeout;
  impl_->engine->setTimeout(timeout);
  if (impl_->device != nullptr) impl_->device->setTimeout(timeout);
  if (impl_->net != nullptr) impl_->net->setTimeout(timeout);
}
Group World::newGroup(const int* ranks, int num_ranks) const {
  return Group::create(ranks, num_ranks, impl_->size, impl_->rank);
}
Group World::worldGroup() const { return Group::whole(impl_->size, impl_->rank); }
WorldStats World::stats() const {
  std::lock_guard<std::mutex> lock(impl_->engine->mutex());
  WorldStats s = impl_->engine->stats();
  if (impl_->net != nullptr) {
    s.net_bytes_sent = impl_->net->bytesSent();
    s.net_bytes_received = impl_->net->bytesReceived();
  }
  return s;
}
void World::setMessageTag(uint32_t tag) { impl_->engine->setMessageTag(tag); }
uint32_t World::messageTag() const { return impl_->engine->messageTag(); }
bool World::usable() const { return impl_->engine->usable(); }
void World::watchAbort(const uint64_t* word) { impl_->engine->watchAbort(word); }
int World::device() const { return impl_->device != nullptr ? impl_->options.device : -1; }
int World::stagedDevice() const { return impl_->staged_device; }
int World::nodeOf(int rank) const {
  GFDIT_CHECK(rank >= 0 && rank < impl_->size) << "rank " << rank << " is outside [0, " << impl_->size << ")";
  return impl_->node_of[rank];
}
const std::string& World::hostOf(int rank) const {
  GFDIT_CHECK(rank >= 0 && rank < impl_->size) << "rank " << rank << " is outside [0, " << impl_->size << ")";
  return impl_->hosts[rank];
}
bool World::remote(int rank) const { return impl_->engine->isRemote(rank); }
int World::netPort() const { return impl_->net != nullptr ? impl_->net->port() : -1; }
void World::checkDevice() {
  if (impl_->device == nullptr) return;
  std::lock_guard<std::mutex> lock(impl_->engine->mutex());
  impl_->device->checkErrors();
}

// ---- heaps ----

void* World::heapAlloc(size_t bytes, bool device) {
  Transport& t = impl_->heapOf(device);
  size_t off = t.heap().alloc(bytes);
  if (off == core::HeapAllocator::kNone) {
    GFDIT_THROW(kInvalidUsage) << "gfdit: " << (device ? "device" : "host") << " heap exhausted: " << bytes
                               << " bytes requested, " << t.heap().used() << " of " << t.heap().capacity()
                               << " in use (raise heap_bytes at init)";
  }
  return t.heapBase() + off;
}

// NOTE [symmetric allocation]
// One-sided puts address a peer's tensor by the local tensor's heap offset, so the members of a group need a
// block at the same offset in each heap. Each rank allocates on its own otherwise (a migration allocates only
// on the receivers), so the heaps' histories differ. symmetricAlloc agrees on an offset: every member takes
// (tentatively) the lowest free offset >= a cursor in its own heap and the members all_gather what they took
// (-1: no room); when all took the same offset they keep it, else each gives its block back and the cursor
// becomes the largest offset taken. The cursor only grows, so this ends within as many rounds as there are
// free blocks; usually the first round agrees. Every member decides on the same gathered numbers, so they
// agree on success, on the offset, and on failure (InvalidUsage on every member, naming the heaps' state).
void* World::symmetricAlloc(const Group& group, size_t bytes, bool device) {
  checkMember(group, impl_->size, impl_->rank);
  Transport& t = impl_->heapOf(device);
  core::HeapAllocator& heap = t.heap();
  int n = group.size();
  size_t cursor = 0;
  struct Offer {
    int64_t offset;  // -1: no room
    uint64_t bytes;  // what this member asked for: a put checks only its own block, so all must agree
  };
  std::vector<Offer> offers(n);
  for (int round = 0;; ++round) {
    // firstFitFrom and allocAt are two steps: another thread's heapAlloc in between turns this into "no room"
    // for this round, and the next round looks again from the same cursor.
    size_t mine = heap.firstFitFrom(cursor, bytes);
    if (mine != core::HeapAllocator::kNone && !heap.allocAt(mine, bytes)) mine = core::HeapAllocator::kNone;
    Offer offer{mine == core::HeapAllocator::kNone ? -1 : static_cast<int64_t>(mine), bytes};
    try {
      if (n > 1) {
        allGather(group, &offer, offers.data(), sizeof(offer));
      } else {
        offers[0] = offer;
      }
    } catch (...) {
      if (offer.offset >= 0) heap.free(static_cast<size_t>(offer.offset));
      throw;
    }
    auto sizes_differ = std::any_of(offers.begin(), offers.end(), [&](const Offer& o) { return o.bytes != bytes; });
    auto [lo_it, hi_it] = std::minmax_element(offers.begin(), offers.end(),
                                              [](const Offer& a, const Offer& b) { return a.offset < b.offset; });
    int64_t lo = lo_it->offset, hi = hi_it->offset;
    if (!sizes_differ && lo >= 0 && lo == hi) return t.heapBase() + static_cast<size_t>(lo);
    if (offer.offset >= 0) heap.free(static_cast<size_t>(offer.offset));
    if (sizes_differ) {
      std::ostringstream os;
      os << "gfdit: symmetric allocation on group " << group.toString() << ": the members asked for different sizes (";
      for (int j = 0; j < n; ++j) os << (j ? ", " : "") << "rank " << group.rankAt(j) << ": " << offers[j].bytes;
      os << " bytes); every member must ask for the same size";
      throw Error(ErrorCode::kInvalidUsage, os.str());
    }
    if (lo < 0) {
      std::ostringstream os;
      os << "gfdit: no offset of the " << (device ? "device" : "host") << " heap has room for " << bytes
         << " bytes on every member of group " << group.toString() << " (after " << round + 1
         << " rounds; this rank uses " << heap.used() << " of " << heap.capacity() << " bytes)";
      throw Error(ErrorCode::kInvalidUsage, os.str());
    }
    cursor = static_cast<size_t>(hi);
  }
}

void World::heapFree(void* ptr) {
  Transport* t = impl_->owner(ptr, 1);
  GFDIT_CHECK(t != nullptr && t->heap().free(static_cast<size_t>(static_cast<uint8_t*>(ptr) - t->heapBase())))
      << "gfdit: heapFree of a pointer not from heapAlloc";
}

bool World::inHeap(const void* ptr, size_t bytes) const { return impl_->owner(ptr, bytes) != nullptr; }

size_t World::heapOffset(const void* ptr) const {
  Transport* t = impl_->owner(ptr, 1);
  GFDIT_CHECK(t != nullptr) << "gfdit: pointer is not in the symmetric heap";
  return static_cast<size_t>(static_cast<const uint8_t*>(ptr) - t->heapBase());
}

size_t World::heapUsed(bool device) const { return impl_->heapOf(device).heap().used(); }

// ---- collectives ----

void World::allGather(const Group& group, const void* in, void* out, size_t bytes_per_rank, void* stream) {
  BufferView outs[kMaxRanks];
  for (int j = 0; j < group.size(); ++j) {
    outs[j] = BufferView::contiguous(static_cast<uint8_t*>(out) + j * bytes_per_rank, bytes_per_rank);
  }
  allGatherV(group, BufferView::contiguous(const_cast<void*>(in), bytes_per_rank), outs, stream);
}

void World::allGatherV(const Group& group, const BufferView& in, const BufferView* outs, void* stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.engine->mutex());
  m.engine->checkUsable();
  checkMember(group, m.size, m.rank);
  int n = group.size(), me = group.selfIdx();
  GFDIT_CHECK(outs[me].bytes() == in.bytes())
      << "gfdit: all_gather: this rank's output block has " << outs[me].bytes() << " bytes, input " << in.bytes();
  checkNoOverlap("all_gather", &in, 1, outs, n, me);
  Transport& t = m.transport(stream);
  Collective c(*m.engine, protocol::kAllGather, n, t, stream);
  Plan& plan = c.plan;
  plan.shared_send = true;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    plan.send[j].active = true;
    plan.send[j].view = in;
    plan.send[j].total = in.bytes();
    plan.recv[j].active = true;
    plan.recv[j].view = outs[j];
    plan.recv[j].total = outs[j].bytes();
  }
  // Our own block: skip when the input already is that block (in-place).
  if (in.ptr != outs[me].ptr || !in.isContiguous() || !outs[me].isContiguous()) {
    t.copyLocal(outs[me], 0, in, 0, in.bytes());
  }
  if (n > 1) m.engine->run(group);
  c.finish();
}

void World::allToAll(const Group& group, const void* in, void* out, size_t bytes_per_rank, void* stream) {
  BufferView ins[kMaxRanks], outs[kMaxRanks];
  for (int j = 0; j < group.size(); ++j) {
    ins[j] = BufferView::contiguous(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)) + j * bytes_per_rank,
                                    bytes_per_rank);
    outs[j] = BufferView::contiguous(static_cast<uint8_t*>(out) + j * bytes_per_rank, bytes_per_rank);
  }
  allToAllV(group, ins, outs, stream);
}

void World::allToAllV(const Group& group, const BufferView* ins, const BufferView* outs, void* stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.engine->mutex());
  m.engine->checkUsable();
  checkMember(group, m.size, m.rank);
  int n = group.size(), me = group.selfIdx();
  GFDIT_CHECK(ins[me].bytes() == outs[me].bytes()) << "gfdit: all_to_all: this rank's own block has " << ins[me].bytes()
                                                   << " bytes in and " << outs[me].bytes() << " out";
  checkNoOverlap("all_to_all", ins, n, outs, n, me);
  Transport& t = m.transport(stream);
  Collective c(*m.engine, protocol::kAllToAll, n, t, stream);
  Plan& plan = c.plan;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    plan.send[j].active = true;
    plan.send[j].view = ins[j];
    plan.send[j].total = ins[j].bytes();
    plan.recv[j].active = true;
    plan.recv[j].view = outs[j];
    plan.recv[j].total = outs[j].bytes();
  }
  if (outs[me].ptr != ins[me].ptr) t.copyLocal(outs[me], 0, ins[me], 0, ins[me].bytes());
  if (n > 1) m.engine->run(group);
  c.finish();
}

void World::reduceScatter(const Group& group, const void* in, void* out, size_t count_per_rank, DType dtype,
                          ReduceOp op, void* stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.engine->mutex());
  m.engine->checkUsable();
  checkMember(group, m.size, m.rank);
  int n = group.size(), me = group.selfIdx();
  size_t block = count_per_rank * dtypeSize(dtype);
  auto* base = const_cast<uint8_t*>(static_cast<const uint8_t*>(in));
  {
    // In place (out is this rank's own block of in) or apart: an output over another block would be overwritten
    // while peers still read that block.
    auto* o = static_cast<uint8_t*>(out);
    bool overlaps = block > 0 && o < base + n * block && base < o + block;
    GFDIT_CHECK(!overlaps || o == base + me * block)
        << "gfdit: reduce_scatter: the output overlaps the input other than as this rank's own block (member " << me
        << " of " << n << "); use a separate output or the block at offset " << me * block << " bytes";
  }
  Transport& t = m.transport(stream);
  Collective c(*m.engine, protocol::kReduceScatter, n, t, stream, dtype, op);
  Plan& plan = c.plan;
  plan.reduce = true;
  plan.own_contrib = base + me * block;
  plan.reduce_out = static_cast<uint8_t*>(out);
  plan.reduce_total = block;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    plan.send[j].active = true;
    plan.send[j].view = BufferView::contiguous(base + j * block, block);
    plan.send[j].total = block;
    plan.recv[j].active = true;
    plan.recv[j].total = block;
  }
  if (n == 1) {
    if (out != in) t.copyLocal(BufferView::contiguous(out, block), 0, BufferView::contiguous(base, block), 0, block);
    c.finish();
    return;
  }
  m.engine->run(group);
  c.finish();
}

void World::allReduce(const Group& group, void* data, size_t count, DType dtype, ReduceOp op, void* stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.engine->mutex());
  m.engine->checkUsable();
  checkMember(group, m.size, m.rank);
  int n = group.size(), me = group.selfIdx();
  Transport& t = m.transport(stream);
  if (n == 1) return;
  size_t esize = dtypeSize(dtype);
  size_t bytes = count * esize;
  auto* base = static_cast<uint8_t*>(data);
  if (bytes <= t.slotBytes() || count < static_cast<size_t>(n)) {
    // One shot: everyone reduces the whole buffer in member order, so every rank gets the same bits.
    // The result goes to scratch first: peers may still be reading `data`.
    uint8_t* scratch = t.scratch(bytes);
    Collective c(*m.engine, protocol::kAllReduceOneShot, n, t, stream, dtype, op);
    Plan& plan = c.plan;
    plan.shared_send = true;
    plan.reduce = true;
    plan.ordered_reduce = true;
    plan.own_contrib = base;
    plan.reduce_out = scratch;
    plan.reduce_total = bytes;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      plan.send[j].active = true;
      plan.send[j].view = BufferView::contiguous(base, bytes);
      plan.send[j].total = bytes;
      plan.recv[j].active = true;
      plan.recv[j].total = bytes;
    }
    m.engine->run(group);
    t.copyLocal(BufferView::contiguous(data, bytes), 0, BufferView::contiguous(scratch, bytes), 0, bytes);
    c.finish();
    return;
  }
  // Reduce-scatter into our block in place, then all-gather the blocks. Blocks are element-aligned;
  // the last member takes the remainder.
  size_t per = count / n;
  auto block_off = [&](int j) { return static_cast<size_t>(j) * per * esize; };
  auto block_len = [&](int j) { return (j == n - 1 ? count - per * (n - 1) : per) * esize; };
  {
    Collective c(*m.engine, protocol::kAllReduceScatter, n, t, stream, dtype, op);
    Plan& plan = c.plan;
    plan.reduce = true;
    plan.own_contrib = base + block_off(me);
    plan.reduce_out = base + block_off(me);
    plan.reduce_total = block_len(me);
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      plan.send[j].active = true;
      plan.send[j].view = BufferView::contiguous(base + block_off(j), block_len(j));
      plan.send[j].total = block_len(j);
      plan.recv[j].active = true;
      plan.recv[j].total = block_len(me);
    }
    m.engine->run(group);
    c.finish();
  }
  Collective c(*m.engine, protocol::kAllReduceGather, n, t, stream, dtype, op);
  Plan& plan = c.plan;
  plan.shared_send = true;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    plan.send[j].active = true;
    plan.send[j].view = BufferView::contiguous(base + block_off(me), block_len(me));
    plan.send[j].total = block_len(me);
    plan.recv[j].active = true;
    plan.recv[j].view = BufferView::contiguous(base + block_off(j), block_len(j));
    plan.recv[j].total = block_len(j);
  }
  m.engine->run(group);
  c.finish();
}

void World::broadcast(const Group& group, void* data, size_t bytes, int root_rank, void* stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.engine->mutex());
  m.engine->checkUsable();
  checkMember(group, m.size, m.rank);
  int root = group.indexOf(root_rank);
  GFDIT_CHECK(root >= 0) << "gfdit: broadcast root " << root_rank << " is not in group " << group.toString();
  int n = group.size(), me = group.selfIdx();
  Transport& t = m.transport(stream);
  if (n == 1) return;
  Collective c(*m.engine, protocol::kBroadcast, n, t, stream);
  Plan& plan = c.plan;
  if (me == root) {
    plan.shared_send = true;
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      plan.send[j].active = true;
      plan.send[j].view = BufferView::contiguous(data, bytes);
      plan.send[j].total = bytes;
    }
  } else {
    plan.recv[root].active = true;
    plan.recv[root].view = BufferView::contiguous(data, bytes);
    plan.recv[root].total = bytes;
  }
  // Only the edges to the root carry messages; members that are neither root nor peer of this rank on
  // a message still count the instance (run() does), which keeps their edge counters in step.
  m.engine->run(group);
  c.finish();
}

void World::send(const void* data, size_t bytes, int dst_rank, void* stream) {
  GFDIT_CHECK(dst_rank >= 0 && dst_rank < impl_->size && dst_rank != impl_->rank)
      << "gfdit: send to rank " << dst_rank << " from rank " << impl_->rank << " in a world of " << impl_->size;
  int ranks[2] = {impl_->rank, dst_rank};
  Group g = Group::create(ranks, 2, impl_->size, impl_->rank);
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.engine->mutex());
  m.engine->checkUsable();
  Collective c(*m.engine, protocol::kSendRecv, 2, m.transport(stream), stream);
  c.plan.send[1].active = true;
  c.plan.send[1].view = BufferView::contiguous(const_cast<void*>(data), bytes);
  c.plan.send[1].total = bytes;
  m.engine->run(g);
  c.finish();
}

void World::recv(void* data, size_t bytes, int src_rank, void* stream) {
  GFDIT_CHECK(src_rank >= 0 && src_rank < impl_->size && src_rank != impl_->rank)
      << "gfdit: recv from rank " << src_rank << " on rank " << impl_->rank << " in a world of " << impl_->size;
  int ranks[2] = {impl_->rank, src_rank};
  Group g = Group::create(ranks, 2, impl_->size, impl_->rank);
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.engine->mutex());
  m.engine->checkUsable();
  Collective c(*m.engine, protocol::kSendRecv, 2, m.transport(stream), stream);
  c.plan.recv[1].active = true;
  c.plan.recv[1].view = BufferView::contiguous(data, bytes);
  c.plan.recv[1].total = bytes;
  m.engine->run(g);
  c.finish();
}

void World::barrier(const Group& group, void* stream) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.engine->mutex());
  m.engine->checkUsable();
  checkMember(group, m.size, m.rank);
  int n = group.size(), me = group.selfIdx();
  Transport& t = m.transport(stream);
  if (n == 1) return;
  Collective c(*m.engine, protocol::kBarrier, n, t, stream);
  c.plan.shared_send = true;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    c.plan.send[j].active = true;
    c.plan.recv[j].active = true;
  }
  m.engine->run(group);
  c.finish();
}

void World::putWithSignal(int peer, const void* src, size_t bytes, size_t remote_heap_offset, void* stream) {
  Impl& m = *impl_;
  GFDIT_CHECK(peer >= 0 && peer < m.size && peer != m.rank) << "gfdit: put to rank " << peer;
  if (stream != nullptr) {
    Transport& t = m.transport(stream);
    std::lock_guard<std::mutex> lock(m.engine->mutex());
    m.engine->checkUsable();
    t.begin(stream);
    try {
      t.putWithSignal(peer, remote_heap_offset, src, bytes);
    } catch (...) {
      t.end();
      throw;
    }
    t.end();
    return;
  }
  size_t peer_heap = m.engine->region(peer).header->heap_bytes;
  GFDIT_CHECK(bytes <= peer_heap && remote_heap_offset <= peer_heap - bytes)
      << "gfdit: put of " << bytes << " bytes at heap offset " << remote_heap_offset << " overruns rank " << peer
      << "'s heap of " << peer_heap << " bytes";
  std::lock_guard<std::mutex> lock(m.engine->mutex());
  m.engine->checkUsable();
  if (m.engine->isRemote(peer)) {
    m.engine->putRemote(peer, remote_heap_offset, src, bytes);
    return;
  }
  uint8_t* dst = m.cpu->peerBase(peer) + m.engine->region(peer).header->heap_offset + remote_heap_offset;
  m.engine->putWithSignal(peer, dst, src, bytes, m.cpu->copier());
}

void World::waitSignal(int peer, uint64_t count, void* stream) {
  Impl& m = *impl_;
  GFDIT_CHECK(peer >= 0 && peer < m.size && peer != m.rank) << "gfdit: wait for puts from rank " << peer;
  if (stream != nullptr) {
    Transport& t = m.transport(stream);
    std::lock_guard<std::mutex> lock(m.engine->mutex());
    m.engine->checkUsable();
    t.begin(stream);
    try {
      t.waitPuts(peer, count);
    } catch (...) {
      t.end();
      throw;
    }
    t.end();
    return;
  }
  std::lock_guard<std::mutex> lock(m.engine->mutex());
  m.engine->checkUsable();
  m.engine->waitSignal(peer, count);
}

}  // namespace gfdit
