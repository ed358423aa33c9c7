// The analytic cost model: the model registry, the hardware and cluster registries, and stage times from
// FLOPs and bytes over peak rates with efficiency factors (see docs/cost_calibration.md for the fit); and the
// names of the stages and of the layout's modes and placements (gfdit/layout.h), defined once here.
#include "gfdit/cost.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "gfdit/error.h"
#include "gfdit/types.h"

namespace gfdit {
namespace cost {

namespace {

std::string joinNames(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << names[i];
  return os.str();
}

// The value of `values` that `name_of` names `name`; another name throws InvalidUsage listing the valid ones.
template <typename E>
E fromName(const std::string& name, const char* what, std::initializer_list<E> values, const char* (*name_of)(E)) {
  std::vector<std::string> names;
  for (E v : values) {
    if (name == name_of(v)) return v;
    names.push_back(name_of(v));
  }
  GFDIT_THROW(kInvalidUsage) << "unknown " << what << " '" << name << "'; valid " << what << "s: " << joinNames(names);
  return *values.begin();  // unreachable
}

// NOTE [model registry]
// Dimensions are the public configs (Hugging Face transformer/config.json of each model and the reference
// implementations' config files): layers, width, heads x head dim, FFN width, text encoder width and the
// text tokens the transformer sees, VAE strides and latent channels, patch sizes. Parameter counts are
// computed from those dimensions (the per-token FLOPs below use the dimensions, the counts only price
// weight reads). Figures that no config states are marked "estimate" where they are set:
// - vae_decode_flops_per_pixel: counted from the Wan-VAE decoder's stages (causal 3x3x3 convolutions of
//   96/192/384 channels at full/half/quarter resolution, two per residual block, three blocks per stage,
//   the low-resolution stages at reduced frame rate); the Qwen-Image VAE is the same decoder run on one
//   frame. The Wan 2.2 VAE (48 channels, 16x) is wider; its figure is scaled from the channel widths.
// - text_tokens of Qwen-Image: its encoder keeps the prompt's real length (no padding, the 34-token chat
//   template dropped); 128 stands for a prompt of a sentence or two. Wan pads to max_sequence_length 512.
// - vae_decoder_convs, vae_halo_channels, vae_mid_channels: counted from diffusers' AutoencoderKLWan decoder
//   (the Qwen-Image VAE is the same decoder) with forward hooks on every convolution of a decode: 33 3x3
//   convolutions per latent frame (conv_in, the mid block's 4, 6 in each of the four up stages, the three
//   upsamplers' 2-D convolutions, conv_out; the upsamplers' temporal convolutions and 1x1 shortcuts need no
//   halo), 25 for the tiny models' TINY_VAE (one residual block per stage). The halo channels sum each 3x3
//   convolution's input channels times its width and frames relative to the output's, for a latent frame of
//   four output frames (video) or for one frame (images): Wan 2.1 VAE 2064.5 (one frame: 2738), Wan 2.2 VAE
//   3040.75, TINY_VAE 68.625 (one frame: 79.5). The same count gives 8.5e6 decoder FLOPs per output pixel
//   for a Wan 2.1 VAE video (8.3e6 above), 1.08e7 for one frame (1.0e7), 1.85e7 for the Wan 2.2 VAE (1.2e7
//   above: an underestimate kept so that a one-rank decode does not change) and 1.8e4 for TINY_VAE (1e5 above
//   was set with the cpu factors, NOTE [cpu hardware]).
// - sampler_history_latents: the shipped scheduler's history in the denoise state (UniPC of order 2, as every
//   Wan folder ships it: two earlier model outputs plus the corrector's last sample; flow-matching Euler, as
//   Qwen-Image and the tiny models ship, keeps none).
// - text_encoder_params: non-embedding parameters (embeddings are a gather, not a GEMM): the Qwen2.5-VL-7B
//   language model (28 layers, 3584 wide, FFN 18944, 4 KV heads) and the UMT5-XXL encoder (24 layers,
//   4096 wide, gated FFN 10240).
// Limits: max_steps 1000 because every shipped scheduler has 1000 training timesteps (more steps only
// repeat timesteps); max_pixels and max_frames a little past what each model was trained for (Qwen-Image to
// 2048 x 2048, Wan 720p up to 161 frames = 10 s at 16 fps) so a server refuses absurd sizes before they run
// out of memory; max_tokens is the token count of the largest allowed size. The tiny models' limits keep a
// request that a CPU finishes in seconds.
std::vector<ModelArch> makeModels() {
  std::vector<ModelArch> v;
  {
    ModelArch m;
    m.name = "qwen-image";
    m.pipeline = "qwen-image";
    m.joint_attention = true;
    m.num_layers = 60;
    m.hidden = 3072;
    m.heads = 24;
    m.head_dim = 128;
    m.ffn = 4 * 3072;
    m.transformer_params = 20.4e9;  // 60 x (two streams x (4 x 3072^2 + 2 x 3072 x 12288) + modulation)
    m.text_hidden = 3584;
    m.text_tokens = 128;  // estimate, see NOTE [model registry]
    m.text_encoder_params = 6.5e9;
    m.vae_stride_t = 1;
    m.vae_stride_s = 8;
    m.latent_channels = 16;
    m.patch_t = 1;
    m.patch_s = 2;
    m.vae_decode_flops_per_pixel = 1.0e7;  // estimate: the Wan-VAE decoder on one frame
    m.vae_decoder_convs = 33;              // the Wan-VAE decoder, see NOTE [model registry]
    m.vae_halo_channels = 2738;            // one frame
    m.vae_mid_channels = 384;
    m.default_height = 1024;
    m.default_width = 1024;
    m.default_frames = 1;
    m.default_steps = 50;
    m.default_guidance = 4.0;
    m.max_steps = 1000;
    m.max_pixels = 2048LL * 2048;
    m.max_frames = 1;
    m.max_tokens = m.tokens(2048, 2048, 1);
    v.push_back(m);
  }
  {
    ModelArch m;
    m.name = "wan2.2";  // T2V A14B: two 14B experts (high noise, low noise), one active per step
    m.pipeline = "wan";
    m.is_video = true;
    m.num_layers = 40;
    m.hidden = 5120;
    m.heads = 40;
    m.head_dim = 128;
    m.ffn = 13824;
    m.num_experts = 2;
    m.transformer_params = 14.0e9;  // one expert: 40 x (8 x 5120^2 + 2 x 5120 x 13824)
    m.text_hidden = 4096;
    m.text_tokens = 512;
    m.text_encoder_params = 4.6e9;
    m.vae_stride_t = 4;
    m.vae_stride_s = 8;
    m.latent_channels = 16;
    m.patch_t = 1;
    m.patch_s = 2;
    m.vae_decode_flops_per_pixel = 8.3e6;  // estimate, see NOTE [model registry]
    m.vae_decoder_convs = 33;              // the Wan 2.1 VAE, see NOTE [model registry]
    m.vae_halo_channels = 2064.5;          // a latent frame of four output frames
    m.vae_mid_channels = 384;
    m.sampler_history_latents = 3;  // UniPC, solver_order 2: two model outputs and last_sample
    m.default_height = 720;
    m.default_width = 1280;
    m.default_frames = 81;
    m.default_steps = 40;
    m.default_guidance = 4.0;
    m.max_steps = 1000;
    m.max_pixels = 1280LL * 720;
    m.max_frames = 161;
    m.max_tokens = m.tokens(720, 1280, m.max_frames);
    v.push_back(m);
  }
  {
    ModelArch m;
    m.name = "wan2.2-5b";  // TI2V 5B, the high-compression Wan 2.2 VAE
    m.is_video = true;
    m.num_layers = 30;
    m.hidden = 3072;
    m.heads = 24;
    m.head_dim = 128;
    m.ffn = 14336;
    m.transformer_params = 4.9e9;  // 30 x (8 x 3072^2 + 2 x 3072 x 14336)
    m.text_hidden = 4096;
    m.text_tokens = 512;
    m.text_encoder_params = 4.6e9;
    m.vae_stride_t = 4;
    m.vae_stride_s = 16;
    m.latent_channels = 48;
    m.patch_t = 1;
    m.patch_s = 2;
    m.vae_decode_flops_per_pixel = 1.2e7;  // estimate, see NOTE [model registry]
    m.vae_decoder_convs = 33;              // the Wan 2.2 VAE, see NOTE [model registry]
    m.vae_halo_channels = 3040.75;
    m.vae_mid_channels = 1024;
    m.sampler_history_latents = 3;  // UniPC, solver_order 2
    m.default_height = 704;
    m.default_width = 1280;
    m.default_frames = 121;
    m.default_steps = 50;
    m.default_guidance = 5.0;
    m.max_steps = 1000;
    m.max_pixels = 1280LL * 704;
    m.max_frames = 161;
    m.max_tokens = m.tokens(704, 1280, m.max_frames);
    v.push_back(m);
  }
  {
    ModelArch m;
    m.name = "wan2.1-1.3b";
    m.pipeline = "wan";
    m.alias = "wan2.1";  // the name gfdit.models.load and gfdit serve take
    m.is_video = true;
    m.num_layers = 30;
    m.hidden = 1536;
    m.heads = 12;
    m.head_dim = 128;
    m.ffn = 8960;
    m.transformer_params = 1.39e9;  // 30 x (8 x 1536^2 + 2 x 1536 x 8960)
    m.text_hidden = 4096;
    m.text_tokens = 512;
    m.text_encoder_params = 4.6e9;
    m.vae_stride_t = 4;
    m.vae_stride_s = 8;
    m.latent_channels = 16;
    m.patch_t = 1;
    m.patch_s = 2;
    m.vae_decode_flops_per_pixel = 8.3e6;  // estimate, see NOTE [model registry]
    m.vae_decoder_convs = 33;              // the Wan 2.1 VAE
    m.vae_halo_channels = 2064.5;
    m.vae_mid_channels = 384;
    m.sampler_history_latents = 3;  // UniPC, solver_order 2
    m.default_height = 480;
    m.default_width = 832;
    m.default_frames = 81;
    m.default_steps = 50;
    m.default_guidance = 5.0;
    m.max_steps = 1000;
    m.max_pixels = 1280LL * 720;
    m.max_frames = 161;
    m.max_tokens = m.tokens(720, 1280, m.max_frames);
    v.push_back(m);
  }
  {
    // python/gfdit/models/tiny.py WAN_CONFIG, wan_pipeline.py TINY_DEFAULTS / TINY_VAE (and its tiny UMT5).
    ModelArch m;
    m.name = "tiny-wan";
    m.pipeline = "wan";
    m.is_video = true;
    m.num_layers = 2;
    m.hidden = 64;
    m.heads = 4;
    m.head_dim = 16;
    m.ffn = 96;
    m.transformer_params = 132240;
    m.text_hidden = 24;
    m.text_tokens = 16;
    m.text_encoder_params = 12072;
    m.vae_stride_t = 4;
    m.vae_stride_s = 8;
    m.latent_channels = 4;
    m.patch_t = 1;
    m.patch_s = 2;
    m.vae_decode_flops_per_pixel = 1.0e5;  // estimate: base_dim 8
    m.vae_decoder_convs = 25;              // TINY_VAE: one residual block per stage
    m.vae_halo_channels = 68.625;
    m.vae_mid_channels = 8;
    m.default_height = 32;
    m.default_width = 48;
    m.default_frames = 9;
    m.default_steps = 4;
    m.default_guidance = 4.0;
    m.max_steps = 200;
    m.max_pixels = 256 * 256;
    m.max_frames = 33;
    m.max_tokens = m.tokens(256, 256, m.max_frames);
    v.push_back(m);
  }
  {
    // python/gfdit/models/tiny.py QWEN_IMAGE_CONFIG, qwen_pipeline.py TINY_DEFAULTS / TINY_VAE.
    ModelArch m;
    m.name = "tiny-qwen-image";
    m.pipeline = "qwen-image";
    m.joint_attention = true;
    m.num_layers = 2;
    m.hidden = 64;
    m.heads = 4;
    m.head_dim = 16;
    m.ffn = 4 * 64;
    m.transformer_params = 331560;
    m.text_hidden = 24;
    m.text_tokens = 64;
    m.text_encoder_params = 45024;
    m.vae_stride_t = 1;
    m.vae_stride_s = 8;
    m.latent_channels = 4;
    m.patch_t = 1;
    m.patch_s = 2;
    m.vae_decode_flops_per_pixel = 1.0e5;  // estimate: base_dim 8
    m.vae_decoder_convs = 25;              // TINY_VAE
    m.vae_halo_channels = 79.5;            // one frame
    m.vae_mid_channels = 8;
    m.default_height = 48;
    m.default_width = 80;
    m.default_frames = 1;
    m.default_steps = 4;
    m.default_guidance = 4.0;
    m.max_steps = 200;
    m.max_pixels = 256 * 256;
    m.max_frames = 1;
    m.max_tokens = m.tokens(256, 256, 1);
    v.push_back(m);
  }
  return v;
}

const std::vector<ModelArch>& models() {
  static const std::vector<ModelArch> v = makeModels();
  return v;
}

// Bytes of physical memory of this machine (0 where the system does not say).
double physicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

// NOTE [hardware figures]
// Peak rates are datasheet dense bf16 and HBM bandwidth (the GPU table of docs/architecture.md, The cost
// model: NVIDIA H20, A100 SXM, H100 SXM, H200 SXM product briefs). NVLink figures there are bidirectional
// aggregates; a rank sends at half of it.
// Across nodes: one 400 Gb/s NIC per GPU, ~50 GB/s per direction. The efficiency factors, the collective
// latency and the per-block overhead are fitted (docs/cost_calibration.md): H20 to GF-DiT's Qwen-Image
// per-step table, H100 to SGLang Diffusion's H100 CI baselines; A100 and H200 take H100's factors (no
// published per-step figure was found for them). On the H200 a bf16 8192^3 matmul reached ~790 TFLOP/s
// (0.8 of peak), so matmul_efficiency is a ceiling that large GEMMs approach, not what a whole step gets.
// Memory per GPU (mem_bytes) is the datasheet's HBM size. Host work (layer_overhead_s, peer_host_s) overlaps
// device work on a GPU (async_launch); the H20's was fitted with the rest of its factors.
std::vector<Hardware> makeHardware() {
  std::vector<Hardware> v;
  auto gpu = [](const char* name, double flops, double mem, double nvlink_bidir, double mem_bytes) {
    Hardware h;
    h.name = name;
    h.peak_flops = flops;
    h.mem_bw = mem;
    h.mem_bytes = mem_bytes;
    h.link_bw = nvlink_bidir / 2;
    h.inter_node_bw = 50e9;
    h.collective_latency_s = 30e-6;
    h.inter_node_latency_s = 60e-6;
    h.matmul_efficiency = 0.65;
    h.attention_efficiency = 0.5;
    h.half_efficiency_tokens = 256;
    h.regroup_s = 1e-6;
    h.ranks_per_node = 8;
    h.conv_efficiency = 0.1;  // fitted to SGLang's Wan 2.1 1.3B decode on H100 (see docs)
    h.layer_overhead_s = 50e-6;
    h.dtype_bytes = 2;
    h.async_launch = true;
    // fitted to SGLang's two-rank Wan 2.1 decode on the H200 (docs/cost_calibration.md, "Decode by degree"): the
    // host-side machinery of a split decode, the same software on every GPU here, so all of them take it
    h.conv_layer_overhead_s = 0.63e-3;
    return h;
  };
  Hardware h20 = gpu("h20", 148e12, 4.0e12, 900e9, 96e9);
  // fitted to GF-DiT's nine points (docs/cost_calibration.md): a vLLM-Omni step in eager mode is host-bound
  // for small images (the host's work per block exceeds the GPU's), see NOTE [analytic step model]
  h20.matmul_efficiency = 0.81;
  h20.attention_efficiency = 0.84;
  h20.half_efficiency_tokens = 256;
  h20.peer_latency_s = 26e-6;      // device side: per peer of an all-to-all
  h20.peer_host_s = 23e-6;         // host side: per peer of an all-to-all
  h20.layer_overhead_s = 2.59e-3;  // host side: one block's launches and Python
  // H100 (and A100, H200, for want of their own figures): matmul at 0.8 of peak as measured on the H200
  // (same die), attention and the per-block overhead fitted to SGLang Diffusion's H100 one-GPU baselines, the
  // per-peer latency to its two-GPU step.
  auto hopperFit = [](Hardware h) {
    h.matmul_efficiency = 0.8;
    h.attention_efficiency = 0.33;
    h.half_efficiency_tokens = 256;
    h.peer_latency_s = 77e-6;
    h.peer_host_s = 23e-6;  // not constrained by the H100 figures (its steps are device-bound): the H20's
    h.layer_overhead_s = 10e-6;
    return h;
  };
  Hardware a100 = hopperFit(gpu("a100", 312e12, 2.0e12, 600e9, 80e9));
  Hardware h100 = hopperFit(gpu("h100", 989e12, 3.35e12, 900e9, 80e9));
  Hardware h200 = hopperFit(gpu("h200", 989e12, 4.8e12, 900e9, 141e9));
  v.push_back(h20);
  v.push_back(a100);
  v.push_back(h100);
  v.push_back(h200);

  // NOTE [cpu hardware]
  // This machine, not measured at run time but for its core count and memory size: one core's float32 peak
  // from a rough AVX2 figure (2 FMA units x 8 lanes x 2 FLOP x ~2.5 GHz = 80 GFLOP/s), ~10 GB/s of memory
  // bandwidth per core, shared-memory copies between ranks at ~5 GB/s, ~20 us per collective. Ranks time-share
  // num_cores cores (see NOTE [cpu contention]); PyTorch eager on tiny shapes is dominated by per-op host cost,
  // hence layer_overhead_s. The efficiencies were set once so that tiny-wan's step and decode at 32x48x9 ..
  // 128x128x33 land within ~2x of a single-thread run on a 2-core development machine (order of magnitude only:
  // use a profile on a CPU); peer_host_s and conv_layer_overhead_s were never set against a CPU and stay 0.
  Hardware cpu;
  cpu.name = "cpu";
  cpu.peak_flops = 80e9;
  cpu.mem_bw = 10e9;
  cpu.link_bw = 5e9;
  cpu.inter_node_bw = 5e9;
  cpu.collective_latency_s = 20e-6;
  cpu.inter_node_latency_s = 20e-6;
  cpu.matmul_efficiency = 0.5;
  cpu.attention_efficiency = 0.3;
  cpu.half_efficiency_tokens = 32;
  cpu.regroup_s = 1e-6;
  cpu.ranks_per_node = 0;  // one node: set from the cluster's rank count
  cpu.num_cores = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  cpu.conv_efficiency = 0.3;
  cpu.layer_overhead_s = 1.2e-3;
  cpu.dtype_bytes = 4;
  cpu.async_launch = false;               // eager PyTorch on a CPU runs each kernel in the calling thread
  cpu.mem_bytes = physicalMemoryBytes();  // shared by the ranks: cluster() gives each its share
  v.push_back(cpu);
  return v;
}

const std::vector<Hardware>& hardwareList() {
  static const std::vector<Hardware> v = makeHardware();
  return v;
}

}  // namespace

const char* stageName(Stage s) {
  switch (s) {
    case Stage::kEncode: return "encode";
    case Stage::kDenoise: return "denoise";
    case Stage::kMigrate: return "migrate";
    case Stage::kDecode: return "decode";
    case Stage::kGather: return "gather";
  }
  return "unknown";
}

Stage stageFromName(const std::string& name) {
  return fromName(name, "stage", {Stage::kEncode, Stage::kDenoise, Stage::kMigrate, Stage::kDecode, Stage::kGather},
                  stageName);
}

// NOTE [published skip rates]
// How often a pass past its warm-up reuses a step cache, where a publication lets us derive it:
// - qwen-image, fbcache: cache-dit's H100 table (docs/benchmark/NVIDIA_GPU.md: Qwen-Image, 50 steps, Ulysses 2
//   with FA3) goes from 12.75 s to 5.67 s with `cache_dit.generate --cache`, whose defaults are F1B0, threshold
//   0.12, 8 warm-up steps, at most 3 cached steps in a row. Taking about 0.5 s of that for the text encoder and
//   the VAE and 1/60 of a step plus the decision for a cached step (one block of 60), the 42 steps past the
//   warm-up ran 71% of their passes from the cache; with at most 3 in a row that is a probability of about 0.9
//   per pass (cachedShare). One point: (0.12, 0.9), linear to 0 below it.
// No figure of the same algorithm exists for the Wan models: TeaCache4Wan2.1's speedups use its polynomial of the
// timestep embedding, not gfdit's metric, and cache-dit publishes no Wan timings. The tiny models have none
// either; `gfdit profile` measures a model's own curves (Profile::skip_curves), which take precedence.
SkipCurve publishedSkipCurve(const std::string& model, CacheKind kind) {
  SkipCurve c;
  c.kind = kind;
  if (kind == CacheKind::kFbCache && (model == "qwen-image")) {
    c.points = {{0.12, 0.9}};
    c.source = "derived from cache-dit's Qwen-Image H100 timings (NOTE [published skip rates])";
  }
  return c;
}

SkipCurve CostModel::skipCurve(CacheKind kind) const { return publishedSkipCurve(model().name, kind); }

namespace {

class WithSkipCurves : public CostModel {
 public:
  WithSkipCurves(std::shared_ptr<const CostModel> base, std::vector<SkipCurve> curves)
      : base_(std::move(base)), curves_(std::move(curves)) {
    GFDIT_CHECK(base_ != nullptr) << "withSkipCurves needs a cost model";
  }
  double seconds(Stage stage, const StageQuery& q) const override { return base_->seconds(stage, q); }
  std::string describe() const override { return base_->describe() + " with other skip curves"; }
  const ModelArch& model() const override { return base_->model(); }
  int32_t sharedCores() const override { return base_->sharedCores(); }
  int32_t maxBatch(const StageQuery& q) const override { return base_->maxBatch(q); }
  SkipCurve skipCurve(CacheKind kind) const override {
    for (const SkipCurve& c : curves_) {
      if (c.kind == kind) return c;
    }
    return base_->skipCurve(kind);
  }

