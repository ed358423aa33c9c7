// Names of the message enums and the encoding of the typed payloads (see gfdit/messages.h, NOTE [typed
// messages]).
#include "gfdit/messages.h"

#include "wire.h"

namespace gfdit {
namespace runtime {

const char* taskKindName(TaskKind k) {
  switch (k) {
    case TaskKind::kEncode: return "encode";
    case TaskKind::kDenoise: return "denoise";
    case TaskKind::kMigrate: return "migrate";
    case TaskKind::kDecode: return "decode";
    case TaskKind::kFree: return "free";
    case TaskKind::kShutdown: return "shutdown";
    case TaskKind::kReinit: return "reinit";
    case TaskKind::kGather: return "gather";
  }
  return "unknown";
}

const char* taskErrorName(TaskError e) {
  switch (e) {
    case TaskError::kOk: return "ok";
    case TaskError::kInvalidRequest: return "invalid_request";
    case TaskError::kModelError: return "model_error";
    case TaskError::kCommError: return "comm_error";
    case TaskError::kWorkerDied: return "worker_died";
    case TaskError::kTimeout: return "timeout";
    case TaskError::kStateLost: return "state_lost";
  }
  return "unknown";
}

namespace {

// Message tags: a kind (high 16 bits) and a version (low 16 bits); a change of a struct's fields bumps its
// version, so that a worker and an engine of different builds refuse each other's messages.
constexpr uint32_t kRequestTag = 0x5251'0002;      // "RQ" v2: cache
constexpr uint32_t kModelInfoTag = 0x4d49'0003;    // "MI" v3: two_experts, cache_kinds
constexpr uint32_t kReinitTag = 0x5249'0001;       // "RI" v1
constexpr uint32_t kBatchTag = 0x424d'0001;        // "BM" v1
constexpr uint32_t kCacheCountsTag = 0x4243'0001;  // "BC" v1

template <typename T>
void putOptional(wire::Writer& w, const std::optional<T>& v) {
  w.put<uint8_t>(v.has_value() ? 1 : 0);
  if (v) w.put(*v);
}

template <typename T>
std::optional<T> getOptional(wire::Reader& r) {
  if (r.get<uint8_t>() == 0) return std::nullopt;
  return r.get<T>();
}

}  // namespace

std::string GenerationRequest::encode() const {
  wire::Writer w(kRequestTag);
  w.putString(prompt);
  w.put<uint8_t>(negative_prompt.has_value() ? 1 : 0);
  if (negative_prompt) w.putString(*negative_prompt);
  putOptional(w, height);
  putOptional(w, width);
  putOptional(w, num_frames);
  putOptional(w, num_inference_steps);
  putOptional(w, guidance_scale);
  putOptional(w, guidance_scale_2);
  w.put(seed).put(priority);
  putOptional(w, deadline_s);
  w.put(static_cast<int32_t>(cache.kind)).put(cache.threshold).put(cache.warmup).put(cache.max_skip);
  return w.take();
}

GenerationRequest GenerationRequest::decode(const std::string& bytes) {
  wire::Reader r(bytes, kRequestTag, "a generation request");
  GenerationRequest q;
  q.prompt = r.getString();
  if (r.get<uint8_t>() != 0) q.negative_prompt = r.getString();
  q.height = getOptional<int32_t>(r);
  q.width = getOptional<int32_t>(r);
  q.num_frames = getOptional<int32_t>(r);
  q.num_inference_steps = getOptional<int32_t>(r);
  q.guidance_scale = getOptional<double>(r);
  q.guidance_scale_2 = getOptional<double>(r);
  q.seed = r.get<uint64_t>();
  q.priority = r.get<int32_t>();
  q.deadline_s = getOptional<double>(r);
  const int32_t kind = r.get<int32_t>();
  GFDIT_CHECK_CODE(kInternal, kind >= 0 && kind <= static_cast<int32_t>(CacheKind::kTeaCache))
      << "a generation request with cache kind " << kind;
  q.cache.kind = static_cast<CacheKind>(kind);
  q.cache.threshold = r.get<double>();
  q.cache.warmup = r.get<int32_t>();
  q.cache.max_skip = r.get<int32_t>();
  r.end();
  return q;
}

std::string ModelInfo::encode() const {
  wire::Writer w(kModelInfoTag);
  w.putString(name);
  w.put(heads).put<uint8_t>(is_video ? 1 : 0).put(patch_t).put(patch_s).put(vae_stride_s).put(vae_stride_t);
  w.put<uint8_t>(two_experts ? 1 : 0);
  w.put(cache_kinds);
  w.put(defaults.height).put(defaults.width).put(defaults.num_frames).put(defaults.num_steps);
  w.put(defaults.guidance_scale);
  return w.take();
}

ModelInfo ModelInfo::decode(const std::string& bytes) {
  wire::Reader r(bytes, kModelInfoTag, "a worker's hello");
  ModelInfo m;
  m.name = r.getString();
  m.heads = r.get<int32_t>();
  m.is_video = r.get<uint8_t>() != 0;
  m.patch_t = r.get<int32_t>();
  m.patch_s = r.get<int32_t>();
  m.vae_stride_s = r.get<int32_t>();
  m.vae_stride_t = r.get<int32_t>();
  m.two_experts = r.get<uint8_t>() != 0;
  m.cache_kinds = r.get<uint32_t>();
  m.defaults.height = r.get<int32_t>();
  m.defaults.width = r.get<int32_t>();
  m.defaults.num_frames = r.get<int32_t>();
  m.defaults.num_steps = r.get<int32_t>();
  m.defaults.guidance_scale = r.get<double>();
  r.end();
  return m;
}

bool ModelInfo::operator==(const ModelInfo& o) const {
  return name == o.name && heads == o.heads && is_video == o.is_video && patch_t == o.patch_t && patch_s == o.patch_s &&
         vae_stride_s == o.vae_stride_s && vae_stride_t == o.vae_stride_t && two_experts == o.two_experts &&
         cache_kinds == o.cache_kinds && defaults.height == o.defaults.height && defaults.width == o.defaults.width &&
         defaults.num_frames == o.defaults.num_frames && defaults.num_steps == o.defaults.num_steps &&
         defaults.guidance_scale == o.defaults.guidance_scale;
}

std::string ReinitPlan::encode() const {
  wire::Writer w(kReinitTag);
  w.put(epoch).put(static_cast<uint32_t>(workers.size()));
  for (int32_t x : workers) w.put(x);
  return w.take();
}

ReinitPlan ReinitPlan::decode(const std::string& bytes) {
  wire::Reader r(bytes, kReinitTag, "a reinit plan");
  ReinitPlan p;
  p.epoch = r.get<uint64_t>();
  uint32_t n = r.get<uint32_t>();
  GFDIT_CHECK_CODE(kInternal, n <= kMaxRanks) << "a reinit plan of " << n << " workers";
  for (uint32_t i = 0; i < n; ++i) p.workers.push_back(r.get<int32_t>());
  r.end();
  return p;
}

std::string BatchMembers::encode() const {
  GFDIT_CHECK_CODE(kInternal, request_ids.size() == step_begins.size() && request_ids.size() < kMaxBatch)
      << "a batch of " << request_ids.size() << " other requests and " << step_begins.size() << " steps";
  wire::Writer w(kBatchTag);
  w.put(static_cast<uint32_t>(request_ids.size()));
  for (size_t i = 0; i < request_ids.size(); ++i) w.put(request_ids[i]).put(step_begins[i]);
  return w.take();
}

BatchMembers BatchMembers::decode(const std::string& bytes) {
  wire::Reader r(bytes, kBatchTag, "a batch's members");
  BatchMembers b;
  uint32_t n = r.get<uint32_t>();
  GFDIT_CHECK_CODE(kInternal, n < static_cast<uint32_t>(kMaxBatch)) << "a batch of " << n << " other requests";
  for (uint32_t i = 0; i < n; ++i) {
    b.request_ids.push_back(r.get<uint64_t>());
    b.step_begins.push_back(r.get<int32_t>());
  }
  r.end();
  return b;
}

std::string BatchCacheCounts::encode() const {
  GFDIT_CHECK_CODE(kInternal, cached_steps.size() == cached_passes.size() && cached_steps.size() < kMaxBatch)
      << "cache counts of " << cached_steps.size() << " and " << cached_passes.size() << " requests";
  wire::Writer w(kCacheCountsTag);
  w.put(static_cast<uint32_t>(cached_steps.size()));
  for (size_t i = 0; i < cached_steps.size(); ++i) w.put(cached_steps[i]).put(cached_passes[i]);
  return w.take();
}

BatchCacheCounts BatchCacheCounts::decode(const std::string& bytes) {
  wire::Reader r(bytes, kCacheCountsTag, "a batch's step cache counts");
  BatchCacheCounts b;
  uint32_t n = r.get<uint32_t>();
  GFDIT_CHECK_CODE(kInternal, n < static_cast<uint32_t>(kMaxBatch)) << "cache counts of " << n << " requests";
  for (uint32_t i = 0; i < n; ++i) {
    b.cached_steps.push_back(r.get<int32_t>());
    b.cached_passes.push_back(r.get<int32_t>());
  }
  r.end();
  return b;
}

}  // namespace runtime
}  // namespace gfdit
