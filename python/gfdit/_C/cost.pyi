"""
cost model: stage times of a request on a group of ranks
"""

from __future__ import annotations
import collections.abc
import gfdit._C.runtime
import typing

__all__: list[str] = [
    "Cluster",
    "CostModel",
    "Hardware",
    "LinkMeasurement",
    "ModelArch",
    "Profile",
    "ProfileEntry",
    "Stage",
    "activation_bytes_per_rank",
    "analytic",
    "best_decode_degree",
    "cached_step_fraction",
    "calibrated_cluster",
    "cluster",
    "cluster_names",
    "hardware",
    "hardware_names",
    "loadable_model_names",
    "max_batch",
    "model_arch",
    "model_names",
    "profiled",
    "published_skip_curve",
    "stage_from_name",
    "stage_name",
    "transferred_cluster",
    "with_skip_curves",
]

class Cluster:
    """
    nodes of ranks of one hardware
    """
    def __repr__(self) -> str: ...
    def node_of(self, rank: typing.SupportsInt | typing.SupportsIndex) -> int:
        """
        node of a rank
        """
    def replace(self, *, hw: typing.Any = None, num_ranks: typing.Any = None) -> Cluster:
        """
        a copy with another hardware or rank count
        """
    @property
    def hw(self) -> Hardware: ...
    @property
    def name(self) -> str: ...
    @property
    def num_ranks(self) -> int: ...
    @property
    def ranks_per_node(self) -> int: ...

class CostModel:
    """
    predicts stage times in seconds
    """
    def __repr__(self) -> str: ...
    def describe(self) -> str:
        """
        a one-line description
        """
    def seconds(
        self,
        stage: Stage,
        height: typing.SupportsInt | typing.SupportsIndex,
        width: typing.SupportsInt | typing.SupportsIndex,
        num_frames: typing.SupportsInt | typing.SupportsIndex = 1,
        num_steps: typing.SupportsInt | typing.SupportsIndex = 1,
        guidance_scale: typing.SupportsFloat | typing.SupportsIndex = 1.0,
        degree: typing.SupportsInt | typing.SupportsIndex = 1,
        ulysses: typing.SupportsInt | typing.SupportsIndex = 1,
        ring: typing.SupportsInt | typing.SupportsIndex = 1,
        mode: typing.Any = gfdit._C.runtime.LayoutMode.USP,
        num_nodes: typing.SupportsInt | typing.SupportsIndex = 1,
        num_new: typing.SupportsInt | typing.SupportsIndex = 0,
        placement: typing.Any = gfdit._C.runtime.Placement.AUTO,
        cfg: typing.SupportsInt | typing.SupportsIndex = 1,
        batch: typing.SupportsInt | typing.SupportsIndex = 1,
        cache: typing.Any = None,
        cached: typing.Any = None,
    ) -> float:
        """
        seconds `stage` takes for `batch` requests of this size on a group of `degree` ranks (degree = ulysses * ring * cfg for a step; cfg 2: CFG-parallel; mode and placement: the enum or its name). cache: the requests' step cache (a CacheSpec, its text or None: what a migration or a gather moves); cached: a step whose passes all reuse this kind of cache (a CacheKind or its name; None: a full step)
        """
    def skip_curve(self, kind: typing.Any) -> gfdit._C.runtime.SkipCurve:
        """
        how often a pass past its warm-up reuses a step cache of `kind`, by threshold
        """
    def skip_rate(self, kind: typing.Any, threshold: typing.SupportsFloat | typing.SupportsIndex) -> float:
        """
        skip_curve(kind).at(threshold)
        """
    @property
    def model(self) -> ModelArch:
        """
        the model it predicts for
        """

class Hardware:
    """
    one device type (datasheet rates and fitted efficiency factors)
    """
    def __repr__(self) -> str: ...
    def replace(self, **kwargs) -> Hardware:
        """
        a copy with the named fields replaced
        """
    @property
    def async_launch(self) -> bool: ...
    @property
    def attention_efficiency(self) -> float: ...
    @property
    def collective_latency_s(self) -> float: ...
    @property
    def conv_efficiency(self) -> float: ...
    @property
    def conv_layer_overhead_s(self) -> float: ...
    @property
    def dtype_bytes(self) -> int: ...
    @property
    def half_efficiency_tokens(self) -> float: ...
    @property
    def inter_node_bw(self) -> float: ...
    @property
    def inter_node_latency_s(self) -> float: ...
    @property
    def layer_overhead_s(self) -> float: ...
    @property
    def link_bw(self) -> float: ...
    @property
    def matmul_efficiency(self) -> float: ...
    @property
    def mem_bw(self) -> float: ...
    @property
    def mem_bytes(self) -> float: ...
    @property
    def name(self) -> str: ...
    @property
    def num_cores(self) -> int: ...
    @property
    def peak_flops(self) -> float: ...
    @property
    def peer_host_s(self) -> float: ...
    @property
    def peer_latency_s(self) -> float: ...
    @property
    def ranks_per_node(self) -> int: ...
    @property
    def regroup_s(self) -> float: ...

