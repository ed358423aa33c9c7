// gfdit._C.cost: the cost model (model, hardware and cluster registries; analytic and profiled models).
// Thin: names become snake_case; the C++ checks the arguments and its errors map to gfdit.InvalidUsage.
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "bindings.h"
#include "gfdit/cost.h"
#include "gfdit/error.h"
#include "gfdit/layout.h"
#include "layout_py.h"

namespace py = pybind11;

namespace gfdit {
namespace python {
namespace {

using cost::Cluster;
using cost::CostModel;
using cost::Hardware;
using cost::ModelArch;
using cost::Profile;
using cost::ProfileEntry;
using cost::Stage;

// A copy of `hw` with the fields named in `kw` replaced (for what-if studies and the calibration fit).
Hardware replaceHardware(const Hardware& hw, const py::kwargs& kw) {
  Hardware h = hw;
  for (const auto& item : kw) {
    const std::string key = item.first.cast<std::string>();
    py::handle v = item.second;
    if (key == "name")
      h.name = v.cast<std::string>();
    else if (key == "peak_flops")
      h.peak_flops = v.cast<double>();
    else if (key == "mem_bw")
      h.mem_bw = v.cast<double>();
    else if (key == "link_bw")
      h.link_bw = v.cast<double>();
    else if (key == "inter_node_bw")
      h.inter_node_bw = v.cast<double>();
    else if (key == "collective_latency_s")
      h.collective_latency_s = v.cast<double>();
    else if (key == "inter_node_latency_s")
      h.inter_node_latency_s = v.cast<double>();
    else if (key == "matmul_efficiency")
      h.matmul_efficiency = v.cast<double>();
    else if (key == "attention_efficiency")
      h.attention_efficiency = v.cast<double>();
    else if (key == "half_efficiency_tokens")
      h.half_efficiency_tokens = v.cast<double>();
    else if (key == "regroup_s")
      h.regroup_s = v.cast<double>();
    else if (key == "ranks_per_node")
      h.ranks_per_node = v.cast<int32_t>();
    else if (key == "num_cores")
      h.num_cores = v.cast<int32_t>();
    else if (key == "conv_efficiency")
      h.conv_efficiency = v.cast<double>();
    else if (key == "layer_overhead_s")
      h.layer_overhead_s = v.cast<double>();
    else if (key == "dtype_bytes")
      h.dtype_bytes = v.cast<int32_t>();
    else if (key == "peer_latency_s")
      h.peer_latency_s = v.cast<double>();
    else if (key == "async_launch")
      h.async_launch = v.cast<bool>();
    else if (key == "peer_host_s")
      h.peer_host_s = v.cast<double>();
    else if (key == "conv_layer_overhead_s")
      h.conv_layer_overhead_s = v.cast<double>();
    else if (key == "mem_bytes")
      h.mem_bytes = v.cast<double>();
    else
      GFDIT_THROW(kInvalidUsage) << "Hardware.replace: unknown field '" << key << "'";
  }
  return h;
}

// A copy of `arch` with the fields named in `kw` replaced (what-if studies: another prompt length, ...).
ModelArch replaceModelArch(const ModelArch& arch, const py::kwargs& kw) {
  ModelArch a = arch;
  for (const auto& item : kw) {
    const std::string key = item.first.cast<std::string>();
    py::handle v = item.second;
    if (key == "name")
      a.name = v.cast<std::string>();
    else if (key == "is_video")
      a.is_video = v.cast<bool>();
    else if (key == "joint_attention")
      a.joint_attention = v.cast<bool>();
    else if (key == "num_layers")
      a.num_layers = v.cast<int32_t>();
    else if (key == "hidden")
      a.hidden = v.cast<int32_t>();
    else if (key == "heads")
      a.heads = v.cast<int32_t>();
    else if (key == "head_dim")
      a.head_dim = v.cast<int32_t>();
    else if (key == "ffn")
      a.ffn = v.cast<int32_t>();
    else if (key == "num_experts")
      a.num_experts = v.cast<int32_t>();
    else if (key == "transformer_params")
      a.transformer_params = v.cast<double>();
    else if (key == "text_hidden")
      a.text_hidden = v.cast<int32_t>();
    else if (key == "text_tokens")
      a.text_tokens = v.cast<int32_t>();
    else if (key == "text_encoder_params")
      a.text_encoder_params = v.cast<double>();
    else if (key == "vae_decode_flops_per_pixel")
      a.vae_decode_flops_per_pixel = v.cast<double>();
    else if (key == "vae_decoder_convs")
      a.vae_decoder_convs = v.cast<int32_t>();
    else if (key == "vae_halo_channels")
      a.vae_halo_channels = v.cast<double>();
    else if (key == "vae_mid_channels")
      a.vae_mid_channels = v.cast<int32_t>();
    else if (key == "sampler_history_latents")
      a.sampler_history_latents = v.cast<int32_t>();
    else
      GFDIT_THROW(kInvalidUsage) << "ModelArch.replace: unknown or fixed field '" << key << "'";
  }
  return a;
}

// The shape of a request of `model` (its tokens from the size).
RequestShape shapeOf(const ModelArch& model, int32_t height, int32_t width, int32_t num_frames, int32_t num_steps,
                     double guidance_scale) {
  RequestShape s;
  s.height = height;
  s.width = width;
  s.num_frames = num_frames;
  s.num_steps = num_steps;
  s.guidance_scale = guidance_scale;
  s.tokens = model.tokens(height, width, num_frames);
  return s;
}

// A query of `degree` ranks (as one Ulysses group, or two halves with cfg 2) for `batch` requests.
cost::StageQuery queryOf(const RequestShape& shape, int32_t degree, int32_t batch, int32_t cfg) {
  cost::StageQuery q;
  q.shape = shape;
  q.degree = degree;
  q.layout.ulysses = cfg > 0 ? degree / cfg : degree;
  q.layout.cfg = cfg;
  q.batch = batch;
  return q;
}

}  // namespace

void register_cost(py::module_& m) {
  py::module_ c = m.def_submodule("cost", "cost model: stage times of a request on a group of ranks");

  py::enum_<Stage>(c, "Stage", "a stage of a request's trajectory")
      .value("ENCODE", Stage::kEncode)
      .value("DENOISE", Stage::kDenoise)
      .value("MIGRATE", Stage::kMigrate)
      .value("DECODE", Stage::kDecode)
      .value("GATHER", Stage::kGather);
  c.def("stage_name", &cost::stageName, py::arg("stage"), "name of a stage: encode, denoise, migrate, decode, gather");
  c.def("stage_from_name", &cost::stageFromName, py::arg("name"),
        "the stage of a name; others raise InvalidUsage listing the valid ones");

  py::class_<ModelArch>(c, "ModelArch", "architecture facts, serving defaults and limits of a model")
      .def_readonly("name", &ModelArch::name)
      .def_readonly("alias", &ModelArch::alias)
      .def_readonly("pipeline", &ModelArch::pipeline, "the staged pipeline gfdit.models.load builds it with, or \"\"")
      .def_readonly("is_video", &ModelArch::is_video)
      .def_readonly("joint_attention", &ModelArch::joint_attention)
      .def_readonly("num_layers", &ModelArch::num_layers)
      .def_readonly("hidden", &ModelArch::hidden)
      .def_readonly("heads", &ModelArch::heads)
      .def_readonly("head_dim", &ModelArch::head_dim)
      .def_readonly("ffn", &ModelArch::ffn)
      .def_readonly("num_experts", &ModelArch::num_experts)
      .def_readonly("transformer_params", &ModelArch::transformer_params)
      .def_readonly("text_hidden", &ModelArch::text_hidden)
      .def_readonly("text_tokens", &ModelArch::text_tokens)
      .def_readonly("text_encoder_params", &ModelArch::text_encoder_params)
      .def_readonly("vae_stride_t", &ModelArch::vae_stride_t)
      .def_readonly("vae_stride_s", &ModelArch::vae_stride_s)
      .def_readonly("latent_channels", &ModelArch::latent_channels)
      .def_readonly("patch_t", &ModelArch::patch_t)
      .def_readonly("patch_s", &ModelArch::patch_s)
      .def_readonly("vae_decode_flops_per_pixel", &ModelArch::vae_decode_flops_per_pixel)
      .def_readonly("vae_decoder_convs", &ModelArch::vae_decoder_convs)
      .def_readonly("vae_halo_channels", &ModelArch::vae_halo_channels)
      .def_readonly("vae_mid_channels", &ModelArch::vae_mid_channels)
      .def_readonly("sampler_history_latents", &ModelArch::sampler_history_latents)
      .def_readonly("default_height", &ModelArch::default_height)
      .def_readonly("default_width", &ModelArch::default_width)
      .def_readonly("default_frames", &ModelArch::default_frames)
      .def_readonly("default_steps", &ModelArch::default_steps)
      .def_readonly("default_guidance", &ModelArch::default_guidance)
      .def_readonly("max_steps", &ModelArch::max_steps)
      .def_readonly("max_pixels", &ModelArch::max_pixels)
      .def_readonly("max_frames", &ModelArch::max_frames)
      .def_readonly("max_tokens", &ModelArch::max_tokens)
      .def("replace", &replaceModelArch, "a copy with the named fields replaced")
      .def("spatial_multiple", &ModelArch::spatialMultiple, "height and width must be multiples of this")
      .def("tokens", &ModelArch::tokens, py::arg("height"), py::arg("width"), py::arg("num_frames") = 1,
           "image/video tokens of a request of this size")
      .def("__repr__", [](const ModelArch& a) { return "<gfdit._C.cost.ModelArch " + a.name + ">"; });

  py::class_<Hardware>(c, "Hardware", "one device type (datasheet rates and fitted efficiency factors)")
      .def_readonly("name", &Hardware::name)
      .def_readonly("peak_flops", &Hardware::peak_flops)
      .def_readonly("mem_bw", &Hardware::mem_bw)
      .def_readonly("link_bw", &Hardware::link_bw)
      .def_readonly("inter_node_bw", &Hardware::inter_node_bw)
      .def_readonly("collective_latency_s", &Hardware::collective_latency_s)
      .def_readonly("inter_node_latency_s", &Hardware::inter_node_latency_s)
      .def_readonly("matmul_efficiency", &Hardware::matmul_efficiency)
      .def_readonly("attention_efficiency", &Hardware::attention_efficiency)
      .def_readonly("half_efficiency_tokens", &Hardware::half_efficiency_tokens)
      .def_readonly("regroup_s", &Hardware::regroup_s)
      .def_readonly("ranks_per_node", &Hardware::ranks_per_node)
      .def_readonly("num_cores", &Hardware::num_cores)
      .def_readonly("conv_efficiency", &Hardware::conv_efficiency)
      .def_readonly("layer_overhead_s", &Hardware::layer_overhead_s)
      .def_readonly("dtype_bytes", &Hardware::dtype_bytes)
      .def_readonly("peer_latency_s", &Hardware::peer_latency_s)
      .def_readonly("async_launch", &Hardware::async_launch)
      .def_readonly("peer_host_s", &Hardware::peer_host_s)
      .def_readonly("conv_layer_overhead_s", &Hardware::conv_layer_overhead_s)
      .def_readonly("mem_bytes", &Hardware::mem_bytes)
      .def("replace", &replaceHardware, "a copy with the named fields replaced")
      .def("__repr__", [](const Hardware& h) { return "<gfdit._C.cost.Hardware " + h.name + ">"; });

  py::class_<Cluster>(c, "Cluster", "nodes of ranks of one hardware")
      .def_readonly("name", &Cluster::name)
      .def_readonly("hw", &Cluster::hw)
      .def_readonly("num_ranks", &Cluster::num_ranks)
      .def_readonly("ranks_per_node", &Cluster::ranks_per_node)
      .def("node_of", &Cluster::nodeOf, py::arg("rank"), "node of a rank")
      .def(
          "replace",
          [](const Cluster& cl, py::object hw, py::object num_ranks) {
            Cluster out = cl;
            if (!hw.is_none()) out.hw = hw.cast<Hardware>();
            if (!num_ranks.is_none()) out.num_ranks = num_ranks.cast<int32_t>();
            return out;
          },
          py::kw_only(), py::arg("hw") = py::none(), py::arg("num_ranks") = py::none(),
          "a copy with another hardware or rank count")
      .def("__repr__", [](const Cluster& cl) {
        return "<gfdit._C.cost.Cluster " + cl.name + " " + std::to_string(cl.num_ranks) + " x " + cl.hw.name + ">";
      });

  c.def("model_arch", &cost::modelArch, py::arg("name"), py::return_value_policy::copy, "a known model");
  c.def("model_names", &cost::modelNames, "names of the known models");
  c.def("loadable_model_names", &cost::loadableModelNames, "the names gfdit.models.load takes");
  c.def("hardware", &cost::hardware, py::arg("name"), py::return_value_policy::copy, "a known hardware");
  c.def("hardware_names", &cost::hardwareNames, "names of the known hardware");
  c.def("cluster", &cost::cluster, py::arg("name"), py::arg("num_ranks") = 0,
        "a known cluster; num_ranks > 0 overrides its rank count (needed for 'cpu')");
  c.def("cluster_names", &cost::clusterNames, "names of the known clusters");

  py::class_<CostModel, std::shared_ptr<CostModel>>(c, "CostModel", "predicts stage times in seconds")
      .def(
          "seconds",
          [](const CostModel& cm, Stage stage, int32_t height, int32_t width, int32_t num_frames, int32_t num_steps,
             double guidance_scale, int32_t degree, int32_t ulysses, int32_t ring, py::handle mode, int32_t num_nodes,
             int32_t num_new, py::handle placement, int32_t cfg, int32_t batch, py::handle cache, py::handle cached) {
            cost::StageQuery q;
            q.shape = shapeOf(cm.model(), height, width, num_frames, num_steps, guidance_scale);
            q.shape.cache = python::cacheSpecArg(cache);
            q.cached = cached.is_none() ? CacheKind::kNone : python::cacheKindArg(cached, "cached");
            q.degree = degree;
            q.layout.ulysses = ulysses;
            q.layout.ring = ring;
            q.layout.mode = python::layoutModeArg(mode, "mode");
            q.layout.placement = python::placementArg(placement, "placement");
            q.layout.cfg = cfg;
            q.num_nodes = num_nodes;
            q.num_new = num_new;
            q.batch = batch;
            return cm.seconds(stage, q);
          },
          py::arg("stage"), py::arg("height"), py::arg("width"), py::arg("num_frames") = 1, py::arg("num_steps") = 1,
          py::arg("guidance_scale") = 1.0, py::arg("degree") = 1, py::arg("ulysses") = 1, py::arg("ring") = 1,
          py::arg("mode") = LayoutMode::kUsp, py::arg("num_nodes") = 1, py::arg("num_new") = 0,
          py::arg("placement") = Placement::kAuto, py::arg("cfg") = 1, py::arg("batch") = 1,
          py::arg("cache") = py::none(), py::arg("cached") = py::none(),
          "seconds `stage` takes for `batch` requests of this size on a group of `degree` ranks (degree = ulysses *"
          " ring * cfg for a step; cfg 2: CFG-parallel; mode and placement: the enum or its name). cache: the "
          "requests' step cache (a CacheSpec, its text or None: what a migration or a gather moves); cached: a step "
          "whose passes all reuse this kind of cache (a CacheKind or its name; None: a full step)")
      .def(
          "skip_curve",
          [](const CostModel& cm, py::handle kind) { return cm.skipCurve(python::cacheKindArg(kind, "kind")); },
          py::arg("kind"), "how often a pass past its warm-up reuses a step cache of `kind`, by threshold")
      .def(
          "skip_rate",
          [](const CostModel& cm, py::handle kind, double threshold) {
            return cm.skipRate(python::cacheKindArg(kind, "kind"), threshold);
          },
          py::arg("kind"), py::arg("threshold"), "skip_curve(kind).at(threshold)")
      .def("describe", &CostModel::describe, "a one-line description")
      .def_property_readonly(
          "model", [](const CostModel& cm) { return cm.model(); }, "the model it predicts for")
      .def("__repr__", [](const CostModel& cm) { return "<gfdit._C.cost.CostModel " + cm.describe() + ">"; });

  c.def(
      "analytic",
      [](const std::string& model_name, const Cluster& cluster) {
        return cost::makeAnalyticCostModel(cost::modelArch(model_name), cluster);
      },
      py::arg("model_name"), py::arg("cluster"), "the analytic cost model of a model on a cluster");
  c.def(
      "analytic",
      [](const ModelArch& model, const Cluster& cluster) { return cost::makeAnalyticCostModel(model, cluster); },
      py::arg("model"), py::arg("cluster"), "the analytic cost model of a (modified) ModelArch on a cluster");
  c.def(
      "best_decode_degree",
      [](const CostModel& cm, int32_t height, int32_t width, int32_t num_frames, int32_t max_degree,
         int32_t ranks_per_node) {
        return cost::bestDecodeDegree(cm, shapeOf(cm.model(), height, width, num_frames, 1, 1.0), max_degree,
                                      ranks_per_node);
      },
      py::arg("cost_model"), py::arg("height"), py::arg("width"), py::arg("num_frames") = 1, py::kw_only(),
      py::arg("max_degree"), py::arg("ranks_per_node") = 0,
      "the decode degree in [1, max_degree] (at most the latent's rows) with the fewest predicted seconds; degrees"
      " the model refuses are skipped");
  c.def(
      "activation_bytes_per_rank",
      [](const ModelArch& model, int32_t height, int32_t width, int32_t num_frames, int32_t degree, int32_t batch,
         int32_t cfg, int32_t dtype_bytes) {
        return cost::activationBytesPerRank(
            model, dtype_bytes, queryOf(shapeOf(model, height, width, num_frames, 1, 1.0), degree, batch, cfg));
      },
      py::arg("model"), py::arg("height"), py::arg("width"), py::arg("num_frames") = 1, py::kw_only(),
      py::arg("degree") = 1, py::arg("batch") = 1, py::arg("cfg") = 1, py::arg("dtype_bytes") = 2,
      "activation bytes one rank holds at the peak of a denoising pass of `batch` requests (an estimate)");
  c.def(
      "max_batch",
      [](const ModelArch& model, const Hardware& hw, int32_t height, int32_t width, int32_t num_frames, int32_t degree,
         int32_t cfg) {
        return cost::maxBatch(model, hw, queryOf(shapeOf(model, height, width, num_frames, 1, 1.0), degree, 1, cfg));
      },
      py::arg("model"), py::arg("hardware"), py::arg("height"), py::arg("width"), py::arg("num_frames") = 1,
      py::kw_only(), py::arg("degree") = 1, py::arg("cfg") = 1,
      "the largest batch whose weights and activations fit a rank's memory (0: not one request)");

  // The schema of a profile file's entries (gfdit.planning.cost reads and writes the files): every field.
  py::class_<ProfileEntry>(c, "ProfileEntry", "one measurement of a profile")
      .def(py::init([](Stage stage, int64_t tokens, int32_t degree, int32_t ulysses, int32_t ring, py::handle mode,
                       bool guidance, int32_t num_new, double seconds, int32_t cfg, int32_t samples, int32_t batch) {
             ProfileEntry e;
             e.stage = stage;
             e.tokens = tokens;
             e.degree = degree;
             e.ulysses = ulysses;
             e.ring = ring;
             e.mode = python::layoutModeArg(mode, "mode");
             e.cfg = cfg;
             e.guidance = guidance;
             e.num_new = num_new;
             e.seconds = seconds;
             e.samples = samples;
             e.batch = batch;
             return e;
           }),
           py::kw_only(), py::arg("stage") = Stage::kDenoise, py::arg("tokens") = 0, py::arg("degree") = 1,
           py::arg("ulysses") = 1, py::arg("ring") = 1, py::arg("mode") = LayoutMode::kUsp, py::arg("guidance") = false,
           py::arg("num_new") = 0, py::arg("seconds") = 0.0, py::arg("cfg") = 1, py::arg("samples") = 0,
           py::arg("batch") = 1, "mode: a LayoutMode or its name")
      .def_readwrite("stage", &ProfileEntry::stage)
      .def_readwrite("tokens", &ProfileEntry::tokens, "image/video tokens of the request")
      .def_readwrite("degree", &ProfileEntry::degree, "ranks in the group")
      .def_readwrite("ulysses", &ProfileEntry::ulysses)
      .def_readwrite("ring", &ProfileEntry::ring)
      .def_property(
          "mode", [](const ProfileEntry& e) { return e.mode; },
          [](ProfileEntry& e, py::handle v) { e.mode = python::layoutModeArg(v, "mode"); },
          "a LayoutMode (set: it or its name)")
      .def_readwrite("cfg", &ProfileEntry::cfg, "2: CFG-parallel (degree = ulysses * ring * cfg for a step)")
      .def_readwrite("guidance", &ProfileEntry::guidance, "two transformer passes per step")
      .def_readwrite("num_new", &ProfileEntry::num_new, "migrate: members that received the state")
      .def_readwrite("batch", &ProfileEntry::batch, "requests served together")
      .def_readwrite("seconds", &ProfileEntry::seconds, "median measured time")
      .def_readwrite("samples", &ProfileEntry::samples, "measurements the median is of (0: not recorded)")
      .def("__repr__", [](const ProfileEntry& e) {
        return std::string("<gfdit._C.cost.ProfileEntry ") + cost::stageName(e.stage) + " " + std::to_string(e.tokens) +
               " tokens, degree " + std::to_string(e.degree) + ", " + layoutModeName(e.mode) + " " +
               std::to_string(e.ulysses) + "x" + std::to_string(e.ring) + (e.cfg == 2 ? " cfg2" : "") +
               (e.batch != 1 ? ", batch " + std::to_string(e.batch) : std::string()) + ", " +
               std::to_string(e.seconds) + " s>";
      });

  py::class_<cost::LinkMeasurement>(c, "LinkMeasurement",
                                    "the link between two nodes as gfdit profile --network measured it")
      .def(py::init<>())
      .def_readwrite("node_a", &cost::LinkMeasurement::node_a)
      .def_readwrite("node_b", &cost::LinkMeasurement::node_b)
      .def_readwrite("ranks_per_node", &cost::LinkMeasurement::ranks_per_node,
                     "ranks on each of the two nodes (each sent to its counterpart at once)")
      .def_readwrite("stream_bytes_per_s", &cost::LinkMeasurement::stream_bytes_per_s,
                     "one large send/recv from one rank to one rank")
      .def_readwrite("concurrent_bytes_per_s", &cost::LinkMeasurement::concurrent_bytes_per_s,
                     "every rank of one node to its counterpart at once, all of them together")
      .def_readwrite("round_trip_s", &cost::LinkMeasurement::round_trip_s, "a small send/recv and back")
      .def_readwrite("collective_s", &cost::LinkMeasurement::collective_s,
                     "a small all_to_all of two members, one on each node")
      .def_readwrite("intra_collective_s", &cost::LinkMeasurement::intra_collective_s,
                     "the same with both members on one node (0: not measured)")
      .def_readwrite("line_bytes_per_s", &cost::LinkMeasurement::line_bytes_per_s,
                     "the link's nominal rate per direction, as its owner states it (0: unknown)")
      .def("__repr__", [](const cost::LinkMeasurement& l) {
        return "<gfdit._C.cost.LinkMeasurement nodes " + std::to_string(l.node_a) + "-" + std::to_string(l.node_b) +
               ", " + std::to_string(l.concurrent_bytes_per_s / 1e6) + " MB/s concurrent, " +
               std::to_string(l.collective_s * 1e6) + " us a collective>";
      });
  c.def("calibrated_cluster", &cost::calibratedCluster, py::arg("cluster"), py::arg("links"),
        "the cluster with the inter-node terms fitted to measured links (NOTE [inter-node calibration])");
  c.def("transferred_cluster", &cost::transferredCluster, py::arg("cluster"), py::arg("links"),
        "another cluster with its inter-node terms scaled by how measured links compare with the model's "
        "assumptions (NOTE [inter-node calibration])");

  py::class_<Profile>(c, "Profile", "measured stage times of one model on one machine")
      .def(py::init<>())
      .def_readwrite("model", &Profile::model)
      .def_readwrite("hardware", &Profile::hardware)
      .def_readwrite("world_size", &Profile::world_size)
      .def_readwrite("num_cores", &Profile::num_cores)
      .def_readwrite("dispatch_s", &Profile::dispatch_s)
      .def_readwrite("completion_s", &Profile::completion_s)
      .def_readwrite("collective_efficiency", &Profile::collective_efficiency)
      .def_readwrite("entries", &Profile::entries, "the measurements (a list; assign a new list to change it)")
      .def_readwrite("skip_curves", &Profile::skip_curves,
                     "measured skip curves of the step caches, at most one per kind (a list)")
      .def_readwrite("fbcache_step_ratio", &Profile::fbcache_step_ratio,
                     "a step whose passes all reuse fbcache over a full step (0: not measured)")
      .def_readwrite("teacache_step_ratio", &Profile::teacache_step_ratio,
                     "a step whose passes all reuse teacache over a full step (0: not measured)")
      .def_readwrite("links", &Profile::links,
                     "the links between the nodes measured (gfdit profile --network; a list, empty: one node)");
  c.def("with_skip_curves", &cost::withSkipCurves, py::arg("model"), py::arg("curves"),
        "`model` with other skip curves (a list of SkipCurve, one per kind): a what-if for a model without one");
  c.def(
      "published_skip_curve",
      [](const std::string& model, py::handle kind) {
        return cost::publishedSkipCurve(model, python::cacheKindArg(kind, "kind"));
      },
      py::arg("model"), py::arg("kind"), "the skip curve published for a model (empty where none is)");
  c.def(
      "cached_step_fraction",
      [](const ModelArch& model, py::handle kind) {
        return cost::cachedStepFraction(model, python::cacheKindArg(kind, "kind"));
      },
      py::arg("model"), py::arg("kind"),
      "the share of a full step a step whose passes all reuse a cache takes, from the model's blocks alone");

  c.def("profiled", &cost::makeProfiledCostModel, py::arg("profile"),
        "a cost model interpolating a profile's measurements");
}

}  // namespace python
}  // namespace gfdit
