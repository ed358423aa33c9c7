// The registry of settings (see gfdit/settings.h).
//
// NOTE [settings]
// Every GFDIT_* variable gfdit reads is one row of kSettings: its name, its default as text, its type and
// what it changes. A C++ reader reads its variable through the accessor of gfdit/settings.h, which goes
// through lookup() and so refuses a name the table does not hold; the Python package reads its own through
// gfdit._C.settings.get(). Defaults that depend on the world (a rank with a core of its own, the world's
// size) are written as the rule the accessor applies. tests/cpp/test_settings.cpp checks that names are
// unique, that every variable the C++ sources name is registered, and that the accessors parse as the
// readers did.
#include "gfdit/settings.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "gfdit/error.h"

namespace gfdit {
namespace settings {
namespace {

constexpr size_t kSlotBytes = 256 << 10;
constexpr int kSpinUsOwnCore = 1000;
constexpr int kSpinUsShared = 2;
constexpr int kYieldUsOwnCore = 0;
constexpr int kYieldUsShared = 300;
constexpr double kHeartbeatStaleS = 10.0;
constexpr size_t kCudaSlotBytes = 4 << 20;
constexpr int kCudaCopyBlocks = 32;
constexpr const char* kCudaCopyTable = "65536:sm,16777216:tma,inf:ce";

const std::vector<Setting>& table() {
  static const std::vector<Setting> kSettings = {
      // ---- the host world (src/collectives/world.cpp) ----
      {"GFDIT_SLOT_BYTES", "262144", "bytes",
       "Bytes of one staging slot of a host world whose WorldOptions::slot_bytes is 0 (rounded up to 64): larger "
       "messages are cut into slots and pipelined."},
      {"GFDIT_NUM_SLOTS", "min(128, max(8, 4 x (world_size - 1)))", "int",
       "Staging slots in each rank's outbound ring of a host world whose WorldOptions::num_slots is 0; raised to "
       "world_size - 1 and 2 at least (NOTE [staging rounds])."},
      {"GFDIT_SPIN_US",
       "adaptive: at most 1000 where every rank has a core of its own, 2 while the host is busy; else 2", "int",
       "Microseconds a wait of a host world spins before it yields or blocks, where WorldOptions::spin_us is "
       "negative (automatic). Setting it (or GFDIT_YIELD_US) fixes both and turns adapting off (NOTE [adaptive "
       "spin])."},
      {"GFDIT_YIELD_US", "0 where every rank has a core of its own, else 300", "int",
       "Microseconds a wait of a host world yields its core after spinning, before it blocks on its doorbell. "
       "Setting it (or GFDIT_SPIN_US) turns adapting off."},
      {"GFDIT_COPY_TABLE", "inf:memcpy", "string",
       "The host copy table, BOUND:PATH entries by ascending message size (\"65536:memcpy,inf:stream\"; paths "
       "memcpy, stream); device paths are refused (GFDIT_CUDA_COPY_TABLE is the device's)."},
      // ---- worlds across hosts (src/collectives/net_edges.cpp) ----
      {"GFDIT_NET_ADDRESS", "the first up, non-loopback IPv4 address, else 127.0.0.1", "string",
       "The IPv4 address a rank listens on for the network edges to ranks of other hosts (NOTE [network edges])."},
      {"GFDIT_NET_EDGES", "auto", "string",
       "\"auto\": network edges between ranks that cannot share memory (other hosts); \"nodes\": also between ranks "
       "of one host whose node ids differ (GFDIT_NODE_IDS), to emulate several machines on one."},
      // ---- workers on other hosts (src/runtime/relay.cpp) ----
      {"GFDIT_NODE_TIMEOUT_S", "10", "seconds",
       "A node agent's connection that brings nothing for this long is lost: on the engine, every worker of that "
       "host is dead; on the agent, its workers are stopped (Python passes it to the relays, NOTE [node agents])."},
      // ---- liveness of peers (src/core/liveness.cpp) ----
      {"GFDIT_PID_LIVENESS", "1", "bool",
       "0 stops trusting the pids of peers in the same pid namespace: only heartbeats tell a dead peer (NOTE "
       "[liveness])."},
      {"GFDIT_HEARTBEAT_STALE_S", "10", "seconds",
       "A peer whose heartbeat has not moved for this long is dead (a value that is not a positive number: 10)."},
      // ---- the CUDA transport (src/collectives/cuda/) ----
      {"GFDIT_CUDA_HEAP_BYTES", "the host heap's size (WorldOptions::heap_bytes)", "bytes",
       "Bytes of each rank's device heap in a world with a CUDA device."},
      {"GFDIT_CUDA_COPY_TABLE", kCudaCopyTable, "string",
       "The device copy table where CudaTransportOptions::copy_table is empty (paths sm, ce, tma; tma becomes "
       "sm without TMA); `gfdit profile --collectives` measures one."},
      {"GFDIT_CUDA_COPY_BLOCKS", "32", "int",
       "Most thread blocks an SM copy uses in the CUDA transport (where CudaTransportOptions::max_sm_blocks is "
       "0) and in the copy-table measurement."},
      {"GFDIT_CUDA_SLOT_BYTES", "4194304", "bytes",
       "Bytes of one device staging slot where CudaTransportOptions::slot_bytes is 0."},
      {"GFDIT_CUDA_NUM_SLOTS", "min(64, max(8, 4 x (world_size - 1)))", "int",
       "Device staging slots of each rank where CudaTransportOptions::num_slots is 0; raised to world_size - 1 "
       "and 2 at least (NOTE [staging rounds])."},
      // ---- the Python package ----
      {"GFDIT_HEAP_BYTES", "268435456", "bytes",
       "Bytes of each rank's symmetric heap in a world made without heap_bytes: gfdit.init, gfdit.Engine's "
       "workers and the torch.distributed backend (Python)."},
      {"GFDIT_DEVICE", "", "string",
       "Where gfdit.Engine's workers run when it is given no device: unset or \"cpu\" the CPU, \"cuda\" worker w "
       "on device w modulo the visible ones, \"cuda:N\" (or N) every worker on device N (Python)."},
      {"GFDIT_NODE_IDS", "", "string",
       "The node id of every rank, e.g. \"0,0,1,1\" (commas or spaces between), in place of the nodes a world "
       "derives from its ranks' hosts; unset or empty: derived. Parallel layouts place Ring and Ulysses by the "
       "nodes (World::nodeOf, gfdit.comm.topology). Under torchrun with GFDIT_NET_EDGES=nodes and this unset, "
       "gfdit.init() sets it from every rank's GROUP_RANK (two torchrun nodes on one host)."},
      {"GFDIT_FAULT_INJECTION", "0", "bool",
       "1 lets tests make a worker fail or hang on purpose with a prompt starting \"gfdit-fault:\" "
       "(\"gfdit-fault:raise\", \"gfdit-fault:sleep=30\"); off otherwise (Python, NOTE [fault injection])."},
      {"GFDIT_WORKER_TRACEBACK", "", "bool",
       "Any non-empty value: a worker prints the traceback of a model error to its stderr (Python)."},
      {"GFDIT_ATTENTION_PLAN_CACHE", "1", "bool",
       "\"0\", \"false\", \"off\" or \"no\" turns the attention plan cache off; it must be set alike on every "
       "member (Python, NOTE [attention plan cache])."},
  };
  return kSettings;
}

// A non-empty value of `name`, or nullptr.
const char* nonEmpty(const char* name) {
  const char* v = lookup(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The host world's parsing: std::stoull (which throws std::invalid_argument on a value that is no number).
size_t sizeOr(const char* name, size_t fallback) {
  const char* v = nonEmpty(name);
  return v != nullptr ? static_cast<size_t>(std::stoull(v)) : fallback;
}

// The CUDA transport's parsing: digits only.
size_t countOr(const char* name, size_t fallback) {
  const char* v = nonEmpty(name);
  if (v == nullptr) return fallback;
  std::string s(v);
  GFDIT_CHECK(s.find_first_not_of("0123456789") == std::string::npos) << name << "=" << s << " is not a number";
  return static_cast<size_t>(std::stoull(s));
}

}  // namespace

const std::vector<Setting>& all() { return table(); }

const Setting* find(const std::string& name) {
  for (const Setting& s : table()) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

const char* lookup(const char* name) {
  GFDIT_CHECK(find(name) != nullptr) << "gfdit: " << name << " is not a setting gfdit knows (gfdit/settings.h)";
  return std::getenv(name);
}

std::string get(const std::string& name) {
  const Setting* s = find(name);
  GFDIT_CHECK(s != nullptr) << "gfdit: " << name << " is not a setting gfdit knows (gfdit/settings.h)";
  const char* v = std::getenv(s->name);
  return v != nullptr ? std::string(v) : std::string(s->default_value);
}

size_t slotBytes() { return sizeOr("GFDIT_SLOT_BYTES", kSlotBytes); }

size_t numSlots(int world_size) {
  return sizeOr("GFDIT_NUM_SLOTS", std::min<size_t>(128, std::max<size_t>(8, 4 * static_cast<size_t>(world_size - 1))));
}

int spinUs(bool own_core) {
  return static_cast<int>(sizeOr("GFDIT_SPIN_US", own_core ? kSpinUsOwnCore : kSpinUsShared));
}

int yieldUs(bool own_core) {
  return static_cast<int>(sizeOr("GFDIT_YIELD_US", own_core ? kYieldUsOwnCore : kYieldUsShared));
}

bool waitsFixed() { return nonEmpty("GFDIT_SPIN_US") != nullptr || nonEmpty("GFDIT_YIELD_US") != nullptr; }

const char* copyTable() { return lookup("GFDIT_COPY_TABLE"); }

const char* netAddress() { return nonEmpty("GFDIT_NET_ADDRESS"); }

bool netEdgesByNode() {
  const char* v = nonEmpty("GFDIT_NET_EDGES");
  if (v == nullptr || std::string(v) == "auto") return false;
  GFDIT_CHECK(std::string(v) == "nodes").param("GFDIT_NET_EDGES")
      << "GFDIT_NET_EDGES=" << v << ": \"auto\" or \"nodes\"";
  return true;
}

const char* nodeIds() { return nonEmpty("GFDIT_NODE_IDS"); }

bool pidLiveness() {
  const char* v = lookup("GFDIT_PID_LIVENESS");
  return v == nullptr || *v == '\0' || std::atoi(v) != 0;
}

double heartbeatStaleS() {
  const char* v = nonEmpty("GFDIT_HEARTBEAT_STALE_S");
  double s = v != nullptr ? std::atof(v) : kHeartbeatStaleS;
  return s > 0 ? s : kHeartbeatStaleS;
}

size_t cudaHeapBytes(size_t host_heap_bytes) { return sizeOr("GFDIT_CUDA_HEAP_BYTES", host_heap_bytes); }

const char* cudaCopyTable() { return lookup("GFDIT_CUDA_COPY_TABLE"); }

const char* cudaDefaultCopyTable() { return kCudaCopyTable; }

size_t cudaSlotBytes() { return countOr("GFDIT_CUDA_SLOT_BYTES", kCudaSlotBytes); }

size_t cudaNumSlots(int world_size) {
  return countOr("GFDIT_CUDA_NUM_SLOTS",
                 std::min<size_t>(64, std::max<size_t>(8, 4 * static_cast<size_t>(world_size - 1))));
}

int cudaCopyBlocks() { return static_cast<int>(countOr("GFDIT_CUDA_COPY_BLOCKS", kCudaCopyBlocks)); }

int cudaCopyBlocksToMeasure() {
  const char* v = nonEmpty("GFDIT_CUDA_COPY_BLOCKS");
  return v != nullptr ? std::max(1, std::atoi(v)) : kCudaCopyBlocks;
}

}  // namespace settings
}  // namespace gfdit