 private:
  std::shared_ptr<const CostModel> base_;
  std::vector<SkipCurve> curves_;
};

}  // namespace

std::shared_ptr<CostModel> withSkipCurves(std::shared_ptr<const CostModel> base, std::vector<SkipCurve> curves) {
  return std::make_shared<WithSkipCurves>(std::move(base), std::move(curves));
}

double cachedStepFraction(const ModelArch& model, CacheKind kind) {
  if (kind == CacheKind::kNone || model.num_layers <= 0) return 1.0;
  const double blocks = kind == CacheKind::kFbCache ? 1.0 : 0.0;
  return std::min(1.0, (blocks + 1.0) / model.num_layers);
}

double stateBytes(const ModelArch& model, const RequestShape& s, int32_t dtype_bytes) {
  const double frames = model.is_video ? (s.num_frames - 1) / std::max(1, model.vae_stride_t) + 1 : 1;
  const double latent = static_cast<double>(model.latent_channels) * frames * (s.height / model.vae_stride_s) *
                        (s.width / model.vae_stride_s) * 4.0;
  const double embeds = (s.guidance() ? 2.0 : 1.0) * model.text_tokens * model.text_hidden * dtype_bytes;
  const double schedule = (std::max(s.num_steps, 1) + 1) * 2.0 * 4.0;
  return latent * (1 + model.sampler_history_latents) + embeds + schedule;
}

double cacheBytes(const ModelArch& model, const RequestShape& shape, int32_t dtype_bytes) {
  if (!shape.cache.on()) return 0;
  const int64_t tokens = shape.tokens > 0 ? shape.tokens : model.tokens(shape.height, shape.width, shape.num_frames);
  return (shape.guidance() ? 2.0 : 1.0) * 2.0 * static_cast<double>(tokens) * model.hidden * dtype_bytes;
}

}  // namespace cost

const char* layoutModeName(LayoutMode m) {
  switch (m) {
    case LayoutMode::kUsp: return "usp";
    case LayoutMode::kTorus: return "torus";
  }
  return "unknown";
}

LayoutMode layoutModeFromName(const std::string& name) {
  return cost::fromName(name, "mode", {LayoutMode::kUsp, LayoutMode::kTorus}, layoutModeName);
}

const char* placementName(Placement p) {
  switch (p) {
    case Placement::kAuto: return "auto";
    case Placement::kUlyssesLow: return "ulysses-low";
    case Placement::kRingLow: return "ring-low";
  }
  return "unknown";
}

Placement placementFromName(const std::string& name) {
  return cost::fromName(name, "placement", {Placement::kAuto, Placement::kUlyssesLow, Placement::kRingLow},
                        placementName);
}

namespace cost {

int64_t ModelArch::tokens(int32_t height, int32_t width, int32_t num_frames) const {
  GFDIT_CHECK(height > 0 && width > 0 && num_frames > 0)
      << name << ": height, width and num_frames must be positive, got " << height << "x" << width << "x" << num_frames;
  const int64_t latent_frames = is_video ? (num_frames - 1) / vae_stride_t + 1 : 1;
  const int64_t cell = static_cast<int64_t>(vae_stride_s) * patch_s;
  return (latent_frames / patch_t) * (height / cell) * (width / cell);
}

const ModelArch& modelArch(const std::string& name) {
  for (const ModelArch& m : models()) {
    if (m.name == name || (!m.alias.empty() && m.alias == name)) return m;
  }
  GFDIT_THROW(kInvalidUsage) << "unknown model '" << name << "'; valid models: " << joinNames(modelNames());
  return models().front();  // unreachable
}

std::vector<std::string> modelNames() {
  std::vector<std::string> names;
  for (const ModelArch& m : models()) names.push_back(m.name);
  return names;
}

std::vector<std::string> loadableModelNames() {
  std::vector<std::string> names;
  for (const ModelArch& m : models()) {
    if (!m.pipeline.empty()) names.push_back(m.alias.empty() ? m.name : m.alias);
  }
  return names;
}

const Hardware& hardware(const std::string& name) {
  for (const Hardware& h : hardwareList()) {
    if (h.name == name) return h;
  }
  GFDIT_THROW(kInvalidUsage) << "unknown hardware '" << name << "'; valid hardware: " << joinNames(hardwareNames());
  return hardwareList().front();  // unreachable
}

std::vector<std::string> hardwareNames() {
  std::vector<std::string> names;
  for (const Hardware& h : hardwareList()) names.push_back(h.name);
  return names;
}

std::vector<std::string> clusterNames() { return {"h20x8", "a100x8", "h100x8", "h200x8", "h20x16", "cpu"}; }

Cluster cluster(const std::string& name, int32_t num_ranks) {
  GFDIT_CHECK(num_ranks >= 0) << "cluster '" << name << "': num_ranks must be >= 0, got " << num_ranks;
  Cluster c;
  c.name = name;
  if (name == "cpu") {
    c.hw = hardware("cpu");
    c.num_ranks = num_ranks > 0 ? num_ranks : c.hw.num_cores;
    c.ranks_per_node = c.num_ranks;  // one node
    c.hw.ranks_per_node = c.num_ranks;
    c.hw.mem_bytes /= c.num_ranks;
    return c;
  }
  const size_t x = name.rfind('x');
  const std::vector<std::string> valid = clusterNames();
  if (x == std::string::npos || std::find(valid.begin(), valid.end(), name) == valid.end()) {
    GFDIT_THROW(kInvalidUsage) << "unknown cluster '" << name << "'; valid clusters: " << joinNames(valid);
  }
  c.hw = hardware(name.substr(0, x));
  c.ranks_per_node = c.hw.ranks_per_node;
  c.num_ranks = num_ranks > 0 ? num_ranks : std::stoi(name.substr(x + 1));
  return c;
}

// NOTE [inter-node calibration]
// The analytic model prices what crosses nodes with two terms of its hardware (NOTE [hardware figures]):
// inter_node_bw, the bytes per second one rank moves across per direction while the layout's collectives cross
// at once, and inter_node_latency_s, the fixed cost of one collective that crosses. Datasheets give neither for a
// cluster at hand (a NIC's line rate says nothing about how many ranks share it or what a collective costs on
// top of the wire), so `gfdit profile --network` measures them with the world's own collectives
// (LinkMeasurement). Two uses:
// - calibratedCluster: the cluster measured. Each term is fitted to one measured quantity:
//   - inter_node_bw = concurrent_bytes_per_s / ranks_per_node: every rank of a node sending to its counterpart
//     on the other node at once is what a layout's all-to-alls and ring rounds across nodes do, so each rank's
//     share of that total is the per-rank rate the step model divides by. It is the stream rate where every
//     rank has a link of its own, and a fraction of it where the ranks share one (the emulated cluster's one
//     veth per node);
//   - inter_node_latency_s = collective_s: a collective of two members on two nodes that moves almost nothing
//     (4 bytes each way) costs that fixed time, the link's round trip and the protocol's work on both ends
//     included.
//   The ranks per node follow the world measured, so num_nodes and the placement of Ulysses and Ring are the
//   measured ones. The round trip and the single stream stay in the profile as the link's own figures; the fit
//   does not use them.
// - transferredCluster: another cluster, whose wire was not measured (experiment (b)'s datasheet h20x16). Only
//   what belongs to the transport and not to the wire carries over, as a ratio of measured to assumed:
//   - bandwidth: the model assumes that the ranks of a node together move the line rate (a NIC's datasheet
//     rate). The measured share, concurrent_bytes_per_s / line_bytes_per_s (framing, TCP, ranks contending for
//     one link), multiplies inter_node_bw;
//   - latency: the model assumes a ratio of inter_node_latency_s to collective_latency_s (2 on the GPUs: 60 us
//     over 30 us). The measured ratio collective_s / intra_collective_s replaces it, so inter_node_latency_s =
//     collective_latency_s x that ratio, and not below 1: a collective that crosses nodes does not cost less
//     than one that stays, and a smaller measurement is the noise of a shared machine.
//   The line rate is the owner's statement (`gfdit profile --network --line-rate`), not a measurement; a link
//   measured without one, or without the intra-node collective, cannot be transferred.
// With several pairs of nodes the worst figure of each kind is taken (a layout waits for its slowest member).
namespace {

void checkLink(const LinkMeasurement& l, size_t i) {
  GFDIT_CHECK(l.ranks_per_node >= 1 && l.concurrent_bytes_per_s > 0 && l.collective_s > 0 &&
              std::isfinite(l.concurrent_bytes_per_s) && std::isfinite(l.collective_s))
      << "link " << i << " (nodes " << l.node_a << "-" << l.node_b
      << "): calibrating needs ranks_per_node >= 1 and positive concurrent_bytes_per_s and collective_s, got "
      << l.ranks_per_node << ", " << l.concurrent_bytes_per_s << ", " << l.collective_s;
}

}  // namespace

Cluster calibratedCluster(const Cluster& cluster, const std::vector<LinkMeasurement>& links) {
  if (links.empty()) return cluster;
  Cluster c = cluster;
  double bw = 0;
  double latency = 0;
  int32_t per_node = 0;
  for (size_t i = 0; i < links.size(); ++i) {
    const LinkMeasurement& l = links[i];
    checkLink(l, i);
    GFDIT_CHECK(per_node == 0 || per_node == l.ranks_per_node)
        << "links measured with " << per_node << " and " << l.ranks_per_node << " ranks per node";
    per_node = l.ranks_per_node;
    const double share = l.concurrent_bytes_per_s / l.ranks_per_node;
    bw = i == 0 ? share : std::min(bw, share);
    latency = std::max(latency, l.collective_s);
  }
  c.hw.inter_node_bw = bw;
  c.hw.inter_node_latency_s = latency;
  c.ranks_per_node = per_node;
  c.hw.ranks_per_node = per_node;
  c.name = cluster.name + " (links measured)";
  return c;
}

Cluster transferredCluster(const Cluster& cluster, const std::vector<LinkMeasurement>& links) {
  if (links.empty()) return cluster;
  double bw_share = 0;
  double latency_ratio = 1;
  for (size_t i = 0; i < links.size(); ++i) {
    const LinkMeasurement& l = links[i];
    checkLink(l, i);
    GFDIT_CHECK(l.line_bytes_per_s > 0 && std::isfinite(l.line_bytes_per_s) && l.intra_collective_s > 0 &&
                std::isfinite(l.intra_collective_s))
        << "link " << i << " (nodes " << l.node_a << "-" << l.node_b
        << "): transferring needs its line rate and an intra-node collective, got line_bytes_per_s "
        << l.line_bytes_per_s << " and intra_collective_s " << l.intra_collective_s;
    const double share = l.concurrent_bytes_per_s / l.line_bytes_per_s;
    bw_share = i == 0 ? share : std::min(bw_share, share);
    latency_ratio = std::max(latency_ratio, l.collective_s / l.intra_collective_s);
  }
  Cluster c = cluster;
  const Hardware& hw = cluster.hw;
  c.hw.inter_node_bw = (hw.inter_node_bw > 0 ? hw.inter_node_bw : hw.link_bw) * bw_share;
  c.hw.inter_node_latency_s = hw.collective_latency_s * latency_ratio;
  c.name = cluster.name + " (inter-node terms scaled by measured links)";
  return c;
}

namespace {

// NOTE [analytic step model]
// One transformer pass, per rank of a sequence-parallel group of p = ulysses x ring ranks, each rank holding
// n = N / p of the N image tokens (T text tokens) of each of the b requests of a batch (StageQuery::batch):
// - Linear layers: 2 FLOPs per weight per token. Wan: self-attention q, k, v, out (4 H^2), cross-attention q
//   and out on the image tokens (2 H^2) and k, v on the text tokens (2 H^2 x T, computed by every rank: the
//   text is replicated), FFN (2 H F). Qwen-Image (MMDiT): the image stream (4 H^2 + 2 H F per token) on n
//   tokens and the text stream (same weights' shape) on all T text tokens on every rank.
// - Attention: 4 L^2 H FLOPs for L tokens (QK^T and PV). Each rank computes its Ulysses member's heads for
//   its ring shard of the queries: 4 L^2 H_u / r with H_u = ceil(heads / u) x head_dim. The heads split
//   evenly when u divides them; otherwise members get floor or ceil shares and the pass waits for the
//   largest, so an uneven split costs like its largest member. Wan: L = N self-attention plus 4 n T H for
//   cross-attention; Qwen-Image: joint attention over L = N + T. Each request of a batch attends to itself.
// - Compute runs at peak x efficiency x m / (m + half_efficiency_tokens) for the m rows a GEMM sees (b x (n +
//   T) for the linear layers, b x n for attention): small per-rank shapes leave the GPU underused, and a
//   batch of small requests fills it better. Matmuls and attention have separate ceilings.
// - Weights: each pass reads every weight once, for the whole batch; a linear layer takes max(its compute,
//   its weight reads) (roofline: small shapes are memory bound). Activations: ~kActivationPasses
//   reads/writes of b x n x H elements per block (norms, modulation, RoPE, residuals, activation functions).
// - Ulysses: 4 all-to-alls per block (q, k, v in, the output back), each moving b x n x H_u elements per peer
//   (the largest member's share), (u - 1) peers; a per-collective latency plus bytes over the slowest link
//   used (NVLink inside a node, the NIC across nodes) plus peer_latency_s per peer (NCCL's all-to-all is one
//   send/recv pair per peer, so small all-to-alls get slower with the group; an off-node peer costs that
//   times the ratio of the inter-node to the intra-node latency). MMDiT text tokens are head-split
//   locally, not exchanged. A batch moves b times the bytes in the same collectives.
// - Ring: r - 1 rounds passing K and V blocks (b x N / r tokens x H_u), overlapped with attention compute:
//   the attention takes max(compute, rotation).
// - Torus: the inter-node all-to-all is chunked and pipelined against ring compute: the attention takes
//   max(compute, all-to-all + rotation) plus one chunk of all-to-all that cannot overlap (pipeline fill).
// - Host work per block, once for a batch: layer_overhead_s (an eager step's launches and Python) plus
//   peer_host_s per all-to-all peer and per ring round (the calls and the reshuffles around them). With
//   asynchronous launches (a GPU, Hardware::async_launch) the host queues kernels while the device runs
//   earlier ones, so a block takes the larger of its host and its device work: a small image is host-bound,
//   its host work grows with the group while its device work shrinks, so more ranks make its step slower
//   (GF-DiT's 512 px points), while a large image stays device-bound and scales. On a CPU the two add.
// - After the last block the output tokens are all-gathered (b x N x patch volume x channels, float32).
// A step (Layout::cfg):
// - cfg = 1: one pass without guidance; with guidance two passes (conditional, unconditional) one after the
//   other on the whole group (p = degree), so the step doubles.
// - cfg = 2 (CFG-parallel, guidance only): the two halves of the group (p = degree / 2 each) run one pass
//   each at the same time, so the step is one pass on degree / 2 ranks plus one exchange: member i of each
//   half swaps its prediction (the velocity, latent-sized, float32) with member i of the other, one
//   collective latency plus those bytes over the link between them (the NIC when the group spans nodes:
//   halves of a group on two nodes sit one on each). A half spans ceil(nodes / 2) of the group's nodes.
// Ranks time-share cores on a CPU (NOTE [cpu contention]): the whole group runs at once either way.
constexpr double kActivationPasses = 20.0;
constexpr double kTorusChunks = 4.0;

// NOTE [decode by degree]
// The VAE decoder on one rank takes its FLOPs (vae_decode_flops_per_pixel x pixels) over the convolution
// rate. On a group of d ranks it runs patch-parallel over the latent's height (each member decodes its
// latent rows, at least one each), as SGLang, vLLM-Omni and xDiT's DistVAE do:
// - its convolutions take 1 / d of the one-rank time, except the mid-block attention (global over each
//   frame's latent positions: its input is all-gathered per latent frame and every member runs it whole,
//   4 L^2 C + 8 L C^2 FLOPs for L latent positions of C = vae_mid_channels, at the attention rate);
// - every 3x3 convolution (vae_decoder_convs of them, run once per latent frame: the causal decoder takes one
//   latent frame at a time) first exchanges one halo row with each neighbour (one above, one below): a
//   collective latency plus peer_latency_s per neighbour plus the rows (vae_halo_channels x width x frames x
//   element bytes per neighbour, over the slowest link) plus conv_layer_overhead_s, the fixed host-side
//   machinery of the split layer (slicing, padding, the send/recv's synchronisation), which does not shrink
//   with the degree;
// - the output (frames x height x width x 3 elements) is gathered to the first member.
// A one-rank decode runs none of that, so degree 1 is the plain FLOP count. Its launches hide behind its
// convolutions (a one-rank decode's time is linear in pixels x frames at a fixed launch count: mold #802),
// so they are not charged on their own. Ranks sharing cores (a CPU) divide the cores (NOTE [cpu contention]).
// A batch of b decodes runs them one after another: b times one, since the decoder is compute-bound and
// batching it gains nothing (mold #802 measured both and reverted them).

struct Links {
  double bw;
  double latency;
};

class AnalyticCostModel : public CostModel {
 public:
  AnalyticCostModel(const ModelArch& model, const Cluster& cluster) : model_(model), cluster_(cluster) {
    GFDIT_CHECK(cluster_.num_ranks > 0) << "cluster '" << cluster_.name << "' has no ranks";
    GFDIT_CHECK(cluster_.hw.peak_flops > 0 && cluster_.hw.mem_bw > 0 && cluster_.hw.link_bw > 0)
        << "hardware '" << cluster_.hw.name << "' needs positive peak_flops, mem_bw and link_bw";
  }

