// The control plane in real time (see engine_loop.h).
//
// NOTE [control thread]
// One thread owns the control plane. Each round it takes the inbox (submit, cancel, probe, shutdown, posted
// by any thread), drains every worker's completion ring, checks worker processes every
// liveness_interval_s, and lets the control plane check deadlines and run the policy. Then, with nothing to
// do, it blocks on the control doorbell (rung by workers after each completion and by post()) until the
// next deadline or liveness check: an idle engine sleeps. Only when the control plane expects a completion
// within spin_window_s (an empty task, a probe) does it spin instead, since waking a sleeping thread costs
// tens of microseconds on a virtual machine; steps dispatched ahead make that latency irrelevant otherwise.
// The thread never waits while it holds the plane's lock: a task for a worker whose dispatch ring is full
// waits in that worker's backlog (RingExecutor), which every round pushes on, so that stats() and status()
// answer whatever the workers do.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <sstream>
#include <utility>

#include "doorbell.h"
#include "gfdit/engine_loop.h"
#include "gfdit/error.h"

namespace gfdit {
namespace runtime {
namespace {

constexpr int64_t kSecond = 1000000000;
// A worker whose dispatch ring stays full this long is wedged: it is killed, and its death starts recovery.
constexpr int64_t kDispatchTimeoutNs = 5 * kSecond;
// How often the control thread looks at a backlog while a worker's ring is full.
constexpr int64_t kBacklogPollNs = 1000000;
// At shutdown, how long the loop waits to tell each live worker to leave (its ring may be full).
constexpr auto kShutdownTimeout = std::chrono::seconds(1);

bool processGone(int pid) {
  siginfo_t info{};
  int rc = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
  if (rc == 0) return info.si_pid == pid;                             // exited (a zombie until its parent reaps it)
  if (errno == ECHILD) return ::kill(pid, 0) != 0 && errno == ESRCH;  // not our child
  return false;
}

}  // namespace

class EngineLoop::RingExecutor : public Executor {
 public:
  RingExecutor(QueueSet& q, std::vector<int>& pids, std::vector<std::shared_ptr<RemoteWorkers>>& remote)
      : q_(q), pids_(pids), remote_(remote), out_(q) {}

  // Never waits (NOTE [control thread]): what does not fit now waits in the worker's backlog, in order.
  void dispatch(const TaskDescriptor& task, const std::vector<int>& workers, const std::string& payload) override {
    const int64_t now = nowNs();
    for (int w : workers) out_.push(w, task, payload, now);
  }
  // Pushes what the backlogs hold; returns whether some still wait. A ring full for kDispatchTimeoutNs: the
  // worker is wedged; it is killed, and its death starts recovery.
  bool flush() {
    for (int w : out_.flush(nowNs(), kDispatchTimeoutNs)) killWorker(w);
    return out_.waiting();
  }
  void forget(int worker) { out_.clear(worker); }
  // Workers on other hosts watch their own host's abort word: each relay bumps it (NOTE [node agents]).
  void abortCollectives() override {
    q_.requestAbort();
    std::vector<RemoteWorkers*> done;
    for (const auto& host : remote_) {
      if (host == nullptr || std::find(done.begin(), done.end(), host.get()) != done.end()) continue;
      host->abortCollectives();
      done.push_back(host.get());
    }
  }
  void killWorker(int worker) override {
    if (worker < 0 || worker >= static_cast<int>(pids_.size())) return;
    if (remote_[worker] != nullptr) {
      remote_[worker]->kill(worker);
    } else if (pids_[worker] > 0) {
      ::kill(pids_[worker], SIGKILL);
    }
  }
  void discardOutput(const OutputRef& ref) override { runtime::discardOutput(ref); }

