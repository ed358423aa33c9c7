// Outputs in shared memory: a worker writes a decoded output into a POSIX shared-memory object of its own,
// the engine maps it without a copy (an OutputRef in the completion says where it lies).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "gfdit/messages.h"

namespace gfdit {
namespace core {
class SharedMemory;
}
namespace runtime {

// NOTE [outputs]
// A decoded output can be hundreds of MB, so it never travels through a ring: the worker writes it into a
// fresh POSIX shared-memory object named `<prefix><task>-<rank>` (prefix from outputPrefix of the queue
// set), and its completion carries the name, dtype and shape. The engine maps the object, unlinks the name
// at once and hands the mapping to the caller without a copy. Names that no completion delivered (a worker
// killed between writing and reporting) are removed by unlinkOutputs at recovery and shutdown.

/// The prefix of output names that belong to the queue set `queue_name`.
std::string outputPrefix(const std::string& queue_name);
/// The WorldOptions::shm_prefix of the workers of the queue set `queue_name`: a worker killed while its world
/// forms leaves its region's name (NOTE [group-free collectives] in gfdit/world.h), which the engine removes
/// at shutdown by this prefix (unlinkOutputs("/" + prefix + "-")).
std::string worldShmPrefix(const std::string& queue_name);
/// Writes `bytes` from `data` into a new shm object `name` (mode 0600); fills `ref` except dtype/shape.
void writeOutput(const std::string& name, const void* data, size_t bytes, OutputRef& ref);
/// A mapped output: the bytes, writable and no longer shared with anyone; unmapped when destroyed.
class MappedOutput {
 public:
  /// Maps `ref`'s object and unlinks its name.
  static std::shared_ptr<MappedOutput> open(const OutputRef& ref);
  ~MappedOutput();
  const void* data() const;
  size_t bytes() const;

 private:
  MappedOutput();
  std::unique_ptr<core::SharedMemory> shm_;
};
/// Unlinks the shm object of `ref` without mapping it (an output nobody will read).
void discardOutput(const OutputRef& ref);
/// Unlinks every shm object whose name starts with `prefix`; returns how many.
int unlinkOutputs(const std::string& prefix);

}  // namespace runtime
}  // namespace gfdit
