"""The parts of gfdit's CUDA support that need no GPU: device parsing, the clear error of a build without the
CUDA transport, CPU/CUDA mixes refused before any message (checked on fake CUDA tensors, which carry a
device but no memory), the attention record's device checks, and that the CPU path keeps its plan keys,
put order and state headers. Runs everywhere (no GPU here or in CI).
"""

from __future__ import annotations

import datetime
import sys

import gfdit
import pytest
import torch
from gfdit import comm
from gfdit.attention import core, pipeline, plan
from gfdit.attention.torus import _put_order
from gfdit.comm import devices

NO_TRANSPORT = "no CUDA transport"


def _fake_cuda(*shape, dtype=torch.float32):
    """A CUDA tensor without memory (torch's FakeTensorMode works on CPU-only builds)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.empty(shape, dtype=dtype, device="cuda")


@pytest.fixture(scope="module")
def world():
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    w = gfdit.World(0, 1, store, timeout=30.0, heap_bytes=1 << 20)
    yield w


# ------------------------------------------------------------------------------------------ device values
@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("cpu", None),
        (torch.device("cpu"), None),
        (0, 0),
        (3, 3),
        ("cuda", "cuda"),
        ("cuda:1", 1),
        (" cuda:2 ", 2),
        (torch.device("cuda"), "cuda"),
        (torch.device("cuda", 5), 5),
    ],
)
def test_parse_device(value, expected):
    assert comm.parse_device(value) == expected


@pytest.mark.parametrize("value", [-1, True, "gpu", "mps", "cuda:x", 1.5, torch.device("meta")])
def test_parse_device_refuses(value):
    with pytest.raises(gfdit.InvalidUsage):
        comm.parse_device(value)


def test_host_only_is_unchanged():
    assert comm.resolve_device(None) is None
    assert comm.resolve_device("cpu", rank=3) is None


@pytest.mark.skipif(comm.cuda_transport_available(), reason="this build has the CUDA transport")
@pytest.mark.parametrize("value", [0, "cuda", "cuda:0", torch.device("cuda", 0)])
def test_no_transport_is_a_clear_error(value):
    with pytest.raises(gfdit.InvalidUsage, match=NO_TRANSPORT):
        comm.resolve_device(value)
    with pytest.raises(gfdit.InvalidUsage, match=NO_TRANSPORT):
        gfdit.init(0, 1, object(), device=value)  # refused before the store is touched
    assert not gfdit.is_initialized()


@pytest.mark.skipif(comm.cuda_transport_available(), reason="this build has the CUDA transport")
def test_engine_refuses_cuda_before_starting_workers():
    with pytest.raises(gfdit.InvalidUsage, match=NO_TRANSPORT):
        gfdit.Engine(model="tiny-wan", world_size=2, device="cuda")


def test_engine_devices(monkeypatch):
    from gfdit.serving.engine import worker_devices

    monkeypatch.delenv("GFDIT_DEVICE", raising=False)
    assert worker_devices(None, 3) == [None, None, None]
    assert worker_devices("cpu", 2) == [None, None]
    monkeypatch.setenv("GFDIT_DEVICE", "cpu")
    assert worker_devices(None, 2) == [None, None]
    with pytest.raises(gfdit.InvalidUsage, match="one per worker"):
        worker_devices([None], 2)
    with pytest.raises(gfdit.InvalidUsage, match="some workers on the CPU"):
        worker_devices([None, 0], 2)


def test_transport_present_but_no_gpu(monkeypatch):
    """What a CUDA build says on a machine where torch sees no GPU (as here once the transport lands)."""
    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    monkeypatch.setattr(devices, "_HAS_CUDA_TRANSPORT", True)
    with pytest.raises(gfdit.InvalidUsage, match="torch sees no CUDA device"):
        comm.resolve_device("cuda:0")
    with pytest.raises(gfdit.InvalidUsage, match="host only"):
        comm.check_placement("all_reduce", [("tensor", torch.device("cuda", 0))], None)


def test_default_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert [comm.default_device(r) for r in range(5)] == [0, 1, 0, 1, 0]
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert comm.default_device(0) == 1
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(gfdit.InvalidUsage, match="no CUDA device"):
        comm.default_device(0)


# ------------------------------------------------------------------------------------------- placement
def test_check_placement():
    cpu, c0, c1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    assert comm.check_placement("x", [("a", cpu), ("b", cpu)], None) is None
    assert comm.check_placement("x", [("a", cpu)], 0) is None  # host collectives on a device world
    assert comm.check_placement("x", [("a", c0), ("b", c0)], 0) == 0
    with pytest.raises(gfdit.InvalidUsage, match="not a mix"):
        comm.check_placement("all_gather_into_tensor", [("out", c0), ("inp", cpu)], 0)
    with pytest.raises(gfdit.InvalidUsage, match="world's device is cuda:0"):
        comm.check_placement("all_reduce", [("tensor", c1)], 0)
    with pytest.raises(gfdit.InvalidUsage):
        comm.check_placement("all_reduce", [("tensor", c0)], None)


def test_stream_handle_of_the_default_stream():
    class S:
        def __init__(self, h):
            self.cuda_stream = h

    assert devices._stream_handle(S(0)) == 1  # cudaStreamLegacy: 0 would mean host pointers
    assert devices._stream_handle(S(0x7F00_0000_1000)) == 0x7F00_0000_1000


def test_collectives_refuse_cuda_on_a_host_world(world):
    fc = _fake_cuda(8)
    cpu = torch.ones(8)
    with pytest.raises(gfdit.InvalidUsage, match="not a mix"):
        world.all_gather_into_tensor(fc, cpu)
    with pytest.raises(gfdit.InvalidUsage, match="not a mix"):
        world.all_to_all_single(cpu, fc)
    with pytest.raises(gfdit.InvalidUsage, match="not a mix"):
        world.reduce_scatter_tensor(fc, cpu)
    for fn in (
        lambda: world.all_reduce(fc),
        lambda: world.broadcast(fc, 0),
        lambda: world.send(fc, 0),
        lambda: world.recv(fc, 0),
        lambda: world.all_gather_into_tensor(fc, fc),
    ):
        with pytest.raises(
            gfdit.InvalidUsage, match=NO_TRANSPORT if not comm.cuda_transport_available() else "host only"
        ):
            fn()
    x = torch.ones(4)
    world.all_reduce(x)  # still usable, on CPU tensors
    assert x.tolist() == [1.0] * 4


def test_device_heap_refused_on_a_host_world(world):
    with pytest.raises(gfdit.InvalidUsage):
        world.empty((4,), device="cuda")
    with pytest.raises(gfdit.InvalidUsage):
        world.wait_signal(0, 1, stream=object())
    assert world.device is None
    world.check()  # nothing to report on a host-only world
    t = world.empty((4,), device="cpu")
    assert world.is_heap_tensor(t)


def test_other_devices_refused(world):
    with pytest.raises(gfdit.InvalidUsage, match="meta"):
        world.all_reduce(torch.empty(3, device="meta"))


# --------------------------------------------------------------------------------------------- attention
def test_attention_record_device_checks():
    q = _fake_cuda(1, 4, 2, 8)
    cpu = torch.ones(1, 4, 2, 8)
    rec, detail, _ = core._local_record(q, q, q, None, None, None, None, 2, 0, None)
    assert rec[0] == core._ERR_DEVICE and "host only" in detail
    rec, detail, _ = core._local_record(q, cpu, q, None, None, None, None, 2, 0, None)
    assert rec[0] == core._ERR_DEVICE
    rec, detail, _ = core._local_record(q, q, q, None, None, None, None, 2, 0, torch.device("cuda", 1))
    assert rec[0] == core._ERR_DEVICE and "cuda:1" in detail
    rec, _, _ = core._local_record(q, q, q, None, None, None, None, 2, 0, torch.device("cuda", 0))
    assert rec[0] == core._ERR_OK and rec[11] == 1
    rec, _, _ = core._local_record(q, q, q, cpu, cpu, cpu, None, 2, 0, torch.device("cuda", 0))
    assert rec[0] == core._ERR_DEVICE  # joint tokens on another device
    rec, _, _ = core._local_record(q, q, q, None, None, None, None, 1, 0, None)
    assert rec[0] == core._ERR_OK  # one member runs no collective: any device
    rec, _, _ = core._local_record(cpu, cpu, cpu, None, None, None, None, 2, 0, None)
    assert rec[0] == core._ERR_OK and rec[11] == 0


def test_attention_members_on_different_devices_refused():
    cpu_rec, _, _ = core._local_record(*(torch.ones(1, 4, 2, 8),) * 3, None, None, None, None, 2, 0, None)
    cuda_rec = list(cpu_rec)
    cuda_rec[11] = 1
    spec = gfdit.ParallelSpec(ulysses=2)
    with pytest.raises(gfdit.InvalidUsage, match="different devices"):
        core._check_records([cpu_rec, cuda_rec], 0, "", spec, [0, 1])


def test_cpu_plan_keys_and_put_order_unchanged():
    spec = gfdit.ParallelSpec(ulysses=2)
    key = plan.plan_key(spec, "ulysses-low", 1, 4, 8, 1, 0, 0, [3, 5])
    assert key == ((2, 1, "usp", "ulysses-low", None), (1, 4, 8, 1, 0, 0), (3, 5))
    assert plan.plan_key(spec, "ulysses-low", 1, 4, 8, 1, 0, 0, [3, 5], 1) != key
    assert _put_order(2) == {"f0": 1, "f1": 2, "o0": 3, "o1": 4}
    assert _put_order(2, ready=True) == {"r": 1, "f0": 2, "f1": 3, "o0": 4, "o1": 5}


def test_stream_executor_only_on_cuda():
    assert pipeline.executor_for(torch.device("cpu")) is pipeline._comm_executor()


def test_cuda_block_attention_falls_back_off_cuda():
    from gfdit.attention import local

    q = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    out, lse = local.block_attention(q, q, q)
    assert out.shape == (1, 2, 5, 8) and lse.shape == (1, 2, 5)


# ------------------------------------------------------------------------------------------ models/state
def test_state_header_has_no_device_bits_on_cpu():
    from gfdit.models import staged

    state = staged.DenoiseState(
        latent=torch.randn(1, 2, 1, 2, 2),
        prompt_embeds=torch.randn(1, 3, 4),
        negative_prompt_embeds=None,
        sigmas=torch.linspace(1, 0, 3),
        timesteps=torch.linspace(1000, 500, 2),
        step_idx=0,
        guidance_scale=1.0,
        grid=(1, 2, 2),
    )
    header, _ = staged.pack_state(state)
    assert int(header[staged._DEVICE_MASK_AT]) == 0
    assert set(staged.DEVICE_TENSORS) <= set(staged.STATE_TENSORS)
    assert not {"sigmas", "timesteps", "history_timesteps"} & set(staged.DEVICE_TENSORS)


def _state(**kw):
    from gfdit.models import staged

    base = dict(
        latent=torch.randn(1, 2, 1, 2, 2),
        prompt_embeds=torch.randn(1, 3, 4),
        negative_prompt_embeds=torch.randn(1, 3, 4),
        sigmas=torch.linspace(1, 0, 3),
        timesteps=torch.linspace(1000, 500, 2),
        step_idx=0,
        guidance_scale=4.0,
        grid=(1, 2, 2),
        history=torch.randn(1, 1, 2, 1, 2, 2),
        history_timesteps=torch.tensor([1000.0]),
    )
    base.update(kw)
    return staged.DenoiseState(**base)


def test_place_state_moves_the_per_step_tensors_only():
    from types import SimpleNamespace

    from gfdit.models import staged

    state = _state()
    on_cpu = SimpleNamespace(device=torch.device("cpu"))
    assert staged.StagedModel.place_state(on_cpu, state) is state  # nothing to move: the same object
    elsewhere = SimpleNamespace(device=torch.device("meta"))  # stands in for a GPU on a CPU-only build
    moved = staged.StagedModel.place_state(elsewhere, state)
    for name in ("latent", "prompt_embeds", "negative_prompt_embeds", "history"):
        assert getattr(moved, name).device.type == "meta", name
    for name in ("sigmas", "timesteps", "history_timesteps"):
        assert getattr(moved, name).device.type == "cpu", name
    assert moved.last_sample is None and state.latent.device.type == "cpu"


# ------------------------------------------------------------------------ the stream paths, on CPU tensors
@pytest.mark.multirank(4)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 4])
def test_stream_paths_on_cpu_tensors(world_pool, n):
    """The CUDA paths of Ring, USP and Torus (stream executor, ready puts, device-side waits) with stand-in
    streams on CPU tensors, against the float64 reference: their protocol (the order and count of puts and
    transfers) runs for real."""
    import cases_cuda
    import mp_harness

    mp_harness.skip_if_too_big(n)
    grids = [(n, 1), (1, n)] + ([(2, 2)] if n == 4 else [])
    cases = []
    for i, ((u, r), mode) in enumerate((g, m) for g in grids for m in ("usp", "torus")):
        spec = {"ulysses": u, "ring": r, "mode": mode, "placement": "ulysses-low"}
        for j, kw in enumerate(
            ({"shape": (1, 24, 4, 8)}, {"shape": (2, 18, 5, 8), "joint": 3, "cached": True})
        ):
            name = f"streams-n{n}-u{u}r{r}-{mode}-{j}"
            splits = (
                None
                if j == 0
                else [1 + 2 * x for x in range(n - 1)] + [18 - sum(1 + 2 * x for x in range(n - 1))]
            )
            cases.append({"name": name, "spec": spec, "seed": 50 + 10 * i + j, "splits": splits, **kw})
    world = world_pool.get(n, timeout=30.0)
    got = world.run(cases_cuda.case_stream_paths_on_cpu, cases, timeout=240.0)
    flat = [rep for per_rank in got for rep in per_rank["reports"]]
    for per_rank in got:  # the stream executor ran the transfers, and Torus its ready puts
        assert per_rank["submits"]["n"] > len(cases) and per_rank["submits"]["ready"] > 0, per_rank["submits"]
    assert len(flat) == len(cases) * n
    bad = [rep for rep in flat if not rep["ok"]]
    assert not bad, bad[:4]
    assert not any(rep["warnings"] for rep in flat), [rep["warnings"] for rep in flat if rep["warnings"]][:2]


def test_world_passes_the_device_to_the_core(monkeypatch):
    """World(device=...) against a stand-in _C.World with the device contract: the index reaches
    create(device=), torch's current device is set, and a host-only world calls create as before."""
    calls = []

    spans_hosts = []  # a world across hosts: the core keeps the device as staged, with no device transport

    class FakeCoreWorld:
        device = property(lambda self: -1 if spans_hosts else self._device)
        staged_device = property(lambda self: self._device if spans_hosts else -1)

        def __init__(self, device):
            self._device = device

        @staticmethod
        def create(*args, **kwargs):
            calls.append((args, kwargs))
            return FakeCoreWorld(kwargs.get("device", -1))

        def world_group(self):
            return None

        def check(self):
            calls.append("check")

    monkeypatch.setattr(gfdit._C, "World", FakeCoreWorld)
    monkeypatch.setattr(devices, "_HAS_CUDA_TRANSPORT", True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    set_to = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: set_to.append(i))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    w = comm.World(3, 4, object(), device="cuda")  # rank 3 on 2 devices: device 1
    assert calls[-1][1] == {"device": 1} and set_to == [1]
    assert w.device == torch.device("cuda", 1)
    w.check()
    assert calls[-1] == "check"
    host = comm.World(0, 4, object())
    assert calls[-1][1] == {} and host.device is None
    with pytest.raises(gfdit.InvalidUsage, match="does not exist"):
        comm.World(0, 4, object(), device="cuda:5")
    assert not w.stages_device_tensors and not host.stages_device_tensors
    # across hosts (NOTE [device tensors across hosts]): the device is the world's, its tensors are staged, and
    # what needs a device heap or a device stream is refused naming why
    spans_hosts.append(True)
    across = comm.World(1, 4, object(), device="cuda")
    assert across.device == torch.device("cuda", 1) and across.stages_device_tensors
    with pytest.raises(gfdit.InvalidUsage, match="spans hosts and has no device heap"):
        across.symmetric_empty((4,), device="cuda")
    with pytest.raises(gfdit.InvalidUsage, match="spans hosts and has no device transport"):
        across.wait_signal(0, stream=object())


# ------------------------------------------------------------------------------------- the extension
def _exported_symbols(path: str) -> list[str]:
    """Names of the symbols an ELF64 little-endian shared object defines in its dynamic symbol table."""
    import struct

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not an ELF64 little-endian file"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        strtab = sections[link][4]
        for k in range(1, size // entsize):
            st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, offset + k * entsize)
            if st_shndx != 0 and (st_info >> 4) in (1, 2):  # defined, GLOBAL or WEAK
                end = data.index(b"\0", strtab + st_name)
                names.append(data[strtab + st_name : end].decode())
    return names


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF (Linux) only")
def test_extension_exports_its_init_function_alone():
    """gfdit._C exports PyInit__C and nothing else (CMakeLists.txt, src/python/module.map): built by a
    compiler that links libstdc++ in statically, a module that exported that copy's symbols had some of its
    references bound to torch's libstdc++.so.6 where torch was imported first, and crashed formatting a number
    (gfdit.build_info(), World creation)."""
    assert _exported_symbols(gfdit._C.__file__) == ["PyInit__C"]
