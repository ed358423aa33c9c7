"""Case functions of the attention tests; they run inside the rank processes of mp_harness worlds.

A case is a plain dict (picklable): shape of the whole sequence, how it is split across the group, the
spec, joint tokens, dtype and seed. Every rank rebuilds the whole q, k, v from the seed, takes its shard,
runs gfdit.attention and compares its output rows with a single-process float64 reference of those rows.
A case with ``cached`` passes seq_splits and runs twice: the second call reuses the first one's plan.
A case with ``device`` ("cuda") runs on CUDA tensors (the world must have a device) and is also compared with
single-process attention on that device (torch's scaled_dot_product_attention over the whole sequence);
``rtol`` / ``atol`` override the float32 / 16-bit tolerances; ``no_sync`` makes torch raise if the cached
(second) call synchronises with the device.
Mismatches are returned, not raised, so one wrong case does not desynchronise the world; a batch of many
cases runs per call to amortise the round trips.
"""

from __future__ import annotations

import gc
import math
import os
import time
import warnings
import weakref

import mp_harness
import torch

F32_RTOL = 1e-5  # max |out - ref| / max |ref|
BF16_ATOL = 1e-2


def _gen(*key: int) -> torch.Generator:
    seed = 0
    for k in key:
        seed = (seed * 1_000_003 + int(k) + 17) % (2**62)
    return torch.Generator().manual_seed(seed)


def make_inputs(case: dict) -> dict:
    """The whole sequence's q, k, v (and joint tokens) of a case, float32, then rounded to its dtype."""
    b, s, h, d = case["shape"]
    g = _gen(case["seed"], 1)
    dtype = getattr(torch, case.get("dtype", "float32"))
    full = {name: torch.randn((b, s, h, d), generator=g).to(dtype) for name in ("q", "k", "v")}
    sj = case.get("joint", 0)
    if sj:
        for name in ("q", "k", "v"):
            full["j" + name] = torch.randn((b, sj, h, d), generator=g).to(dtype)
    return full


