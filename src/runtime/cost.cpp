// The analytic cost model: the model registry, the hardware and cluster registries, and stage times from
// FLOPs and bytes over peak rates with efficiency factors (see docs/cost_calibration.md for the fit); and the
// names of the stages and of the layout's modes and placements (gfdit/layout.h), defined once here.
#include "gfdit/cost.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gfdit/error.h"

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
    m.sampler_history_latents = 3;         // UniPC, solver_order 2: two model outputs and last_sample
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
    m.sampler_history_latents = 3;         // UniPC, solver_order 2
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
    m.sampler_history_latents = 3;         // UniPC, solver_order 2
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

// NOTE [hardware figures]
// Peak rates are datasheet dense bf16 and HBM bandwidth (the GPU table of docs/architecture.md, The cost
// model: NVIDIA H20, A100 SXM, H100 SXM, H200 SXM product briefs). NVLink figures there are bidirectional
// aggregates; a rank sends at half of it.
// Across nodes: one 400 Gb/s NIC per GPU, ~50 GB/s per direction. The efficiency factors, the collective
// latency and the per-block overhead are fitted (docs/cost_calibration.md): H20 to GF-DiT's Qwen-Image
// per-step table, H100 to SGLang Diffusion's H100 CI baselines; A100 and H200 take H100's factors (no
// published per-step figure was found for them). On the H200 a bf16 8192^3 matmul reached ~790 TFLOP/s
// (0.8 of peak), so matmul_efficiency is a ceiling that large GEMMs approach, not what a whole step gets.
std::vector<Hardware> makeHardware() {
  std::vector<Hardware> v;
  auto gpu = [](const char* name, double flops, double mem, double nvlink_bidir) {
    Hardware h;
    h.name = name;
    h.peak_flops = flops;
    h.mem_bw = mem;
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
    return h;
  };
  Hardware h20 = gpu("h20", 148e12, 4.0e12, 900e9);
  h20.matmul_efficiency = 0.95;  // fitted; pinned at the fit's cap, see docs/cost_calibration.md
  h20.attention_efficiency = 0.835;
  h20.half_efficiency_tokens = 256;
  h20.peer_latency_s = 73e-6;  // per peer of an all-to-all, with the copies around it (eager PyTorch)
  h20.layer_overhead_s = 0.633e-3;
  // H100 (and A100, H200, for want of their own figures): matmul at 0.8 of peak as measured on the H200
  // (same die), attention and the per-block overhead fitted to SGLang Diffusion's H100 baselines.
  auto hopperFit = [](Hardware h) {
    h.matmul_efficiency = 0.8;
    h.attention_efficiency = 0.33;
    h.half_efficiency_tokens = 256;
    h.peer_latency_s = 73e-6;  // not constrained by the H100 figures: the H20's
    h.layer_overhead_s = 10e-6;
    return h;
  };
  Hardware a100 = hopperFit(gpu("a100", 312e12, 2.0e12, 600e9));
  Hardware h100 = hopperFit(gpu("h100", 989e12, 3.35e12, 900e9));
  Hardware h200 = hopperFit(gpu("h200", 989e12, 4.8e12, 900e9));
  v.push_back(h20);
  v.push_back(a100);
  v.push_back(h100);
  v.push_back(h200);

  // NOTE [cpu hardware]
  // This machine, not measured at run time: one core's float32 peak from a rough AVX2 figure (2 FMA units x
  // 8 lanes x 2 FLOP x ~2.5 GHz = 80 GFLOP/s), ~10 GB/s of memory bandwidth per core, shared-memory copies
  // between ranks at ~5 GB/s, ~20 us per collective. Ranks time-share num_cores cores (see NOTE [cpu
  // contention]); PyTorch eager on tiny shapes is dominated by per-op host cost, hence layer_overhead_s. The
  // efficiencies were set once so that tiny-wan's step and decode at 32x48x9 .. 128x128x33 land within ~2x of a
  // single-thread run on a 2-core development machine (order of magnitude only: use a profile on a CPU).
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
  }
  return "unknown";
}