 private:
  QueueSet& q_;
  std::vector<int>& pids_;
  std::vector<std::shared_ptr<RemoteWorkers>>& remote_;
  Dispatcher out_;
};

EngineLoop::EngineLoop(EngineOptions options, std::shared_ptr<Policy> policy,
                       std::shared_ptr<const cost::CostModel> cost)
    : options_(std::move(options)) {
  GFDIT_CHECK(options_.num_workers >= 1 && options_.num_workers <= kMaxRanks).param("world_size")
      << "world_size " << options_.num_workers << " is outside [1, " << kMaxRanks << "]";
  options_.control.world_size = options_.num_workers;
  queues_ = QueueSet::create(options_.num_workers, options_.ring_bytes);
  output_prefix_ = outputPrefix(queues_->name());
  pids_.assign(options_.num_workers, 0);
  remote_.assign(options_.num_workers, nullptr);
  executor_ = std::make_unique<RingExecutor>(*queues_, pids_, remote_);
  plane_ = std::make_unique<ControlPlane>(options_.control, clock_, *executor_, std::move(policy), std::move(cost));
  plane_->setFinishedCallback([this](RequestResult&& r) {
    std::lock_guard<std::mutex> lock(results_mu_);
    results_.push_back(std::move(r));
    results_cv_.notify_all();
  });
  plane_->setProgressCallback([this](const RequestProgress& p) {
    std::lock_guard<std::mutex> lock(results_mu_);
    progress_.push_back(p);
    if (progress_.size() == 1) results_cv_.notify_all();  // the first of a batch only: NOTE [progress pace]
  });
  plane_->setProbeCallback([this](const Completion& c, int64_t seen) {
    std::lock_guard<std::mutex> lock(results_mu_);
    probes_.push_back({c.dispatch_ns, c.start_ns, c.post_ns, seen});
    results_cv_.notify_all();
  });
}

EngineLoop::~EngineLoop() {
  shutdown();
  if (queue_fd_ >= 0) ::close(queue_fd_);
  unlinkOutputs(output_prefix_);
  unlinkOutputs("/" + worldShmPrefix() + "-");
}

ModelInfo EngineLoop::awaitWorkers(const std::vector<int>& pids, double timeout_s) {
  GFDIT_CHECK(!started_) << "awaitWorkers after start";
  GFDIT_CHECK(static_cast<int>(pids.size()) == options_.num_workers)
      << pids.size() << " worker pids for " << options_.num_workers << " workers";
  {
    std::lock_guard<std::mutex> lock(plane_mu_);
    pids_ = pids;
  }
  awaiting_hello_.assign(options_.num_workers, false);
  hello_errors_.assign(options_.num_workers, std::string());
  std::vector<ModelInfo> hello(options_.num_workers);
  std::vector<bool> seen(options_.num_workers, false);
  std::string payload;
  int left = options_.num_workers;
  int64_t deadline = nowNs() + static_cast<int64_t>(timeout_s * kSecond);
  const int64_t liveness_ns = static_cast<int64_t>(options_.liveness_interval_s * kSecond);
  Completion c;
  while (left > 0) {
    uint32_t bell = __atomic_load_n(&queues_->controlBell()->value, __ATOMIC_SEQ_CST);
    bool got = false;
    for (int w = 0; w < options_.num_workers; ++w) {
      while (queues_->tryPopCompletion(w, c, &payload)) {
        got = true;
        if (c.task_id != 0) continue;
        GFDIT_CHECK_CODE(kRemoteError, c.ok()) << "worker " << w << " failed to start: " << payload;
        if (!seen[w]) {
          seen[w] = true;
          hello[w] = ModelInfo::decode(payload);
          --left;
        }
      }
    }
    if (got) continue;
    for (int w = 0; w < options_.num_workers; ++w) {
      if (seen[w]) continue;
      std::string why;
      const bool gone = remote_[w] != nullptr ? remote_[w]->gone(w, &why) : processGone(pids_[w]);
      GFDIT_CHECK_CODE(kRemoteError, !gone)
          << "worker " << w << " exited during start-up" << (why.empty() ? "" : ": ") << why;
    }
    int64_t now = nowNs();
    GFDIT_CHECK_CODE(kTimeout, now < deadline) << "workers not ready within " << timeout_s << " s";
    waitDoorbell(queues_->controlBell(), bell, std::min(deadline, now + liveness_ns));  // then look at the pids
  }
  for (int w = 1; w < options_.num_workers; ++w) {
    GFDIT_CHECK_CODE(kRemoteError, hello[w] == hello[0])
        << "worker " << w << " loaded another model than worker 0 (" << hello[w].name << " with " << hello[w].heads
        << " heads against " << hello[0].name << " with " << hello[0].heads << ")";
  }
  info_ = hello[0];
  limits_ = RequestLimits::of(cost::modelArch(info_.name), info_);
  have_info_ = true;
  return info_;
}

void EngineLoop::setLimits(const RequestLimits& limits) { limits_ = limits; }

RequestShape EngineLoop::check(GenerationRequest& q) const {
  GFDIT_CHECK(have_info_) << "a request before the workers said which model they loaded (awaitWorkers)";
  return checkRequest(q, limits_, info_.defaults);
}

std::vector<uint64_t> EngineLoop::submitGroup(std::vector<GenerationRequest>& qs) {
  GFDIT_CHECK(!closed_) << "the engine is shut down";
  std::vector<RequestSpec> specs;
  for (GenerationRequest& q : qs) specs.push_back(specOf(q));  // every one checked before any is queued
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);  // one swap of the inbox takes them all (NOTE [control thread])
    const uint64_t first = next_id_;
    for (RequestSpec& spec : specs) {
      spec.id = next_id_++;
      spec.group = specs.size() > 1 ? first : 0;
      ids.push_back(spec.id);
      inbox_.push_back(Event{Event::kSubmit, spec.id, std::move(spec)});
    }
  }
  ringDoorbell(queues_->controlBell());
  return ids;
}