  double seconds(Stage stage, const StageQuery& q) const override {
    check(stage, q);
    const int64_t tokens =
        q.shape.tokens > 0 ? q.shape.tokens : model_.tokens(q.shape.height, q.shape.width, q.shape.num_frames);
    switch (stage) {
      case Stage::kEncode: return q.batch * encode(q) * contention(q.degree);
      case Stage::kDenoise: return step(q, tokens) * contention(q.degree);
      case Stage::kMigrate: return q.num_new > 0 ? migrate(q) * contention(q.num_new + 1) : 0.0;
      case Stage::kDecode: return q.batch * decode(q);
      case Stage::kGather: return gather(q) * contention(q.degree);
    }
    return 0.0;
  }

  std::string describe() const override {
    std::ostringstream os;
    os << "analytic " << model_.name << " on " << cluster_.name << " (" << cluster_.num_ranks << " x "
       << cluster_.hw.name << ")";
    return os.str();
  }

  const ModelArch& model() const override { return model_; }
  int32_t sharedCores() const override { return cluster_.hw.num_cores; }
  int32_t maxBatch(const StageQuery& q) const override {
    // no memory size (a CPU): nothing but the message's limit
    if (cluster_.hw.mem_bytes <= 0) return kMaxBatch;
    return std::max(1, std::min(kMaxBatch, cost::maxBatch(model_, cluster_.hw, q)));
  }