def splits_of(case: dict, n: int) -> list[int]:
    s = case["shape"][1]
    if case.get("splits") is not None:
        assert len(case["splits"]) == n and sum(case["splits"]) == s, case
        return list(case["splits"])
    assert s % n == 0, case
    return [s // n] * n


def reference(full: dict, rows: slice, joint_pos: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float64 attention of the q rows `rows` (and of the joint queries) over the whole sequence."""
    q, k, v = (full[x].double() for x in ("q", "k", "v"))
    if "jq" in full:
        jk, jv = full["jk"].double(), full["jv"].double()
        if joint_pos == "front":
            k, v = torch.cat([jk, k], 1), torch.cat([jv, v], 1)
        else:
            k, v = torch.cat([k, jk], 1), torch.cat([v, jv], 1)
    scale = 1.0 / math.sqrt(q.shape[-1])

    def attend(qq: torch.Tensor) -> torch.Tensor:
        s = torch.einsum("bqhd,bkhd->bhqk", qq, k) * scale
        return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)

    out = attend(q[:, rows])
    jout = attend(full["jq"].double()) if "jq" in full else None
    return out, jout


def _error(
    out: torch.Tensor, ref: torch.Tensor, dtype: str, rtol: float | None = None, atol: float | None = None
) -> tuple[float, bool]:
    if out.shape != ref.shape:
        return float("inf"), False
    if out.numel() == 0:
        return 0.0, True
    diff = (out.double().cpu() - ref.double().cpu()).abs().max().item()
    if not math.isfinite(diff):
        return float("inf"), False
    if dtype == "float32":
        err = diff / max(ref.abs().max().item(), 1e-30)
        return err, err <= (F32_RTOL if rtol is None else rtol)
    return diff, diff <= (BF16_ATOL if atol is None else atol)


def single_device_reference(full: dict, rows: slice, joint_pos: str, device: str) -> torch.Tensor:
    """Single-process attention on `device` of the q rows `rows` over the whole sequence (joint keys too):
    torch's scaled_dot_product_attention in the case's dtype."""
    q, k, v = (full[x].to(device) for x in ("q", "k", "v"))
    if "jq" in full:
        jk, jv = full["jk"].to(device), full["jv"].to(device)
        k, v = (
            torch.cat([j, x], 1) if joint_pos == "front" else torch.cat([x, j], 1)
            for j, x in ((jk, k), (jv, v))
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        q[:, rows].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    )
    return out.transpose(1, 2)


def _spec(case: dict):
    import gfdit.attention as ga

    return ga.ParallelSpec(**case["spec"])


def run_case(ctx, case: dict) -> dict | None:
    """Runs one case on this rank; None when this rank is not in the case's group."""
    import gfdit
    import gfdit.attention as ga

    ranks = case.get("group") or list(range(ctx.world_size))
    if ctx.rank not in ranks:
        return None
    me = ranks.index(ctx.rank)
    n = len(ranks)
    group = None if case.get("group") is None else gfdit.new_group(ranks)
    full = make_inputs(case)
    splits = splits_of(case, n)
    off = sum(splits[:me])
    rows = slice(off, off + splits[me])
    device = case.get("device")
    q, k, v = (full[x][:, rows].clone().to(device or "cpu") for x in ("q", "k", "v"))
    kwargs = {}
    if "jq" in full:
        kwargs = {
            "joint_q": full["jq"].to(device or "cpu"),
            "joint_k": full["jk"].to(device or "cpu"),
            "joint_v": full["jv"].to(device or "cpu"),
            "joint": case.get("joint_pos", "front"),
        }
    if case.get("node_ids") is not None:
        kwargs["topology"] = ga.Topology(tuple(case["node_ids"]))
    # A heap block held on member 0 only (as after a migration that allocated on some members): the heaps differ,
    # and the Torus workspace must still land at one offset on every member (NOTE [symmetric allocation]).
    skew = gfdit.empty((4096,), device=device) if case.get("skew_heap") and me == 0 else None
    if case.get("cached"):
        kwargs["seq_splits"] = splits
    world = gfdit.get_world()
    ref, jref = reference(full, rows, case.get("joint_pos", "front"))
    dtype = case.get("dtype", "float32")
    rtol, atol = case.get("rtol"), case.get("atol")
    sref = single_device_reference(full, rows, case.get("joint_pos", "front"), device) if device else None
    report = {"name": case["name"], "rank": ctx.rank, "ok": True, "err": 0.0, "warnings": []}
    for call in range(2 if case.get("cached") else 1):
        before = world.stats().all_gathers
        start = time.perf_counter()
        qc, kc, vc = q.clone(), k.clone(), v.clone()
        # no_sync: a call on a cached plan must not wait for the device (torch raises on a synchronisation)
        strict = bool(case.get("no_sync")) and call == 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if strict:
                torch.cuda.set_sync_debug_mode("error")
            try:
                res = ga.attention(qc, kc, vc, group=group, spec=_spec(case), **kwargs)
            finally:
                if strict:
                    torch.cuda.set_sync_debug_mode("default")
        elapsed = time.perf_counter() - start
        out, jout = res if "jq" in full else (res, None)
        if device and out.device.type != "cuda":
            report.update(ok=False, device=str(out.device))
        err, ok = _error(out, ref, dtype, rtol, atol)
        if sref is not None:
            serr, sok = _error(out, sref, dtype, rtol, atol)
            report.update(sdpa_err=max(report.get("sdpa_err", 0.0), serr), ok=report["ok"] and sok)
        report["all_gathers"] = report.get("all_gathers", []) + [world.stats().all_gathers - before]
        report.update(
            err=max(report["err"], err), ok=report["ok"] and ok, time=elapsed, shape=tuple(out.shape)
        )
        report["warnings"] += [str(w.message) for w in caught]
        if jref is not None:
            jerr, jok = _error(jout, jref, dtype, rtol, atol)
            report.update(jerr=max(report.get("jerr", 0.0), jerr), ok=report["ok"] and jok)
    del skew
    return report


def case_batch(ctx, cases: list) -> list:
    """Runs every case in order on this rank (see mp_harness.run_batch)."""
    return mp_harness.run_batch(ctx, cases, run_case)


def case_bad_input(ctx, kind: str) -> dict:
    """Runs a call that must be refused on every rank; returns the exception's class names and message."""
    import gfdit
    import gfdit.attention as ga

    _t = torch
    n = ctx.world_size
    g = _gen(7, ctx.rank)
    b, s, h, d = 1, 8, 4, 16
    spec = ga.ParallelSpec(ulysses=n, ring=1)
    shape_q = shape_k = (b, s, h, d)
    if kind == "heads":
        h = n - 1  # fewer heads than the Ulysses degree
        shape_q = shape_k = (b, s, h, d)
    elif kind == "torus_uneven_chunks":
        h = n + 1  # heads n + 1 over ulysses n: the smallest member has 1 head, fewer than 2 chunks
        shape_q = shape_k = (b, s, h, d)
        spec = ga.ParallelSpec(ulysses=n, ring=1, mode="torus", torus_chunks=2)
    elif kind == "spec_size":
        spec = ga.ParallelSpec(ulysses=n, ring=2)
    elif kind == "mismatch":
        if ctx.rank == 1:
            shape_q = shape_k = (b, s, h, d * 2)  # D differs on one member
    elif kind == "qkv_shapes":
        if ctx.rank == n - 1:
            shape_k = (b, s + 1, h, d)  # k shard differs from q shard on one member
    elif kind == "torus_chunks":
        # 4 heads / n per member is not divisible by 3
        spec = ga.ParallelSpec(ulysses=n, ring=1, mode="torus", torus_chunks=3)
    elif kind in ("joint_partial", "seq_splits_own", "seq_splits_differ", "cache_mix"):
        pass
    else:
        raise ValueError(kind)
    q = _t.randn(shape_q, generator=g)
    k = _t.randn(shape_k, generator=g)
    v = _t.randn(shape_k, generator=g)
    kwargs = {}
    if kind == "joint_partial":
        kwargs = {"joint_q": _t.randn(b, 3, h, d, generator=g)} if ctx.rank == 0 else {}
    elif kind == "seq_splits_own":  # member 0's own entry is not its S_local
        kwargs = {"seq_splits": [s + 1] + [s] * (n - 1) if ctx.rank == 0 else [s] * n}
    elif kind == "seq_splits_differ":  # each list is right about its own member, but they differ
        kwargs = {"seq_splits": [s] * n if ctx.rank == 0 else [s + 1] + [s] * (n - 1)}
    elif kind == "cache_mix":
        kwargs = {"seq_splits": [s] * n}
    from gfdit.attention import core

    ga.clear_plan_cache()  # every member exchanges: the refusal is the plain InvalidUsage
    core.PLAN_CACHE = not (kind == "cache_mix" and ctx.rank == 0)
    try:
        ga.attention(q, k, v, spec=spec, **kwargs)
    except Exception as exc:  # noqa: BLE001
        result = {"types": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    else:
        result = {"types": [], "message": "no error"}
    finally:
        core.PLAN_CACHE = True
    # The world must still work after a refused call.
    x = _t.ones(4)
    gfdit.all_reduce(x)
    result["after"] = x.tolist()
    return result


def case_env_topology(ctx, node_ids: str) -> str:
    """Placement chosen by "auto" from GFDIT_NODE_IDS."""
    import gfdit.attention as ga
    from gfdit.attention.spec import resolve_placement

    os.environ["GFDIT_NODE_IDS"] = node_ids
    try:
        topo = ga.Topology.from_env(ctx.world_size)
        return resolve_placement(ga.ParallelSpec(2, ctx.world_size // 2), list(range(ctx.world_size)), topo)
    finally:
        del os.environ["GFDIT_NODE_IDS"]


# --------------------------------------------------------------------------------------- the plan cache
def _shards(ctx, seed: int, splits: list, h: int, d: int, members: list, joint: int = 0) -> tuple:
    """This rank's q, k, v rows of a whole sequence drawn from seed, with joint tokens when asked."""
    full = make_inputs({"shape": (1, sum(splits), h, d), "seed": seed, "joint": joint})
    me = members.index(ctx.rank)
    lo = sum(splits[:me])
    rows = slice(lo, lo + splits[me])
    return full, rows, tuple(full[x][:, rows].clone() for x in ("q", "k", "v"))


def case_plan_cache(ctx) -> dict:
    """Counts the all_gathers of repeated calls: with seq_splits only the first call of a plan exchanges
    metadata; without it, or with the cache off, every call does; interleaved groups and an evicting
    cycle of keys stay correct. Returns {what: [all_gathers per call]} and the worst error."""
    import gfdit
    import gfdit.attention as ga
    from gfdit.attention import core

    n = ctx.world_size
    ga.clear_plan_cache()
    counts: dict = {}
    worst = 0.0

    def run(what, seed, splits, h, spec, members=None, joint=0, cached=True):
        nonlocal worst
        members = members or list(range(n))
        if ctx.rank not in members:
            return
        group = None if members == list(range(n)) else gfdit.new_group(members)
        full, rows, (q, k, v) = _shards(ctx, seed, splits, h, 16, members, joint)
        kw = {"seq_splits": splits} if cached else {}
        if joint:
            kw.update(joint_q=full["jq"], joint_k=full["jk"], joint_v=full["jv"])
        before = gfdit.get_world().stats().all_gathers
        res = ga.attention(q, k, v, group=group, spec=ga.ParallelSpec(**spec), **kw)
        counts.setdefault(what, []).append(gfdit.get_world().stats().all_gathers - before)
        out = res[0] if joint else res
        ref, _ = reference(full, rows, "front")
        worst = max(worst, _error(out, ref, "float32")[0])

    uly = {"ulysses": n, "ring": 1, "mode": "usp"}
    even = [8] * n
    uneven = [5 + 2 * i for i in range(n)]
    for _ in range(3):
        run("ulysses", 1, even, n + 1, uly)  # uneven heads too
    for _ in range(2):
        run("ulysses-joint", 2, uneven, n, uly, joint=3)  # the joint merge keeps its one all_gather
    for _ in range(2):
        run("no-seq-splits", 3, uneven, n, uly, cached=False)
    core.PLAN_CACHE = False
    try:
        for _ in range(2):
            run("cache-off", 1, even, n + 1, uly)
    finally:
        core.PLAN_CACHE = True
    # Interleaved groups: each member takes part in its groups' calls in one global order.
    groups = [(list(range(n)), {"ulysses": 1, "ring": n, "mode": "usp"}), ([1, 0], {"ulysses": 2, "ring": 1})]
    if n >= 4:
        groups += [([3, 2], {"ulysses": 1, "ring": 2}), ([2, 0, 3, 1], {"ulysses": 2, "ring": 2})]
    for _ in range(2):
        for i, (members, spec) in enumerate(groups):
            run(f"group{i}", 10 + i, [4 + j for j in range(len(members))], 3, spec, members=members)
    # A cycle of three keys through a cache of two: every call misses, on every member alike.
    saved = core.PLAN_CAPACITY
    core.PLAN_CAPACITY = 2
    try:
        for _ in range(2):
            for j in range(3):
                run("evicting", 20 + j, [6 + j] * n, n, uly)
    finally:
        core.PLAN_CAPACITY = saved
    info = ga.plan_cache_info()
    # Kept plans hold their world weakly: destroying it frees it (then a fresh world for the next cases).
    ref = weakref.ref(gfdit.get_world())
    gfdit.destroy()
    gc.collect()
    released = ref() is None
    gfdit.init(ctx.rank, n, ctx.store, timeout=ctx.timeout)
    return {"counts": counts, "err": worst, "info": info, "released": released}


def case_plan_disagreement(ctx, kind: str, spec: dict) -> dict:
    """Members that do not pass the arguments of one call: every member must raise PlanMismatch soon,
    the world is unusable afterwards, and a fresh world (init again) works."""
    import gfdit
    import gfdit.attention as ga
    from gfdit.attention import core

    n, me = ctx.world_size, ctx.rank
    sp = ga.ParallelSpec(**spec)
    h, d = 2 * sp.ulysses + 1, 8  # uneven heads
    a = [4 + i for i in range(n)]
    b = [6 + (i % 2) for i in range(n)]

    def call(splits, bad=False):
        _, _, (q, k, v) = _shards(ctx, 5, splits, h, d, list(range(n)))
        if bad:
            k = k[:, :, :, : d // 2].contiguous()  # q and k shards differ: a local error
        return ga.attention(q, k, v, spec=sp, seq_splits=splits)

    call(a)  # every member caches plan a
    call(b)  # and plan b
    start = time.monotonic()
    result = {"types": [], "message": "no error"}
    try:
        if kind == "new_shapes":  # member 0's shard grows, the others reuse plan a
            call([a[0] + 1] + a[1:] if me == 0 else a)
        elif kind == "bad_input":  # the last member's input is bad (a local error: it exchanges)
            call(a, bad=me == n - 1)
        elif kind == "two_plans":  # member 0 runs plan a, the others plan b
            call(a if me == 0 else b)
        elif kind == "cache_switch":  # the cache is off on member 0 only
            core.PLAN_CACHE = me != 0
            call(a)
        else:
            raise ValueError(kind)
    except gfdit.Error as exc:
        result = {"types": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    finally:
        core.PLAN_CACHE = True
    result["elapsed"] = time.monotonic() - start
    world = gfdit.get_world()
    result["usable"] = world.usable
    try:
        gfdit.barrier()
        result["after"] = "no error"
    except gfdit.Error as exc:
        result["after"] = f"{type(exc).__name__}: {exc}"
    # A fresh world on the same store (every rank does this, whatever happened), for the next cases.
    gfdit.destroy()
    gfdit.init(ctx.rank, n, ctx.store, timeout=ctx.timeout)
    x = torch.ones(3)
    gfdit.all_reduce(x)
    result["fresh"] = x.tolist()
    return result
