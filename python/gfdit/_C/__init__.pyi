"""
gfdit C++ core: group-free collectives
"""

from __future__ import annotations
import collections.abc
import typing
from . import cost
from . import runtime
from . import settings

__all__: list[str] = [
    "DType",
    "Error",
    "Group",
    "HeapBlock",
    "InvalidUsage",
    "ReduceOp",
    "RemoteError",
    "SystemError",
    "Timeout",
    "World",
    "WorldStats",
    "build_info",
    "cost",
    "has_device_transport",
    "measure_copy_table",
    "runtime",
    "settings",
]

class DType:
    """
    Members:

      float32

      float16

      bfloat16

      int32

      int64

      uint8

      float64
    """

    __members__: typing.ClassVar[
        dict[str, DType]
    ]  # value = {'float32': <DType.float32: 0>, 'float16': <DType.float16: 1>, 'bfloat16': <DType.bfloat16: 2>, 'int32': <DType.int32: 3>, 'int64': <DType.int64: 4>, 'uint8': <DType.uint8: 5>, 'float64': <DType.float64: 6>}
    bfloat16: typing.ClassVar[DType]  # value = <DType.bfloat16: 2>
    float16: typing.ClassVar[DType]  # value = <DType.float16: 1>
    float32: typing.ClassVar[DType]  # value = <DType.float32: 0>
    float64: typing.ClassVar[DType]  # value = <DType.float64: 6>
    int32: typing.ClassVar[DType]  # value = <DType.int32: 3>
    int64: typing.ClassVar[DType]  # value = <DType.int64: 4>
    uint8: typing.ClassVar[DType]  # value = <DType.uint8: 5>
    @typing.overload
    def __eq__(self, other: DType) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: DType) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class Error(RuntimeError):
    message: typing.ClassVar[str] = ""
    param = None
    where = None
    @staticmethod
    def __init__(*args, **kwargs):
        """
        (self: object, message: object = '', *, param: object = None, where: object = None) -> None
        """

