"""Case functions of the CUDA tests (test_cuda_*.py); they run inside mp_harness worlds whose ranks joined
gfdit with ``device="cuda"`` (every rank on its default GPU: one GPU shared by all ranks when the machine has
one).

Inputs are drawn on the CPU from seeds, so every rank can rebuild any rank's input, and moved to the rank's
GPU. References are single-process torch on that GPU (cat, stack, sum in float64), compared on the CPU after
the device finished. Mismatches are collected (cases_common.Checker) and raised only after every rank ran
every collective of the case, so one wrong result does not desynchronise the world.
"""

from __future__ import annotations

import torch
from cases_common import Checker, generator, rand_tensor, reduce_ref, reduce_scale

CUDA_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8")
FLOATS = ("float32", "float16", "bfloat16", "float64")
T_AG, T_A2A, T_A2AV, T_RS, T_AR, T_BC, T_P2P, T_4D, T_STRESS, T_HEAP = range(1, 11)


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _rand(shape, dtype: str, *key: int, kind: str = "any", n: int = 1) -> torch.Tensor:
    if dtype == "float64":
        return torch.randn(tuple(shape), generator=generator(*key), dtype=torch.float64)
    return rand_tensor(shape, dtype, *key, kind=kind, n=n)


def _tol_dtype(dtype: str) -> str:
    return "float32" if dtype == "float64" else dtype


def _reduced(chk: Checker, got, inputs, op: str, dtype: str, what: str) -> None:
    """got against the exact reduction of inputs (CUDA tensors), on the CPU."""
    ref = reduce_ref(inputs, op, dtype if dtype != "float64" else "float32").cpu()
    scale = reduce_scale(inputs).cpu()
    if dtype == "float64":
        chk.reduced(got.cpu().to(torch.float64), ref, scale, "float32", what, slack=1e-6)
    else:
        chk.reduced(got.cpu(), ref, scale, dtype, what)


def _info(ctx) -> dict:
    import gfdit

    w = gfdit.get_world()
    return {"rank": ctx.rank, "device": str(w.device), "current": torch.cuda.current_device()}


def case_info(ctx) -> dict:
    """Where this rank runs (the world's device and torch's current device)."""
    return _info(ctx)