RequestSpec EngineLoop::specOf(GenerationRequest& q) const {
  RequestSpec spec;
  spec.shape = check(q);
  spec.arrival_ns = nowNs();
  if (q.deadline_s) spec.deadline_ns = spec.arrival_ns + static_cast<int64_t>(*q.deadline_s * kSecond);
  spec.priority = q.priority;
  spec.max_degree = options_.num_workers;  // Ulysses splits the heads, unevenly past their divisors
  spec.num_heads = info_.heads;
  spec.payload = q.encode();
  return spec;
}

uint64_t EngineLoop::submit(GenerationRequest& q) { return submit(specOf(q)); }

void EngineLoop::start() {
  GFDIT_CHECK(!started_) << "the engine loop is already started";
  GFDIT_CHECK(have_info_) << "awaitWorkers first";
  // kept open for replacements (NOTE [replacements] in control.cpp), whose processes inherit it
  queue_fd_ = ::shm_open(queues_->name().c_str(), O_RDWR | O_CLOEXEC, 0600);
  GFDIT_CHECK_CODE(kSystemError, queue_fd_ >= 0) << "shm_open(" << queues_->name() << "): " << std::strerror(errno);
  queues_->unlinkName();  // every worker mapped it: nothing remains in /dev/shm
  started_ = true;
  thread_ = std::thread([this] { loop(); });
}

void EngineLoop::post(Event e) {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    inbox_.push_back(std::move(e));
  }
  ringDoorbell(queues_->controlBell());
}

uint64_t EngineLoop::submit(RequestSpec spec) {
  GFDIT_CHECK(!closed_) << "the engine is shut down";
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    id = next_id_++;
  }
  spec.id = id;
  if (spec.arrival_ns == 0) spec.arrival_ns = nowNs();
  Event e{Event::kSubmit, id, std::move(spec)};
  post(std::move(e));
  return id;
}

void EngineLoop::cancel(uint64_t id) { post(Event{Event::kCancel, id, {}}); }

// NOTE [progress pace]
// The control plane reports progress at every step and state change (RequestProgress), and results when
// requests end. Waking the thread that waits for them (Engine._collect, which takes the GIL and calls the
// listeners) at every step costs the control thread a futex wake and the cores a Python wake-up per step, which
// on a host with fewer cores than ranks slows the steps themselves. So results and the end wake it at once,
// while progress alone is handed over at most once per kProgressIntervalS: the first progress after a hand-over
// wakes the waiter (later ones find the batch begun and do not notify), which, when the interval has not passed,
// lingers until it has, collecting what comes meanwhile and returning at once when a result arrives. A reader of
// progress (RequestHandle.status, the live page) is thus at most an interval behind.
EngineUpdates EngineLoop::waitUpdates(double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto pace = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kProgressIntervalS));
  std::unique_lock<std::mutex> lock(results_mu_);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(std::max(0.0, timeout_s)));
  while (results_.empty() && !closed_) {
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (progress_.empty()) {
      results_cv_.wait_until(lock, deadline);
    } else if (now >= last_updates_ + pace) {
      break;
    } else {
      results_cv_.wait_until(lock, std::min(deadline, last_updates_ + pace));  // lingers: more may come
    }
  }
  last_updates_ = Clock::now();
  EngineUpdates out;
  out.progress.swap(progress_);
  out.results.assign(std::make_move_iterator(results_.begin()), std::make_move_iterator(results_.end()));
  results_.clear();
  return out;
}

