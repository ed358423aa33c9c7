"""
trajectory runtime: control plane, rings, simulator
"""

from __future__ import annotations
import collections.abc
import gfdit._C
import gfdit._C.cost
import typing

__all__: list[str] = [
    "AgentRelay",
    "AgentRequest",
    "CacheKind",
    "CacheSpec",
    "Decision",
    "EngineLoop",
    "GenerationRequest",
    "LIVENESS_INTERVAL_S",
    "Layout",
    "LayoutFamily",
    "LayoutMode",
    "MAX_PAYLOAD_BYTES",
    "MappedOutput",
    "ModelDefaults",
    "ModelInfo",
    "NODE_PROTOCOL_VERSION",
    "NODE_TIMEOUT_S",
    "NodeHello",
    "NodeRelay",
    "NodeState",
    "NodeWelcome",
    "OutputRef",
    "PendingNode",
    "Placement",
    "Policy",
    "ProbeSample",
    "RemoteWorkerState",
    "RemoteWorkers",
    "RequestCost",
    "RequestLimits",
    "RequestProgress",
    "RequestRecord",
    "RequestResult",
    "RequestState",
    "SchedulerView",
    "SimOutcome",
    "SimRequest",
    "SimResult",
    "Simulator",
    "SkipCurve",
    "StageRecord",
    "TaskError",
    "TaskKind",
    "Transition",
    "WorkerLoop",
    "WorkerTask",
    "best_layout",
    "cache_kind_from_name",
    "cache_kind_name",
    "cached_share",
    "check_request",
    "discard_output",
    "layout_mode_from_name",
    "layout_mode_name",
    "make_policy",
    "max_ulysses_degree",
    "now_ns",
    "open_output",
    "output_prefix",
    "placement_from_name",
    "placement_name",
    "plain_layout",
    "policy_names",
    "task_error_of",
    "unlink_outputs",
    "world_shm_prefix",
]

