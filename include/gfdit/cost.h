// The cost model: how long each stage of a request takes on a group of ranks with a given layout.
//
// Two sources behind one interface: analytic (FLOPs and bytes from a model's architecture over a piece of
// hardware's peak rates, with efficiency factors, plus collective volume over link bandwidth) and profiled
// (stage times measured on the machine at hand by `gfdit profile`, interpolated). Policies and the
// simulator ask it; nothing in it touches rings, workers or tensors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gfdit/layout.h"
#include "gfdit/step_cache.h"

namespace gfdit {
namespace cost {

/// A stage of a request's trajectory; each is named as the task kind that runs it (taskKindName).
enum class Stage : int32_t {
  kEncode = 0,   ///< text encoder (and the initial latent), once, on one rank
  kDenoise = 1,  ///< one whole denoising step (two transformer passes with guidance, in turn or CFG-parallel)
  kMigrate = 2,  ///< hand the denoise state from one holder to the group's new members
  kDecode = 3,   ///< VAE decode, on one rank or patch-parallel over the latent's height on a group
  /// the holders exchange their shards of the request's step cache, so each holds it whole (NOTE [cache
  /// gathers] in src/runtime/control.cpp); 0 for a request without a step cache
  kGather = 4,
};

/// Name of a stage ("encode", "denoise", "migrate", "decode").
const char* stageName(Stage s);
/// The stage of a name as stageName writes it; other names throw InvalidUsage listing the valid ones.
Stage stageFromName(const std::string& name);

/// Architecture facts of a model family member, from its public config (docs/architecture.md, The cost model).
struct ModelArch {
  std::string name;              ///< "qwen-image", "wan2.2", "wan2.2-5b", "wan2.1-1.3b", "tiny-wan", ...
  std::string alias;             ///< the shorter name it also answers to ("wan2.1"); "" when none
  std::string pipeline;          ///< the staged pipeline gfdit.models.load builds it with ("wan", "qwen-image"), or ""
  bool is_video = false;         ///< takes num_frames > 1
  bool joint_attention = false;  ///< MMDiT (text tokens in the attention, Qwen-Image) vs cross-attention (Wan)
  int32_t num_layers = 0;
  int32_t hidden = 0;  ///< model width
  int32_t heads = 0;
  int32_t head_dim = 0;
  int32_t ffn = 0;                ///< feed-forward inner width
  int32_t num_experts = 1;        ///< Wan 2.2 A14B: two experts, one active per step
  double transformer_params = 0;  ///< parameters of one (active) transformer
  int32_t text_hidden = 0;        ///< text encoder output width
  int32_t text_tokens = 0;        ///< text tokens the transformer sees (max_sequence_length or typical)
  double text_encoder_params = 0;
  int32_t vae_stride_t = 1;  ///< temporal VAE compression (frames = stride * k + 1 for video)
  int32_t vae_stride_s = 8;  ///< spatial VAE compression
  int32_t latent_channels = 16;
  int32_t patch_t = 1;
  int32_t patch_s = 2;
  double vae_decode_flops_per_pixel = 0;  ///< decoder FLOPs per output pixel (per frame)
  int32_t vae_decoder_convs = 0;          ///< the decoder's 3x3 convolutions, each run once per latent frame
  /// Channels of one halo row summed over those convolutions, per output pixel of width and output frame
  /// (each convolution's input channels x its width / the output's x its frames / the output's).
  double vae_halo_channels = 0;
  int32_t vae_mid_channels = 0;  ///< width of the decoder's mid-block attention (one head, per frame)
  /// Latent-sized float32 tensors the sampler keeps in the denoise state besides the latent, at most (its
  /// shipped scheduler: UniPC of order 2 keeps 2 earlier model outputs and its corrector's sample; Euler none).
  int32_t sampler_history_latents = 0;
  // serving defaults
  int32_t default_height = 0;
  int32_t default_width = 0;
  int32_t default_frames = 1;
  int32_t default_steps = 0;
  double default_guidance = 1.0;
  // limits a request is checked against at submit (configurable by the engine)
  int32_t max_steps = 0;
  int64_t max_pixels = 0;  ///< height * width
  int32_t max_frames = 1;
  int64_t max_tokens = 0;  ///< transformer sequence tokens (image/video tokens)