RequestStatus EngineLoop::status(uint64_t id) {
  std::lock_guard<std::mutex> lock(plane_mu_);  // then the inbox: the control thread's order
  RequestStatus s = plane_->status(id);
  if (s.known) return s;
  // Submitted, and the control thread has not taken it from the inbox yet: it is queued.
  std::lock_guard<std::mutex> ilock(inbox_mu_);
  for (const Event& e : inbox_) {
    if (e.kind == Event::kSubmit && e.id == id) {
      s.known = true;
      s.num_steps = e.spec.shape.num_steps;
      break;
    }
  }
  return s;
}

std::vector<ProbeSample> EngineLoop::ping(int worker, int count, double timeout_s) {
  GFDIT_CHECK(started_ && !closed_) << "the engine is not running";
  GFDIT_CHECK(worker >= 0 && worker < options_.num_workers) << "worker " << worker;
  std::vector<ProbeSample> out;
  for (int i = 0; i < count; ++i) {
    {
      std::lock_guard<std::mutex> lock(results_mu_);
      probes_.clear();
    }
    post(Event{Event::kProbe, static_cast<uint64_t>(worker), {}});
    std::unique_lock<std::mutex> lock(results_mu_);
    bool ok = results_cv_.wait_for(lock, std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6)),
                                   [&] { return !probes_.empty() || closed_; });
    GFDIT_CHECK_CODE(kTimeout, ok && !probes_.empty())
        << "ping of worker " << worker << " not answered in " << timeout_s << " s";
    out.push_back(probes_.front());
  }
  return out;
}

EngineStats EngineLoop::stats() {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(plane_mu_);
    s.control = plane_->stats();
    s.loop_wakeups = loop_wakeups_;
    for (int w = 0; w < options_.num_workers; ++w) {
      s.alive.push_back(plane_->alive(w));
      s.joining.push_back(plane_->joining(w));
    }
    s.num_requests = plane_->numRequests();
    s.tasks_in_flight = plane_->numTasksInFlight();
    s.recovering = plane_->recovering();
  }
  if (thread_.joinable()) {
    clockid_t cid;
    if (pthread_getcpuclockid(thread_.native_handle(), &cid) == 0) {
      timespec ts;
      if (clock_gettime(cid, &ts) == 0) s.control_cpu_ns = static_cast<int64_t>(ts.tv_sec) * kSecond + ts.tv_nsec;
    }
  }
  return s;
}

void EngineLoop::shutdown() {
  if (closed_) return;
  if (started_ && thread_.joinable()) {
    post(Event{Event::kShutdown, 0, {}});
    thread_.join();
  }
  {
    std::lock_guard<std::mutex> lock(results_mu_);
    closed_ = true;
    results_cv_.notify_all();
  }
  queues_->unlinkName();
}

void EngineLoop::checkWorkers() {
  for (int w = 0; w < options_.num_workers; ++w) {
    if (!plane_->alive(w) && !plane_->joining(w)) continue;
    const bool gone = remote_[w] != nullptr ? remote_[w]->gone(w, nullptr) : pids_[w] > 0 && processGone(pids_[w]);
    if (gone) plane_->onWorkerDeath(w);
  }
}

void EngineLoop::setReplacing(bool on, const std::string& reason) {
  std::lock_guard<std::mutex> lock(plane_mu_);
  plane_->setReplacing(on, reason);
}

void EngineLoop::prepareReplacement(int worker) {
  GFDIT_CHECK(started_ && !closed_) << "the engine is not running";
  GFDIT_CHECK(worker >= 0 && worker < options_.num_workers).param("worker") << "worker " << worker;
  std::lock_guard<std::mutex> lock(plane_mu_);  // the control thread uses the rings only while it holds it
  GFDIT_CHECK(!plane_->alive(worker) && !plane_->joining(worker))
      << "worker " << worker << " is alive or joining: there is nothing to replace";
  executor_->forget(worker);
  // a remote worker's dispatch ring is read by its relay: it lets go of it before the ring is reset
  GFDIT_CHECK_CODE(kTimeout, remote_[worker] == nullptr || remote_[worker]->release(worker))
      << "worker " << worker << ": its relay did not let go of its rings in time; try again";
  queues_->resetWorker(worker);
  pids_[worker] = 0;
  awaiting_hello_[worker] = true;
  hello_errors_[worker].clear();
}

void EngineLoop::setWorkerPid(int worker, int pid) {
  GFDIT_CHECK(worker >= 0 && worker < options_.num_workers).param("worker") << "worker " << worker;
  std::lock_guard<std::mutex> lock(plane_mu_);
  pids_[worker] = pid;
}

