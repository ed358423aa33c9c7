// The typed messages (NOTE [typed messages]): round trips, refusals of malformed bytes, and the one request
// check, whose errors name their field (gfdit::Error::param).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "control_harness.h"
#include "gfdit/error.h"
#include "gfdit/limits.h"
#include "gfdit/messages.h"

using namespace gfdit;
using namespace gfdit::runtime;
using gfdit::testing::errorOf;

namespace {

GenerationRequest full() {
  GenerationRequest q;
  q.prompt = "a harbour at dawn";
  q.negative_prompt = std::string("blurry\0fog", 10);  // bytes, not C strings
  q.height = 64;
  q.width = 96;
  q.num_frames = 9;
  q.num_inference_steps = 7;
  q.guidance_scale = 4.5;
  q.guidance_scale_2 = 3.0;
  q.seed = 0xFFFFFFFFFFFFFFFFull;
  q.priority = -3;
  q.deadline_s = 2.5;
  return q;
}

ModelInfo tinyVideo() {
  ModelInfo m;
  m.name = "tiny-wan";
  m.heads = 4;
  m.is_video = true;
  m.patch_t = 1;
  m.patch_s = 2;
  m.vae_stride_s = 8;
  m.vae_stride_t = 4;
  m.defaults = ModelDefaults{32, 48, 5, 4, 5.0};
  return m;
}

RequestLimits limitsOf(const ModelInfo& m) {
  RequestLimits l;
  l.vae_stride_s = m.vae_stride_s;
  l.patch_s = m.patch_s;
  l.temporal_stride = m.vae_stride_t;
  l.patch_t = m.patch_t;
  l.is_video = m.is_video;
  l.max_steps = 50;
  l.max_pixels = 256 * 256;
  l.max_frames = 33;
  l.max_tokens = 4096;
  return l;
}

}  // namespace

TEST(Messages, ARequestRoundTripsEveryField) {
  GenerationRequest q = full();
  GenerationRequest back = GenerationRequest::decode(q.encode());
  EXPECT_EQ(back.prompt, q.prompt);
  EXPECT_EQ(back.negative_prompt, q.negative_prompt);
  EXPECT_EQ(back.height, q.height);
  EXPECT_EQ(back.width, q.width);
  EXPECT_EQ(back.num_frames, q.num_frames);
  EXPECT_EQ(back.num_inference_steps, q.num_inference_steps);
  EXPECT_EQ(back.guidance_scale, q.guidance_scale);
  EXPECT_EQ(back.guidance_scale_2, q.guidance_scale_2);
  EXPECT_EQ(back.seed, q.seed);
  EXPECT_EQ(back.priority, q.priority);
  EXPECT_EQ(back.deadline_s, q.deadline_s);
  GenerationRequest bare;  // unset stays unset
  bare.prompt = "x";
  GenerationRequest bare_back = GenerationRequest::decode(bare.encode());
  EXPECT_FALSE(bare_back.negative_prompt || bare_back.height || bare_back.guidance_scale_2 || bare_back.deadline_s);
}

TEST(Messages, AHelloAndAReinitPlanRoundTrip) {
  ModelInfo m = tinyVideo();
  EXPECT_EQ(ModelInfo::decode(m.encode()), m);
  ModelInfo other = m;
  other.heads = 8;
  EXPECT_NE(other, m);
  ReinitPlan p;
  p.epoch = 3;
  p.workers = {0, 2, 5};
  ReinitPlan back = ReinitPlan::decode(p.encode());
  EXPECT_EQ(back.epoch, 3u);
  EXPECT_EQ(back.workers, p.workers);
}

TEST(Messages, MalformedBytesAreRefusedNeverDecoded) {
  std::string bytes = full().encode();
  for (size_t cut : {size_t{0}, size_t{3}, size_t{10}, bytes.size() - 1}) {  // truncated
    Error e = errorOf([&] { GenerationRequest::decode(bytes.substr(0, cut)); });
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(e.message().find("a generation request"), std::string::npos) << e.what();
  }
  Error extra = errorOf([&] { GenerationRequest::decode(bytes + "x"); });  // something appended
  EXPECT_NE(extra.message().find("left over"), std::string::npos) << extra.what();
  Error foreign = errorOf([&] { GenerationRequest::decode(tinyVideo().encode()); });  // another message
  EXPECT_NE(foreign.message().find("tag"), std::string::npos) << foreign.what();
  Error stale = errorOf([&] { ReinitPlan::decode(bytes); });
  EXPECT_NE(stale.message().find("a reinit plan"), std::string::npos) << stale.what();
}

TEST(Errors, CarryTheirParameterApartFromTheMessageAndWhere) {
  Error e = errorOf([] { GFDIT_CHECK(1 + 1 == 3).param("height") << "height 33 is not a multiple of 16"; });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage);
  EXPECT_EQ(e.param(), "height");
  EXPECT_EQ(e.message(), "height 33 is not a multiple of 16");
  EXPECT_NE(e.where().find("test_messages.cpp:"), std::string::npos) << e.where();
  EXPECT_NE(e.where().find("check failed: 1 + 1 == 3"), std::string::npos) << e.where();
  EXPECT_EQ(std::string(e.what()), e.where() + e.message());
  Error plain(ErrorCode::kTimeout, "waited");
  EXPECT_EQ(plain.param(), "");
  EXPECT_EQ(plain.where(), "");
  EXPECT_STREQ(plain.what(), "waited");
}

