#!/usr/bin/env python3
"""gfdit on a GPU: collectives against a device-to-device copy, group formation, attention in every mode
against single-process attention, one tiny-wan denoise step at world 2 against world 1.

Run by bench/gpu_check.sh; it also runs anywhere else: without a GPU it says so and exits with status 3,
and without gfdit's CUDA transport it measures only what needs none (the copy and single-process
attention) and marks the rest as skipped. Ranks are processes (one per rank, spawned); on a machine with
one GPU they all share it (``gfdit.init(device="cuda")``: rank modulo the visible devices). The tables say
so ("N processes on 1 GPU") and whether those processes ran under MPS, which decides whether their kernels
run side by side or time-slice: ``GFDIT_BENCH_MPS`` (on/off, set by bench/gpu_check.sh, which starts the
MPS daemon; "unknown" when unset).

Parts, each in fresh rank processes, each failing soft (its error becomes its row, the next part runs):

  copy         torch ``dst.copy_(src)`` on the device, one process alone on the GPU (the baseline), and the
               single-process attention baseline (gfdit's local path and torch's SDPA)
  groups       ``gfdit.new_group`` (host, us), and the first CUDA all_reduce on a fresh group against a warm
               one (each timed to the end of the device's work)
  collectives  all_gather_into_tensor / all_to_all_single / all_reduce on CUDA tensors (ordinary ones, and
               device heap ones from ``gfdit.empty(device="cuda")`` when the build has a device heap),
               4 KiB .. 256 MiB per rank; time per operation from CUDA events over a loop, max over ranks
  attention    gfdit.attention in every mode (Ulysses, Ring, Torus; USP 2 x 2 in both placements and Torus
               2 x 2 at 4 ranks) on bfloat16, cached plans (seq_splits), against single-process attention
  model        one tiny-wan denoise step at world 2 (Ulysses 2) against the same step on one member

Bandwidth: busbw as nccl-tests defines it (all_gather (n*S)(n-1)/n/t, all_to_all S(n-1)/n/t, all_reduce
2(n-1)/n S/t for S bytes per rank). "moved/GPU" = busbw x the ranks that share one GPU (what that GPU's
memory moves for the collective); "vs copy" = moved/GPU over the copy's bytes/s for the same S (a copy of S
bytes reads S and writes S, as a received byte does). Targets: vs copy >= 70% from 16 MiB; 4 KiB latency
< 10 us.

    python3 bench/bench_gpu.py --json out.json --table out.txt
    python3 bench/bench_gpu.py --worlds 2 --sizes 4K,16M --parts copy,collectives    # a quick look
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

PARTS = ("copy", "groups", "collectives", "attention", "model")
OPS = ("all_gather_into_tensor", "all_to_all_single", "all_reduce")
SHORT = {
    "all_gather_into_tensor": "all_gather",
    "all_to_all_single": "all_to_all",
    "all_reduce": "all_reduce",
}
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,256M"
TARGET_COPY_FRACTION = 0.70
TARGET_COPY_FROM = 16 * C.MIB
TARGET_LATENCY_S = 10e-6
TARGET_LATENCY_SIZE = 4 * C.KIB
NO_GPU_EXIT = 3


def busbw_factor(op: str, n: int) -> float:
    return {"all_gather_into_tensor": n * (n - 1) / n, "all_to_all_single": (n - 1) / n}.get(
        op, 2 * (n - 1) / n
    )


def iters_for(size: int) -> int:
    """Timed iterations per size (the same on every rank, so the loops match)."""
    if size <= 256 * C.KIB:
        return 200
    if size <= 4 * C.MIB:
        return 50
    if size <= 64 * C.MIB:
        return 10
    return 4


def _dev():
    import torch

    return torch.device("cuda", torch.cuda.current_device())


def _timed_loop(fn, iters: int) -> float:
    """Seconds per call of fn (enqueued back to back), from CUDA events on the current stream."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def _sync_barrier() -> None:
    import gfdit
    import torch

    torch.cuda.synchronize()
    gfdit.barrier()  # host barrier: every rank's device is idle before the timed loop starts


