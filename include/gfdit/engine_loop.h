// The control plane in real time: worker processes behind shared-memory rings, the machine's clock, one
// control thread that blocks on a futex when there is nothing to do. gfdit.Engine is a thin facade over it;
// a C++ program can use it directly with workers of its own that speak the ring protocol (rings.h, messages.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gfdit/clock.h"
#include "gfdit/control.h"
#include "gfdit/cost.h"
#include "gfdit/limits.h"
#include "gfdit/messages.h"
#include "gfdit/outputs.h"
#include "gfdit/policy.h"
#include "gfdit/request.h"
#include "gfdit/rings.h"

namespace gfdit {
namespace runtime {

/// How often the engine loop checks that its worker processes live, in seconds; so the control thread also
/// wakes at least this often while it runs (NOTE [control thread] in src/runtime/engine_loop.cpp).
constexpr double kLivenessIntervalS = 0.1;
/// Progress alone wakes the one who waits for updates at most once this often (NOTE [progress pace]).
constexpr double kProgressIntervalS = 0.02;

/// Settings of an engine loop.
struct EngineOptions {
  int num_workers = 1;
  ControlConfig control;                            ///< world_size is set to num_workers
  uint32_t ring_bytes = 1u << 20;                   ///< per ring
  double liveness_interval_s = kLivenessIntervalS;  ///< how often worker processes are checked
  double spin_window_s = 50e-6;  ///< spin instead of sleeping when a completion is expected this soon
};

/// One probe round trip: when the control plane wrote it, the worker took it, posted its completion, and
/// the control plane saw it (monotonic ns).
struct ProbeSample {
  int64_t dispatch_ns = 0;
  int64_t start_ns = 0;
  int64_t post_ns = 0;
  int64_t seen_ns = 0;
};

/// Workers that run on other hosts, behind a relay (NOTE [node agents] in src/runtime/relay.cpp): the engine loop asks
/// it, instead of a process id, whether such a worker is gone, and asks it to stop one or to abort its collectives.
/// Every method returns within a bounded time and never throws for a worker it does not know.
class RemoteWorkers {
 public:
  virtual ~RemoteWorkers() = default;
  /// Whether `worker` is gone (its process ended, or its host was lost); `why` (when given) says what happened.
  virtual bool gone(int worker, std::string* why) = 0;
  /// Stops `worker` (asks its host to kill it); its death then comes back through gone().
  virtual void kill(int worker) = 0;
  /// Bumps the abort word of the workers on other hosts (World::watchAbort), as QueueSet::requestAbort does here.
  virtual void abortCollectives() = 0;
  /// Stops taking tasks from dead `worker`'s dispatch ring, whose rings are about to be reset for a replacement;
  /// returns once it has (false when it could not make sure in time).
  virtual bool release(int worker) = 0;
};

/// What happened since the last EngineLoop::waitUpdates: progress of requests (in order) and the requests that
/// ended. A request's final progress comes before its result.
struct EngineUpdates {
  std::vector<RequestProgress> progress;
  std::vector<RequestResult> results;
};

/// What an engine loop reports of itself (EngineLoop::stats).
struct EngineStats {
  ControlStats control;
  int64_t control_cpu_ns = 0;  ///< CPU time of the control thread so far
  int64_t loop_wakeups = 0;    ///< times the control thread woke up
  std::vector<bool> alive;
  std::vector<bool> joining;  ///< replacements that said hello and wait for the next world (NOTE [replacements])
  size_t num_requests = 0;    ///< not yet pruned
  size_t tasks_in_flight = 0;
  bool recovering = false;
};

/// The real-time engine core. Thread-safe: any thread may submit, cancel, query and wait for results.
class EngineLoop {
 public:
  EngineLoop(EngineOptions options, std::shared_ptr<Policy> policy,
             std::shared_ptr<const cost::CostModel> cost = nullptr);
  ~EngineLoop();

  /// The rings' shared-memory name, for workers to attach (unlinked once start() runs).
  const std::string& queueName() const { return queues_->name(); }
  /// Prefix of the names workers give their outputs (NOTE [outputs]).
  std::string outputNamePrefix() const { return output_prefix_; }
  /// The WorldOptions::shm_prefix workers give their worlds (worldShmPrefix).
  std::string worldShmPrefix() const { return runtime::worldShmPrefix(queues_->name()); }
  /// Waits until every worker posted its hello (a completion with task_id 0, carrying a ModelInfo: NOTE [typed
  /// messages]) and returns the model they loaded. Throws when a worker reports an error, two workers report
  /// different models, a process in `pids` exits (or a remote worker is gone: setRemote; its pid is ignored), or the
  /// timeout passes. The requests' limits are then the
  /// model's (RequestLimits::of its registry entry and the hello) until setLimits.
  ModelInfo awaitWorkers(const std::vector<int>& pids, double timeout_s);
  /// What submit(GenerationRequest&) checks requests against.
  void setLimits(const RequestLimits& limits);
  const RequestLimits& limits() const { return limits_; }
  /// Starts the control thread (every worker attached: the rings' name is removed).
  void start();

