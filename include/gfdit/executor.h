// How the control plane runs tasks: an Executor that queues them on workers (the engine's rings, the
// simulator's simulated cluster, or a program's own).
#pragma once

#include <string>
#include <vector>

#include "gfdit/messages.h"

namespace gfdit {
namespace runtime {

/// Runs tasks on workers. The control plane calls it from its one thread, in its one total order
/// (NOTE [dispatch order] in src/runtime/control.cpp); completions come back through
/// ControlPlane::onCompletion.
class Executor {
 public:
  virtual ~Executor() = default;
  /// Queues `task` (with `payload`) on each worker in `workers`, in FIFO order per worker. Never waits for
  /// a worker to run it.
  virtual void dispatch(const TaskDescriptor& task, const std::vector<int>& workers, const std::string& payload) = 0;
  /// Releases collectives blocked on a dead or wedged worker (recovery starts).
  virtual void abortCollectives() {}
  /// Stops a worker that missed a task deadline; its death is then reported through onWorkerDeath.
  virtual void killWorker(int worker) {}
  /// An output nobody will read (its request was cancelled or pruned).
  virtual void discardOutput(const OutputRef& ref) {}
};

}  // namespace runtime
}  // namespace gfdit