 private:
  void check(Stage stage, const StageQuery& q) const {
    GFDIT_CHECK(q.degree >= 1) << "degree must be >= 1, got " << q.degree;
    GFDIT_CHECK(q.degree <= cluster_.num_ranks)
        << "a group of " << q.degree << " ranks does not fit cluster " << cluster_.name << " of " << cluster_.num_ranks;
    GFDIT_CHECK(q.num_nodes >= 1 && q.num_nodes <= q.degree)
        << "num_nodes must be in [1, degree " << q.degree << "], got " << q.num_nodes;
    GFDIT_CHECK(q.num_new >= 0) << "num_new must be >= 0, got " << q.num_new;
    GFDIT_CHECK(q.batch >= 1) << "batch must be >= 1, got " << q.batch;
    if (stage == Stage::kDenoise) {
      GFDIT_CHECK(q.layout.cfg == 1 || q.layout.cfg == 2) << "cfg must be 1 or 2, got " << q.layout.cfg;
      GFDIT_CHECK(q.layout.ulysses >= 1 && q.layout.ring >= 1 && q.layout.degree() == q.degree)
          << "layout " << q.layout.ulysses << " x " << q.layout.ring
          << (q.layout.cfg != 1 ? " x cfg " + std::to_string(q.layout.cfg) : std::string()) << " does not match degree "
          << q.degree;
      GFDIT_CHECK(q.layout.ulysses <= model_.heads)
          << model_.name << ": ulysses " << q.layout.ulysses << " exceeds the " << model_.heads << " heads";
      GFDIT_CHECK(q.layout.mode == LayoutMode::kUsp || q.layout.mode == LayoutMode::kTorus)
          << "mode must be usp or torus, got " << static_cast<int32_t>(q.layout.mode);
      GFDIT_CHECK(q.layout.cfg == 1 || q.shape.guidance())
          << "cfg 2 (CFG-parallel) needs guidance (guidance_scale > 1), got " << q.shape.guidance_scale;
    }
    if (stage == Stage::kDecode) {
      const int32_t rows = q.shape.height / model_.vae_stride_s;
      GFDIT_CHECK(q.degree <= std::max(rows, 1))
          << model_.name << ": a decode on " << q.degree << " ranks needs a latent row per member, but "
          << q.shape.height << " px high has " << rows;
    }
  }