  /// Checks `request` (filling its unset fields with the model's defaults: checkRequest) and queues it; returns
  /// its id. Bad fields throw InvalidUsage naming them (Error::param). Needs awaitWorkers first.
  uint64_t submit(GenerationRequest& request);
  /// Checks every request as submit does (one that fails throws, and none is queued), then queues them all at
  /// once as one group (RequestSpec::group: the first one's id), so that the policy first sees them together;
  /// returns their ids.
  std::vector<uint64_t> submitGroup(std::vector<GenerationRequest>& requests);
  /// What submit checks, alone: fills `request`'s unset fields and returns its shape, or throws as submit would
  /// (a caller that must refuse bad input before anything else, such as a server before its admission).
  RequestShape check(GenerationRequest& request) const;
  /// Queues a request whose shape passed checkRequest and whose payload the workers understand; returns its id.
  uint64_t submit(RequestSpec spec);
  /// Cancels a request.
  void cancel(uint64_t id);
  /// Progress and results since the last call; waits up to `timeout_s` for at least one. Empty when closed.
  /// Results come at once; progress alone at most once per kProgressIntervalS (NOTE [progress pace]).
  /// Whoever runs the loop calls it regularly: nothing else drains them.
  EngineUpdates waitUpdates(double timeout_s);
  RequestStatus status(uint64_t id);
  /// `count` probe round trips to an idle `worker`, one after another.
  std::vector<ProbeSample> ping(int worker, int count, double timeout_s);
  EngineStats stats();
  /// Cancels what is in flight, tells the workers to leave, stops the control thread.
  void shutdown();

  // Replacing dead workers (NOTE [replacements] in src/runtime/control.cpp). Whoever starts the workers starts a
  // replacement: prepareReplacement, then the process (attaching with queueFd(): the rings' name is gone), then
  // setWorkerPid. Its hello makes it a joiner; its model must be the engine's.
  /// Whether dead workers will be replaced: see ControlPlane::setReplacing.
  void setReplacing(bool on, const std::string& reason = std::string());
  /// A descriptor of the rings' region, open for as long as the loop lives (for a replacement to inherit).
  int queueFd() const { return queue_fd_; }
  /// Readies dead `worker`'s rings for a replacement and forgets its process. Throws unless it is dead.
  void prepareReplacement(int worker);
  /// The replacement's process id (its death is then noticed like any worker's).
  void setWorkerPid(int worker, int pid);
  /// `worker` runs on another host behind `host` (a relay): its liveness, its kill and the abort of its collectives
  /// go through `host` instead of a process id and this host's abort word (NOTE [node agents]).
  void setRemote(int worker, std::shared_ptr<RemoteWorkers> host);
  /// Why `worker`'s latest replacement was refused at its hello ("" if it was not), and forgets it.
  std::string takeReplacementError(int worker);
  bool closed() const { return closed_; }

 private:
  /// A checked request's spec (its unset fields filled in), not yet queued.
  RequestSpec specOf(GenerationRequest& request) const;

  struct Event {
    enum Kind { kSubmit, kCancel, kProbe, kShutdown } kind;
    uint64_t id = 0;
    RequestSpec spec;
  };
  class RingExecutor;

  void loop();
  void post(Event e);
  void checkWorkers();
  void onHello(int worker, const Completion& c, const std::string& payload);

  EngineOptions options_;
  std::unique_ptr<QueueSet> queues_;
  std::string output_prefix_;
  std::unique_ptr<RingExecutor> executor_;
  RealClock clock_;
  std::unique_ptr<ControlPlane> plane_;
  std::vector<int> pids_;
  std::vector<std::shared_ptr<RemoteWorkers>> remote_;  ///< by worker; null for a local process
  std::vector<bool> awaiting_hello_;                    ///< a replacement is starting (prepareReplacement)
  std::vector<std::string> hello_errors_;               ///< takeReplacementError
  int queue_fd_ = -1;
  std::thread thread_;
  std::mutex plane_mu_;  // held by the control thread while it works (not while it waits)
  std::mutex inbox_mu_;
  std::vector<Event> inbox_;
  std::mutex results_mu_;
  std::condition_variable results_cv_;
  std::deque<RequestResult> results_;
  std::vector<RequestProgress> progress_;
  std::chrono::steady_clock::time_point last_updates_{};  // when waitUpdates last returned
  ModelInfo info_;
  RequestLimits limits_;
  bool have_info_ = false;
  std::vector<ProbeSample> probes_;
  uint64_t next_id_ = 1;
  bool started_ = false;
  bool stop_ = false;
  bool closed_ = false;
  int64_t loop_wakeups_ = 0;
};

}  // namespace runtime
}  // namespace gfdit