Stage stageFromName(const std::string& name) {
  return fromName(name, "stage", {Stage::kEncode, Stage::kDenoise, Stage::kMigrate, Stage::kDecode}, stageName);
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

namespace {

// NOTE [analytic step model]
// One transformer pass, per rank of a sequence-parallel group of p = ulysses x ring ranks, each rank holding
// n = N / p of the N image tokens (T text tokens):
// - Linear layers: 2 FLOPs per weight per token. Wan: self-attention q, k, v, out (4 H^2), cross-attention q
//   and out on the image tokens (2 H^2) and k, v on the text tokens (2 H^2 x T, computed by every rank: the
//   text is replicated), FFN (2 H F). Qwen-Image (MMDiT): the image stream (4 H^2 + 2 H F per token) on n
//   tokens and the text stream (same weights' shape) on all T text tokens on every rank.
// - Attention: 4 L^2 H FLOPs for L tokens (QK^T and PV). Each rank computes its Ulysses member's heads for
//   its ring shard of the queries: 4 L^2 H_u / r with H_u = ceil(heads / u) x head_dim. The heads split
//   evenly when u divides them; otherwise members get floor or ceil shares and the pass waits for the
//   largest, so an uneven split costs like its largest member. Wan: L = N self-attention plus 4 n T H for
//   cross-attention; Qwen-Image: joint attention over L = N + T.
// - Compute runs at peak x efficiency x n / (n + half_efficiency_tokens): small per-rank shapes leave the
//   GPU underused (short GEMMs, launch-bound kernels). Matmuls and attention have separate ceilings.
// - Weights: each pass reads every weight once; a linear layer takes max(its compute, its weight reads)
//   (roofline: small shapes are memory bound). Activations: ~kActivationPasses reads/writes of n x H
//   elements per block (norms, modulation, RoPE, residuals, activation functions) at memory bandwidth.
// - A fixed layer_overhead_s per block (kernel launches, host work of an eager PyTorch step).
// - Ulysses: 4 all-to-alls per block (q, k, v in, the output back), each moving n x H_u elements per peer
//   (the largest member's share), (u - 1) peers; a per-collective latency plus bytes over the slowest link
//   used (NVLink inside a node, the NIC across nodes) plus peer_latency_s per peer (NCCL's all-to-all is one
//   send/recv pair per peer, so small all-to-alls get slower with the group; an off-node peer costs that
//   times the ratio of the inter-node to the intra-node latency). MMDiT text tokens are head-split
//   locally, not exchanged.
// - Ring: r - 1 rounds passing K and V blocks (N / r tokens x H_u), overlapped with attention compute:
//   the attention takes max(compute, rotation).
// - Torus: the inter-node all-to-all is chunked and pipelined against ring compute: the attention takes
//   max(compute, all-to-all + rotation) plus one chunk of all-to-all that cannot overlap (pipeline fill).
// - After the last block the output tokens are all-gathered (N x patch volume x channels, float32).
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
      case Stage::kEncode: return encode(q) * contention(q.degree);
      case Stage::kDenoise: return step(q, tokens) * contention(q.degree);
      case Stage::kMigrate: return q.num_new > 0 ? migrate(q) * contention(q.num_new + 1) : 0.0;
      case Stage::kDecode: return decode(q);
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

 private:
  void check(Stage stage, const StageQuery& q) const {
    GFDIT_CHECK(q.degree >= 1) << "degree must be >= 1, got " << q.degree;
    GFDIT_CHECK(q.degree <= cluster_.num_ranks)
        << "a group of " << q.degree << " ranks does not fit cluster " << cluster_.name << " of " << cluster_.num_ranks;
    GFDIT_CHECK(q.num_nodes >= 1 && q.num_nodes <= q.degree)
        << "num_nodes must be in [1, degree " << q.degree << "], got " << q.num_nodes;
    GFDIT_CHECK(q.num_new >= 0) << "num_new must be >= 0, got " << q.num_new;
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
      return pass(q.layout, tokens, half_degree, half_nodes) + l.latency + outputBytes(tokens) / l.bw;
    }
    return (q.shape.guidance() ? 2.0 : 1.0) * pass(q.layout, tokens, q.degree, q.num_nodes);
  }

  // The transformer's output (the velocity), float32: what the output all-gather and CFG's exchange move.
  double outputBytes(int64_t tokens) const {
    return static_cast<double>(tokens) * model_.patch_t * model_.patch_s * model_.patch_s * model_.latent_channels *
           4.0;
  }

  // One pass of the transformer on one rank of `d` = layout.ulysses x layout.ring ranks over `nodes` nodes.
  double pass(const Layout& layout, int64_t tokens, int32_t d, int32_t nodes) const {
    const Hardware& hw = cluster_.hw;
    const double N = static_cast<double>(tokens);
    const double T = model_.text_tokens;
    const double H = model_.hidden;
    const double F = model_.ffn;
    const double db = hw.dtype_bytes;
    const int32_t u = layout.ulysses;
    const int32_t r = layout.ring;
    const double n = N / d;
    // the heads of the largest Ulysses member (an uneven split waits for it)
    const double H_u = static_cast<double>((model_.heads + u - 1) / u) * model_.head_dim;

    // Compute per block; the saturation follows the rows the block's GEMMs see (image and text tokens).
    double t_linear = 0;
    double attention = 0;
    double act_tokens = n;
    if (model_.joint_attention) {
      const double per_token = 2.0 * (4 * H * H + 2 * H * F);
      t_linear = per_token * (n + T) / matmulRate(n + T);
      attention = 4.0 * (N + T) * (N + T) * H_u / r;
      act_tokens = n + T;
    } else {
      const double per_token = 2.0 * (6 * H * H + 2 * H * F);
      t_linear = (per_token * n + 2.0 * 2 * T * H * H) / matmulRate(n + T);
      attention = 4.0 * N * N * H_u / r + 4.0 * n * T * H;
    }
    const double t_weights = model_.transformer_params * db / model_.num_layers / hw.mem_bw;
    const double t_act = kActivationPasses * act_tokens * H * db / hw.mem_bw;
    const double t_attn = attention / (hw.peak_flops * hw.attention_efficiency * saturation(n));

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

    // Ulysses: one all-to-all moves n x H_u elements to each peer (the largest member's share).
    double t_a2a = 0;
    if (u > 1) {
      const double per_peer = n * H_u * db;
      const Links in = intraNode();
      const Links out = interNode();
      const int32_t off = u - u_on_node;
      const double t_in = (u_on_node - 1) * per_peer / in.bw;
      const double t_out = off * per_peer / out.bw;
      // An off-node send/recv pair costs what the NIC's latency costs over NVLink's, relative to a peer here.
      const double off_peer = hw.peer_latency_s * out.latency / in.latency;
      t_a2a = (off > 0 ? out.latency : in.latency) + (u_on_node - 1) * hw.peer_latency_s + off * off_peer +
              std::max(t_in, t_out);
    }
    // Ring: r - 1 rounds of K and V blocks.
    double t_ring = 0;
    if (r > 1) {
      const Links l = ring_crosses ? interNode() : intraNode();
      const double block = 2.0 * (N / r) * H_u * db;
      t_ring = (r - 1) * (l.latency + block / l.bw);
    }
    double t_block_attn;
    if (layout.mode == LayoutMode::kTorus) {
      t_block_attn = std::max(t_attn, 4 * t_a2a + t_ring) + 4 * t_a2a / kTorusChunks;
    } else {
      t_block_attn = std::max(t_attn, t_ring) + 4 * t_a2a;
    }
    const double t_block = std::max(t_linear, t_weights) + t_act + t_block_attn + hw.layer_overhead_s;

    double t_pass = model_.num_layers * t_block;
    if (d > 1) {  // all-gather of the output tokens (float32)
      const Links l = nodes > 1 ? interNode() : intraNode();
      t_pass += l.latency + outputBytes(tokens) * (d - 1) / d / l.bw;
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

  // VAE decode on one rank: the decoder's FLOPs per output pixel over the convolution rate.
  double decode(const StageQuery& q) const {
    const Hardware& hw = cluster_.hw;
    const double pixels = static_cast<double>(q.shape.height) * q.shape.width * q.shape.num_frames;
    return model_.vae_decode_flops_per_pixel * pixels / (hw.peak_flops * hw.conv_efficiency);
  }

  // Broadcast of the denoise state from one holder to num_new members (a pipelined tree: the bytes cross a
  // link about once, the latency is paid once per tree level), plus forming the new group. The state: the
  // latent, the sampler's history (multistep solvers keep earlier model outputs and a sample, each shaped
  // like the latent: ModelArch::sampler_history_latents), the text embeddings and the schedule.
  double migrate(const StageQuery& q) const {
    const Hardware& hw = cluster_.hw;
    const RequestShape& s = q.shape;
    const int64_t latent_frames = model_.is_video ? (s.num_frames - 1) / model_.vae_stride_t + 1 : 1;
    const double latent = static_cast<double>(model_.latent_channels) * latent_frames *
                          (s.height / model_.vae_stride_s) * (s.width / model_.vae_stride_s) * 4.0;
    const double embeds = (s.guidance() ? 2.0 : 1.0) * model_.text_tokens * model_.text_hidden * hw.dtype_bytes;
    const double schedule = (std::max(s.num_steps, 1) + 1) * 2.0 * 4.0;
    const Links l = q.num_nodes > 1 ? interNode() : intraNode();
    const double levels = std::ceil(std::log2(static_cast<double>(q.num_new) + 1.0));
    const double history = model_.sampler_history_latents * latent;
    return hw.regroup_s + levels * l.latency + (latent + history + embeds + schedule) / l.bw;
  }

  ModelArch model_;
  Cluster cluster_;
};

}  // namespace

std::shared_ptr<CostModel> makeAnalyticCostModel(const ModelArch& model, const Cluster& cluster) {
  return std::make_shared<AnalyticCostModel>(model, cluster);
}

}  // namespace cost
}  // namespace gfdit