  // NOTE [cpu contention]
  // Ranks that outnumber the cores time-share them, so a stage on d ranks takes d / num_cores times longer
  // than with a core each. The result is the stage's time when it runs alone.
  double contention(int32_t ranks) const {
    const int32_t cores = cluster_.hw.num_cores;
    return cores > 0 && ranks > cores ? static_cast<double>(ranks) / cores : 1.0;
  }

  double saturation(double tokens) const {
    const double h = cluster_.hw.half_efficiency_tokens;
    return h > 0 ? tokens / (tokens + h) : 1.0;
  }

  Links intraNode() const { return {cluster_.hw.link_bw, cluster_.hw.collective_latency_s}; }
  Links interNode() const {
    const Hardware& hw = cluster_.hw;
    return {hw.inter_node_bw > 0 ? hw.inter_node_bw : hw.link_bw,
            hw.inter_node_latency_s > 0 ? hw.inter_node_latency_s : hw.collective_latency_s};
  }
  // What one send/recv pair with a peer adds to a collective; an off-node peer costs the NIC's latency
  // relative to NVLink's (when NVLink has one).
  double peerLatency(bool off_node) const {
    const double p = cluster_.hw.peer_latency_s;
    const double in = intraNode().latency;
    return off_node && in > 0 ? p * interNode().latency / in : p;
  }