void EngineLoop::setRemote(int worker, std::shared_ptr<RemoteWorkers> host) {
  GFDIT_CHECK(worker >= 0 && worker < options_.num_workers).param("worker") << "worker " << worker;
  std::lock_guard<std::mutex> lock(plane_mu_);
  remote_[worker] = std::move(host);
}

std::string EngineLoop::takeReplacementError(int worker) {
  GFDIT_CHECK(worker >= 0 && worker < options_.num_workers).param("worker") << "worker " << worker;
  std::lock_guard<std::mutex> lock(plane_mu_);
  return std::exchange(hello_errors_[worker], std::string());
}

void EngineLoop::onHello(int worker, const Completion& c, const std::string& payload) {
  awaiting_hello_[worker] = false;
  if (!c.ok()) {
    hello_errors_[worker] = "failed to start: " + payload;
    return;  // the process ends by itself
  }
  ModelInfo info = ModelInfo::decode(payload);
  if (!(info == info_)) {
    hello_errors_[worker] = "loaded another model than the engine's (" + info.name + ")";
    executor_->killWorker(worker);
    return;
  }
  plane_->onWorkerJoin(worker);
}

void EngineLoop::loop() {
  pthread_setname_np(pthread_self(), "gfdit-control");
  Doorbell* bell = queues_->controlBell();
  const int64_t liveness_ns = static_cast<int64_t>(options_.liveness_interval_s * kSecond);
  const int64_t spin_ns = static_cast<int64_t>(options_.spin_window_s * kSecond);
  int64_t next_liveness = 0;
  std::vector<Event> events;
  Completion c;
  std::string message;  // a completion's payload: the failure's text
  bool stopping = false;
  while (true) {
    uint32_t seen = __atomic_load_n(&bell->value, __ATOMIC_SEQ_CST);
    bool worked = false;
    int64_t next_timer = INT64_MAX;
    {
      std::lock_guard<std::mutex> lock(plane_mu_);
      ++loop_wakeups_;
      try {
        {
          std::lock_guard<std::mutex> ilock(inbox_mu_);
          events.swap(inbox_);
        }
        for (Event& e : events) {
          worked = true;
          switch (e.kind) {
            case Event::kSubmit: plane_->submit(std::move(e.spec)); break;
            case Event::kCancel: plane_->cancel(e.id); break;
            case Event::kProbe:
              if (plane_->alive(static_cast<int>(e.id))) plane_->probe(static_cast<int>(e.id));
              break;
            case Event::kShutdown: stopping = true; break;
          }
        }
        events.clear();
        for (int w = 0; w < options_.num_workers; ++w) {
          while (queues_->tryPopCompletion(w, c, &message)) {
            worked = true;
            if (c.task_id == 0 && awaiting_hello_[w]) {
              onHello(w, c, message);
            } else {
              plane_->onCompletion(c, message);
            }
          }
        }
        int64_t now = nowNs();
        if (now >= next_liveness) {
          checkWorkers();
          next_liveness = now + liveness_ns;
        }
        if (stopping) {
          plane_->finishAll("engine shut down");
          TaskDescriptor t;
          t.kind = static_cast<uint32_t>(TaskKind::kShutdown);
          for (int w = 0; w < options_.num_workers; ++w) {
            if (plane_->alive(w) || plane_->joining(w) || awaiting_hello_[w]) {
              queues_->pushTask(w, t, std::string(), kShutdownTimeout);
            }
          }
          return;
        }
        next_timer = plane_->poll();
        if (executor_->flush()) next_timer = std::min(next_timer, nowNs() + kBacklogPollNs);
      } catch (const std::exception& e) {
        // A bug in the control plane must not leave callers waiting for ever.
        plane_->finishAll(std::string("engine control plane failed: ") + e.what(), true);
      }
    }
    if (worked) continue;
    int64_t now = nowNs();
    int64_t expected = plane_->expectedCompletionNs();
    if (expected != INT64_MAX && expected - now < spin_ns && now - expected < spin_ns) {
      // a completion is due: spin (NOTE [control thread])
      int64_t spin_end = expected + spin_ns;
      while (__atomic_load_n(&bell->value, __ATOMIC_SEQ_CST) == seen && nowNs() < spin_end) core::cpuRelax();
      continue;
    }
    waitDoorbell(bell, seen, std::min(next_timer, next_liveness));
  }
}

}  // namespace runtime
}  // namespace gfdit