# --------------------------------------------------------------------------------------------- collectives
def case_collectives(ctx, seed: int, dtypes: list, sizes: list) -> int:
    """Every collective and dtype on CUDA tensors against torch on the GPU; returns the number of checks."""
    import gfdit

    n, me, dev = ctx.world_size, ctx.rank, _dev()
    chk = Checker(me)
    for dtype in dtypes:
        dt = getattr(torch, dtype)
        for size in sizes:
            what = f"{dtype} x {size}"
            # all_gather_into_tensor
            ins = [_rand((size,), dtype, seed, r, T_AG).to(dev) for r in range(n)]
            out = torch.full((n * size,), 7, dtype=dt, device=dev)
            gfdit.all_gather_into_tensor(out, ins[me])
            chk.equal(out.cpu(), torch.cat(ins).cpu(), f"all_gather {what}")
            # all_to_all_single, even
            rows = max(1, size // n)
            ins = [_rand((n * rows, 3), dtype, seed, r, T_A2A).to(dev) for r in range(n)]
            out = torch.empty((n * rows, 3), dtype=dt, device=dev)
            gfdit.all_to_all_single(out, ins[me])
            ref = torch.cat([ins[j][me * rows : (me + 1) * rows] for j in range(n)])
            chk.equal(out.cpu(), ref.cpu(), f"all_to_all_single {what}")
            # all_to_all_single, uneven splits: rank r sends s(r, j) rows to j
            s = [[(r + 2 * j + size) % 3 + (1 if size > 1 else 0) for j in range(n)] for r in range(n)]
            ins = [_rand((sum(s[r]), 2), dtype, seed, r, T_A2AV).to(dev) for r in range(n)]
            out = torch.empty((sum(s[j][me] for j in range(n)), 2), dtype=dt, device=dev)
            gfdit.all_to_all_single(out, ins[me], [s[j][me] for j in range(n)], s[me])
            ref = torch.cat([ins[j][sum(s[j][:me]) : sum(s[j][: me + 1])] for j in range(n)])
            chk.equal(out.cpu(), ref.cpu(), f"all_to_all_single splits {what}")
            # reductions
            ops = ("sum", "max", "min")
            for op in ops:
                ins = [_rand((n * size,), dtype, seed, r, T_RS, kind="sum", n=n).to(dev) for r in range(n)]
                out = torch.empty((size,), dtype=dt, device=dev)
                gfdit.reduce_scatter_tensor(out, ins[me], op=op)
                _reduced(
                    chk, out, [x[me * size : (me + 1) * size] for x in ins], op, dtype, f"rs {op} {what}"
                )
                ins = [_rand((size,), dtype, seed, r, T_AR, kind="sum", n=n).to(dev) for r in range(n)]
                t = ins[me].clone()
                gfdit.all_reduce(t, op=op)
                _reduced(chk, t, ins, op, dtype, f"all_reduce {op} {what}")
            # broadcast from the last rank
            src = n - 1
            x = _rand((size,), dtype, seed, src, T_BC).to(dev)
            t = x.clone() if me == src else torch.zeros_like(x)
            gfdit.broadcast(t, src=src)
            chk.equal(t.cpu(), x.cpu(), f"broadcast {what}")
            # send / recv around the ring (even ranks send first)
            nxt, prv = (me + 1) % n, (me - 1) % n
            mine = _rand((size,), dtype, seed, me, T_P2P).to(dev)
            got = torch.zeros_like(mine)
            if me % 2 == 0:
                gfdit.send(mine, nxt)
                gfdit.recv(got, prv)
            else:
                gfdit.recv(got, prv)
                gfdit.send(mine, nxt)
            chk.equal(got.cpu(), _rand((size,), dtype, seed, prv, T_P2P), f"send/recv {what}")
        # all_to_all_4d (the strided views of Ulysses), uneven sequence and heads, both directions
        seq = [3 + r for r in range(n)]
        heads = [2 + (j % 2) for j in range(n)]
        h, d, b = sum(heads), 8, 2
        fulls = [_rand((b, seq[r], h, d), dtype, seed, r, T_4D).to(dev) for r in range(n)]
        out = torch.empty((b, sum(seq), heads[me], d), dtype=dt, device=dev)
        gfdit.all_to_all_4d(out, fulls[me], 2, 1, seq_splits=seq, head_splits=heads)
        lo = sum(heads[:me])
        ref = torch.cat([f[:, :, lo : lo + heads[me]] for f in fulls], dim=1)
        chk.equal(out.cpu(), ref.cpu(), f"all_to_all_4d 2->1 {dtype}")
        back = torch.empty((b, seq[me], h, d), dtype=dt, device=dev)
        gfdit.all_to_all_4d(back, out, 1, 2, seq_splits=seq, head_splits=heads)
        chk.equal(back.cpu(), fulls[me].cpu(), f"all_to_all_4d 1->2 {dtype}")
    torch.cuda.synchronize()
    gfdit.get_world().check()
    return chk.raise_if_any()


def case_overlap_stress(ctx, seed: int, iters: int) -> dict:
    """Overlapping groups in one shared random order, CUDA and CPU collectives interleaved on the same
    edges, some on a side stream, checked only at the end (the host runs ahead of the device)."""
    import gfdit

    n, me, dev = ctx.world_size, ctx.rank, _dev()
    gen = generator(seed, T_STRESS)
    groups = [[i, j] for i in range(n) for j in range(n) if i != j]
    if n >= 3:
        groups += [[0, 1, 2], [2, 0, 1][: min(3, n)], list(range(n))[::-1]]
    groups.append(list(range(n)))
    side = torch.cuda.Stream()
    pending = []  # (what, got, expected)
    counts = {"cuda": 0, "cpu": 0, "side_stream": 0}
    for it in range(iters):
        ranks = groups[int(torch.randint(0, len(groups), (1,), generator=gen))]
        op = ("all_reduce", "all_gather", "all_to_all", "broadcast")[
            int(torch.randint(0, 4, (1,), generator=gen))
        ]
        size = int(torch.randint(1, 40_000, (1,), generator=gen))
        on_cpu = int(torch.randint(0, 5, (1,), generator=gen)) == 0
        on_side = not on_cpu and int(torch.randint(0, 4, (1,), generator=gen)) == 0
        g = gfdit.new_group(ranks)
        if me not in ranks:
            continue
        k = len(ranks)
        pos = ranks.index(me)
        where = torch.device("cpu") if on_cpu else dev
        ins = [_rand((k * size,), "float32", seed, it, r, kind="sum", n=k).to(where) for r in ranks]
        stream = side if on_side else torch.cuda.current_stream()
        if on_side:
            stream.wait_stream(torch.cuda.current_stream())  # the inputs were copied on the default stream
        with torch.cuda.stream(stream):
            if op == "all_reduce":
                got = ins[pos].clone()
                g.all_reduce(got)
                exp = torch.stack([x.double() for x in ins]).sum(0).float()
            elif op == "all_gather":
                got = torch.empty((k * k * size,), device=where)
                g.all_gather_into_tensor(got, ins[pos])
                exp = torch.cat(ins)
            elif op == "all_to_all":
                got = torch.empty((k * size,), device=where)
                g.all_to_all_single(got, ins[pos])
                exp = torch.cat([x[pos * size : (pos + 1) * size] for x in ins])
            else:
                got = ins[pos].clone() if pos == 0 else torch.zeros_like(ins[pos])
                g.broadcast(got, src=ranks[0])
                exp = ins[0]
        if on_side:
            torch.cuda.current_stream().wait_stream(side)
        counts["cpu" if on_cpu else "cuda"] += 1
        counts["side_stream"] += int(on_side)
        pending.append((f"iter {it} {op} {ranks} {'cpu' if on_cpu else 'cuda'}", got, exp))
    torch.cuda.synchronize()
    gfdit.get_world().check()
    chk = Checker(me)
    for what, got, exp in pending:
        if got.dtype == torch.float32 and "all_reduce" in what:
            err = (got.cpu().double() - exp.cpu().double()).abs().max().item() if got.numel() else 0.0
            chk.true(err <= 1e-4 * max(1.0, exp.abs().max().item()), what, f"max error {err}")
        else:
            chk.equal(got.cpu(), exp.cpu(), what)
    chk.raise_if_any()
    return counts


def case_device_heap(ctx, seed: int) -> dict:
    """gfdit.empty(device="cuda"): zero-copy all_gather from device heap tensors, and one-sided puts with
    device-side waits. Returns {"supported": False, "why": ...} when the build's device heap refuses."""
    import gfdit

    n, me, dev = ctx.world_size, ctx.rank, _dev()
    try:
        x = gfdit.empty((n, 4096), dtype=torch.float32, device="cuda")
    except gfdit.InvalidUsage as exc:
        return {"supported": False, "why": str(exc)}
    chk = Checker(me)
    chk.true(x.device == dev, "device heap tensor device", str(x.device))
    chk.true(gfdit.is_heap_tensor(x), "is_heap_tensor(device heap tensor)")
    mine = _rand((4096,), "float32", seed, me, T_HEAP).to(dev)
    src = gfdit.empty((4096,), dtype=torch.float32, device="cuda")
    src.copy_(mine)
    out = torch.empty((n * 4096,), device=dev)
    gfdit.all_gather_into_tensor(out, src)
    ref = torch.cat([_rand((4096,), "float32", seed, r, T_HEAP) for r in range(n)])
    x.zero_()
    x[me].copy_(mine)
    gfdit.barrier()  # every x is zeroed (host barrier: the zeroing is enqueued before it on every rank)
    torch.cuda.synchronize()
    gfdit.barrier()  # and done on every device before anyone puts
    for p in range(n):
        if p != me:
            gfdit.put_with_signal(mine, x[me], p)
    stream = torch.cuda.current_stream()
    for p in range(n):
        if p != me:
            gfdit.wait_signal(p, 1, stream=stream)
    torch.cuda.synchronize()
    gfdit.get_world().check()
    chk.equal(out.cpu(), ref, "all_gather from device heap")
    chk.equal(x.cpu(), ref.view(n, 4096), "put_with_signal into device heap")
    gfdit.barrier()  # nobody frees its heap block while a peer still puts into it
    chk.raise_if_any()
    return {"supported": True}


def case_refusals(ctx) -> dict:
    """Arguments a device world refuses locally (same on every rank, before any message): a CPU/CUDA mix,
    and a CUDA tensor on another device when there is one; the world stays usable."""
    import gfdit

    dev = _dev()
    got = {}
    cu = torch.ones(4 * ctx.world_size, device=dev)
    cpu = torch.ones(4)
    for name, fn in {
        "mix_all_gather": lambda: gfdit.all_gather_into_tensor(cu, cpu),
        "mix_all_to_all": lambda: gfdit.all_to_all_single(cu, cpu.repeat(ctx.world_size)),
        "mix_put": lambda: gfdit.put_with_signal(cpu, cu, (ctx.rank + 1) % ctx.world_size),
    }.items():
        try:
            fn()
            got[name] = "no error"
        except gfdit.InvalidUsage as exc:
            got[name] = str(exc)
    if torch.cuda.device_count() > 1:
        other = torch.ones(4, device=torch.device("cuda", (dev.index + 1) % torch.cuda.device_count()))
        try:
            gfdit.all_reduce(other)
            got["other_device"] = "no error"
        except gfdit.InvalidUsage as exc:
            got["other_device"] = str(exc)
    t = torch.full((4,), float(ctx.rank + 1), device=dev)
    gfdit.all_reduce(t)
    got["after"] = t.cpu().tolist()
    return got


# ---------------------------------------------------------------------------------------------- models
def case_model_step(ctx, model_name: str, spec: dict, seed: int) -> dict:
    """One denoise step of a tiny model on CUDA on the whole world with ``spec`` against the same step on a
    one-member group (world 1) in this process; then the state migrated from rank 0 to everyone. Returns
    errors, devices and digests."""
    import gfdit
    from gfdit import models

    dev = _dev()
    m = models.load(model_name, device=dev)
    cond = m.encode("a red fox in the snow", guidance_scale=m.defaults.guidance_scale)
    shape = m.latent_shape()
    state = m.initial_state(cond, m.init_latent(seed, shape), grid=tuple(shape[2:]))
    whole = gfdit.new_group(list(range(ctx.world_size)))
    par = m.denoise_step(state, 0, group=whole, spec=gfdit.ParallelSpec(**spec))
    one = m.denoise_step(state, 0, group=gfdit.new_group([ctx.rank]), spec=None)
    torch.cuda.synchronize()
    err = (par.latent.double() - one.latent.double()).abs().max().item()
    scale = one.latent.abs().max().item()
    moved = m.migrate(par if ctx.rank == 0 else None, whole, 0)
    torch.cuda.synchronize()
    gfdit.get_world().check()
    return {
        "err": err,
        "rel": err / max(scale, 1e-30),
        "latent_device": str(par.latent.device),
        "schedule_device": str(par.sigmas.device),
        "migrated_device": str(moved.latent.device),
        "digest": models.state_digest(moved),
        "par_digest": models.state_digest(par),
    }


# ------------------------------------------------------------------------- stream paths on CPU tensors
class _FakeEvent:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _FakeStream:
    cuda_stream = 0

    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


def case_stream_paths_on_cpu(ctx, cases: list) -> dict:
    """Runs attention cases with the CUDA code paths (the stream executor, Torus's ready puts and device-side
    waits) on CPU tensors: torch.cuda's streams and events are stand-ins that do nothing, submitted work runs
    at once on the calling thread, and wait_signal(stream=...) waits on the host. The collectives, the put
    counting and the buffers are real, so this checks the stream paths' protocol without a GPU."""
    import contextlib

    import attn_harness as ah
    from gfdit import comm
    from gfdit.attention import pipeline, torus, usp

    fake = _FakeStream()
    saved_cuda = {
        name: getattr(torch.cuda, name)
        for name in ("Event", "Stream", "current_stream", "stream", "current_device")
    }
    saved = (usp.executor_for, torus.executor_for, torus._uses_streams, comm.World.wait_signal)
    host_wait = comm.World.wait_signal

    def wait_signal(self, peer, count=1, stream=None):
        host_wait(self, peer, count)

    submits = {"n": 0, "ready": 0}
    real_submit = pipeline.StreamExecutor.submit

    def counting_submit(self, fn, *args):
        submits["n"] += 1
        submits["ready"] += getattr(fn, "__name__", "") == "ready"
        return real_submit(self, fn, *args)

    def stream_executor(device):
        ex = pipeline.StreamExecutor(device)
        ex.submit = counting_submit.__get__(ex)
        return ex

    torch.cuda.Event, torch.cuda.Stream = _FakeEvent, _FakeStream
    torch.cuda.current_stream = lambda device=None: fake
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.current_device = lambda: 0
    usp.executor_for = torus.executor_for = stream_executor
    torus._uses_streams = lambda t: True
    comm.World.wait_signal = wait_signal
    pipeline._comm_streams.clear()
    try:
        return {"reports": ah.case_batch(ctx, cases), "submits": submits}
    finally:
        for name, value in saved_cuda.items():
            setattr(torch.cuda, name, value)
        usp.executor_for, torus.executor_for, torus._uses_streams, comm.World.wait_signal = saved
        pipeline._comm_streams.clear()