class Group:
    def __len__(self) -> int: ...
    def __repr__(self) -> str: ...
    def index_of(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> int:
        """
        Index of a global rank, or -1.
        """
    def rank(self) -> int:
        """
        Index of the calling rank in the group, or -1 when it is not a member.
        """
    def rank_at(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> int:
        """
        Global rank of member idx.
        """
    def size(self) -> int:
        """
        Number of members.
        """
    @property
    def is_member(self) -> bool:
        """
        Whether the calling rank is a member.
        """
    @property
    def ranks(self) -> list[int]: ...

class HeapBlock:
    @property
    def __cuda_array_interface__(self) -> typing.Any: ...
    @property
    def address(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def device(self) -> bool: ...

class InvalidUsage(Error, ValueError):
    pass

class ReduceOp:
    """
    Members:

      sum

      max

      min

      prod
    """

    __members__: typing.ClassVar[
        dict[str, ReduceOp]
    ]  # value = {'sum': <ReduceOp.sum: 0>, 'max': <ReduceOp.max: 1>, 'min': <ReduceOp.min: 2>, 'prod': <ReduceOp.prod: 3>}
    max: typing.ClassVar[ReduceOp]  # value = <ReduceOp.max: 1>
    min: typing.ClassVar[ReduceOp]  # value = <ReduceOp.min: 2>
    prod: typing.ClassVar[ReduceOp]  # value = <ReduceOp.prod: 3>
    sum: typing.ClassVar[ReduceOp]  # value = <ReduceOp.sum: 0>
    @typing.overload
    def __eq__(self, other: ReduceOp) -> bool: ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool: ...
    def __getstate__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __int__(self) -> int: ...
    @typing.overload
    def __ne__(self, other: ReduceOp) -> bool: ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool: ...
    def __repr__(self) -> str: ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None: ...
    def __str__(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class RemoteError(Timeout):
    pass

class SystemError(Error, OSError):
    pass

class Timeout(Error, TimeoutError):
    pass

class World:
    @staticmethod
    def create(
        rank: typing.SupportsInt | typing.SupportsIndex,
        world_size: typing.SupportsInt | typing.SupportsIndex,
        store: typing.Any,
        timeout_s: typing.SupportsFloat | typing.SupportsIndex,
        heap_bytes: typing.SupportsInt | typing.SupportsIndex,
        slot_bytes: typing.SupportsInt | typing.SupportsIndex = 0,
        num_slots: typing.SupportsInt | typing.SupportsIndex = 0,
        spin_us: typing.SupportsInt | typing.SupportsIndex = -1,
        key_prefix: str = "gfdit",
        device: typing.SupportsInt | typing.SupportsIndex = -1,
        shm_prefix: str = "gfdit",
    ) -> World: ...
    def all_gather(
        self,
        group: Group,
        inp: typing.SupportsInt | typing.SupportsIndex,
        out: typing.SupportsInt | typing.SupportsIndex,
        bytes: typing.SupportsInt | typing.SupportsIndex,
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def all_gather_v(
        self,
        group: Group,
        inp: tuple[
            typing.SupportsInt | typing.SupportsIndex,
            typing.SupportsInt | typing.SupportsIndex,
            typing.SupportsInt | typing.SupportsIndex,
            typing.SupportsInt | typing.SupportsIndex,
        ],
        outs: collections.abc.Sequence[
            tuple[
                typing.SupportsInt | typing.SupportsIndex,
                typing.SupportsInt | typing.SupportsIndex,
                typing.SupportsInt | typing.SupportsIndex,
                typing.SupportsInt | typing.SupportsIndex,
            ]
        ],
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def all_reduce(
        self,
        group: Group,
        data: typing.SupportsInt | typing.SupportsIndex,
        count: typing.SupportsInt | typing.SupportsIndex,
        dtype: DType,
        op: ReduceOp,
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def all_to_all(
        self,
        group: Group,
        inp: typing.SupportsInt | typing.SupportsIndex,
        out: typing.SupportsInt | typing.SupportsIndex,
        bytes: typing.SupportsInt | typing.SupportsIndex,
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def all_to_all_v(
        self,
        group: Group,
        ins: collections.abc.Sequence[
            tuple[
                typing.SupportsInt | typing.SupportsIndex,
                typing.SupportsInt | typing.SupportsIndex,
                typing.SupportsInt | typing.SupportsIndex,
                typing.SupportsInt | typing.SupportsIndex,
            ]
        ],
        outs: collections.abc.Sequence[
            tuple[
                typing.SupportsInt | typing.SupportsIndex,
                typing.SupportsInt | typing.SupportsIndex,
                typing.SupportsInt | typing.SupportsIndex,
                typing.SupportsInt | typing.SupportsIndex,
            ]
        ],
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def barrier(self, group: Group, stream: typing.SupportsInt | typing.SupportsIndex = 0) -> None: ...
    def broadcast(
        self,
        group: Group,
        data: typing.SupportsInt | typing.SupportsIndex,
        bytes: typing.SupportsInt | typing.SupportsIndex,
        root: typing.SupportsInt | typing.SupportsIndex,
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def check(self) -> None:
        """
        Raises an error a device transport found asynchronously (a device-side wait that expired).
        """
    def heap_alloc(
        self, bytes: typing.SupportsInt | typing.SupportsIndex, device: bool = False
    ) -> HeapBlock: ...
    def heap_offset(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> int: ...
    def heap_used(self, device: bool = False) -> int: ...
    def host_of(self, rank: typing.SupportsInt | typing.SupportsIndex) -> str:
        """
        The host name `rank` reported.
        """
    def in_heap(
        self, arg0: typing.SupportsInt | typing.SupportsIndex, arg1: typing.SupportsInt | typing.SupportsIndex
    ) -> bool: ...
    def new_group(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> Group:
        """
        A group of the given ranks: local, no communication.
        """
    def node_of(self, rank: typing.SupportsInt | typing.SupportsIndex) -> int:
        """
        The node `rank` runs on: ranks whose hosts share memory share one (GFDIT_NODE_IDS overrides).
        """
    def put_with_signal(
        self,
        peer: typing.SupportsInt | typing.SupportsIndex,
        src: typing.SupportsInt | typing.SupportsIndex,
        bytes: typing.SupportsInt | typing.SupportsIndex,
        offset: typing.SupportsInt | typing.SupportsIndex,
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def recv(
        self,
        data: typing.SupportsInt | typing.SupportsIndex,
        bytes: typing.SupportsInt | typing.SupportsIndex,
        src: typing.SupportsInt | typing.SupportsIndex,
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def reduce_scatter(
        self,
        group: Group,
        inp: typing.SupportsInt | typing.SupportsIndex,
        out: typing.SupportsInt | typing.SupportsIndex,
        count: typing.SupportsInt | typing.SupportsIndex,
        dtype: DType,
        op: ReduceOp,
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def remote(self, rank: typing.SupportsInt | typing.SupportsIndex) -> bool:
        """
        Whether this rank talks to `rank` over the network (NOTE [network edges]).
        """
    def send(
        self,
        data: typing.SupportsInt | typing.SupportsIndex,
        bytes: typing.SupportsInt | typing.SupportsIndex,
        dst: typing.SupportsInt | typing.SupportsIndex,
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def set_message_tag(self, tag: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Labels the messages of the collectives that follow (see NOTE [message tags]); 0 is the default.
        """
    def set_timeout(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None: ...
    def stats(self) -> WorldStats: ...
    def symmetric_alloc(
        self, group: Group, bytes: typing.SupportsInt | typing.SupportsIndex, device: bool = False
    ) -> HeapBlock:
        """
        A heap block at the same offset on every member of the group (collective; NOTE [symmetric allocation]).
        """
    def wait_signal(
        self,
        peer: typing.SupportsInt | typing.SupportsIndex,
        count: typing.SupportsInt | typing.SupportsIndex = 1,
        stream: typing.SupportsInt | typing.SupportsIndex = 0,
    ) -> None: ...
    def watch_abort(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Waits fail once the 64-bit word at `address` changes (the runtime's abort counter).
        """
    def world_group(self) -> Group: ...
    @property
    def device(self) -> int:
        """
        The CUDA device of the device transport, or -1.
        """
    @property
    def message_tag(self) -> int: ...
    @property
    def net_port(self) -> int:
        """
        The TCP port of this rank's network edges, or -1 when every peer shares its memory.
        """
    @property
    def num_slots(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def staged_device(self) -> int:
        """
        The device asked for by a world that spans hosts (staged through host memory), or -1.
        """
    @property
    def timeout_s(self) -> float: ...
    @property
    def usable(self) -> bool:
        """
        False once an error broke this world.
        """

class WorldStats:
    @property
    def all_gathers(self) -> int: ...
    @property
    def blocking_waits(self) -> int: ...
    @property
    def collectives(self) -> int: ...
    @property
    def messages_sent(self) -> int: ...
    @property
    def net_bytes_received(self) -> int: ...
    @property
    def net_bytes_sent(self) -> int: ...
    @property
    def staged_bytes(self) -> int: ...
    @property
    def zero_copy_sends(self) -> int: ...

def build_info() -> dict: ...
def has_device_transport() -> bool:
    """
    Whether worlds can have a device transport (a CUDA build, enabled).
    """

def measure_copy_table(
    device: typing.SupportsInt | typing.SupportsIndex = 0,
    min_bytes: typing.SupportsInt | typing.SupportsIndex = 4096,
    max_bytes: typing.SupportsInt | typing.SupportsIndex = 268435456,
    iterations: typing.SupportsInt | typing.SupportsIndex = 20,
) -> dict:
    """
    Times the CUDA copy paths (sm, tma, ce) on `device` at sizes min_bytes * 4^k up to max_bytes and returns the fastest per size as a copy table (GFDIT_CUDA_COPY_TABLE's format).
    """