class AgentRelay:
    """
    A node agent's end of its connection to the engine (include/gfdit/relay.h).
    """
    def __init__(
        self,
        host: str,
        port: typing.SupportsInt | typing.SupportsIndex,
        hello: NodeHello,
        timeout_s: typing.SupportsFloat | typing.SupportsIndex,
        node_timeout_s: typing.SupportsFloat | typing.SupportsIndex = 10.0,
    ) -> None:
        """
        Connects and says hello; raises with the engine's reason when it refuses this node.
        """
    def close(self) -> None:
        """
        Says goodbye and removes every name this node made in /dev/shm.
        """
    def next(
        self, timeout_s: typing.SupportsFloat | typing.SupportsIndex
    ) -> gfdit._C.runtime.AgentRequest | None:
        """
        The engine's next request (an AgentRequest), or None after timeout_s.
        """
    def start(self) -> str:
        """
        Makes this host's rings and starts relaying; returns their name for the workers.
        """
    def worker_died(
        self,
        worker: typing.SupportsInt | typing.SupportsIndex,
        exit_code: typing.SupportsInt | typing.SupportsIndex,
        why: str,
    ) -> None: ...
    def worker_started(
        self,
        worker: typing.SupportsInt | typing.SupportsIndex,
        pid: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    @property
    def engine_address(self) -> str: ...
    @property
    def lost(self) -> bool: ...
    @property
    def queue_fd(self) -> int: ...
    @property
    def welcome(self) -> NodeWelcome: ...
    @property
    def why(self) -> str: ...

class AgentRequest:
    """
    What the engine asks of a node agent.
    """
    class Kind:
        """
        Members:

          KILL

          START

          END
        """

        END: typing.ClassVar[AgentRequest.Kind]  # value = <Kind.END: 3>
        KILL: typing.ClassVar[AgentRequest.Kind]  # value = <Kind.KILL: 1>
        START: typing.ClassVar[AgentRequest.Kind]  # value = <Kind.START: 2>
        __members__: typing.ClassVar[
            dict[str, AgentRequest.Kind]
        ]  # value = {'KILL': <Kind.KILL: 1>, 'START': <Kind.START: 2>, 'END': <Kind.END: 3>}
        @typing.overload
        def __eq__(self, other: AgentRequest.Kind) -> bool: ...
        @typing.overload
        def __eq__(self, other: typing.SupportsInt | typing.SupportsIndex) -> bool: ...
        @typing.overload
        def __eq__(self, other: typing.Any) -> bool: ...
        def __getstate__(self) -> int: ...
        def __hash__(self) -> int: ...
        def __index__(self) -> int: ...
        def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
        def __int__(self) -> int: ...
        @typing.overload
        def __ne__(self, other: AgentRequest.Kind) -> bool: ...
        @typing.overload
        def __ne__(self, other: typing.SupportsInt | typing.SupportsIndex) -> bool: ...
        @typing.overload
        def __ne__(self, other: typing.Any) -> bool: ...
        def __repr__(self) -> str: ...
        def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
        def __str__(self) -> str: ...
        @property
        def name(self) -> str: ...
        @property
        def value(self) -> int: ...

    @property
    def kind(self) -> AgentRequest.Kind: ...
    @property
    def orderly(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def worker(self) -> int: ...

class CacheKind:
    """
    which step cache a request uses

    Members:

      NONE

      FBCACHE

      TEACACHE
    """

    FBCACHE: typing.ClassVar[CacheKind]  # value = <CacheKind.FBCACHE: 1>
    NONE: typing.ClassVar[CacheKind]  # value = <CacheKind.NONE: 0>
    TEACACHE: typing.ClassVar[CacheKind]  # value = <CacheKind.TEACACHE: 2>
    __members__: typing.ClassVar[
        dict[str, CacheKind]
    ]  # value = {'NONE': <CacheKind.NONE: 0>, 'FBCACHE': <CacheKind.FBCACHE: 1>, 'TEACACHE': <CacheKind.TEACACHE: 2>}
    @typing.overload
    def __eq__(self, other: CacheKind) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: CacheKind) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class CacheSpec:
    """
    a request's step cache and its settings
    """

    __hash__: typing.ClassVar[None] = None
    @staticmethod
    def defaults(kind: CacheKind) -> CacheSpec:
        """
        The published defaults of a kind.
        """
    @staticmethod
    def parse(text: str) -> CacheSpec:
        """
        Reads 'kind[:threshold][,warmup=N][,max_skip=M]' ('' or 'none': off); bad text raises InvalidUsage naming cache.
        """
    def __eq__(self, arg0: CacheSpec) -> bool: ...
    def __getstate__(self) -> str: ...
    def __init__(
        self,
        kind: typing.Any = CacheKind.NONE,
        threshold: typing.SupportsFloat | typing.SupportsIndex | None = None,
        warmup: typing.SupportsInt | typing.SupportsIndex | None = None,
        max_skip: typing.SupportsInt | typing.SupportsIndex | None = None,
    ) -> None:
        """
        kind: a CacheKind or its name; unset settings take the kind's defaults; bad values raise InvalidUsage naming cache
        """
    def __repr__(self) -> str: ...
    def __setstate__(self, arg0: str) -> None: ...
    def __str__(self) -> str: ...
    def always_full(
        self,
        step: typing.SupportsInt | typing.SupportsIndex,
        num_steps: typing.SupportsInt | typing.SupportsIndex,
    ) -> bool:
        """
        Whether step `step` of `num_steps` always runs in full (warm-up; teacache's last step).
        """
    def on(self) -> bool:
        """
        Whether a cache is on.
        """
    @property
    def cache_kind(self) -> CacheKind:
        """
        the kind as a CacheKind
        """
    @property
    def kind(self) -> str:
        """
        "none", "fbcache" or "teacache"
        """
    @property
    def max_skip(self) -> int:
        """
        -1: no limit
        """
    @property
    def threshold(self) -> float: ...
    @property
    def warmup(self) -> int: ...

class Decision:
    dispatch_ahead: bool
    layout: Layout
    def __init__(
        self,
        request_id: typing.SupportsInt | typing.SupportsIndex,
        ranks: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        layout: Layout = ...,
        num_steps: typing.SupportsInt | typing.SupportsIndex = 1,
        decode_degree: typing.SupportsInt | typing.SupportsIndex = 0,
        batch: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] = [],
        stage: gfdit._C.cost.Stage = gfdit._C.cost.Stage.DENOISE,
    ) -> None: ...
    @property
    def batch(self) -> list[int]:
        """
        Other ready requests of the same shape and guidance that run these steps with it, one batched forward per step (NOTE [batches])
        """
    @batch.setter
    def batch(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None: ...
    @property
    def decode_degree(self) -> int:
        """
        Ranks the decode splits over after these steps: 0, the cost model's choice.
        """
    @decode_degree.setter
    def decode_degree(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def num_steps(self) -> int: ...
    @num_steps.setter
    def num_steps(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def ranks(self) -> list[int]: ...
    @ranks.setter
    def ranks(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None: ...
    @property
    def request_id(self) -> int: ...
    @request_id.setter
    def request_id(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def stage(self) -> gfdit._C.cost.Stage:
        """
        What it runs: Stage.DENOISE (its steps, after its encode when it has not started), Stage.ENCODE (the encode alone) or Stage.DECODE (the decode, for a policy that places decodes); NOTE [stages]
        """
    @stage.setter
    def stage(self, arg0: gfdit._C.cost.Stage) -> None: ...

class EngineLoop:
    def __init__(
        self,
        num_workers: typing.SupportsInt | typing.SupportsIndex,
        policy: typing.Any,
        cost: gfdit._C.cost.CostModel = None,
        max_inflight_steps: typing.SupportsInt | typing.SupportsIndex = 2,
        task_timeout_s: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        max_attempts: typing.SupportsInt | typing.SupportsIndex = 3,
        ring_bytes: typing.SupportsInt | typing.SupportsIndex = 1048576,
        node_of: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] = [],
        lookahead: bool = True,
    ) -> None: ...
    def await_workers(
        self,
        pids: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex],
        timeout_s: typing.SupportsFloat | typing.SupportsIndex,
    ) -> ModelInfo:
        """
        Waits for every worker's hello; returns the ModelInfo.
        """
    def cancel(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def check(self, request: GenerationRequest) -> None:
        """
        What submit checks, alone: fills the request's unset fields, or raises as submit would.
        """
    def ping(
        self,
        worker: typing.SupportsInt | typing.SupportsIndex,
        count: typing.SupportsInt | typing.SupportsIndex,
        timeout_s: typing.SupportsFloat | typing.SupportsIndex,
    ) -> list[ProbeSample]: ...
    def prepare_replacement(self, worker: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Readies a dead worker's rings for its replacement.
        """
    def set_remote(self, worker: typing.SupportsInt | typing.SupportsIndex, host: RemoteWorkers) -> None:
        """
        The worker runs on another host behind this relay (a NodeRelay): liveness, kill and abort go through it.
        """
    def set_replacing(self, on: bool, reason: str = "") -> None:
        """
        Whether dead workers will be replaced (then the last one's death keeps the requests waiting).
        """
    def set_worker_pid(
        self,
        worker: typing.SupportsInt | typing.SupportsIndex,
        pid: typing.SupportsInt | typing.SupportsIndex,
    ) -> None: ...
    def shutdown(self) -> None: ...
    def start(self) -> None: ...
    def stats(self) -> dict: ...
    def submit(self, request: GenerationRequest) -> int:
        """
        Checks the request (its unset fields take the model's defaults, in place) and queues it; its id.
        """
    def submit_group(
        self, requests: collections.abc.Sequence[GenerationRequest]
    ) -> tuple[list[int], list[GenerationRequest]]:
        """
        Checks every request (none is queued if one fails), then queues them as one group (the n images of one job; the policies batch them where that pays); (their ids, the requests with defaults filled in).
        """
    def take_replacement_error(self, worker: typing.SupportsInt | typing.SupportsIndex) -> str:
        """
        Why the worker's latest replacement was refused at its hello ('' if it was not).
        """
    def wait_updates(
        self, timeout_s: typing.SupportsFloat | typing.SupportsIndex
    ) -> tuple[list[RequestProgress], list[RequestResult]]:
        """
        (progress, results) since the last call; waits up to timeout_s for one.
        """
    @property
    def closed(self) -> bool: ...
    @property
    def limits(self) -> RequestLimits:
        """
        What submit checks requests against.
        """
    @limits.setter
    def limits(self, arg1: RequestLimits) -> None: ...
    @property
    def queue_fd(self) -> int:
        """
        A descriptor of the rings' region, for a replacement worker to inherit.
        """
    @property
    def queue_name(self) -> str: ...

class GenerationRequest:
    """
    A generation request as the engine checks it; unset fields (None) take the model's defaults at submit.
    """
    def __init__(
        self,
        *,
        prompt: typing.Any,
        negative_prompt: typing.Any = None,
        height: typing.Any = None,
        width: typing.Any = None,
        num_frames: typing.Any = None,
        num_inference_steps: typing.Any = None,
        guidance_scale: typing.Any = None,
        guidance_scale_2: typing.Any = None,
        seed: typing.Any = 0,
        priority: typing.Any = 0,
        deadline_s: typing.Any = None,
        cache: typing.Any = None,
    ) -> None:
        """
        Each field is checked for its type here (gfdit.InvalidUsage naming it); its value at submit. cache: a CacheSpec, its text ("fbcache:0.08,warmup=8") or None.
        """
    @property
    def cache(self) -> CacheSpec:
        """
        the step cache (a CacheSpec; kind "none" when off)
        """
    @property
    def deadline_s(self) -> float | None: ...
    @property
    def guidance_scale(self) -> float | None: ...
    @property
    def guidance_scale_2(self) -> float | None: ...
    @property
    def height(self) -> int | None: ...
    @property
    def negative_prompt(self) -> str | None: ...
    @property
    def num_frames(self) -> int | None: ...
    @property
    def num_inference_steps(self) -> int | None: ...
    @property
    def priority(self) -> int: ...
    @property
    def prompt(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def width(self) -> int | None: ...

class Layout:
    """
    parallel layout of a step: ulysses x ring per pass, mode, placement, cfg
    """

    __hash__: typing.ClassVar[None] = None
    def __eq__(self, arg0: Layout) -> bool: ...
    def __init__(
        self,
        ulysses: typing.SupportsInt | typing.SupportsIndex = 1,
        ring: typing.SupportsInt | typing.SupportsIndex = 1,
        mode: typing.Any = LayoutMode.USP,
        placement: typing.Any = Placement.AUTO,
        cfg: typing.SupportsInt | typing.SupportsIndex = 1,
    ) -> None:
        """
        mode and placement: the enum or its name ("torus", "ring-low")
        """
    def __repr__(self) -> str: ...
    def degree(self) -> int:
        """
        Ranks the layout spans: ulysses * ring * cfg.
        """
    def pass_degree(self) -> int:
        """
        Ranks one transformer pass spans: ulysses * ring.
        """
    @property
    def cfg(self) -> int:
        """
        1: the guidance passes in turn; 2: CFG-parallel (one pass per half)
        """
    @cfg.setter
    def cfg(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def mode(self) -> LayoutMode:
        """
        a LayoutMode (set: it or its name)
        """
    @mode.setter
    def mode(self, arg1: typing.Any) -> None: ...
    @property
    def placement(self) -> Placement:
        """
        a Placement (set: it or its name)
        """
    @placement.setter
    def placement(self, arg1: typing.Any) -> None: ...
    @property
    def ring(self) -> int: ...
    @ring.setter
    def ring(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def ulysses(self) -> int: ...
    @ulysses.setter
    def ulysses(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class LayoutFamily:
    """
    Members:

      AUTO

      USP

      SWIFT

      TORUS
    """

    AUTO: typing.ClassVar[LayoutFamily]  # value = <LayoutFamily.AUTO: 0>
    SWIFT: typing.ClassVar[LayoutFamily]  # value = <LayoutFamily.SWIFT: 2>
    TORUS: typing.ClassVar[LayoutFamily]  # value = <LayoutFamily.TORUS: 3>
    USP: typing.ClassVar[LayoutFamily]  # value = <LayoutFamily.USP: 1>
    __members__: typing.ClassVar[
        dict[str, LayoutFamily]
    ]  # value = {'AUTO': <LayoutFamily.AUTO: 0>, 'USP': <LayoutFamily.USP: 1>, 'SWIFT': <LayoutFamily.SWIFT: 2>, 'TORUS': <LayoutFamily.TORUS: 3>}
    @typing.overload
    def __eq__(self, other: LayoutFamily) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: LayoutFamily) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class LayoutMode:
    """
    how one transformer pass splits attention over its members

    Members:

      USP

      TORUS
    """

    TORUS: typing.ClassVar[LayoutMode]  # value = <LayoutMode.TORUS: 1>
    USP: typing.ClassVar[LayoutMode]  # value = <LayoutMode.USP: 0>
    __members__: typing.ClassVar[
        dict[str, LayoutMode]
    ]  # value = {'USP': <LayoutMode.USP: 0>, 'TORUS': <LayoutMode.TORUS: 1>}
    @typing.overload
    def __eq__(self, other: LayoutMode) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: LayoutMode) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class MappedOutput:
    @property
    def bytes(self) -> int: ...

class ModelDefaults:
    """
    A model's serving defaults.
    """
    def __init__(
        self,
        *,
        height: typing.SupportsInt | typing.SupportsIndex,
        width: typing.SupportsInt | typing.SupportsIndex,
        num_frames: typing.SupportsInt | typing.SupportsIndex,
        num_steps: typing.SupportsInt | typing.SupportsIndex,
        guidance_scale: typing.SupportsFloat | typing.SupportsIndex,
    ) -> None: ...
    @property
    def guidance_scale(self) -> float: ...
    @property
    def height(self) -> int: ...
    @property
    def num_frames(self) -> int: ...
    @property
    def num_steps(self) -> int: ...
    @property
    def width(self) -> int: ...

class ModelInfo:
    """
    What a worker reports of the model it loaded (its hello).
    """

    defaults: ModelDefaults
    is_video: bool
    name: str
    two_experts: bool
    def __init__(self) -> None: ...
    def __repr__(self) -> str: ...
    @property
    def cache_kinds(self) -> list[str]:
        """
        the step caches the model implements, by name ("fbcache", "teacache")
        """
    @cache_kinds.setter
    def cache_kinds(self, arg1: collections.abc.Sequence[str]) -> None: ...
    @property
    def heads(self) -> int: ...
    @heads.setter
    def heads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def patch_s(self) -> int: ...
    @patch_s.setter
    def patch_s(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def patch_t(self) -> int: ...
    @patch_t.setter
    def patch_t(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def vae_stride_s(self) -> int: ...
    @vae_stride_s.setter
    def vae_stride_s(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def vae_stride_t(self) -> int: ...
    @vae_stride_t.setter
    def vae_stride_t(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class NodeHello:
    """
    What a node agent says of itself when it connects to an engine.
    """

    host: str
    @staticmethod
    def decode(data: bytes) -> NodeHello: ...
    def __init__(self) -> None: ...
    def encode(self) -> bytes: ...
    @property
    def num_workers(self) -> int: ...
    @num_workers.setter
    def num_workers(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def pid(self) -> int: ...
    @pid.setter
    def pid(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class NodeRelay(RemoteWorkers):
    """
    The engine's end of the node agents' connections (include/gfdit/relay.h).
    """
    def __init__(
        self,
        num_workers: typing.SupportsInt | typing.SupportsIndex,
        address: str,
        port: typing.SupportsInt | typing.SupportsIndex,
        node_timeout_s: typing.SupportsFloat | typing.SupportsIndex = 10.0,
    ) -> None: ...
    def accept(
        self, timeout_s: typing.SupportsFloat | typing.SupportsIndex
    ) -> gfdit._C.runtime.PendingNode | None:
        """
        The next node agent that said a valid hello (a PendingNode), or None after timeout_s.
        """
    def admit(self, id: typing.SupportsInt | typing.SupportsIndex, welcome: NodeWelcome) -> None:
        """
        Takes a pending agent for the welcome's workers and sends it the welcome.
        """
    def close(self) -> None: ...
    def kill(self, worker: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def nodes(self) -> list[NodeState]: ...
    def refusals(self) -> list[str]:
        """
        Why each refused connection was refused, oldest first.
        """
    def refuse(self, id: typing.SupportsInt | typing.SupportsIndex, reason: str) -> None: ...
    def start(self, queue_name: str) -> None:
        """
        Relays between the admitted nodes and the engine's rings.
        """
    def start_worker(self, worker: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Asks the worker's agent to start a new process for it (its rings here were reset).
        """
    def worker_state(self, worker: typing.SupportsInt | typing.SupportsIndex) -> RemoteWorkerState: ...
    @property
    def port(self) -> int: ...

class NodeState:
    @property
    def address(self) -> str: ...
    @property
    def connected(self) -> bool: ...
    @property
    def host(self) -> str: ...
    @property
    def node(self) -> int: ...
    @property
    def why(self) -> str: ...
    @property
    def workers(self) -> list[int]: ...

class NodeWelcome:
    """
    The engine's answer to a node agent it takes: its workers and their start.
    """

    model: str
    model_path: str
    store_host: str
    @staticmethod
    def decode(data: bytes) -> NodeWelcome: ...
    def __init__(self) -> None: ...
    def encode(self) -> bytes: ...
    @property
    def heap_bytes(self) -> int: ...
    @heap_bytes.setter
    def heap_bytes(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def joining(self) -> bool:
        """
        they replace workers of a lost node: they join the world at its next REINIT
        """
    @joining.setter
    def joining(self, arg0: bool) -> None: ...
    @property
    def node(self) -> int: ...
    @node.setter
    def node(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def node_of(self) -> list[int]: ...
    @node_of.setter
    def node_of(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None: ...
    @property
    def store_port(self) -> int: ...
    @store_port.setter
    def store_port(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def threads(self) -> int: ...
    @threads.setter
    def threads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def timeout_s(self) -> float: ...
    @timeout_s.setter
    def timeout_s(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    @property
    def workers(self) -> list[int]: ...
    @workers.setter
    def workers(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None: ...
    @property
    def world_size(self) -> int: ...
    @world_size.setter
    def world_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class OutputRef:
    def __init__(self) -> None: ...
    @property
    def bytes(self) -> int: ...
    @property
    def dtype(self) -> gfdit._C.DType: ...
    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...

class PendingNode:
    """
    A node agent that said a valid hello and waits for the engine's answer.
    """
    @property
    def address(self) -> str: ...
    @property
    def hello(self) -> NodeHello: ...
    @property
    def id(self) -> int: ...

class Placement:
    """
    which axis of the ulysses x ring grid consecutive members form

    Members:

      AUTO

      ULYSSES_LOW

      RING_LOW
    """

    AUTO: typing.ClassVar[Placement]  # value = <Placement.AUTO: 0>
    RING_LOW: typing.ClassVar[Placement]  # value = <Placement.RING_LOW: 2>
    ULYSSES_LOW: typing.ClassVar[Placement]  # value = <Placement.ULYSSES_LOW: 1>
    __members__: typing.ClassVar[
        dict[str, Placement]
    ]  # value = {'AUTO': <Placement.AUTO: 0>, 'ULYSSES_LOW': <Placement.ULYSSES_LOW: 1>, 'RING_LOW': <Placement.RING_LOW: 2>}
    @typing.overload
    def __eq__(self, other: Placement) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: Placement) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class Policy:
    def __init__(self) -> None: ...
    def layouts(self) -> LayoutFamily: ...
    def name(self) -> str: ...
    def places_decodes(self) -> bool:
        """
        Whether it places decodes itself (Decision.stage = Stage.DECODE): a request whose steps are done then waits for its decision instead of decoding on its holders at once.
        """
    def schedule(self, arg0: SchedulerView) -> list[Decision]: ...

class ProbeSample:
    @property
    def dispatch_ns(self) -> int: ...
    @property
    def post_ns(self) -> int: ...
    @property
    def seen_ns(self) -> int: ...
    @property
    def start_ns(self) -> int: ...

class RemoteWorkerState:
    """
    A remote worker as its node agent last reported it.
    """
    @property
    def connected(self) -> bool: ...
    @property
    def exit_code(self) -> int: ...
    @property
    def node(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def running(self) -> bool: ...
    @property
    def why(self) -> str: ...

class RemoteWorkers:
    """
    Workers on other hosts, as the engine loop sees them (EngineLoop.set_remote).
    """

class RequestCost:
    def __repr__(self) -> str: ...
    def cached_step_s(self, degree: typing.SupportsInt | typing.SupportsIndex) -> float:
        """
        Seconds of a step whose passes all reuse the step cache (the full step without one).
        """
    def decode_at(self, degree: typing.SupportsInt | typing.SupportsIndex) -> float:
        """
        Seconds of the decode split over `degree` ranks (decode_s where that degree was not predicted).
        """
    def full_step_s(self, degree: typing.SupportsInt | typing.SupportsIndex) -> float:
        """
        Seconds of a step that computes every block.
        """
    def layout(self, degree: typing.SupportsInt | typing.SupportsIndex) -> Layout:
        """
        The layout step_s(degree) assumes.
        """
    def step_s(self, degree: typing.SupportsInt | typing.SupportsIndex) -> float:
        """
        Seconds of one step on a group of `degree` ranks, the mean over the request's steps of what its step cache is expected to leave of them; inf where not predicted or not allowed.
        """
    def steps_s(
        self,
        degree: typing.SupportsInt | typing.SupportsIndex,
        begin: typing.SupportsInt | typing.SupportsIndex,
        count: typing.SupportsInt | typing.SupportsIndex,
    ) -> float:
        """
        Seconds of steps [begin, begin + count) on `degree` ranks: warm-up steps in full, the others the expected mix of full and cached steps (NOTE [step caches]).
        """
    @property
    def cache(self) -> CacheSpec: ...
    @property
    def cache_share(self) -> float:
        """
        expected share of the steps past the warm-up that reuse the cache
        """
    @property
    def decode_degree(self) -> int: ...
    @property
    def decode_s(self) -> float: ...
    @property
    def encode_s(self) -> float: ...
    @property
    def known(self) -> bool: ...
    @property
    def max_ulysses(self) -> int: ...
    @property
    def migrate_s(self) -> float: ...

class RequestLimits:
    is_video: bool
    @staticmethod
    def of(model: str) -> RequestLimits:
        """
        The limits of a known model.
        """
    @staticmethod
    def of_loaded(model: str, info: ModelInfo) -> RequestLimits:
        """
        The limits of a loaded model: its registry entry's, with the strides its workers reported.
        """
    def __init__(self) -> None: ...
    def check(
        self,
        height: typing.SupportsInt | typing.SupportsIndex,
        width: typing.SupportsInt | typing.SupportsIndex,
        num_frames: typing.SupportsInt | typing.SupportsIndex,
        num_steps: typing.SupportsInt | typing.SupportsIndex,
        guidance_scale: typing.SupportsFloat | typing.SupportsIndex = 1.0,
        cache: typing.Any = None,
    ) -> int:
        """
        Checks a request; returns its tokens or raises InvalidUsage naming the field.
        """
    def tokens(
        self,
        arg0: typing.SupportsInt | typing.SupportsIndex,
        arg1: typing.SupportsInt | typing.SupportsIndex,
        arg2: typing.SupportsInt | typing.SupportsIndex,
    ) -> int: ...
    @property
    def cache_kinds(self) -> int:
        """
        the step caches the model implements, as bits
        """
    @cache_kinds.setter
    def cache_kinds(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def max_frames(self) -> int: ...
    @max_frames.setter
    def max_frames(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def max_pixels(self) -> int: ...
    @max_pixels.setter
    def max_pixels(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def max_steps(self) -> int: ...
    @max_steps.setter
    def max_steps(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def max_tokens(self) -> int: ...
    @max_tokens.setter
    def max_tokens(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def patch_s(self) -> int: ...
    @patch_s.setter
    def patch_s(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def patch_t(self) -> int: ...
    @patch_t.setter
    def patch_t(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def temporal_stride(self) -> int: ...
    @temporal_stride.setter
    def temporal_stride(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    @property
    def vae_stride_s(self) -> int: ...
    @vae_stride_s.setter
    def vae_stride_s(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None: ...

class RequestProgress:
    """
    A change of a request's state, step or ranks.
    """
    @property
    def id(self) -> int: ...
    @property
    def num_steps(self) -> int: ...
    @property
    def ranks(self) -> list[int]: ...
    @property
    def running(self) -> bool: ...
    @property
    def state(self) -> RequestState: ...
    @property
    def step(self) -> int: ...
    @property
    def t_ns(self) -> int: ...

class RequestRecord:
    def __repr__(self) -> str: ...
    def remaining_s(self, degree: typing.SupportsInt | typing.SupportsIndex) -> float:
        """
        Predicted seconds to its end on `degree` ranks (0 without a cost model).
        """
    @property
    def arrival_ns(self) -> int: ...
    @property
    def attempts(self) -> int: ...
    @property
    def batch_leader(self) -> int:
        """
        busy: the request whose batch it runs in (its own id when it leads one), else 0
        """
    @property
    def batch_size(self) -> int: ...
    @property
    def busy(self) -> bool: ...
    @property
    def cache(self) -> CacheSpec:
        """
        its step cache (a CacheSpec)
        """
    @property
    def cost(self) -> RequestCost: ...
    @property
    def deadline_ns(self) -> int: ...
    @property
    def decision_end_ns(self) -> int: ...
    @property
    def group(self) -> int:
        """
        submitted together with the other requests of this group (Engine.submit_batch); 0: none
        """
    @property
    def guidance_scale(self) -> float: ...
    @property
    def height(self) -> int: ...
    @property
    def id(self) -> int: ...
    @property
    def latent_rows(self) -> int: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def max_degree(self) -> int: ...
    @property
    def num_frames(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_steps(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def ranks(self) -> list[int]: ...
    @property
    def state(self) -> RequestState: ...
    @property
    def step(self) -> int: ...
    @property
    def steps_in_flight(self) -> int: ...
    @property
    def steps_left(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def width(self) -> int: ...

class RequestResult:
    @property
    def arrival_ns(self) -> int: ...
    @property
    def deadline_ns(self) -> int: ...
    @property
    def id(self) -> int: ...
    @property
    def output(self) -> OutputRef: ...
    @property
    def priority(self) -> int: ...
    @property
    def reason(self) -> str: ...
    @property
    def stages(self) -> list[StageRecord]: ...
    @property
    def state(self) -> RequestState: ...
    @property
    def transitions(self) -> list[Transition]: ...

class RequestState:
    """
    Members:

      QUEUED

      ENCODING

      DENOISING

      DECODING

      DONE

      FAILED

      CANCELLED
    """

    CANCELLED: typing.ClassVar[RequestState]  # value = <RequestState.CANCELLED: 6>
    DECODING: typing.ClassVar[RequestState]  # value = <RequestState.DECODING: 3>
    DENOISING: typing.ClassVar[RequestState]  # value = <RequestState.DENOISING: 2>
    DONE: typing.ClassVar[RequestState]  # value = <RequestState.DONE: 4>
    ENCODING: typing.ClassVar[RequestState]  # value = <RequestState.ENCODING: 1>
    FAILED: typing.ClassVar[RequestState]  # value = <RequestState.FAILED: 5>
    QUEUED: typing.ClassVar[RequestState]  # value = <RequestState.QUEUED: 0>
    __members__: typing.ClassVar[
        dict[str, RequestState]
    ]  # value = {'QUEUED': <RequestState.QUEUED: 0>, 'ENCODING': <RequestState.ENCODING: 1>, 'DENOISING': <RequestState.DENOISING: 2>, 'DECODING': <RequestState.DECODING: 3>, 'DONE': <RequestState.DONE: 4>, 'FAILED': <RequestState.FAILED: 5>, 'CANCELLED': <RequestState.CANCELLED: 6>}
    @typing.overload
    def __eq__(self, other: RequestState) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: RequestState) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class SchedulerView:
    @property
    def cost(self) -> typing.Any: ...
    @property
    def free_ranks(self) -> list[int]: ...
    @property
    def node_of(self) -> list[int]: ...
    @property
    def now_ns(self) -> int: ...
    @property
    def ready(self) -> list: ...
    @property
    def running(self) -> list: ...
    @property
    def world_size(self) -> int: ...

class SimOutcome:
    @property
    def arrival_s(self) -> float: ...
    @property
    def deadline_s(self) -> typing.Any: ...
    @property
    def finish_s(self) -> float: ...
    @property
    def first_start_s(self) -> float: ...
    @property
    def id(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def state(self) -> str: ...

class SimRequest:
    def __init__(
        self,
        *,
        id: typing.SupportsInt | typing.SupportsIndex,
        arrival_s: typing.SupportsFloat | typing.SupportsIndex,
        height: typing.SupportsInt | typing.SupportsIndex,
        width: typing.SupportsInt | typing.SupportsIndex,
        num_frames: typing.SupportsInt | typing.SupportsIndex = 1,
        num_steps: typing.SupportsInt | typing.SupportsIndex = 0,
        guidance_scale: typing.SupportsFloat | typing.SupportsIndex | None = None,
        deadline_s: typing.SupportsFloat | typing.SupportsIndex | None = None,
        priority: typing.SupportsInt | typing.SupportsIndex = 0,
        cache: typing.Any = None,
    ) -> None: ...
    @property
    def arrival_s(self) -> float: ...
    @property
    def id(self) -> int: ...

class SimResult:
    @property
    def busy_rank_s(self) -> float: ...
    @property
    def cache_passes(self) -> int:
        """
        passes of the steps of requests with a step cache
        """
    @property
    def cached_passes(self) -> int:
        """
        those of them that reused it (drawn)
        """
    @property
    def intervals(self) -> list: ...
    @property
    def makespan_s(self) -> float: ...
    @property
    def num_ranks(self) -> int: ...
    @property
    def num_tasks(self) -> int: ...
    @property
    def requests(self) -> list[SimOutcome]: ...
    @property
    def stats(self) -> dict: ...
    @property
    def wall_s(self) -> float: ...

class Simulator:
    def __init__(
        self,
        cost_model: gfdit._C.cost.CostModel,
        cluster: gfdit._C.cost.Cluster,
        policy: typing.Any,
        max_inflight_steps: typing.SupportsInt | typing.SupportsIndex = 2,
        record_intervals: bool = False,
        dispatch_s: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        completion_s: typing.SupportsFloat | typing.SupportsIndex = 0.0,
        regroup_s: typing.SupportsFloat | typing.SupportsIndex = -1.0,
        num_cores: typing.SupportsInt | typing.SupportsIndex = -1,
        lookahead: bool = True,
        collective_efficiency: typing.SupportsFloat | typing.SupportsIndex = 1.0,
        regroup_every_change: bool = False,
        cache_seed: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def run(self, requests: collections.abc.Sequence[SimRequest]) -> SimResult: ...

class SkipCurve:
    """
    how often a pass past its warm-up reuses a step cache, by threshold
    """
    def __init__(
        self,
        kind: typing.Any,
        points: collections.abc.Sequence[
            tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex]
        ],
        source: str = "",
    ) -> None: ...
    def __repr__(self) -> str: ...
    def at(self, threshold: typing.SupportsFloat | typing.SupportsIndex) -> float:
        """
        The probability at `threshold`.
        """
    @property
    def kind(self) -> CacheKind: ...
    @property
    def points(self) -> list[tuple[float, float]]: ...
    @property
    def source(self) -> str: ...

class StageRecord:
    @property
    def batch(self) -> int:
        """
        requests the task stepped in one batched forward, this one included (NOTE [batches])
        """
    @property
    def cached_passes(self) -> int:
        """
        transformer passes of the task that reused it
        """
    @property
    def cached_steps(self) -> int:
        """
        steps of the task whose every pass reused the step cache (NOTE [step caches])
        """
    @property
    def dispatch_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...
    @property
    def error(self) -> TaskError: ...
    @property
    def kind(self) -> TaskKind: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def num_steps(self) -> int: ...
    @property
    def ranks(self) -> list[int]: ...
    @property
    def regroup(self) -> bool:
        """
        a denoise task on another set of ranks than the request's previous one (NOTE [regroups])
        """
    @property
    def start_ns(self) -> int: ...
    @property
    def step_begin(self) -> int: ...

class TaskError:
    """
    Members:

      OK

      INVALID_REQUEST

      MODEL_ERROR

      COMM_ERROR

      WORKER_DIED

      TIMEOUT

      STATE_LOST
    """

    COMM_ERROR: typing.ClassVar[TaskError]  # value = <TaskError.COMM_ERROR: 3>
    INVALID_REQUEST: typing.ClassVar[TaskError]  # value = <TaskError.INVALID_REQUEST: 1>
    MODEL_ERROR: typing.ClassVar[TaskError]  # value = <TaskError.MODEL_ERROR: 2>
    OK: typing.ClassVar[TaskError]  # value = <TaskError.OK: 0>
    STATE_LOST: typing.ClassVar[TaskError]  # value = <TaskError.STATE_LOST: 6>
    TIMEOUT: typing.ClassVar[TaskError]  # value = <TaskError.TIMEOUT: 5>
    WORKER_DIED: typing.ClassVar[TaskError]  # value = <TaskError.WORKER_DIED: 4>
    __members__: typing.ClassVar[
        dict[str, TaskError]
    ]  # value = {'OK': <TaskError.OK: 0>, 'INVALID_REQUEST': <TaskError.INVALID_REQUEST: 1>, 'MODEL_ERROR': <TaskError.MODEL_ERROR: 2>, 'COMM_ERROR': <TaskError.COMM_ERROR: 3>, 'WORKER_DIED': <TaskError.WORKER_DIED: 4>, 'TIMEOUT': <TaskError.TIMEOUT: 5>, 'STATE_LOST': <TaskError.STATE_LOST: 6>}
    @typing.overload
    def __eq__(self, other: TaskError) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: TaskError) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class TaskKind:
    """
    Members:

      ENCODE

      DENOISE

      MIGRATE

      DECODE

      FREE

      SHUTDOWN

      REINIT

      GATHER
    """

    DECODE: typing.ClassVar[TaskKind]  # value = <TaskKind.DECODE: 4>
    DENOISE: typing.ClassVar[TaskKind]  # value = <TaskKind.DENOISE: 2>
    ENCODE: typing.ClassVar[TaskKind]  # value = <TaskKind.ENCODE: 1>
    FREE: typing.ClassVar[TaskKind]  # value = <TaskKind.FREE: 5>
    GATHER: typing.ClassVar[TaskKind]  # value = <TaskKind.GATHER: 8>
    MIGRATE: typing.ClassVar[TaskKind]  # value = <TaskKind.MIGRATE: 3>
    REINIT: typing.ClassVar[TaskKind]  # value = <TaskKind.REINIT: 7>
    SHUTDOWN: typing.ClassVar[TaskKind]  # value = <TaskKind.SHUTDOWN: 6>
    __members__: typing.ClassVar[
        dict[str, TaskKind]
    ]  # value = {'ENCODE': <TaskKind.ENCODE: 1>, 'DENOISE': <TaskKind.DENOISE: 2>, 'MIGRATE': <TaskKind.MIGRATE: 3>, 'DECODE': <TaskKind.DECODE: 4>, 'FREE': <TaskKind.FREE: 5>, 'SHUTDOWN': <TaskKind.SHUTDOWN: 6>, 'REINIT': <TaskKind.REINIT: 7>, 'GATHER': <TaskKind.GATHER: 8>}
    @typing.overload
    def __eq__(self, other: TaskKind) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: TaskKind) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class Transition:
    @property
    def state(self) -> RequestState: ...
    @property
    def step(self) -> int: ...
    @property
    def t_ns(self) -> int: ...

class WorkerLoop:
    """
    A worker's end of the engine's rings (include/gfdit/worker_loop.h).
    """
    def __init__(
        self,
        queue_name: str,
        worker: typing.SupportsInt | typing.SupportsIndex,
        queue_fd: typing.SupportsInt | typing.SupportsIndex = -1,
    ) -> None: ...
    def complete(self, task: WorkerTask, output: typing.Any = None) -> None:
        """
        The task ran; a DECODE task's output (a contiguous array) goes into shared memory.
        """
    def fail(self, task: WorkerTask, error: typing.Any) -> None:
        """
        The task failed with this exception.
        """
    def held_step(self, request_id: typing.SupportsInt | typing.SupportsIndex) -> int: ...
    def hello(self, info: ModelInfo) -> None: ...
    def hello_failed(self, message: str) -> None: ...
    def next(self, poll_s: typing.SupportsFloat | typing.SupportsIndex) -> gfdit._C.runtime.WorkerTask | None:
        """
        The next task to run, or None once the engine said to stop or is gone.
        """
    def progress(
        self,
        request_id: typing.SupportsInt | typing.SupportsIndex,
        step: typing.SupportsInt | typing.SupportsIndex,
        cached_steps: typing.SupportsInt | typing.SupportsIndex = 0,
        cached_passes: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    @property
    def abort_address(self) -> int: ...
    @property
    def worker(self) -> int: ...
    @property
    def world_broken(self) -> bool: ...
    @property
    def world_shm_prefix(self) -> str: ...

class WorkerTask:
    """
    One task as a worker runs it.
    """
    @property
    def batch(self) -> list[tuple[int, int]]:
        """
        DENOISE of a batch: the other requests it steps with request_id, each with the step it starts at
        """
    @property
    def dispatch_ns(self) -> int: ...
    @property
    def epoch(self) -> int:
        """
        REINIT: the new world's epoch
        """
    @property
    def kind(self) -> TaskKind: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def num_steps(self) -> int: ...
    @property
    def ranks(self) -> list[int]: ...
    @property
    def request(self) -> GenerationRequest:
        """
        ENCODE: the request, every field set
        """
    @property
    def request_id(self) -> int: ...
    @property
    def src_rank(self) -> int: ...
    @property
    def step_begin(self) -> int: ...
    @property
    def task_id(self) -> int: ...
    @property
    def workers(self) -> list[int]:
        """
        REINIT: the workers of the new world, in rank order
        """

def best_layout(
    cost_model: gfdit._C.cost.CostModel,
    height: typing.SupportsInt | typing.SupportsIndex,
    width: typing.SupportsInt | typing.SupportsIndex,
    num_frames: typing.SupportsInt | typing.SupportsIndex,
    num_steps: typing.SupportsInt | typing.SupportsIndex,
    guidance_scale: typing.SupportsFloat | typing.SupportsIndex,
    degree: typing.SupportsInt | typing.SupportsIndex,
    num_nodes: typing.SupportsInt | typing.SupportsIndex = 1,
    family: LayoutFamily = LayoutFamily.AUTO,
) -> tuple[Layout, float]:
    """
    The fastest layout of `family` for one step on `degree` ranks over `num_nodes` nodes, and its seconds.
    """

def cache_kind_from_name(name: str) -> CacheKind:
    """
    the kind of a name; others raise InvalidUsage naming cache
    """

def cache_kind_name(kind: CacheKind) -> str:
    """
    name of a cache kind: none, fbcache, teacache
    """

def cached_share(
    p: typing.SupportsFloat | typing.SupportsIndex, max_skip: typing.SupportsInt | typing.SupportsIndex
) -> float:
    """
    The long-run share of eligible steps that reuse a cache hit with probability p, at most max_skip in a row.
    """

def check_request(
    model: str,
    height: typing.SupportsInt | typing.SupportsIndex,
    width: typing.SupportsInt | typing.SupportsIndex,
    num_frames: typing.SupportsInt | typing.SupportsIndex,
    num_steps: typing.SupportsInt | typing.SupportsIndex,
    guidance_scale: typing.SupportsFloat | typing.SupportsIndex = 1.0,
    cache: typing.Any = None,
) -> int:
    """
    Checks a request against a known model's limits; returns its tokens or raises InvalidUsage naming the field.
    """

def discard_output(ref: OutputRef) -> None: ...
def layout_mode_from_name(name: str) -> LayoutMode:
    """
    the mode of a name; others raise InvalidUsage listing the valid ones
    """

def layout_mode_name(mode: LayoutMode) -> str:
    """
    name of a mode: usp, torus
    """

def make_policy(name: str) -> Policy:
    """
    A built-in policy by name; unknown names raise InvalidUsage listing the built-in ones.
    """

def max_ulysses_degree(heads: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    The largest Ulysses degree a model of `heads` heads allows: the heads (uneven splits allowed), <= 64.
    """

def now_ns() -> int:
    """
    Monotonic nanoseconds, comparable across the processes of a machine.
    """

def open_output(ref: OutputRef) -> MappedOutput:
    """
    Maps an output a worker wrote (writable, private to this process) and removes its name.
    """

def output_prefix(queue_name: str) -> str: ...
def placement_from_name(name: str) -> Placement:
    """
    the placement of a name; others raise InvalidUsage listing the valid ones
    """

def placement_name(placement: Placement) -> str:
    """
    name of a placement: auto, ulysses-low, ring-low
    """

def plain_layout(
    degree: typing.SupportsInt | typing.SupportsIndex, num_heads: typing.SupportsInt | typing.SupportsIndex
) -> Layout:
    """
    The layout policies use without a cost model: Ulysses over gcd(degree, heads), Ring for the rest.
    """

def policy_names() -> list[str]: ...
def task_error_of(error: typing.Any) -> TaskError:
    """
    The TaskError a worker reports for this exception.
    """

def unlink_outputs(prefix: str) -> int: ...
def world_shm_prefix(queue_name: str) -> str: ...

LIVENESS_INTERVAL_S: float = 0.1
MAX_PAYLOAD_BYTES: int = 65536
NODE_PROTOCOL_VERSION: int = 1
NODE_TIMEOUT_S: float = 10.0
