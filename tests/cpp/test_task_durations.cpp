// TaskDurations: moving averages keyed by kind, shape and layout, and their fallbacks (NOTE [task durations]).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "task_durations.h"

using namespace gfdit;
using namespace gfdit::runtime;

namespace {

RequestShape shape(int64_t tokens, double guidance = 1.0) {
  RequestShape s;
  s.tokens = tokens;
  s.guidance_scale = guidance;
  return s;
}

Layout ulysses(int u) {
  Layout l;
  l.ulysses = u;
  return l;
}

}  // namespace

TEST(TaskDurations, KeysSeparateKindShapeGuidanceAndLayout) {
  const RequestShape small = shape(16), large = shape(4096), guided = shape(16, 4.0);
  const TaskKey a = TaskDurations::key(TaskKind::kDenoise, &small, ulysses(1));
  EXPECT_EQ(a, TaskDurations::key(TaskKind::kDenoise, &small, ulysses(1)));
  EXPECT_FALSE(a == TaskDurations::key(TaskKind::kDenoise, &large, ulysses(1)));
  EXPECT_FALSE(a == TaskDurations::key(TaskKind::kDenoise, &guided, ulysses(1)));
  EXPECT_FALSE(a == TaskDurations::key(TaskKind::kDenoise, &small, ulysses(2)));
  EXPECT_FALSE(a == TaskDurations::key(TaskKind::kEncode, &small, ulysses(1)));
  const TaskKey none = TaskDurations::key(TaskKind::kFree, nullptr, Layout());
  EXPECT_EQ(none.tokens, 0);
  EXPECT_FALSE(none.guidance);

  TaskDurations d;
  const TaskKey b = TaskDurations::key(TaskKind::kDenoise, &large, ulysses(1));
  d.record(a, 1, 1e6);
  d.record(b, 1, 1e8);
  EXPECT_DOUBLE_EQ(d.measuredNs(a, 1), 1e6);
  EXPECT_DOUBLE_EQ(d.measuredNs(b, 1), 1e8);
  EXPECT_EQ(d.size(), 2u);
}

TEST(TaskDurations, DenoiseIsPerStepAndTheAverageWeighsNewSamplesByAFifth) {
  const RequestShape s = shape(256);
  const TaskKey step = TaskDurations::key(TaskKind::kDenoise, &s, ulysses(2));
  const TaskKey encode = TaskDurations::key(TaskKind::kEncode, &s, Layout());
  TaskDurations d;
  d.record(step, 4, 4e6);  // 1 ms a step
  EXPECT_DOUBLE_EQ(d.measuredNs(step, 1), 1e6);
  EXPECT_DOUBLE_EQ(d.measuredNs(step, 3), 3e6);
  d.record(step, 1, 2e6);
  EXPECT_DOUBLE_EQ(d.measuredNs(step, 1), 0.8 * 1e6 + 0.2 * 2e6);
  d.record(encode, 0, 5e6);  // other kinds are per task, whatever num_steps says
  EXPECT_DOUBLE_EQ(d.measuredNs(encode, 7), 5e6);
  d.record(encode, 0, 0);  // no duration: not a measurement
  d.record(encode, 0, -1);
  EXPECT_DOUBLE_EQ(d.measuredNs(encode, 1), 5e6);
}

TEST(TaskDurations, UnmeasuredKeysFallBackToThePredictionThenTheLastOfTheirKind) {
  const RequestShape small = shape(16), large = shape(4096);
  const TaskKey a = TaskDurations::key(TaskKind::kDenoise, &small, ulysses(1));
  const TaskKey b = TaskDurations::key(TaskKind::kDenoise, &large, ulysses(1));
  TaskDurations d;
  EXPECT_EQ(d.estimateNs(a, 1, 0), 0);      // nothing known
  EXPECT_EQ(d.estimateNs(a, 2, 3e6), 3e6);  // the prediction (already for the task's steps)
  d.record(b, 1, 1e8);
  EXPECT_EQ(d.estimateNs(a, 1, 3e6), 3e6);  // a prediction beats another shape's measurement
  EXPECT_EQ(d.estimateNs(a, 2, 0), 2e8);    // without one: the last step of any shape, per step
  EXPECT_EQ(d.measuredNs(a, 1), 1e8);       // measured time only: the prediction is skipped
  d.record(a, 1, 1e6);
  EXPECT_EQ(d.estimateNs(a, 1, 3e6), 1e6);  // its own measurement beats everything
  const TaskKey other = TaskDurations::key(TaskKind::kMigrate, &small, Layout());
  EXPECT_EQ(d.estimateNs(other, 0, 0), 0);  // kinds do not stand in for each other
}

TEST(TaskDurations, PredictionsComeFromTheRequestsCost) {
  RequestCost cost;
  EXPECT_EQ(TaskDurations::predictedNs(cost, TaskKind::kDenoise, 1, 1), 0);  // no cost model
  cost.known = true;
  cost.encode_s = 0.5;
  cost.decode_s = 0.25;
  cost.migrate_s = 0.125;
  cost.step_s.fill(std::numeric_limits<double>::infinity());
  cost.step_s[2] = 0.01;
  EXPECT_DOUBLE_EQ(TaskDurations::predictedNs(cost, TaskKind::kEncode, 2, 0), 0.5e9);
  EXPECT_DOUBLE_EQ(TaskDurations::predictedNs(cost, TaskKind::kDecode, 1, 0), 0.25e9);
  EXPECT_DOUBLE_EQ(TaskDurations::predictedNs(cost, TaskKind::kMigrate, 1, 0), 0.125e9);
  EXPECT_DOUBLE_EQ(TaskDurations::predictedNs(cost, TaskKind::kDenoise, 2, 3), 0.03e9);
  EXPECT_EQ(TaskDurations::predictedNs(cost, TaskKind::kDenoise, 4, 1), 0);  // not predicted: infinity
  EXPECT_EQ(TaskDurations::predictedNs(cost, TaskKind::kFree, 1, 0), 0);
}

TEST(TaskDurations, TheTableIsBoundedAndDropsTheKeyMeasuredLeastRecently) {
  TaskDurations d;
  const size_t n = TaskDurations::kMaxKeys;
  for (size_t i = 0; i < n; ++i) {
    const RequestShape s = shape(static_cast<int64_t>(i) + 1);
    d.record(TaskDurations::key(TaskKind::kDenoise, &s, Layout()), 1, 1e6);
  }
  const RequestShape first = shape(1), second = shape(2);
  d.record(TaskDurations::key(TaskKind::kDenoise, &first, Layout()), 1, 2e6);  // measured again: now the newest
  const RequestShape extra = shape(0);
  d.record(TaskDurations::key(TaskKind::kDenoise, &extra, Layout()), 1, 3e6);
  EXPECT_EQ(d.size(), n);
  EXPECT_DOUBLE_EQ(d.measuredNs(TaskDurations::key(TaskKind::kDenoise, &first, Layout()), 1), 0.8 * 1e6 + 0.2 * 2e6);
  // the oldest (shape 2) is gone: it falls back to the last measurement of its kind
  EXPECT_DOUBLE_EQ(d.measuredNs(TaskDurations::key(TaskKind::kDenoise, &second, Layout()), 1), 3e6);
}