TEST(RequestCheck, FillsTheModelsDefaultsAndReturnsTheShape) {
  ModelInfo m = tinyVideo();
  GenerationRequest q;
  q.prompt = "p";
  RequestShape s = checkRequest(q, limitsOf(m), m.defaults);
  EXPECT_EQ(*q.height, 32);
  EXPECT_EQ(*q.width, 48);
  EXPECT_EQ(*q.num_frames, 5);
  EXPECT_EQ(*q.num_inference_steps, 4);
  EXPECT_EQ(*q.guidance_scale, 5.0);
  EXPECT_FALSE(q.guidance_scale_2.has_value());
  EXPECT_EQ(s.height, 32);
  EXPECT_EQ(s.num_steps, 4);
  EXPECT_EQ(s.tokens, 2 * (32 / 16) * (48 / 16));  // (5 - 1) / 4 + 1 latent frames
}

TEST(RequestCheck, EveryRefusalNamesItsField) {
  ModelInfo m = tinyVideo();
  RequestLimits lim = limitsOf(m);
  struct Case {
    std::function<void(GenerationRequest&)> bad;
    const char* param;
  };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Case> cases = {
      {[](GenerationRequest& q) { q.num_inference_steps = 0; }, "num_inference_steps"},
      {[](GenerationRequest& q) { q.num_inference_steps = 51; }, "num_inference_steps"},
      {[](GenerationRequest& q) { q.height = 0; }, "height"},
      {[](GenerationRequest& q) { q.height = 40; }, "height"},
      {[](GenerationRequest& q) { q.width = 40; }, "width"},
      {[](GenerationRequest& q) { q.height = q.width = 512; }, "height"},  // pixels
      {[](GenerationRequest& q) { q.num_frames = 8; }, "num_frames"},      // not 4k + 1
      {[](GenerationRequest& q) { q.num_frames = 37; }, "num_frames"},     // over the limit
      {[&](GenerationRequest& q) { q.guidance_scale = inf; }, "guidance_scale"},
      {[](GenerationRequest& q) { q.guidance_scale = -1; }, "guidance_scale"},
      {[](GenerationRequest& q) { q.guidance_scale_2 = std::nan(""); }, "guidance_scale_2"},
      {[](GenerationRequest& q) { q.deadline_s = 0; }, "deadline_s"},
      {[&](GenerationRequest& q) { q.deadline_s = inf; }, "deadline_s"},
      {[](GenerationRequest& q) { q.prompt = std::string(kMaxPayloadBytes, 'x'); }, "prompt"},
      {[](GenerationRequest& q) { q.negative_prompt = std::string(kMaxPayloadBytes, 'x'); }, "negative_prompt"},
  };
  for (const Case& c : cases) {
    GenerationRequest q;
    q.prompt = "p";
    c.bad(q);
    Error e = errorOf([&] { checkRequest(q, lim, m.defaults); });
    EXPECT_EQ(e.code(), ErrorCode::kInvalidUsage) << e.what();
    EXPECT_EQ(e.param(), c.param) << e.what();
  }
  RequestLimits image = lim;
  image.is_video = false;
  GenerationRequest frames;
  frames.prompt = "p";
  frames.num_frames = 5;
  EXPECT_EQ(errorOf([&] { checkRequest(frames, image, m.defaults); }).param(), "num_frames");
}

TEST(Messages, BatchMembersRoundTripAndRefuseGarbage) {
  BatchMembers b;
  b.request_ids = {7, 9, 12};
  b.step_begins = {0, 3, 41};
  BatchMembers back = BatchMembers::decode(b.encode());
  EXPECT_EQ(back.request_ids, b.request_ids);
  EXPECT_EQ(back.step_begins, b.step_begins);
  std::string bytes = b.encode();
  EXPECT_THROW(BatchMembers::decode(bytes.substr(0, bytes.size() - 1)), Error);
  EXPECT_THROW(BatchMembers::decode(ReinitPlan().encode()), Error);
}

TEST(RequestCheck, ASecondExpertsGuidanceIsForModelsWithTwo) {
  // a model with one expert refuses guidance_scale_2 at the check, naming it; one with two takes it
  ModelInfo m = tinyVideo();
  GenerationRequest q;
  q.prompt = "p";
  q.guidance_scale_2 = 3.0;
  RequestLimits one = limitsOf(m);
  Error e = errorOf([&] { checkRequest(q, one, m.defaults); });
  EXPECT_EQ(e.param(), "guidance_scale_2") << e.what();
  EXPECT_NE(std::string(e.what()).find("one expert"), std::string::npos) << e.what();
  m.two_experts = true;
  RequestLimits two = RequestLimits::of(cost::modelArch("tiny-wan"), m);  // the hello's word decides
  EXPECT_TRUE(two.two_experts);
  EXPECT_NO_THROW(checkRequest(q, two, m.defaults));
  EXPECT_TRUE(RequestLimits::of(cost::modelArch("wan2.2")).two_experts);
  EXPECT_FALSE(RequestLimits::of(cost::modelArch("qwen-image")).two_experts);
  // the hello carries it
  EXPECT_TRUE(ModelInfo::decode(m.encode()).two_experts);
}
