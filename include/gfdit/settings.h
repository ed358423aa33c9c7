// One registry of settings: every GFDIT_* environment variable gfdit reads, C++ and Python alike, with its
// default and its meaning, in one table (settings::all(); Python: gfdit._C.settings.entries()). The C++
// readers go through one accessor per variable below; each reads the environment when called.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gfdit {
namespace settings {

/// One environment variable gfdit reads.
struct Setting {
  const char* name;           ///< "GFDIT_SPIN_US"
  const char* default_value;  ///< what applies while it is unset, as text ("": nothing, i.e. off or none)
  const char* type;           ///< "bytes", "int", "seconds", "bool" or "string"
  const char* meaning;        ///< for people: what it changes, and who reads it
};

/// Every setting, in the registry's order (names are unique).
const std::vector<Setting>& all();
/// The setting called `name`, or nullptr when the registry has none.
const Setting* find(const std::string& name);
/// The environment's value of the registered setting `name`, or nullptr while it is unset; throws
/// InvalidUsage for a name the registry does not hold.
const char* lookup(const char* name);
/// The environment's value of the registered setting `name`, or its default as text while it is unset;
/// throws InvalidUsage for a name the registry does not hold.
std::string get(const std::string& name);

// ---- the C++ readers' accessors (same defaults, parsing and messages as each reader had) ----

/// GFDIT_SLOT_BYTES: bytes of a host world's staging slot (262144 while unset or empty; std::stoull).
size_t slotBytes();
/// GFDIT_NUM_SLOTS: staging slots of a host world of `world_size` ranks (min(128, max(8, 4 x (world_size -
/// 1))) while unset or empty; std::stoull).
size_t numSlots(int world_size);
/// GFDIT_SPIN_US: microseconds a host world's wait spins (while unset or empty: 1000 where every rank has a
/// core, the most an adaptive wait spins, else 2).
int spinUs(bool own_core);
/// GFDIT_YIELD_US: microseconds a host world's wait yields its core after spinning (0 where every rank has a
/// core, else 300).
int yieldUs(bool own_core);
/// Whether GFDIT_SPIN_US or GFDIT_YIELD_US is set (non-empty): a host world's waits then spin and yield as
/// spinUs and yieldUs say, without adapting to the host's load (NOTE [adaptive spin]).
bool waitsFixed();
/// GFDIT_COPY_TABLE: the host copy table as set (nullptr while unset; an empty value is returned as is).
const char* copyTable();
/// GFDIT_NET_ADDRESS: the IPv4 address of this rank's network edges (nullptr while unset or empty).
const char* netAddress();
/// GFDIT_NET_EDGES: whether ranks of one host whose node ids differ talk over the network ("nodes"; false while
/// unset, empty or "auto"; another value throws InvalidUsage).
bool netEdgesByNode();
/// GFDIT_NODE_IDS as set (nullptr while unset or empty).
const char* nodeIds();
/// GFDIT_PID_LIVENESS: whether peers' pids are trusted where namespaces match (true while unset or empty,
/// else std::atoi != 0).
bool pidLiveness();
/// GFDIT_HEARTBEAT_STALE_S: seconds after which a peer whose heartbeat stands still is dead (10 while unset,
/// empty or not a positive number; std::atof).
double heartbeatStaleS();
/// GFDIT_CUDA_HEAP_BYTES: bytes of a rank's device heap (`host_heap_bytes` while unset or empty; std::stoull).
size_t cudaHeapBytes(size_t host_heap_bytes);
/// GFDIT_CUDA_COPY_TABLE: the device copy table as set (nullptr while unset).
const char* cudaCopyTable();
/// The device copy table that applies while GFDIT_CUDA_COPY_TABLE is unset or empty.
const char* cudaDefaultCopyTable();
/// GFDIT_CUDA_SLOT_BYTES: bytes of a device staging slot (4194304 while unset or empty; digits only, else
/// InvalidUsage "GFDIT_CUDA_SLOT_BYTES=<value> is not a number").
size_t cudaSlotBytes();
/// GFDIT_CUDA_NUM_SLOTS: device staging slots of a world of `world_size` ranks (min(64, max(8, 4 x
/// (world_size - 1))) while unset or empty; digits only, as cudaSlotBytes).
size_t cudaNumSlots(int world_size);
/// GFDIT_CUDA_COPY_BLOCKS as the CUDA transport reads it: most blocks of an SM copy (32 while unset or
/// empty; digits only, as cudaSlotBytes).
int cudaCopyBlocks();
/// GFDIT_CUDA_COPY_BLOCKS as the copy-table measurement reads it: std::atoi, at least 1 (32 while unset or
/// empty).
int cudaCopyBlocksToMeasure();

}  // namespace settings
}  // namespace gfdit