  double matmulRate(double tokens) const {
    const Hardware& hw = cluster_.hw;
    return hw.peak_flops * hw.matmul_efficiency * saturation(tokens);
  }

  // One step: one or two passes, or CFG-parallel's one pass per half plus the exchange; see NOTE [analytic
  // step model].
  double step(const StageQuery& q, int64_t tokens) const {
    if (q.layout.cfg == 2) {
      const int32_t half_degree = q.degree / 2;
      const int32_t half_nodes = std::min(half_degree, (q.num_nodes + 1) / 2);
      const Links l = q.num_nodes > 1 ? interNode() : intraNode();
      return pass(q.layout, tokens, half_degree, half_nodes, q.batch, q.cached) + l.latency +
             q.batch * outputBytes(tokens) / l.bw;
    }
    return (q.shape.guidance() ? 2.0 : 1.0) * pass(q.layout, tokens, q.degree, q.num_nodes, q.batch, q.cached);
  }

  // The transformer's output (the velocity), float32: what the output all-gather and CFG's exchange move.
  double outputBytes(int64_t tokens) const {
    return static_cast<double>(tokens) * model_.patch_t * model_.patch_s * model_.patch_s * model_.latent_channels *
           4.0;
  }

  // One pass of the transformer over `batch` requests on one rank of `d` = layout.ulysses x layout.ring ranks
  // over `nodes` nodes.
  // `cached`: a pass that reuses that step cache (NOTE [step caches]): it runs the first block (fbcache) or none
  // (teacache), and its decision: the change metric (a few reads of the shard's hidden states), one all-reduce
  // of two numbers over the pass's members, and one block's host work for the rest of the pass's machinery.
  double pass(const Layout& layout, int64_t tokens, int32_t d, int32_t nodes, int32_t batch,
              CacheKind cached = CacheKind::kNone) const {
    const Hardware& hw = cluster_.hw;
    const double N = static_cast<double>(tokens);
    const double T = model_.text_tokens;
    const double H = model_.hidden;
    const double F = model_.ffn;
    const double db = hw.dtype_bytes;
    const double b = batch;
    const int32_t u = layout.ulysses;
    const int32_t r = layout.ring;
    const double n = N / d;
    // the heads of the largest Ulysses member (an uneven split waits for it)
    const double H_u = static_cast<double>((model_.heads + u - 1) / u) * model_.head_dim;

    // Compute per block; the saturation follows the rows the block's GEMMs see (image and text tokens).
    double t_linear = 0;
    double attention = 0;
    double act_tokens = b * n;
    if (model_.joint_attention) {
      const double per_token = 2.0 * (4 * H * H + 2 * H * F);
      t_linear = per_token * b * (n + T) / matmulRate(b * (n + T));
      attention = b * 4.0 * (N + T) * (N + T) * H_u / r;
      act_tokens = b * (n + T);
    } else {
      const double per_token = 2.0 * (6 * H * H + 2 * H * F);
      t_linear = b * (per_token * n + 2.0 * 2 * T * H * H) / matmulRate(b * (n + T));
      attention = b * (4.0 * N * N * H_u / r + 4.0 * n * T * H);
    }
    const double t_weights = model_.transformer_params * db / model_.num_layers / hw.mem_bw;
    const double t_act = kActivationPasses * act_tokens * H * db / hw.mem_bw;
    const double t_attn = attention / (hw.peak_flops * hw.attention_efficiency * saturation(b * n));

    // Which axis crosses nodes (see Layout::placement): Ulysses next to each other unless ring-low.
    const int32_t per_node = (d + nodes - 1) / nodes;
    const bool ring_low = layout.placement == Placement::kRingLow ||
                          (layout.placement == Placement::kAuto && layout.mode == LayoutMode::kTorus);
    int32_t u_on_node;  // members of a rank's Ulysses group on its own node (itself included)
    bool ring_crosses;
    if (ring_low) {
      u_on_node = std::min(u, std::max(1, per_node / r));
      ring_crosses = r > per_node;
    } else {
      u_on_node = std::min(u, per_node);
      ring_crosses = nodes > 1;
    }

    // Ulysses: one all-to-all moves b x n x H_u elements to each peer (the largest member's share).
    double t_a2a = 0;
    if (u > 1) {
      const double per_peer = b * n * H_u * db;
      const Links in = intraNode();
      const Links out = interNode();
      const int32_t off = u - u_on_node;
      const double t_in = (u_on_node - 1) * per_peer / in.bw;
      const double t_out = off * per_peer / out.bw;
      t_a2a = (off > 0 ? out.latency : in.latency) + (u_on_node - 1) * peerLatency(false) + off * peerLatency(true) +
              std::max(t_in, t_out);
    }
    // Ring: r - 1 rounds of K and V blocks.
    double t_ring = 0;
    if (r > 1) {
      const Links l = ring_crosses ? interNode() : intraNode();
      const double block = 2.0 * b * (N / r) * H_u * db;
      t_ring = (r - 1) * (l.latency + block / l.bw);
    }
    double t_block_attn;
    if (layout.mode == LayoutMode::kTorus) {
      t_block_attn = std::max(t_attn, 4 * t_a2a + t_ring) + 4 * t_a2a / kTorusChunks;
    } else {
      t_block_attn = std::max(t_attn, t_ring) + 4 * t_a2a;
    }
    const double t_device = std::max(t_linear, t_weights) + t_act + t_block_attn;
    const double t_host = hw.layer_overhead_s + (4.0 * (u - 1) + (r - 1)) * hw.peer_host_s;
    const double t_block = hw.async_launch ? std::max(t_device, t_host) : t_device + t_host;

    double t_pass = model_.num_layers * t_block;
    if (cached != CacheKind::kNone) {
      const double blocks = cached == CacheKind::kFbCache ? 1.0 : 0.0;
      const Links l = nodes > 1 ? interNode() : intraNode();
      const double metric = 3.0 * act_tokens * H * db / hw.mem_bw + (d > 1 ? l.latency : 0.0);
      t_pass = blocks * t_block + metric + hw.layer_overhead_s;
    }
    if (d > 1) {  // all-gather of the output tokens (float32)
      const Links l = nodes > 1 ? interNode() : intraNode();
      t_pass += l.latency + b * outputBytes(tokens) * (d - 1) / d / l.bw;
    }
    return t_pass;
  }