  /// Height and width must be multiples of this (VAE stride times patch size).
  int32_t spatialMultiple() const { return vae_stride_s * patch_s; }
  /// Latent rows of a request of this height: the most members a decode can split over.
  int32_t latentRows(int32_t height) const { return height / std::max(1, vae_stride_s); }
  /// Image/video tokens of a request of this size.
  int64_t tokens(int32_t height, int32_t width, int32_t num_frames) const;
};

/// A known model by name or alias; unknown names throw InvalidUsage listing the known ones.
const ModelArch& modelArch(const std::string& name);
/// Names of the known models.
std::vector<std::string> modelNames();
/// The names gfdit.models.load takes: the models with a pipeline, by alias where they have one.
std::vector<std::string> loadableModelNames();

/// One device type in a cluster (or this CPU), from datasheets, with efficiency factors.
struct Hardware {
  std::string name;                 ///< "h20", "a100", "h100", "h200", "cpu"
  double peak_flops = 0;            ///< dense bf16 (float32 for "cpu"), FLOP/s per rank
  double mem_bw = 0;                ///< bytes/s per rank
  double link_bw = 0;               ///< bytes/s per rank per direction inside a node
  double inter_node_bw = 0;         ///< bytes/s per rank per direction across nodes
  double collective_latency_s = 0;  ///< fixed cost of one collective inside a node
  double inter_node_latency_s = 0;  ///< fixed cost of one collective across nodes
  double matmul_efficiency = 0.6;   ///< share of peak a large GEMM reaches
  double attention_efficiency = 0.5;
  double half_efficiency_tokens = 0;  ///< per-rank tokens at which compute efficiency halves
  double regroup_s = 1e-6;            ///< cost of forming a new group (gfdit: ~1 us; NCCL: ~0.78 s)
  int32_t ranks_per_node = 8;
  int32_t num_cores = 0;         ///< ranks share this many cores (CPU); 0: one device per rank
  double conv_efficiency = 0.3;  ///< share of peak the VAE decoder's 3-D convolutions reach
  double layer_overhead_s = 0;   ///< fixed host/launch cost of one transformer block in one pass
  double peer_latency_s = 0;     ///< added cost per peer of an all-to-all (one send/recv pair each)
  int32_t dtype_bytes = 2;       ///< bytes of a weight or activation element (bf16; float32 on "cpu")
  /// Kernels are queued asynchronously (a GPU): a block costs the larger of its host and its device work.
  /// false (a CPU): the host runs the kernels itself, so the two add.
  bool async_launch = true;
  double peer_host_s = 0;  ///< host work per peer of an all-to-all or ring round (its calls and reshuffles)
  /// Fixed cost of one decoder convolution on one latent frame in a patch-parallel decode (its halo's slices,
  /// padding and synchronisation), the same at every degree > 1.
  double conv_layer_overhead_s = 0;
  double mem_bytes = 0;  ///< memory one rank may use (HBM; on "cpu" this machine's share per rank); 0: unknown
};

/// A known piece of hardware by name; unknown names throw InvalidUsage listing the known ones.
const Hardware& hardware(const std::string& name);
/// Names of the known hardware.
std::vector<std::string> hardwareNames();

/// A cluster: `num_nodes` nodes of `ranks_per_node` ranks of one hardware ("h20x8", "h20x16", "cpu").
struct Cluster {
  std::string name;
  Hardware hw;
  int32_t num_ranks = 0;
  int32_t ranks_per_node = 0;
  /// Node of a rank.
  int32_t nodeOf(int32_t rank) const { return ranks_per_node > 0 ? rank / ranks_per_node : 0; }
};

/// A known cluster by name ("h20x8", "a100x8", "h100x8", "h200x8", "h20x16", "cpu"); `num_ranks` > 0
/// overrides the rank count (needed for "cpu"). Unknown names throw InvalidUsage listing the valid ones.
Cluster cluster(const std::string& name, int32_t num_ranks = 0);
/// Names of the known clusters.
std::vector<std::string> clusterNames();

/// What a stage estimate depends on besides the model: the request's size and the group.
struct StageQuery {
  RequestShape shape;
  int32_t degree = 1;     ///< ranks in the group
  Layout layout;          ///< layout.degree() (ulysses * ring * cfg) == degree
  int32_t num_nodes = 1;  ///< nodes the group spans (1: all inside one node)
  int32_t num_new = 0;    ///< kMigrate: members that receive the state
  /// Requests of this shape served together: one batched transformer forward per step (kDenoise), one state
  /// broadcast (kMigrate), one after another (kEncode, kDecode). The stage's time covers all of them.
  int32_t batch = 1;
  /// kDenoise: a step whose every pass reuses this step cache (NOTE [step caches] in gfdit/step_cache.h): it
  /// runs the first block (fbcache) or none (teacache) and the decision; kNone: a step that computes every block.
  CacheKind cached = CacheKind::kNone;
};

/// Predicts stage times in seconds. Implementations are immutable and safe to share between threads.
class CostModel {
 public:
  virtual ~CostModel() = default;
  /// Seconds `stage` takes for `q` (kDenoise: one whole step, both guidance passes when on).
  virtual double seconds(Stage stage, const StageQuery& q) const = 0;
  /// A one-line description ("analytic qwen-image on h20", "profile of tiny-wan on cpu").
  virtual std::string describe() const = 0;
  /// The model it predicts for.
  virtual const ModelArch& model() const = 0;
  /// Cores the ranks share (a CPU whose ranks outnumber its cores), or 0 with one device per rank. A rank
  /// beyond the cores adds no compute, only waits in collectives: policies lend spare ranks up to it.
  virtual int32_t sharedCores() const { return 0; }
  /// The largest batch of `q.shape` on `q.degree` ranks it prices and the memory holds (at least 1): the
  /// analytic model's memory limit (cost::maxBatch), a profile's largest measured batch.
  virtual int32_t maxBatch(const StageQuery& q) const {
    (void)q;
    return 1;
  }
  /// How often a pass past its warm-up reuses a step cache of `kind`, by threshold: a profile's measured curve,
  /// else the figures published for the model (publishedSkipCurve), else none (an empty curve: predictions
  /// assume no step reuses the cache).
  virtual SkipCurve skipCurve(CacheKind kind) const;
  /// skipCurve(kind).at(threshold).
  double skipRate(CacheKind kind, double threshold) const { return skipCurve(kind).at(threshold); }
};

/// `base` with other skip curves: each of `curves` replaces what base.skipCurve answers for its kind (a what-if:
/// a stand-in for a model without a published or measured curve); everything else is base's.
std::shared_ptr<CostModel> withSkipCurves(std::shared_ptr<const CostModel> base, std::vector<SkipCurve> curves);
/// The skip curve published for `model` and `kind` (NOTE [published skip rates] in src/runtime/cost.cpp), or an
/// empty one.
SkipCurve publishedSkipCurve(const std::string& model, CacheKind kind);
/// The share of a full step's time that a step whose passes all reuse a cache of `kind` takes, from the model's
/// blocks alone: the blocks it still runs (1 for fbcache, 0 for teacache) plus about one block's worth for the
/// decision and the pass's other work, over the model's blocks (what a profile without a measurement assumes).
double cachedStepFraction(const ModelArch& model, CacheKind kind);
/// Bytes of a request's denoise state without its step cache, as a migration moves it: the latent and the
/// sampler's history (float32), the text embeddings (`dtype_bytes`) and the schedule.
double stateBytes(const ModelArch& model, const RequestShape& shape, int32_t dtype_bytes);
/// Bytes of a request's whole step cache: per pass (two with guidance), the cached residual and the decision's
/// reference, each tokens x hidden elements of `dtype_bytes` (0 without a cache).
double cacheBytes(const ModelArch& model, const RequestShape& shape, int32_t dtype_bytes);

/// The analytic model of `model` on `cluster` (which also fixes the topology used for num_nodes).
std::shared_ptr<CostModel> makeAnalyticCostModel(const ModelArch& model, const Cluster& cluster);

/// One measurement of a profile: the schema of a profile file's entries (gfdit.planning.cost reads and
/// writes them).
struct ProfileEntry {
  Stage stage = Stage::kDenoise;
  int64_t tokens = 0;  ///< image/video tokens of the request
  int32_t degree = 1;  ///< ranks in the group
  int32_t ulysses = 1;
  int32_t ring = 1;
  LayoutMode mode = LayoutMode::kUsp;
  int32_t cfg = 1;        ///< Layout::cfg (degree = ulysses * ring * cfg for a step)
  bool guidance = false;  ///< two passes per step
  int32_t num_new = 0;    ///< kMigrate: members that received the state
  int32_t batch = 1;      ///< requests served together (StageQuery::batch)
  double seconds = 0;     ///< median measured time
  int32_t samples = 0;    ///< measurements the median is of (0: not recorded)
};

/// What `gfdit profile --network` measured of the link between two nodes of a world, with the world's own
/// collectives between ranks of the two (NOTE [inter-node calibration] in src/runtime/cost.cpp).
struct LinkMeasurement {
  int32_t node_a = 0;
  int32_t node_b = 1;
  int32_t ranks_per_node = 1;         ///< ranks on each of the two nodes (each sent to its counterpart at once)
  double stream_bytes_per_s = 0;      ///< one large send/recv from one rank to one rank
  double concurrent_bytes_per_s = 0;  ///< every rank of one node to its counterpart at once, all of them together
  double round_trip_s = 0;            ///< a small send/recv and back, one rank to one rank
  double collective_s = 0;            ///< a small all_to_all of two members, one on each node
  double intra_collective_s = 0;      ///< the same with both members on one node (0: not measured)
  double line_bytes_per_s = 0;        ///< the link's nominal rate per direction, as its owner states it (0: unknown)
};

/// `cluster` with the inter-node terms its hardware takes from `links` (NOTE [inter-node calibration] in
/// src/runtime/cost.cpp): inter_node_bw and inter_node_latency_s, and the ranks per node of the world measured.
/// No links: `cluster` unchanged. A measurement that is not positive where the fit needs it throws InvalidUsage.
Cluster calibratedCluster(const Cluster& cluster, const std::vector<LinkMeasurement>& links);

/// `cluster` (another network than the one measured) with its inter-node terms scaled by how `links` compare
/// with what the analytic model assumes of a link (NOTE [inter-node calibration]): inter_node_bw times the
/// measured share of the line rate, inter_node_latency_s the intra-node latency times the measured ratio of a
/// collective across nodes to one inside. No links: `cluster` unchanged. A link without a line rate or an
/// intra-node collective throws InvalidUsage.
Cluster transferredCluster(const Cluster& cluster, const std::vector<LinkMeasurement>& links);

/// Measured stage times for one model on one machine.
struct Profile {
  std::string model;
  std::string hardware = "cpu";
  int32_t world_size = 0;
  int32_t num_cores = 0;             ///< cores the ranks shared when measured (0: one device per rank)
  double dispatch_s = 0;             ///< control plane -> worker start, measured
  double completion_s = 0;           ///< worker end -> control plane, measured
  double collective_efficiency = 1;  ///< share of its share of the cores a collective task gets done while
                                     ///< ranks outnumber cores (NOTE [simulated execution] in simulator.cpp)
  std::vector<ProfileEntry> entries;
  /// Measured skip curves of the step caches (CostModel::skipCurve), at most one per kind.
  std::vector<SkipCurve> skip_curves;
  /// Seconds of a step whose passes all reuse the cache over a full step's, per kind, measured on this model
  /// (0: not measured; the model's block count then prices it, as cost::cachedStepFraction).
  double fbcache_step_ratio = 0;
  double teacache_step_ratio = 0;
  /// The links between the nodes of the world measured (`gfdit profile --network`; empty: one node).
  std::vector<LinkMeasurement> links;
};

/// A cost model that interpolates `profile` (piecewise linear in tokens between measured shapes of the same
/// stage, degree, layout (CFG-parallel included), guidance and batch, and linear in batch between measured
/// batches). A query outside the measured range throws InvalidUsage naming the shape, stage, degree and batch
/// it lacks.
std::shared_ptr<CostModel> makeProfiledCostModel(const Profile& profile);

/// The decode degree in [1, max_degree] with the fewest predicted seconds for `shape` (ties: the smaller), at
/// most the latent's height in rows (one row per member at least). A group of more than `ranks_per_node` ranks
/// (0: no limit) spans nodes. Degrees the model refuses (unmeasured in a profile, larger than the cluster) are
/// skipped; when it refuses every one, degree 1's error is thrown.
int32_t bestDecodeDegree(const CostModel& cost, const RequestShape& shape, int32_t max_degree,
                         int32_t ranks_per_node = 0);

/// Activation bytes one rank holds at the peak of a denoising pass of `q.batch` requests of `q.shape` on
/// `q.degree` ranks (an estimate: docs/cost_calibration.md, "Memory").
double activationBytesPerRank(const ModelArch& model, int32_t dtype_bytes, const StageQuery& q);
/// The largest batch of `q.shape` on `q.degree` ranks whose weights and activations fit `hw.mem_bytes`
/// (0: not even one request fits); InvalidUsage when `hw.mem_bytes` is unknown (0).
int32_t maxBatch(const ModelArch& model, const Hardware& hw, const StageQuery& q);

}  // namespace cost
}  // namespace gfdit
