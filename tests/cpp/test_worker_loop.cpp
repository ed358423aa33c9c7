// The worker's half of the ring protocol (NOTE [worker loop]): a forked child runs a WorkerLoop with a
// scripted "model", and this process plays the engine on the rings: the hello, the tasks the loop answers by
// itself (a probe, lost states, a broken world), step tracking, errors by code, outputs, the engine's end.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "gfdit/clock.h"
#include "gfdit/outputs.h"
#include "gfdit/rings.h"
#include "gfdit/worker_loop.h"

using namespace gfdit;
using namespace gfdit::runtime;

namespace {

constexpr auto kWait = std::chrono::seconds(20);
const float kOutput[4] = {0.25f, 0.5f, 0.75f, 1.0f};

ModelInfo helloInfo() {
  ModelInfo m;
  m.name = "scripted";
  m.heads = 6;
  m.defaults = ModelDefaults{16, 32, 1, 3, 1.0};
  return m;
}

// The child: a worker whose model succeeds at everything but migrations, which raise a RemoteError.
[[noreturn]] void runWorker(const std::string& queue_name) {
  int rc = 0;
  try {
    WorkerLoop loop(queue_name, 0);
    loop.hello(helloInfo());
    while (std::optional<WorkerTask> t = loop.next(0.05)) {
      switch (t->kind) {
        case TaskKind::kDenoise:
          for (int k = t->step_begin; k < t->step_begin + t->num_steps; ++k) loop.progress(t->request_id, k + 1);
          loop.complete(*t);
          break;
        case TaskKind::kMigrate: loop.fail(*t, ErrorCode::kRemoteError, "RemoteError: a peer went away"); break;
        case TaskKind::kDecode: loop.complete(*t, kOutput, sizeof(kOutput), DType::kFloat32, {4}); break;
        case TaskKind::kEncode:
          if (t->request.prompt == "bad") {
            loop.fail(*t, ErrorCode::kInvalidUsage, "InvalidUsage: no");
            break;
          }
          loop.complete(*t);
          break;
        default: loop.complete(*t); break;
      }
    }
  } catch (...) {
    rc = 3;
  }
  _exit(rc);
}

class Engine {
 public:
  Engine() : set_(QueueSet::create(1, 1 << 16)) {}
  ~Engine() { set_->unlinkName(); }
  const std::string& name() const { return set_->name(); }

  void send(TaskKind kind, uint64_t request, int32_t step_begin = 0, int32_t num_steps = 0,
            const std::string& payload = std::string()) {
    TaskDescriptor d;
    d.task_id = ++next_task_;
    d.request_id = request;
    d.kind = static_cast<uint32_t>(kind);
    d.step_begin = step_begin;
    d.num_steps = num_steps;
    d.num_ranks = 1;
    d.payload_bytes = static_cast<uint32_t>(payload.size());
    d.dispatch_ns = nowNs();
    ASSERT_TRUE(set_->pushTask(0, d, payload, kWait));
  }
  /// The next completion (waits for it), and its payload.
  Completion receive(std::string* payload = nullptr) {
    auto until = std::chrono::steady_clock::now() + kWait;
    Completion c;
    while (!set_->tryPopCompletion(0, c, payload)) {
      if (std::chrono::steady_clock::now() > until) {
        ADD_FAILURE() << "no completion within 20 s";
        return c;
      }
      usleep(200);
    }
    return c;
  }
  uint64_t lastTask() const { return next_task_; }

 private:
  std::unique_ptr<QueueSet> set_;
  uint64_t next_task_ = 0;
};

std::string encodeTask(const std::string& prompt) {
  GenerationRequest q;
  q.prompt = prompt;
  q.height = 16;
  q.width = 32;
  q.num_frames = 1;
  q.num_inference_steps = 3;
  q.guidance_scale = 1.0;
  return q.encode();
}

}  // namespace