  // Text encoder on every member of the group (replicated), with the negative prompt when guidance is on.
  double encode(const StageQuery& q) const {
    const Hardware& hw = cluster_.hw;
    const double passes = q.shape.guidance() ? 2.0 : 1.0;
    const double T = model_.text_tokens;
    const double t_compute = 2.0 * model_.text_encoder_params * T / matmulRate(T);
    const double t_weights = model_.text_encoder_params * hw.dtype_bytes / hw.mem_bw;
    return passes * std::max(t_compute, t_weights);
  }

  // One VAE decode on q.degree ranks; see NOTE [decode by degree].
  double decode(const StageQuery& q) const {
    const Hardware& hw = cluster_.hw;
    const RequestShape& s = q.shape;
    const double pixels = static_cast<double>(s.height) * s.width * s.num_frames;
    const double one_rank = model_.vae_decode_flops_per_pixel * pixels / (hw.peak_flops * hw.conv_efficiency);
    const int32_t d = q.degree;
    if (d == 1) return one_rank;
    const double db = hw.dtype_bytes;
    const double chunks = static_cast<double>(latentFrames(s));
    const double L = static_cast<double>(s.height / model_.vae_stride_s) * (s.width / model_.vae_stride_s);
    const double C = model_.vae_mid_channels;
    const double attention =
        std::min(one_rank, chunks * (4.0 * L * L * C + 8.0 * L * C * C) / (hw.peak_flops * hw.attention_efficiency));
    const Links l = q.num_nodes > 1 ? interNode() : intraNode();
    const double neighbours = d > 2 ? 2.0 : 1.0;
    const double exchanges = chunks * model_.vae_decoder_convs;
    const double halo = exchanges * (l.latency + neighbours * peerLatency(q.num_nodes > 1) + hw.conv_layer_overhead_s) +
                        neighbours * model_.vae_halo_channels * s.width * s.num_frames * db / l.bw;
    const double gather_attention = chunks * (l.latency + L * C * db * (d - 1) / d / l.bw);
    const double gather_output = l.latency + pixels * 3.0 * db * (d - 1) / d / l.bw;
    return ((one_rank - attention) / d + attention + halo + gather_attention + gather_output) * contention(d);
  }