# ----------------------------------------------------------------------------------------------------------
# rank functions (module level: the ranks are spawned)


def rank_groups(ctx: C.RankContext) -> dict[str, Any]:
    import gfdit
    import torch

    n = ctx.world_size
    patterns = [list(range(n)), list(range(n))[::-1], [0, n - 1]]
    count = 20000
    t0 = time.perf_counter()
    for i in range(count):
        gfdit.new_group(patterns[i % len(patterns)])
    new_group_s = (time.perf_counter() - t0) / count
    x = torch.ones(1024, device=_dev())  # 4 KiB
    gfdit.all_reduce(x)  # warms the world's device path (not the group's: groups have no state)
    _sync_barrier()
    t0 = time.perf_counter()
    g = gfdit.new_group(list(range(n))[::-1])
    g.all_reduce(x)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    warm = []
    for _ in range(50):
        _sync_barrier()
        t0 = time.perf_counter()
        g.all_reduce(x)
        torch.cuda.synchronize()
        warm.append(time.perf_counter() - t0)
    first, med = ctx.max_over_ranks([first_s, C.median(warm)])
    return {"new_group_s": new_group_s, "first_collective_s": first, "warm_collective_s": med}


def rank_collectives(ctx: C.RankContext) -> dict[str, Any]:
    """Group formation first (its failure is recorded, the collectives still run), then the sweep."""
    try:
        groups = rank_groups(ctx)
    except Exception as e:
        groups = {"error": f"{type(e).__name__}: {e}"}
    return {"groups": groups, "records": _sweep(ctx)}


def _sweep(ctx: C.RankContext) -> list[dict[str, Any]]:
    import gfdit
    import torch

    opts = ctx.options
    n, me, dev = ctx.world_size, ctx.rank, _dev()
    deadline = time.monotonic() + float(opts["budget_s"])
    records = []
    kinds = ["tensor"]
    try:
        probe = gfdit.empty((1024,), dtype=torch.float32, device="cuda")
        del probe
        heap_ok = 1.0
    except gfdit.InvalidUsage:
        heap_ok = 0.0
    if ctx.max_over_ranks([1.0 - heap_ok])[0] == 0.0:
        kinds.append("heap")
    for kind in kinds:
        for op in OPS:
            for size in opts["sizes"]:
                if kind == "heap" and size > opts["heap_max"]:
                    continue
                stop = ctx.max_over_ranks([float(time.monotonic() > deadline)])[0]
                if stop:
                    records.append({"op": op, "kind": kind, "size": size, "skipped": "out of time"})
                    continue
                elems = max(n, size // 4 // n * n)  # float32, divisible by n for all_to_all

                def alloc(shape, fill):
                    if kind == "heap":
                        t = gfdit.empty(shape, dtype=torch.float32, device="cuda")
                        return t.fill_(fill)
                    return torch.full(shape, fill, dtype=torch.float32, device=dev)

                inp = out = fn = None
                try:  # the buffers; a full device heap skips the size on every rank alike
                    if op == "all_gather_into_tensor":
                        inp, out = alloc((elems,), float(me + 1)), alloc((n * elems,), 0.0)
                    elif op == "all_to_all_single":
                        inp, out = alloc((elems,), float(me + 1)), alloc((elems,), 0.0)
                    else:
                        inp = out = alloc((elems,), 0.0)  # zeros stay zeros: the loop never overflows
                    full = 0.0
                except (gfdit.InvalidUsage, torch.cuda.OutOfMemoryError):
                    full = 1.0
                if ctx.max_over_ranks([full])[0]:
                    records.append({"op": op, "kind": kind, "size": size, "skipped": f"no memory ({kind})"})
                    inp = out = None
                    continue
                if op == "all_gather_into_tensor":

                    def fn(inp=inp, out=out):
                        gfdit.all_gather_into_tensor(out, inp)
                elif op == "all_to_all_single":

                    def fn(inp=inp, out=out):
                        gfdit.all_to_all_single(out, inp)
                else:

                    def fn(inp=inp):
                        gfdit.all_reduce(inp)

                try:
                    for _ in range(3):
                        fn()
                    _sync_barrier()
                    t = _timed_loop(fn, iters_for(size))
                    gfdit.get_world().check()
                    if op == "all_reduce":
                        ok = bool(out[0].item() == 0.0 and out[-1].item() == 0.0)
                    else:
                        blocks = out.view(n, -1)
                        # block j comes from rank j, which filled its input with j + 1
                        want = torch.arange(1, n + 1, dtype=torch.float32, device=dev)
                        ok = bool(torch.equal(blocks[:, 0], want) and torch.equal(blocks[:, -1], want))
                    err = ""
                except Exception as e:  # a failed size is a row; the world is probably broken: stop
                    t, ok, err = float("nan"), False, f"{type(e).__name__}: {str(e)[:200]}"
                worst = ctx.max_over_ranks([t if not math.isnan(t) else float("inf"), float(not ok)])
                records.append(
                    {
                        "op": op,
                        "kind": kind,
                        "size": size,
                        "bytes": elems * 4,
                        "time_s": worst[0],
                        "ok": worst[1] == 0.0,
                        "error": err,
                    }
                )
                del inp, out, fn
                if err:
                    return records
    return records


def _attention_inputs(shape, dtype, seed, dev):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype).to(dev) for _ in range(3)]