TEST(WorkerLoop, SpeaksTheWorkersHalfOfTheProtocol) {
  Engine e;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) runWorker(e.name());

  std::string payload;
  Completion hello = e.receive(&payload);  // the hello: the model the worker loaded
  EXPECT_EQ(hello.task_id, 0u);
  EXPECT_TRUE(hello.ok());
  EXPECT_EQ(ModelInfo::decode(payload), helloInfo());

  e.send(TaskKind::kFree, 0);  // a probe: answered by the loop itself
  Completion probe = e.receive();
  EXPECT_TRUE(probe.ok());
  EXPECT_EQ(probe.task_id, e.lastTask());

  e.send(TaskKind::kDenoise, 5, 0, 1);  // no state of request 5 here yet
  Completion lost = e.receive(&payload);
  EXPECT_EQ(static_cast<TaskError>(lost.error), TaskError::kStateLost);
  EXPECT_NE(payload.find("holds no state of request 5"), std::string::npos) << payload;
  EXPECT_EQ(lost.step_end, -1);

  e.send(TaskKind::kEncode, 5, 0, 0, encodeTask("a fox"));
  Completion enc = e.receive();
  EXPECT_TRUE(enc.ok());
  EXPECT_EQ(enc.step_end, 0);
  e.send(TaskKind::kDenoise, 5, 0, 2);
  Completion steps = e.receive();
  EXPECT_TRUE(steps.ok());
  EXPECT_EQ(steps.step_end, 2);
  e.send(TaskKind::kDenoise, 5, 1, 1);  // the worker is at step 2
  Completion stale = e.receive(&payload);
  EXPECT_EQ(static_cast<TaskError>(stale.error), TaskError::kStateLost);
  EXPECT_NE(payload.find("at step 2, not 1"), std::string::npos) << payload;
  EXPECT_EQ(stale.step_end, 2);

  e.send(TaskKind::kEncode, 6, 0, 0, encodeTask("bad"));  // InvalidUsage: the request cannot run
  EXPECT_EQ(static_cast<TaskError>(e.receive().error), TaskError::kInvalidRequest);

  e.send(TaskKind::kMigrate, 5, 2, 0);  // a RemoteError: the world is broken
  Completion comm = e.receive(&payload);
  EXPECT_EQ(static_cast<TaskError>(comm.error), TaskError::kCommError);
  EXPECT_EQ(payload, "RemoteError: a peer went away");
  e.send(TaskKind::kDenoise, 5, 2, 1);  // refused until a REINIT, without running
  Completion down = e.receive(&payload);
  EXPECT_EQ(static_cast<TaskError>(down.error), TaskError::kCommError);
  EXPECT_NE(payload.find("world is down"), std::string::npos) << payload;
  EXPECT_EQ(down.step_end, 2);
  ReinitPlan plan;
  plan.epoch = 1;
  plan.workers = {0};
  e.send(TaskKind::kReinit, 0, 0, 0, plan.encode());
  EXPECT_TRUE(e.receive().ok());
  e.send(TaskKind::kDenoise, 5, 2, 1);  // the world is back
  Completion again = e.receive();
  EXPECT_TRUE(again.ok());
  EXPECT_EQ(again.step_end, 3);

  e.send(TaskKind::kDecode, 5);
  Completion dec = e.receive();
  ASSERT_TRUE(dec.ok());
  EXPECT_EQ(dec.output.dtype, static_cast<int32_t>(DType::kFloat32));
  EXPECT_EQ(dec.output.ndim, 1);
  EXPECT_EQ(dec.output.shape[0], 4);
  auto out = MappedOutput::open(dec.output);
  ASSERT_EQ(out->bytes(), sizeof(kOutput));
  EXPECT_EQ(std::memcmp(out->data(), kOutput, sizeof(kOutput)), 0);

  e.send(TaskKind::kFree, 5);  // dropped: a decode of it now finds no state
  EXPECT_EQ(e.receive().step_end, -1);
  e.send(TaskKind::kDecode, 5);
  EXPECT_EQ(static_cast<TaskError>(e.receive().error), TaskError::kStateLost);

  e.send(TaskKind::kShutdown, 0);  // next() ends: the child leaves
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(WorkerLoop, ErrorCodesDecideTheTaskError) {
  EXPECT_EQ(taskErrorOf(ErrorCode::kTimeout), TaskError::kCommError);
  EXPECT_EQ(taskErrorOf(ErrorCode::kRemoteError), TaskError::kCommError);
  EXPECT_EQ(taskErrorOf(ErrorCode::kInvalidUsage), TaskError::kInvalidRequest);
  EXPECT_EQ(taskErrorOf(ErrorCode::kSystemError), TaskError::kModelError);
  EXPECT_EQ(taskErrorOf(ErrorCode::kInternal), TaskError::kModelError);
}
