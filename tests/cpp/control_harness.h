// Test doubles for the control plane: an executor that records tasks and completes them on demand, and a
// cost model with fixed stage times.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>

#include <gtest/gtest.h>
#include <map>
#include <string>
#include <vector>

#include <functional>

#include "gfdit/clock.h"
#include "gfdit/control.h"
#include "gfdit/cost.h"
#include "gfdit/error.h"
#include "gfdit/executor.h"
#include "gfdit/limits.h"
#include "gfdit/messages.h"
#include "gfdit/policy.h"
#include "gfdit/request.h"

namespace gfdit {
namespace testing {

using namespace gfdit::runtime;

/// The gfdit::Error `fn` throws; a test fails when it throws none.
inline Error errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no gfdit::Error was thrown";
  return Error(ErrorCode::kInternal, "none");
}

/// Records every dispatched task; the test completes them (in FIFO order per worker, as workers would).
class ScriptExecutor : public Executor {
 public:
  struct Sent {
    TaskDescriptor d;
    std::vector<int> workers;
    std::string payload;
  };
  void dispatch(const TaskDescriptor& d, const std::vector<int>& workers, const std::string& payload) override {
    sent.push_back({d, workers, payload});
    for (int w : workers) queues[w].push_back(sent.size() - 1);
  }
  void abortCollectives() override { ++aborts; }
  void killWorker(int w) override { killed.push_back(w); }
  void discardOutput(const OutputRef& ref) override { discarded.push_back(ref.name); }

  /// The completion worker `w` would post for task `i` of `sent`.
  Completion completionOf(size_t i, int w, TaskError err = TaskError::kOk, int64_t t_ns = 0,
                          int32_t step_end = -2) const {
    const TaskDescriptor& d = sent[i].d;
    Completion c;
    c.task_id = d.task_id;
    c.request_id = d.request_id;
    c.kind = d.kind;
    c.rank = w;
    c.error = static_cast<int32_t>(err);
    c.start_ns = t_ns;
    c.end_ns = t_ns;
    auto k = static_cast<TaskKind>(d.kind);
    if (k == TaskKind::kDenoise) c.step_end = d.step_begin + d.num_steps;
    if (k == TaskKind::kMigrate) c.step_end = d.step_begin;
    if (k == TaskKind::kDecode && d.ranks[0] == w) {  // the first member reports the output
      std::snprintf(c.output.name, sizeof(c.output.name), "/out-%llu", static_cast<unsigned long long>(d.task_id));
    }
    if (err != TaskError::kOk && k == TaskKind::kDenoise) c.step_end = d.step_begin;
    if (step_end != -2) c.step_end = step_end;
    return c;
  }

  /// Completes the oldest unfinished task at the head of worker w's queue; returns its index in `sent`.
  long completeHead(ControlPlane& cp, int w, TaskError err = TaskError::kOk, int32_t step_end = -2) {
    if (queues[w].empty()) return -1;
    size_t i = queues[w].front();
    queues[w].pop_front();
    // a failure's text travels as the completion's payload (NOTE [typed messages])
    std::string message = err == TaskError::kOk ? std::string() : std::string("injected ") + taskErrorName(err);
    cp.onCompletion(completionOf(i, w, err, 0, step_end), message);
    return static_cast<long>(i);
  }

  /// Completes everything queued, round-robin over workers, until nothing is left (polling in between).
  int drain(ControlPlane& cp, int max_rounds = 100000) {
    int n = 0;
    for (int round = 0; round < max_rounds; ++round) {
      bool any = false;
      for (auto& kv : queues) {
        if (!kv.second.empty()) {
          completeHead(cp, kv.first);
          any = true;
          ++n;
        }
      }
      cp.poll();
      if (!any) break;
    }
    return n;
  }

  /// Kinds of the tasks sent, as names.
  std::vector<std::string> kinds() const {
    std::vector<std::string> out;
    for (const auto& s : sent) out.push_back(taskKindName(static_cast<TaskKind>(s.d.kind)));
    return out;
  }

  std::vector<Sent> sent;
  std::map<int, std::deque<size_t>> queues;
  int aborts = 0;
  std::vector<int> killed;
  std::vector<std::string> discarded;
};

/// A model for tests: image tokens only, heads 4.
inline cost::ModelArch testArch() {
  cost::ModelArch a;
  a.name = "test";
  a.heads = 4;
  a.num_layers = 2;
  a.hidden = 64;
  a.head_dim = 16;
  a.vae_stride_s = 8;
  a.patch_s = 2;
  a.default_height = 64;
  a.default_width = 64;
  a.default_steps = 4;
  a.max_steps = 100;
  a.max_pixels = 1 << 20;
  a.max_tokens = 1 << 20;
  return a;
}

/// Fixed stage times: encode, decode and migrate constant; a step `step_s * tokens / 256 / degree^eff`.
class FixedCost : public cost::CostModel {
 public:
  FixedCost(double encode_s, double step_s, double decode_s, double migrate_s, double scaling = 1.0)
      : encode_s_(encode_s),
        step_s_(step_s),
        decode_s_(decode_s),
        migrate_s_(migrate_s),
        scaling_(scaling),
        arch_(testArch()) {}
  double seconds(cost::Stage stage, const cost::StageQuery& q) const override {
    switch (stage) {
      case cost::Stage::kEncode: return encode_s_;
      case cost::Stage::kDecode: return decode_s_;
      case cost::Stage::kMigrate: return migrate_s_;
      case cost::Stage::kDenoise: {
        double base = step_s_ * static_cast<double>(std::max<int64_t>(q.shape.tokens, 1)) / 256.0;
        return base / std::pow(static_cast<double>(q.degree), scaling_) * (1 + (q.batch - 1) * batch_cost_);
      }
    }
    return 0;
  }
  std::string describe() const override { return "fixed"; }
  const cost::ModelArch& model() const override { return arch_; }
  int32_t maxBatch(const cost::StageQuery&) const override { return max_batch_; }
  /// Batches of up to `max_batch` requests, a step of b of them costing (1 + (b - 1) x `batch_cost`) steps.
  FixedCost& batches(int32_t max_batch, double batch_cost) {
    max_batch_ = max_batch;
    batch_cost_ = batch_cost;
    return *this;
  }

 private:
  double encode_s_, step_s_, decode_s_, migrate_s_, scaling_;
  int32_t max_batch_ = 1;
  double batch_cost_ = 1.0;
  cost::ModelArch arch_;
};

/// A request of `h` x `w` pixels (64x64 = 16 tokens at stride 16) and `steps` steps, checked.
inline RequestSpec spec(int steps, int h = 64, int w = 64, int64_t arrival_ns = 0) {
  RequestSpec s;
  s.shape.height = h;
  s.shape.width = w;
  s.shape.num_frames = 1;
  s.shape.num_steps = steps;
  RequestLimits lim = RequestLimits::of(testArch());
  checkRequest(s.shape, lim);
  s.arrival_ns = arrival_ns;
  s.max_degree = 4;
  s.payload = "{\"prompt\": \"p\"}";
  return s;
}

}  // namespace testing
}  // namespace gfdit