def rank_attention(ctx: C.RankContext) -> list[dict[str, Any]]:
    import gfdit
    import gfdit.attention as ga
    import torch

    opts = ctx.options
    n, me, dev = ctx.world_size, ctx.rank, _dev()
    b, s, h, d = opts["attn_shape"]
    dtype = getattr(torch, opts["attn_dtype"])
    q, k, v = _attention_inputs((b, s, h, d), dtype, 7, dev)
    splits = [s // n] * n
    rows = slice(me * (s // n), (me + 1) * (s // n))
    # single-process attention on this GPU of this rank's rows over the whole sequence
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:, rows].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    ).transpose(1, 2)
    modes = [("ulysses", dict(ulysses=n, ring=1)), ("ring", dict(ulysses=1, ring=n))]
    modes.append(("torus", dict(ulysses=n, ring=1, mode="torus")))
    if n == 4:
        modes += [
            ("usp 2x2 ulysses-low", dict(ulysses=2, ring=2, placement="ulysses-low")),
            ("usp 2x2 ring-low", dict(ulysses=2, ring=2, placement="ring-low")),
            ("torus 2x2", dict(ulysses=2, ring=2, mode="torus", placement="ulysses-low")),
        ]
    records = []
    ql, kl, vl = (x[:, rows].contiguous() for x in (q, k, v))
    for name, spec_kw in modes:
        try:
            spec = gfdit.ParallelSpec(**spec_kw)

            def fn(spec=spec):
                return ga.attention(ql, kl, vl, spec=spec, seq_splits=splits)

            out = fn()
            fn()
            _sync_barrier()
            t = _timed_loop(fn, int(opts["attn_iters"]))
            err = (out.float() - ref.float()).abs().max().item()
            msg = ""
        except Exception as e:
            t, err, msg = float("nan"), float("inf"), f"{type(e).__name__}: {str(e)[:200]}"
        worst = ctx.max_over_ranks([t if not math.isnan(t) else float("inf"), err])
        records.append({"mode": name, "spec": spec_kw, "time_s": worst[0], "max_err": worst[1], "error": msg})
        if msg:
            break
    return records


def rank_model(ctx: C.RankContext) -> dict[str, Any]:
    import gfdit
    import torch
    from gfdit import models

    n, me, dev = ctx.world_size, ctx.rank, _dev()
    m = models.load("tiny-wan", device=dev)
    cond = m.encode("a red fox in the snow")
    shape = m.latent_shape()
    state = m.initial_state(cond, m.init_latent(3, shape), grid=tuple(shape[2:]))
    whole = gfdit.new_group(list(range(n)))
    spec = gfdit.ParallelSpec(ulysses=n)
    par = m.denoise_step(state, 0, group=whole, spec=spec)  # warm
    _sync_barrier()
    times = []
    for _ in range(5):
        _sync_barrier()
        t0 = time.perf_counter()
        par = m.denoise_step(state, 0, group=whole, spec=spec)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    one_times = []
    one = None
    _sync_barrier()
    if me == 0:  # world 1 alone on the GPU
        mine = gfdit.new_group([0])
        one = m.denoise_step(state, 0, group=mine, spec=None)
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            one = m.denoise_step(state, 0, group=mine, spec=None)
            torch.cuda.synchronize()
            one_times.append(time.perf_counter() - t0)
    _sync_barrier()
    if one is None:
        one = m.denoise_step(state, 0, group=gfdit.new_group([me]), spec=None)
    err = (par.latent.double() - one.latent.double()).abs().max().item()
    rel = err / max(one.latent.abs().max().item(), 1e-30)
    worst = ctx.max_over_ranks([C.median(times), rel])
    return {
        "spec": f"ulysses {n}",
        "step_s": worst[0],
        "world1_step_s": C.median(one_times) if one_times else float("nan"),
        "rel_err": worst[1],
        "latent_shape": list(state.latent.shape),
    }


# ----------------------------------------------------------------------------------------------------------
# parent-process baselines


def measure_copy(sizes: list[int]) -> dict[int, dict[str, float]]:
    import torch

    out = {}
    for size in sizes:
        src = torch.randint(0, 255, (size,), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        torch.cuda.synchronize()
        t = _timed_loop(lambda dst=dst, src=src: dst.copy_(src), iters_for(size))
        out[size] = {"time_s": t, "bytes_per_s": size / t}
        del src, dst
    torch.cuda.empty_cache()
    return out


def measure_single_attention(shape, dtype_name: str, iters: int) -> dict[str, float]:
    import torch
    from gfdit.attention import core

    dtype = getattr(torch, dtype_name)
    q, k, v = _attention_inputs(shape, dtype, 7, torch.device("cuda"))
    qb, kb, vb = (x.transpose(1, 2) for x in (q, k, v))

    def local():  # what one member of gfdit.attention runs
        return core._local(q, k, v, None, False)  # no joint tokens

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(qb, kb, vb)

    res = {}
    for name, fn in (("gfdit_local", local), ("sdpa", sdpa)):
        fn()
        torch.cuda.synchronize()
        res[name + "_s"] = _timed_loop(fn, iters)
    return res


# ----------------------------------------------------------------------------------------------------------
# report


def gpus_per_world(n: int) -> int:
    import torch

    return max(1, min(n, torch.cuda.device_count()))


def mps_state() -> str:
    """Whether the ranks' processes share the GPU through MPS, as the caller says (GFDIT_BENCH_MPS)."""
    value = os.environ.get("GFDIT_BENCH_MPS", "").strip().lower()
    return value if value in ("on", "off") else "unknown"


def sharing(worlds: list[int], mps: str) -> str:
    """How the measured worlds' ranks sit on the GPUs, e.g. "2, 4 processes on 1 GPU, MPS on"."""
    per_gpus: dict[int, list[int]] = {}
    for n in sorted(set(worlds)):
        per_gpus.setdefault(gpus_per_world(n), []).append(n)
    parts = [
        f"{', '.join(str(n) for n in ns)} processes on {g} GPU{'s' if g > 1 else ''}"
        for g, ns in sorted(per_gpus.items())
    ]
    return f"{'; '.join(parts)}, MPS {mps}"


def build_tables(result: dict[str, Any]) -> tuple[str, list[C.Target]]:
    texts, targets = [], []
    mps = result.get("env", {}).get("mps", "unknown")

    def placed(title: str, worlds) -> str:
        return f"{title} [{sharing([int(n) for n in worlds], mps)}]"

    copy = {int(k): v for k, v in result.get("copy", {}).items()}
    errors = result.get("errors", {})
    if copy:
        rows = [
            [C.fmt_size(s), C.fmt_us(v["time_s"]), C.fmt_gbps(v["bytes_per_s"])]
            for s, v in sorted(copy.items())
        ]
        texts.append(
            C.print_table("device-to-device copy (torch copy_, one process)", ["size", "us", "GB/s"], rows)
        )
    single = result.get("single_attention")
    groups = result.get("groups", {})
    if groups:
        rows = []
        for n, g in sorted(groups.items(), key=lambda x: int(x[0])):
            if "error" in g:
                rows.append([str(n), "-", "-", "-", g["error"][:80]])
                continue
            rows.append(
                [
                    str(n),
                    C.fmt_us(g["new_group_s"]),
                    C.fmt_us(g["first_collective_s"]),
                    C.fmt_us(g["warm_collective_s"]),
                ]
            )
        texts.append(
            C.print_table(
                placed(
                    "group formation (new_group: host; collectives: 4 KiB CUDA all_reduce to the device's end)",
                    groups,
                ),
                ["ranks", "new_group us", "first collective us", "warm collective us", "error"],
                rows,
            )
        )
    coll = result.get("collectives", {})
    if coll:
        rows = []
        for n_s, recs in sorted(coll.items(), key=lambda x: int(x[0])):
            n = int(n_s)
            share = n / gpus_per_world(n)
            for rec in recs:
                op, kind, size = rec["op"], rec["kind"], rec["size"]
                if rec.get("skipped"):
                    rows.append(
                        [f"{n} {SHORT[op]} {kind}", C.fmt_size(size), "-", "-", "-", "-", rec["skipped"]]
                    )
                    continue
                t = rec["time_s"]
                valid = rec["ok"] and math.isfinite(t) and t > 0
                busbw = busbw_factor(op, n) * rec["bytes"] / t if valid else float("nan")
                moved = busbw * share
                base = copy.get(size, {}).get("bytes_per_s")
                frac = moved / base if base and valid else float("nan")
                note = "" if rec["ok"] else ("WRONG RESULT " + rec.get("error", ""))[:60]
                if size >= TARGET_COPY_FROM and base:
                    met = bool(valid and frac >= TARGET_COPY_FRACTION)
                    targets.append(
                        C.Target(
                            f"{n} ranks {SHORT[op]} {kind} {C.fmt_size(size)} vs copy", frac, ">= 70%", met
                        )
                    )
                    note = note or f"target 70%: {C.verdict(met)}"
                if size == TARGET_LATENCY_SIZE:
                    met = bool(valid and t < TARGET_LATENCY_S)
                    targets.append(C.Target(f"{n} ranks {SHORT[op]} {kind} 4 KiB latency", t, "< 10 us", met))
                    note = note or f"target <10us: {C.verdict(met)}"
                rows.append(
                    [
                        f"{n} {SHORT[op]} {kind}",
                        C.fmt_size(size),
                        C.fmt_us(t),
                        C.fmt_gbps(busbw),
                        C.fmt_gbps(moved),
                        C.fmt_pct(frac),
                        note,
                    ]
                )
        texts.append(
            C.print_table(
                placed(
                    "collectives on CUDA tensors (time per op: CUDA events over a loop, max over ranks)", coll
                ),
                ["ranks op kind", "size/rank", "us", "busbw GB/s", "moved/GPU GB/s", "vs copy", "note"],
                rows,
                notes=[
                    "moved/GPU = busbw x ranks sharing one GPU; vs copy = moved/GPU / copy_ GB/s of the same size"
                ],
            )
        )
    attn = result.get("attention", {})
    if attn or single:
        rows = []
        if single:
            rows.append(
                [
                    "1",
                    "single process (gfdit local)",
                    f"{single['gfdit_local_s'] * 1e3:.3f}",
                    "1.00x",
                    "-",
                    "",
                ]
            )
            rows.append(["1", "single process (torch SDPA)", f"{single['sdpa_s'] * 1e3:.3f}", "-", "-", ""])
        base = single["gfdit_local_s"] if single else None
        for n_s, recs in sorted(attn.items(), key=lambda x: int(x[0])):
            for rec in recs:
                t = rec["time_s"]
                ok = math.isfinite(t) and rec["max_err"] <= 0.05 and not rec["error"]
                targets.append(
                    C.Target(
                        f"{n_s} ranks attention {rec['mode']} matches one process",
                        rec["max_err"],
                        "<= 0.05 (bf16)",
                        ok,
                    )
                )
                rows.append(
                    [
                        n_s,
                        rec["mode"],
                        f"{t * 1e3:.3f}" if math.isfinite(t) else "-",
                        C.fmt_ratio(base / t) if base and math.isfinite(t) else "-",
                        f"{rec['max_err']:.2e}" if math.isfinite(rec["max_err"]) else "-",
                        rec["error"][:60],
                    ]
                )
        shape = result.get("attn_shape")
        texts.append(
            C.print_table(
                placed(f"attention {shape} {result.get('attn_dtype')} (ms per call, max over ranks)", attn),
                ["ranks", "mode", "ms", "vs single", "max err vs 1 proc", "error"],
                rows,
            )
        )
    model = result.get("model", {})
    if model:
        rows = []
        for n_s, rec in sorted(model.items(), key=lambda x: int(x[0])):
            ok = rec["rel_err"] <= 1e-3
            targets.append(
                C.Target(f"{n_s} ranks tiny-wan step matches world 1", rec["rel_err"], "<= 1e-3 rel", ok)
            )
            rows.append(
                [
                    n_s,
                    rec["spec"],
                    f"{rec['step_s'] * 1e3:.2f}",
                    f"{rec['world1_step_s'] * 1e3:.2f}",
                    f"{rec['rel_err']:.2e}",
                ]
            )
        texts.append(
            C.print_table(
                placed("tiny-wan denoise step on CUDA", model),
                ["ranks", "spec", "step ms", "world 1 ms", "rel err vs world 1"],
                rows,
            )
        )
    if errors:
        rows = [[k, str(v).splitlines()[-1][:100] if str(v).strip() else "?"] for k, v in errors.items()]
        texts.append(C.print_table("parts that failed or were skipped", ["part", "why"], rows))
    summary = C.target_summary(targets)
    print(summary, flush=True)
    texts.append(summary)
    return "\n\n".join(texts) + "\n", targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="2,4", help="world sizes (ranks share the GPUs)")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="bytes per rank, e.g. 4K,16M,256M")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"subset of {','.join(PARTS)}")
    ap.add_argument(
        "--budget-s", type=float, default=200.0, help="time for everything; parts past it are skipped"
    )
    ap.add_argument("--attn-shape", default="1,16384,24,128", help="B,S,H,D of attention (S divisible by 4)")
    ap.add_argument("--attn-dtype", default="bfloat16")
    ap.add_argument("--attn-iters", type=int, default=5)
    ap.add_argument("--heap-max", default="64M", help="largest size measured on device heap tensors")
    ap.add_argument("--json", default=None)
    ap.add_argument("--table", default=None, help="also write the tables to this file")
    args = ap.parse_args(argv)
    start = time.monotonic()
    deadline = start + args.budget_s

    try:
        import torch
    except Exception as e:
        print(f"bench_gpu: torch is not importable ({e}); nothing measured", file=sys.stderr)
        return NO_GPU_EXIT
    if not torch.cuda.is_available():
        print(
            f"bench_gpu: no GPU (torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); nothing measured",
            file=sys.stderr,
        )
        return NO_GPU_EXIT
    ok, why = C.gfdit_importable()
    if not ok:
        print(f"bench_gpu: gfdit is not importable ({why}); build it first", file=sys.stderr)
        return 1
    import gfdit

    env = C.environment()
    env["gpu"] = torch.cuda.get_device_name(0)
    env["gpus"] = torch.cuda.device_count()
    env["cuda_transport"] = gfdit.cuda_transport_available()
    env["mps"] = mps_state()
    C.header("bench_gpu", env)
    print(f"bench_gpu: ranks are processes: {sharing(C.parse_ints(args.worlds), env['mps'])}", flush=True)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    worlds = C.parse_ints(args.worlds)
    sizes = C.parse_sizes(args.sizes)
    shape = tuple(C.parse_ints(args.attn_shape))
    result: dict[str, Any] = {
        "env": env,
        "errors": {},
        "attn_shape": list(shape),
        "attn_dtype": args.attn_dtype,
    }

    def soft(name: str, fn, *a) -> Any:
        left = deadline - time.monotonic()
        if left < 15:
            result["errors"][name] = f"skipped: out of time (budget {args.budget_s:.0f} s)"
            return None
        t0 = time.monotonic()
        try:
            out = fn(*a)
            print(f"[bench_gpu] {name}: done in {time.monotonic() - t0:.1f} s", flush=True)
            return out
        except Exception as e:
            result["errors"][name] = f"{type(e).__name__}: {e}"
            print(
                f"[bench_gpu] {name} failed after {time.monotonic() - t0:.1f} s:\n{traceback.format_exc()}",
                flush=True,
            )
            return None

    if "copy" in parts or "collectives" in parts:
        got = soft("copy", measure_copy, sizes)
        if got:
            result["copy"] = got
    if "copy" in parts or "attention" in parts:
        got = soft("single attention", measure_single_attention, shape, args.attn_dtype, args.attn_iters)
        if got:
            result["single_attention"] = got
    torch.cuda.empty_cache()

    base_opts = {"device": "cuda", "gfdit_timeout_s": 30.0, "store_timeout_s": 60.0}
    if "groups" in parts and "collectives" not in parts:
        parts.append("collectives")  # group formation is measured in the collectives' ranks
    world_parts = [p for p in ("collectives", "attention", "model") if p in parts]
    if not gfdit.cuda_transport_available():
        for p in world_parts:
            result["errors"][p] = "skipped: this gfdit build has no CUDA transport"
        world_parts = []
    for part in world_parts:
        for n in worlds:
            if part == "model" and n != 2:
                continue
            opts = dict(base_opts)
            fn = {"collectives": rank_collectives, "attention": rank_attention, "model": rank_model}[part]
            if part == "collectives":  # at most half of what is left, shared by the worlds
                left = max(10.0, 0.5 * (deadline - time.monotonic()))
                opts.update(
                    sizes=sizes, budget_s=left / max(1, len(worlds)), heap_max=C.parse_size(args.heap_max)
                )
                opts["heap_bytes"] = 1 << 30
            if part == "attention":
                opts.update(attn_shape=shape, attn_dtype=args.attn_dtype, attn_iters=args.attn_iters)
                opts["heap_bytes"] = 1 << 30
            timeout = max(20.0, deadline - time.monotonic())
            got = soft(f"{part} (ranks {n})", C.run_ranks, fn, n, opts, timeout)
            if got is None:
                continue
            if part == "collectives":
                result.setdefault("groups", {})[str(n)] = got[0]["groups"]
                result.setdefault("collectives", {})[str(n)] = got[0]["records"]
            else:
                result.setdefault(part, {})[str(n)] = got[0]

    table, targets = build_tables(result)
    result["targets"] = [t.as_dict() for t in targets]
    result["elapsed_s"] = time.monotonic() - start
    C.write_json(args.json, result)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table)
    failed = [k for k, v in result["errors"].items() if not str(v).startswith("skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
