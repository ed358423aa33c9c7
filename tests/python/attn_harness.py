"""Case functions of the attention tests; they run inside the rank processes of mp_harness worlds.

A case is a plain dict (picklable): shape of the whole sequence, how it is split across the group, the
spec, joint tokens, dtype and seed. Every rank rebuilds the whole q, k, v from the seed, takes its shard,
runs gfdit.attention and compares its output rows with a single-process float64 reference of those rows.
Mismatches are returned, not raised, so one wrong case does not desynchronise the world; a batch of many
cases runs per call to amortise the round trips.
"""

from __future__ import annotations

import math
import os
import time
import warnings

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


def _error(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> tuple[float, bool]:
    if out.shape != ref.shape:
        return float("inf"), False
    if out.numel() == 0:
        return 0.0, True
    diff = (out.double() - ref).abs().max().item()
    if not math.isfinite(diff):
        return float("inf"), False
    if dtype == "float32":
        err = diff / max(ref.abs().max().item(), 1e-30)
        return err, err <= F32_RTOL
    return diff, diff <= BF16_ATOL


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
    q, k, v = (full[x][:, rows].clone() for x in ("q", "k", "v"))
    kwargs = {}
    if "jq" in full:
        kwargs = {
            "joint_q": full["jq"],
            "joint_k": full["jk"],
            "joint_v": full["jv"],
            "joint": case.get("joint_pos", "front"),
        }
    if case.get("node_ids") is not None:
        kwargs["topology"] = ga.Topology(tuple(case["node_ids"]))
    # A heap block held on member 0 only: the Torus workspace lands at different offsets (fallback path).
    skew = gfdit.empty((4096,)) if case.get("skew_heap") and me == 0 else None
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = ga.attention(q, k, v, group=group, spec=_spec(case), **kwargs)
    elapsed = time.perf_counter() - start
    del skew
    out, jout = res if "jq" in full else (res, None)
    ref, jref = reference(full, rows, case.get("joint_pos", "front"))
    dtype = case.get("dtype", "float32")
    err, ok = _error(out, ref, dtype)
    report = {
        "name": case["name"],
        "rank": ctx.rank,
        "err": err,
        "ok": ok,
        "time": elapsed,
        "shape": tuple(out.shape),
        "warnings": [str(w.message) for w in caught],
    }
    if jref is not None:
        jerr, jok = _error(jout, jref, dtype)
        report.update(jerr=jerr, ok=ok and jok)
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
        h = 6 if n == 4 else 3  # not divisible by the Ulysses degree
        shape_q = shape_k = (b, s, h, d)
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
    elif kind == "joint_partial":
        pass
    else:
        raise ValueError(kind)
    q = _t.randn(shape_q, generator=g)
    k = _t.randn(shape_k, generator=g)
    v = _t.randn(shape_k, generator=g)
    kwargs = {}
    if kind == "joint_partial":
        kwargs = {"joint_q": _t.randn(b, 3, h, d, generator=g)} if ctx.rank == 0 else {}
    try:
        ga.attention(q, k, v, spec=spec, **kwargs)
    except Exception as exc:  # noqa: BLE001
        result = {"types": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    else:
        result = {"types": [], "message": "no error"}
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