class LinkMeasurement:
    """
    the link between two nodes as gfdit profile --network measured it
    """
    def __init__(self) -> None: ...
    def __repr__(self) -> str: ...
    @property
    def collective_s(self) -> float:
        """
        a small all_to_all of two members, one on each node
        """
    @collective_s.setter
    def collective_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def concurrent_bytes_per_s(self) -> float:
        """
        every rank of one node to its counterpart at once, all of them together
        """
    @concurrent_bytes_per_s.setter
    def concurrent_bytes_per_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def intra_collective_s(self) -> float:
        """
        the same with both members on one node (0: not measured)
        """
    @intra_collective_s.setter
    def intra_collective_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def line_bytes_per_s(self) -> float:
        """
        the link's nominal rate per direction, as its owner states it (0: unknown)
        """
    @line_bytes_per_s.setter
    def line_bytes_per_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def node_a(self) -> int: ...
    @node_a.setter
    def node_a(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def node_b(self) -> int: ...
    @node_b.setter
    def node_b(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def ranks_per_node(self) -> int:
        """
        ranks on each of the two nodes (each sent to its counterpart at once)
        """
    @ranks_per_node.setter
    def ranks_per_node(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def round_trip_s(self) -> float:
        """
        a small send/recv and back
        """
    @round_trip_s.setter
    def round_trip_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def stream_bytes_per_s(self) -> float:
        """
        one large send/recv from one rank to one rank
        """
    @stream_bytes_per_s.setter
    def stream_bytes_per_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...

class ModelArch:
    """
    architecture facts, serving defaults and limits of a model
    """
    def __repr__(self) -> str: ...
    def replace(self, **kwargs) -> ModelArch:
        """
        a copy with the named fields replaced
        """
    def spatial_multiple(self) -> int:
        """
        height and width must be multiples of this
        """
    def tokens(
        self,
        height: typing.SupportsInt | typing.SupportsIndex,
        width: typing.SupportsInt | typing.SupportsIndex,
        num_frames: typing.SupportsInt | typing.SupportsIndex = 1,
    ) -> int:
        """
        image/video tokens of a request of this size
        """
    @property
    def alias(self) -> str: ...
    @property
    def default_frames(self) -> int: ...
    @property
    def default_guidance(self) -> float: ...
    @property
    def default_height(self) -> int: ...
    @property
    def default_steps(self) -> int: ...
    @property
    def default_width(self) -> int: ...
    @property
    def ffn(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def is_video(self) -> bool: ...
    @property
    def joint_attention(self) -> bool: ...
    @property
    def latent_channels(self) -> int: ...
    @property
    def max_frames(self) -> int: ...
    @property
    def max_pixels(self) -> int: ...
    @property
    def max_steps(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def patch_s(self) -> int: ...
    @property
    def patch_t(self) -> int: ...
    @property
    def pipeline(self) -> str:
        """
        the staged pipeline gfdit.models.load builds it with, or ""
        """
    @property
    def sampler_history_latents(self) -> int: ...
    @property
    def text_encoder_params(self) -> float: ...
    @property
    def text_hidden(self) -> int: ...
    @property
    def text_tokens(self) -> int: ...
    @property
    def transformer_params(self) -> float: ...
    @property
    def vae_decode_flops_per_pixel(self) -> float: ...
    @property
    def vae_decoder_convs(self) -> int: ...
    @property
    def vae_halo_channels(self) -> float: ...
    @property
    def vae_mid_channels(self) -> int: ...
    @property
    def vae_stride_s(self) -> int: ...
    @property
    def vae_stride_t(self) -> int: ...

class Profile:
    """
    measured stage times of one model on one machine
    """

    hardware: str
    model: str
    def __init__(self) -> None: ...
    @property
    def collective_efficiency(self) -> float: ...
    @collective_efficiency.setter
    def collective_efficiency(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def completion_s(self) -> float: ...
    @completion_s.setter
    def completion_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def dispatch_s(self) -> float: ...
    @dispatch_s.setter
    def dispatch_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def entries(self) -> list[ProfileEntry]:
        """
        the measurements (a list; assign a new list to change it)
        """
    @entries.setter
    def entries(self, arg0: collections.abc.Sequence[ProfileEntry]) -> None: ...
    @property
    def fbcache_step_ratio(self) -> float:
        """
        a step whose passes all reuse fbcache over a full step (0: not measured)
        """
    @fbcache_step_ratio.setter
    def fbcache_step_ratio(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def links(self) -> list[LinkMeasurement]:
        """
        the links between the nodes measured (gfdit profile --network; a list, empty: one node)
        """
    @links.setter
    def links(self, arg0: collections.abc.Sequence[LinkMeasurement]) -> None: ...
    @property
    def num_cores(self) -> int: ...
    @num_cores.setter
    def num_cores(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def skip_curves(self) -> list[gfdit._C.runtime.SkipCurve]:
        """
        measured skip curves of the step caches, at most one per kind (a list)
        """
    @skip_curves.setter
    def skip_curves(self, arg0: collections.abc.Sequence[gfdit._C.runtime.SkipCurve]) -> None: ...
    @property
    def teacache_step_ratio(self) -> float:
        """
        a step whose passes all reuse teacache over a full step (0: not measured)
        """
    @teacache_step_ratio.setter
    def teacache_step_ratio(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def world_size(self) -> int: ...
    @world_size.setter
    def world_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class ProfileEntry:
    """
    one measurement of a profile
    """

    stage: Stage
    def __init__(
        self,
        *,
        stage: Stage = Stage.DENOISE,
        tokens: typing.SupportsInt | typing.SupportsIndex = 0,
        degree: typing.SupportsInt | typing.SupportsIndex = 1,
        ulysses: typing.SupportsInt | typing.SupportsIndex = 1,
        ring: typing.SupportsInt | typing.SupportsIndex = 1,
        mode: typing.Any = gfdit._C.runtime.LayoutMode.USP,
        guidance: bool = False,
        num_new: typing.SupportsInt | typing.SupportsIndex = 0,
        seconds: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        cfg: typing.SupportsInt | typing.SupportsIndex = 1,
        samples: typing.SupportsInt | typing.SupportsIndex = 0,
        batch: typing.SupportsInt | typing.SupportsIndex = 1,
    ) -> None:
        """
        mode: a LayoutMode or its name
        """
    def __repr__(self) -> str: ...
    @property
    def batch(self) -> int:
        """
        requests served together
        """
    @batch.setter
    def batch(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def cfg(self) -> int:
        """
        2: CFG-parallel (degree = ulysses * ring * cfg for a step)
        """
    @cfg.setter
    def cfg(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def degree(self) -> int:
        """
        ranks in the group
        """
    @degree.setter
    def degree(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def guidance(self) -> bool:
        """
        two transformer passes per step
        """
    @guidance.setter
    def guidance(self, arg0: bool) -> None: ...
    @property
    def mode(self) -> gfdit._C.runtime.LayoutMode:
        """
        a LayoutMode (set: it or its name)
        """
    @mode.setter
    def mode(self, arg1: typing.Any) -> None: ...
    @property
    def num_new(self) -> int:
        """
        migrate: members that received the state
        """
    @num_new.setter
    def num_new(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def ring(self) -> int: ...
    @ring.setter
    def ring(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def samples(self) -> int:
        """
        measurements the median is of (0: not recorded)
        """
    @samples.setter
    def samples(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def seconds(self) -> float:
        """
        median measured time
        """
    @seconds.setter
    def seconds(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def tokens(self) -> int:
        """
        image/video tokens of the request
        """
    @tokens.setter
    def tokens(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def ulysses(self) -> int: ...
    @ulysses.setter
    def ulysses(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class Stage:
    """
    a stage of a request's trajectory

    Members:

      ENCODE

      DENOISE

      MIGRATE

      DECODE

      GATHER
    """

    DECODE: typing.ClassVar[Stage]  # value = <Stage.DECODE: 3>
    DENOISE: typing.ClassVar[Stage]  # value = <Stage.DENOISE: 1>
    ENCODE: typing.ClassVar[Stage]  # value = <Stage.ENCODE: 0>
    GATHER: typing.ClassVar[Stage]  # value = <Stage.GATHER: 4>
    MIGRATE: typing.ClassVar[Stage]  # value = <Stage.MIGRATE: 2>
    __members__: typing.ClassVar[
        dict[str, Stage]
    ]  # value = {'ENCODE': <Stage.ENCODE: 0>, 'DENOISE': <Stage.DENOISE: 1>, 'MIGRATE': <Stage.MIGRATE: 2>, 'DECODE': <Stage.DECODE: 3>, 'GATHER': <Stage.GATHER: 4>}
    @typing.overload
    def __eq__(self, other: Stage) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: Stage) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

def activation_bytes_per_rank(
    model: ModelArch,
    height: typing.SupportsInt | typing.SupportsIndex,
    width: typing.SupportsInt | typing.SupportsIndex,
    num_frames: typing.SupportsInt | typing.SupportsIndex = 1,
    *,
    degree: typing.SupportsInt | typing.SupportsIndex = 1,
    batch: typing.SupportsInt | typing.SupportsIndex = 1,
    cfg: typing.SupportsInt | typing.SupportsIndex = 1,
    dtype_bytes: typing.SupportsInt | typing.SupportsIndex = 2,
) -> float:
    """
    activation bytes one rank holds at the peak of a denoising pass of `batch` requests (an estimate)
    """

@typing.overload
def analytic(model_name: str, cluster: Cluster) -> CostModel:
    """
    the analytic cost model of a model on a cluster
    """

@typing.overload
def analytic(model: ModelArch, cluster: Cluster) -> CostModel:
    """
    the analytic cost model of a (modified) ModelArch on a cluster
    """

def best_decode_degree(
    cost_model: CostModel,
    height: typing.SupportsInt | typing.SupportsIndex,
    width: typing.SupportsInt | typing.SupportsIndex,
    num_frames: typing.SupportsInt | typing.SupportsIndex = 1,
    *,
    max_degree: typing.SupportsInt | typing.SupportsIndex,
    ranks_per_node: typing.SupportsInt | typing.SupportsIndex = 0,
) -> int:
    """
    the decode degree in [1, max_degree] (at most the latent's rows) with the fewest predicted seconds; degrees the model refuses are skipped
    """

def cached_step_fraction(model: ModelArch, kind: typing.Any) -> float:
    """
    the share of a full step a step whose passes all reuse a cache takes, from the model's blocks alone
    """

def calibrated_cluster(cluster: Cluster, links: collections.abc.Sequence[LinkMeasurement]) -> Cluster:
    """
    the cluster with the inter-node terms fitted to measured links (NOTE [inter-node calibration])
    """

def cluster(name: str, num_ranks: typing.SupportsInt | typing.SupportsIndex = 0) -> Cluster:
    """
    a known cluster; num_ranks > 0 overrides its rank count (needed for 'cpu')
    """

def cluster_names() -> list[str]:
    """
    names of the known clusters
    """

def hardware(name: str) -> Hardware:
    """
    a known hardware
    """

def hardware_names() -> list[str]:
    """
    names of the known hardware
    """

def loadable_model_names() -> list[str]:
    """
    the names gfdit.models.load takes
    """

def max_batch(
    model: ModelArch,
    hardware: Hardware,
    height: typing.SupportsInt | typing.SupportsIndex,
    width: typing.SupportsInt | typing.SupportsIndex,
    num_frames: typing.SupportsInt | typing.SupportsIndex = 1,
    *,
    degree: typing.SupportsInt | typing.SupportsIndex = 1,
    cfg: typing.SupportsInt | typing.SupportsIndex = 1,
) -> int:
    """
    the largest batch whose weights and activations fit a rank's memory (0: not one request)
    """

def model_arch(name: str) -> ModelArch:
    """
    a known model
    """

def model_names() -> list[str]:
    """
    names of the known models
    """

def profiled(profile: Profile) -> CostModel:
    """
    a cost model interpolating a profile's measurements
    """

def published_skip_curve(model: str, kind: typing.Any) -> gfdit._C.runtime.SkipCurve:
    """
    the skip curve published for a model (empty where none is)
    """

def stage_from_name(name: str) -> Stage:
    """
    the stage of a name; others raise InvalidUsage listing the valid ones
    """

def stage_name(stage: Stage) -> str:
    """
    name of a stage: encode, denoise, migrate, decode, gather
    """

def transferred_cluster(cluster: Cluster, links: collections.abc.Sequence[LinkMeasurement]) -> Cluster:
    """
    another cluster with its inter-node terms scaled by how measured links compare with the model's assumptions (NOTE [inter-node calibration])
    """

def with_skip_curves(
    model: CostModel, curves: collections.abc.Sequence[gfdit._C.runtime.SkipCurve]
) -> CostModel:
    """
    `model` with other skip curves (a list of SkipCurve, one per kind): a what-if for a model without one
    """