  int64_t latentFrames(const RequestShape& s) const {
    return model_.is_video ? (s.num_frames - 1) / model_.vae_stride_t + 1 : 1;
  }

  // Broadcast of the denoise state from one holder to num_new members (a pipelined tree: the bytes cross a
  // link about once, the latency is paid once per tree level), plus forming the new group. The state: the
  // latent, the sampler's history (multistep solvers keep earlier model outputs and a sample, each shaped
  // like the latent: ModelArch::sampler_history_latents), the text embeddings and the schedule; a batch's
  // states travel in the same broadcast.
  double migrate(const StageQuery& q) const {
    const Hardware& hw = cluster_.hw;
    const RequestShape& s = q.shape;
    const Links l = q.num_nodes > 1 ? interNode() : intraNode();
    const double levels = std::ceil(std::log2(static_cast<double>(q.num_new) + 1.0));
    const double state = stateBytes(model_, s, hw.dtype_bytes);
    const double cache = cacheBytes(model_, s, hw.dtype_bytes);  // gathered whole first (NOTE [cache gathers])
    return hw.regroup_s + levels * l.latency + q.batch * (state + cache) / l.bw;
  }

  // The holders' exchange of their shards of a step cache (NOTE [cache gathers] in control.cpp): an all-gather
  // of the whole cache over q.degree members, each receiving (d - 1) / d of it.
  double gather(const StageQuery& q) const {
    const double bytes = cacheBytes(model_, q.shape, cluster_.hw.dtype_bytes);
    if (bytes <= 0 || q.degree < 2) return 0.0;
    const Links l = q.num_nodes > 1 ? interNode() : intraNode();
    return l.latency + q.batch * bytes * (q.degree - 1) / q.degree / l.bw;
  }

  ModelArch model_;
  Cluster cluster_;
};

}  // namespace

std::shared_ptr<CostModel> makeAnalyticCostModel(const ModelArch& model, const Cluster& cluster) {
  return std::make_shared<AnalyticCostModel>(model, cluster);
}

int32_t bestDecodeDegree(const CostModel& cost, const RequestShape& shape, int32_t max_degree, int32_t ranks_per_node) {
  GFDIT_CHECK(max_degree >= 1) << "max_degree must be >= 1, got " << max_degree;
  GFDIT_CHECK(ranks_per_node >= 0) << "ranks_per_node must be >= 0, got " << ranks_per_node;
  const int32_t rows = std::max(1, cost.model().latentRows(shape.height));
  int32_t best = 0;
  double best_s = 0;
  std::exception_ptr one_rank_error;
  for (int32_t d = 1; d <= std::min(max_degree, rows); ++d) {
    StageQuery q;
    q.shape = shape;
    q.degree = d;
    q.num_nodes = ranks_per_node > 0 ? (d + ranks_per_node - 1) / ranks_per_node : 1;
    double s = 0;
    try {
      s = cost.seconds(Stage::kDecode, q);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidUsage) throw;
      if (d == 1) one_rank_error = std::current_exception();
      continue;
    }
    if (best == 0 || s < best_s) {
      best = d;
      best_s = s;
    }
  }
  if (best == 0) std::rethrow_exception(one_rank_error);  // every degree refused, degree 1 first
  return best;
}

// The peak of one block of an eager forward pass, per token a rank holds: the FFN's residual stream, normed
// input and inner activation before and after its nonlinearity (2 H + 2 F), or the attention's input, normed
// input, q, k, v before and after the Ulysses exchange and its output (9 H), whichever is larger. An estimate
// from the block's structure, not a measurement (docs/cost_calibration.md, "Memory").
double activationBytesPerRank(const ModelArch& model, int32_t dtype_bytes, const StageQuery& q) {
  GFDIT_CHECK(q.degree >= 1 && q.batch >= 1 && (q.layout.cfg == 1 || q.layout.cfg == 2))
      << "degree and batch must be >= 1 and cfg 1 or 2, got degree " << q.degree << ", batch " << q.batch << ", cfg "
      << q.layout.cfg;
  const int64_t tokens =
      q.shape.tokens > 0 ? q.shape.tokens : model.tokens(q.shape.height, q.shape.width, q.shape.num_frames);
  const double pass_degree = std::max(1, q.degree / q.layout.cfg);  // CFG-parallel: a half runs each pass
  const double rows = static_cast<double>(tokens) / pass_degree + model.text_tokens;
  const double per_token = std::max(2.0 * model.hidden + 2.0 * model.ffn, 9.0 * model.hidden);
  return q.batch * rows * per_token * dtype_bytes;
}

int32_t maxBatch(const ModelArch& model, const Hardware& hw, const StageQuery& q) {
  GFDIT_CHECK(hw.mem_bytes > 0) << "hardware '" << hw.name << "': its memory size is unknown (mem_bytes 0)";
  StageQuery one = q;
  one.batch = 1;
  // every rank holds all the transformer's weights (sequence parallelism splits tokens, not weights), both
  // experts of a two-expert model
  const double weights = model.transformer_params * model.num_experts * hw.dtype_bytes;
  const double per_request = activationBytesPerRank(model, hw.dtype_bytes, one);
  const double fit = std::floor((hw.mem_bytes - weights) / per_request);
  return fit < 0 ? 0 : static_cast<int32_t>(std::min(fit, 1e9));
}

}  // namespace cost
}  // namespace gfdit
