#!/usr/bin/env python3
"""Sequence-parallel attention: gfdit.attention against the same algorithm on gloo, in the same run.

For every mode (Ulysses, Ring, USP, Torus) and sequence length (tokens of the whole sequence; B=1, H=8,
D=64, float32 by default) it reports, with one process per rank and one thread per process:

  * T1: the attention layer at world 1 (gfdit.attention on a one-member group = plain flash attention
    for CPU), in a world of one process;
  * T2 gfdit: gfdit.attention.attention(q, k, v, group=world, spec=...) at world 2;
  * T2 gloo: the same algorithm on torch.distributed gloo (bench/attention_baseline.py: Ulysses with
    all_to_all_single on permuted contiguous tensors, Ring with isend/irecv of K/V blocks; same local
    flash attention and log-sum-exp merge, gfdit's own PartialMerger);
  * comm gfdit / comm gloo: both layers with the local attention removed (PartialMerger.add_block patched
    to do nothing, so the result is the merger's empty result): what remains is the communication and the
    packing around it;
  * ratios: comm speedup = comm gloo / comm gfdit (target >= 10x); layer speedup = T2 gloo / T2 gfdit
    (target >= 1x, >= 2x at 1k tokens); parallel efficiency = T1 / (world * T2 gfdit) (target >= 0.8
    from 8k tokens up).

Then Torus against USP on the same grid, and a whole tiny-Wan transformer forward (diffusers
WanTransformer3DModel, seeded weights, a few thousand tokens): T1 = the plain model in a world of one
process, T2 gfdit = gfdit.models.parallelize(model)(..., group=, spec=), T2 gloo = the same wrapper with its
attention call (gfdit.models.wan.attention) replaced by the gloo baseline.

Timing: each (mode, tokens) runs its gfdit and gloo variants once to warm up, then alternately for a few
repetitions, each call after a barrier; a repetition's time is the max over ranks, the table shows the
median over repetitions. At world 2 USP and Torus have no 2-D grid: USP 2x1 is the Ulysses call itself
(same code path) and Torus 2x1 is Torus's chunked, one-sided Ulysses pipeline with a ring of one.

    python bench/bench_attention.py                  # full: 1k..16k tokens, under ~8 minutes on 2 cores
    python bench/bench_attention.py --quick          # 1k and 4k tokens, smaller Wan, under ~90 s
    python bench/bench_attention.py --tokens 2k --modes ring,torus --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

MODES = ("ulysses", "ring", "usp", "torus")
DEFAULT_TOKENS = "1k,2k,4k,8k,16k"
QUICK_TOKENS = "1k,4k"

TARGET_COMM_SPEEDUP = 10.0
TARGET_LAYER_SPEEDUP = 1.0
TARGET_LAYER_SPEEDUP_SMALL = 2.0
TARGET_SMALL_TOKENS = 1024
TARGET_EFFICIENCY = 0.8
TARGET_EFFICIENCY_FROM = 8192

# Tiny Wan for the whole-model figures: tiny.WAN_CONFIG with the layer benchmark's heads (8 x 64).
WAN_OVERRIDES = dict(num_attention_heads=8, attention_head_dim=64, ffn_dim=1024, num_layers=2)
WAN_LATENT = dict(frames=4, height=48, width=64)  # 4 x 24 x 32 = 3072 tokens (patch 1x2x2)
WAN_LATENT_QUICK = dict(frames=2, height=48, width=64)  # 1536 tokens


def parse_tokens(text: str) -> list[int]:
    out = []
    for s in text.split(","):
        s = s.strip().lower()
        if s:
            out.append(int(float(s[:-1]) * 1024) if s.endswith("k") else int(s))
    return out


def fmt_tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def fmt_ms(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:,.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    return f"{ms:.2f}"


def grid(mode: str, n: int) -> tuple[int, int]:
    """(ulysses, ring) of a mode on n members: USP/Torus take the most square 2-D grid, else n x 1."""
    if mode == "ulysses":
        return n, 1
    if mode == "ring":
        return 1, n
    best = (n, 1)
    for u in range(2, n):
        if n % u == 0 and u >= n // u:
            best = (u, n // u)
    return best


def pass_fail(met: bool | None) -> str:
    return "-" if met is None else ("PASS" if met else "FAIL")


# ----------------------------------------------------------------------------------------------------------
# inside a rank


@contextlib.contextmanager
def comm_only():
    """Removes the local attention from every PartialMerger (gfdit's and the baseline's alike)."""
    from gfdit.attention.local import PartialMerger

    saved = PartialMerger.add_block
    PartialMerger.add_block = lambda self, q, k, v: None
    try:
        yield
    finally:
        PartialMerger.add_block = saved


def measure(
    ctx: C.RankContext, fns: list[tuple[str, Callable[[], Any]]], opts: dict[str, Any], target_s: float
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Warm-up (one call each, outputs kept), then alternating timed repetitions, each after a barrier.

    Returns ({name: {"median_s", "times_s" (max over ranks per repetition), "reps"}}, {name: warm-up output}).
    """
    import gfdit

    outs: dict[str, Any] = {}
    warm = 0.0
    for _ in range(opts["warmup"]):
        for name, fn in fns:
            gfdit.barrier()
            t0 = time.perf_counter()
            outs[name] = fn()
            warm += time.perf_counter() - t0
    warm = ctx.max_over_ranks([warm / max(1, opts["warmup"])])[0]  # same repetition count on every rank
    reps = int(max(opts["min_reps"], min(opts["max_reps"], math.ceil(target_s / max(warm, 1e-6)))))
    times = {name: [0.0] * reps for name, _ in fns}
    for i in range(reps):
        for name, fn in fns:
            gfdit.barrier()
            t0 = time.perf_counter_ns()
            fn()
            times[name][i] = (time.perf_counter_ns() - t0) * 1e-9
    res = {}
    for name, _ in fns:
        per_rank = ctx.gather_over_ranks(times[name])
        worst = [max(r[i] for r in per_rank) for i in range(reps)]
        res[name] = {"median_s": C.median(worst), "times_s": worst, "reps": reps}
    return res, outs


def make_qkv(tokens_local: int, opts: dict[str, Any], rank: int):
    import torch

    dtype = getattr(torch, opts["dtype"])
    g = torch.Generator().manual_seed(1000 + rank + 7 * tokens_local)
    shape = (opts["batch"], tokens_local, opts["heads"], opts["head_dim"])
    return tuple(torch.randn(shape, generator=g).to(dtype) for _ in range(3))


def world1_fn(ctx: C.RankContext) -> dict[str, Any]:
    """T1: the attention layer and the plain tiny Wan in a world of one process."""
    import gfdit
    import torch
    from gfdit.attention import ParallelSpec

    opts = ctx.options
    one = gfdit.new_group([ctx.rank])
    spec = ParallelSpec(ulysses=1, ring=1, mode="usp", placement="ulysses-low")
    out: dict[str, Any] = {"layer": {}, "wan": None}
    for tokens in opts["tokens"]:
        q, k, v = make_qkv(tokens, opts, 0)
        layer_fn = lambda: gfdit.attention.attention(q, k, v, group=one, spec=spec)  # noqa: E731
        res, _ = measure(ctx, [("t1", layer_fn)], opts, opts["layer_target_s"])
        out["layer"][tokens] = res["t1"]
        print(
            f"  world 1, {fmt_tokens(tokens)} tokens: T1 {fmt_ms(res['t1']['median_s'])} ms "
            f"({res['t1']['reps']} reps)",
            flush=True,
        )
        q = k = v = None  # free them before the next benchmark
    if opts["wan"]:
        from gfdit.models import tiny

        model = tiny.tiny_wan(0, **WAN_OVERRIDES)
        inputs = tiny.wan_inputs(model, 1, **opts["wan_latent"])
        with torch.no_grad():
            res, _ = measure(ctx, [("t1", lambda: model(**inputs))], opts, opts["wan_target_s"])
        out["wan"] = res["t1"]
        print(
            f"  world 1, tiny Wan {opts['wan_tokens']} tokens: T1 {fmt_ms(res['t1']['median_s'])} ms",
            flush=True,
        )
    return out


def world2_fn(ctx: C.RankContext) -> dict[str, Any]:
    """T2 and comm-only times of gfdit and the gloo baseline, then the tiny Wan."""
    import gfdit
    import torch
    from attention_baseline import GlooUSP
    from gfdit.attention import ParallelSpec

    opts = ctx.options
    n = ctx.world_size
    # Every gloo grid is built up front (dist.new_group is collective), outside any timed region.
    gloo = {}
    for mode in opts["modes"]:
        ur = grid(mode, n)
        if ur not in gloo:
            gloo[ur] = GlooUSP(*ur)
    specs = {
        m: ParallelSpec(
            ulysses=grid(m, n)[0],
            ring=grid(m, n)[1],
            mode="torus" if m == "torus" else "usp",
            placement="ulysses-low",
        )
        for m in opts["modes"]
    }
    records: list[dict[str, Any]] = []
    for tokens in opts["tokens"]:
        q, k, v = make_qkv(tokens // n, opts, ctx.rank)
        for mode in opts["modes"]:
            spec, base = specs[mode], gloo[grid(mode, n)]
            g_fn = lambda: gfdit.attention.attention(q, k, v, spec=spec)  # noqa: E731
            b_fn = lambda: base(q, k, v)  # noqa: E731
            layer, outs = measure(ctx, [("gfdit", g_fn), ("gloo", b_fn)], opts, opts["layer_target_s"])
            diff = float((outs["gfdit"].float() - outs["gloo"].float()).abs().max())
            diff = ctx.max_over_ranks([diff])[0]
            del outs
            with comm_only():
                comm, _ = measure(ctx, [("gfdit", g_fn), ("gloo", b_fn)], opts, opts["comm_target_s"])
            rec = {
                "mode": mode,
                "ulysses": spec.ulysses,
                "ring": spec.ring,
                "spec_mode": spec.mode,
                "tokens": tokens,
                "world_size": n,
                "max_abs_diff_gfdit_vs_gloo": diff,
                "layer_gfdit": layer["gfdit"],
                "layer_gloo": layer["gloo"],
                "comm_gfdit": comm["gfdit"],
                "comm_gloo": comm["gloo"],
            }
            records.append(rec)
            ctx.log(
                f"  world {n}, {mode:<7} {spec.ulysses}x{spec.ring} {fmt_tokens(tokens):>3}: "
                f"gfdit {fmt_ms(layer['gfdit']['median_s'])} ms, "
                f"gloo {fmt_ms(layer['gloo']['median_s'])} ms "
                f"({layer['gfdit']['reps']} reps); comm gfdit {fmt_ms(comm['gfdit']['median_s'])} ms, "
                f"gloo {fmt_ms(comm['gloo']['median_s'])} ms ({comm['gfdit']['reps']} reps)"
            )
        q = k = v = None  # free them before the next benchmark
    wan: list[dict[str, Any]] = []
    if opts["wan"]:
        import gfdit.models.wan as wan_mod
        from gfdit.models import parallelize, tiny

        model = tiny.tiny_wan(0, **WAN_OVERRIDES)
        inputs = tiny.wan_inputs(model, 1, **opts["wan_latent"])
        par = parallelize(model)
        gfdit_attention = wan_mod.attention

        def gloo_attention(q_, k_, v_, *, group=None, spec=None):  # what WanSelfAttentionProcessor calls
            return gloo[(spec.ulysses, spec.ring)](q_, k_, v_)

        for mode in opts["wan_modes"]:
            spec = specs[mode]

            def g_fn(spec=spec):
                return par(**inputs, spec=spec)[0]

            def b_fn(spec=spec):
                wan_mod.attention = gloo_attention
                try:
                    return par(**inputs, spec=spec)[0]
                finally:
                    wan_mod.attention = gfdit_attention

            with torch.no_grad():
                res, outs = measure(ctx, [("gfdit", g_fn), ("gloo", b_fn)], opts, opts["wan_target_s"])
            diff = ctx.max_over_ranks([float((outs["gfdit"] - outs["gloo"]).abs().max())])[0]
            wan.append(
                {
                    "mode": mode,
                    "ulysses": spec.ulysses,
                    "ring": spec.ring,
                    "spec_mode": spec.mode,
                    "world_size": n,
                    "max_abs_diff_gfdit_vs_gloo": diff,
                    "gfdit": res["gfdit"],
                    "gloo": res["gloo"],
                }
            )
            ctx.log(
                f"  world {n}, tiny Wan {mode:<7}: gfdit {fmt_ms(res['gfdit']['median_s'])} ms, "
                f"gloo {fmt_ms(res['gloo']['median_s'])} ms ({res['gfdit']['reps']} reps)"
            )
    return {"records": records, "wan": wan}


# ----------------------------------------------------------------------------------------------------------
# report


def report(t1: dict[str, Any], w2: dict[str, Any], opts: dict[str, Any]) -> tuple[list[str], list[C.Target]]:
    n = opts["world"]
    tables, targets = [], []
    rows = []
    for rec in w2["records"]:
        mode, tokens = rec["mode"], rec["tokens"]
        t_1 = t1["layer"][tokens]["median_s"]
        tg, tb = rec["layer_gfdit"]["median_s"], rec["layer_gloo"]["median_s"]
        cg, cb = rec["comm_gfdit"]["median_s"], rec["comm_gloo"]["median_s"]
        comm_x, layer_x, eff = cb / cg, tb / tg, t_1 / (n * tg)
        layer_tgt = TARGET_LAYER_SPEEDUP_SMALL if tokens <= TARGET_SMALL_TOKENS else TARGET_LAYER_SPEEDUP
        eff_tgt = TARGET_EFFICIENCY if tokens >= TARGET_EFFICIENCY_FROM else None
        comm_ok, layer_ok = comm_x >= TARGET_COMM_SPEEDUP, layer_x >= layer_tgt
        eff_ok = None if eff_tgt is None else eff >= eff_tgt
        check_ok = rec["max_abs_diff_gfdit_vs_gloo"] <= opts["check_tol"]
        rec.update(
            {
                "t1_s": t_1,
                "comm_speedup": comm_x,
                "layer_speedup": layer_x,
                "parallel_efficiency": eff,
                "comm_fraction_gfdit": cg / tg,
                "check_ok": check_ok,
                "targets": {
                    "comm_speedup": TARGET_COMM_SPEEDUP,
                    "layer_speedup": layer_tgt,
                    "parallel_efficiency": eff_tgt,
                },
            }
        )
        name = f"attention {mode} {rec['ulysses']}x{rec['ring']} {fmt_tokens(tokens)}"
        targets.append(
            C.Target(f"{name}: comm speedup vs gloo", comm_x, f">= {TARGET_COMM_SPEEDUP:.0f}x", comm_ok)
        )
        targets.append(C.Target(f"{name}: layer speedup vs gloo", layer_x, f">= {layer_tgt:.0f}x", layer_ok))
        if eff_tgt is not None:
            targets.append(C.Target(f"{name}: parallel efficiency", eff, f">= {eff_tgt:.1f}", eff_ok))
        if not check_ok:
            targets.append(
                C.Target(
                    f"{name}: result equals gloo's",
                    rec["max_abs_diff_gfdit_vs_gloo"],
                    f"<= {opts['check_tol']:g}",
                    False,
                )
            )
        rows.append(
            [
                mode,
                f"{rec['ulysses']}x{rec['ring']}",
                fmt_tokens(tokens),
                fmt_ms(t_1),
                fmt_ms(tg),
                fmt_ms(tb),
                fmt_ms(cg),
                fmt_ms(cb),
                C.fmt_pct(cg / tg),
                C.fmt_ratio(comm_x),
                pass_fail(comm_ok),
                C.fmt_ratio(layer_x),
                f">={layer_tgt:.0f}x {pass_fail(layer_ok)}",
                f"{eff:.2f}",
                f">={eff_tgt:.1f} {pass_fail(eff_ok)}" if eff_tgt else "-",
                f"{rec['max_abs_diff_gfdit_vs_gloo']:.0e}" + ("" if check_ok else " FAIL"),
            ]
        )
    headers = [
        "mode",
        "grid",
        "tokens",
        "T1",
        "T2 gfdit",
        "T2 gloo",
        "comm gfdit",
        "comm gloo",
        "comm/T2",
        "comm x",
        ">=10x",
        "layer x",
        "target",
        "eff",
        "target",
        "|gfdit-gloo|",
    ]
    notes = [
        f"times in ms; B={opts['batch']}, H={opts['heads']}, D={opts['head_dim']}, {opts['dtype']}, "
        f"world {n} "
        "(one process per rank, torch.set_num_threads(1)); tokens = whole sequence, each rank holds 1/"
        f"{n}",
        "T1: world 1 (one process), gfdit.attention on a 1-member group = flash attention for CPU; T2: world "
        f"{n}; each time = median over repetitions of the max over ranks",
        "comm: the same layer with PartialMerger.add_block patched out (no local attention); comm/T2 = comm "
        "gfdit / T2 gfdit",
        "comm x = comm gloo / comm gfdit; layer x = T2 gloo / T2 gfdit; eff = T1 / (world * T2 gfdit); "
        "|gfdit-gloo| = max abs difference of the outputs",
    ]
    if n == 2:
        notes.append(
            "world 2: USP 2x1 is the Ulysses call itself (no 2-D grid; same code path, a second "
            "measurement); Torus 2x1 = chunked Ulysses with one-sided puts, ring of one. "
            "Baseline of USP and Torus = gloo USP on the same grid"
        )
    tables.append(
        C.print_table(f"Sequence-parallel attention, gfdit vs gloo (world {n})", headers, rows, notes)
    )

    # Torus against USP on the same grid.
    by = {(r["mode"], r["tokens"]): r for r in w2["records"]}
    rows = []
    for tokens in opts["tokens"]:
        u, t = by.get(("usp", tokens)), by.get(("torus", tokens))
        if u is None or t is None:
            continue
        rows.append(
            [
                fmt_tokens(tokens),
                f"{t['ulysses']}x{t['ring']}",
                fmt_ms(u["layer_gfdit"]["median_s"]),
                fmt_ms(t["layer_gfdit"]["median_s"]),
                C.fmt_ratio(u["layer_gfdit"]["median_s"] / t["layer_gfdit"]["median_s"]),
                fmt_ms(u["comm_gfdit"]["median_s"]),
                fmt_ms(t["comm_gfdit"]["median_s"]),
                C.fmt_ratio(u["comm_gfdit"]["median_s"] / t["comm_gfdit"]["median_s"]),
            ]
        )
    if rows:
        tables.append(
            C.print_table(
                "Torus vs USP at equal degree (gfdit)",
                ["tokens", "grid", "T2 USP", "T2 Torus", "USP/Torus", "comm USP", "comm Torus", "USP/Torus"],
                rows,
                ["times in ms; USP/Torus > 1x: Torus is faster; no target"],
            )
        )

    if w2["wan"]:
        t_1 = t1["wan"]["median_s"]
        rows = []
        for rec in w2["wan"]:
            tg, tb = rec["gfdit"]["median_s"], rec["gloo"]["median_s"]
            layer_x, eff = tb / tg, t_1 / (n * tg)
            ok = layer_x >= TARGET_LAYER_SPEEDUP
            check_ok = rec["max_abs_diff_gfdit_vs_gloo"] <= opts["check_tol"]
            rec.update({"t1_s": t_1, "speedup": layer_x, "parallel_efficiency": eff, "check_ok": check_ok})
            name = f"tiny Wan {opts['wan_tokens']} tokens {rec['mode']} {rec['ulysses']}x{rec['ring']}"
            targets.append(
                C.Target(f"{name}: forward speedup vs gloo", layer_x, f">= {TARGET_LAYER_SPEEDUP:.0f}x", ok)
            )
            if not check_ok:
                targets.append(
                    C.Target(
                        f"{name}: output equals gloo's",
                        rec["max_abs_diff_gfdit_vs_gloo"],
                        f"<= {opts['check_tol']:g}",
                        False,
                    )
                )
            rows.append(
                [
                    rec["mode"],
                    f"{rec['ulysses']}x{rec['ring']}",
                    opts["wan_tokens"],
                    fmt_ms(t_1),
                    fmt_ms(tg),
                    fmt_ms(tb),
                    C.fmt_ratio(layer_x),
                    f">=1x {pass_fail(ok)}",
                    f"{eff:.2f}",
                    f"{rec['max_abs_diff_gfdit_vs_gloo']:.0e}" + ("" if check_ok else " FAIL"),
                ]
            )
        cfg = ", ".join(f"{k}={v}" for k, v in WAN_OVERRIDES.items())
        lat = opts["wan_latent"]
        tables.append(
            C.print_table(
                "Tiny Wan transformer forward (diffusers WanTransformer3DModel), gfdit vs gloo",
                [
                    "mode",
                    "grid",
                    "tokens",
                    "T1",
                    "T2 gfdit",
                    "T2 gloo",
                    "x gloo",
                    "target",
                    "eff",
                    "|gfdit-gloo|",
                ],
                rows,
                [
                    f"times in ms; gfdit.models.tiny.tiny_wan with {cfg}; latent F,H,W = {lat['frames']},"
                    f"{lat['height']},{lat['width']} (patch 1x2x2), 7 text tokens",
                    "T1: the plain model in a world of one process; T2 gfdit: gfdit.models.parallelize(model)(..., "
                    "spec=); T2 gloo: the same wrapper with its attention call replaced by the gloo USP baseline "
                    "(the wrapper's final output all_gather stays on gfdit in both)",
                    "eff = T1 / (world * T2 gfdit), no target at this size (the 0.8 target starts at 8k tokens)",
                ],
            )
        )
    return tables, targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help=f"tokens {QUICK_TOKENS}, smaller Wan, fewer repetitions"
    )
    ap.add_argument("--tokens", default=None, help=f"sequence lengths (default {DEFAULT_TOKENS})")
    ap.add_argument("--modes", default=",".join(MODES), help="comma separated: ulysses,ring,usp,torus")
    ap.add_argument("--wan-modes", default=None, help="modes of the tiny Wan forward (default: --modes)")
    ap.add_argument("--world", type=int, default=2, help="ranks of the parallel runs (default 2)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--max-reps", type=int, default=None, help="most timed repetitions (default 15, quick 7)")
    ap.add_argument("--no-wan", action="store_true", help="skip the tiny Wan forward")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed for one world")
    ap.add_argument(
        "--json",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "attention.json"),
        help="JSON output (default %(default)s)",
    )
    args = ap.parse_args(argv)

    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    wan_modes = [m for m in (args.wan_modes or args.modes).split(",") if m]
    for m in modes + wan_modes:
        if m not in MODES:
            ap.error(f"unknown mode {m}; choose from {MODES}")
    tokens = parse_tokens(args.tokens or (QUICK_TOKENS if args.quick else DEFAULT_TOKENS))
    for t in tokens:
        if t % args.world:
            ap.error(f"{t} tokens do not split evenly over {args.world} ranks")
    if args.heads % args.world:
        ap.error(f"{args.heads} heads are not divisible by the world size {args.world}")
    latent = WAN_LATENT_QUICK if args.quick else WAN_LATENT
    wan_tokens = latent["frames"] * (latent["height"] // 2) * (latent["width"] // 2)
    opts = {
        "tokens": tokens,
        "modes": modes,
        "wan_modes": wan_modes,
        "world": args.world,
        "batch": 1,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "dtype": args.dtype,
        "warmup": args.warmup,
        "min_reps": args.min_reps,
        "max_reps": args.max_reps or (7 if args.quick else 15),
        # seconds of timed repetitions aimed at per measurement (fewer reps once min_reps exceed it)
        "layer_target_s": 1.0 if args.quick else 4.0,
        "comm_target_s": 0.3 if args.quick else 1.0,
        "wan_target_s": 1.0 if args.quick else 4.0,
        "wan": not args.no_wan,
        "wan_latent": latent,
        "wan_tokens": wan_tokens,
        "check_tol": 1e-3 if args.dtype == "float32" else 5e-2,
        "heap_bytes": 1024 * C.MIB,  # lazily backed; Torus's workspace at 16k tokens is 64 MiB
    }

    env = C.environment()
    C.header("gfdit sequence-parallel attention vs gloo", env)
    print(
        f"config: B=1, H={args.heads}, D={args.head_dim}, {args.dtype}, "
        f"tokens {[fmt_tokens(t) for t in tokens]}, "
        f"modes {modes}, world 1 and {args.world}, one thread per rank",
        flush=True,
    )
    t_start = time.monotonic()
    errors: dict[str, str] = {}
    t1: dict[str, Any] = {}
    w2: dict[str, Any] = {"records": [], "wan": []}
    print("world of 1 process (T1) ...", flush=True)
    try:
        t1 = C.run_ranks(world1_fn, 1, opts, timeout_s=args.timeout)[0]
    except Exception as e:
        errors["world_size=1"] = str(e)
        print(f"world of 1 FAILED: {e}", file=sys.stderr, flush=True)
    print(f"world of {args.world} processes ...", flush=True)
    try:
        w2 = C.run_ranks(world2_fn, args.world, opts, timeout_s=args.timeout)[0]
    except Exception as e:
        errors[f"world_size={args.world}"] = str(e)
        print(f"world of {args.world} FAILED: {e}", file=sys.stderr, flush=True)

    tables: list[str] = []
    targets: list[C.Target] = []
    if not errors:
        tables, targets = report(t1, w2, opts)
        for t in targets:
            value = C.fmt_ratio(t.value) if "speedup" in t.name else f"{t.value:.3g}"
            print(f"{pass_fail(t.met)}  {t.name}: {value} (target {t.target})")
        print(C.target_summary(targets), flush=True)
    else:
        print("errors: " + "; ".join(f"{k}: {v.splitlines()[-1] if v else v}" for k, v in errors.items()))
    load_end = [round(x, 2) for x in os.getloadavg()]
    print(
        f"total {time.monotonic() - t_start:.0f} s; load average at the end {load_end} on "
        f"{env.get('cpu_count')} cpus (above ~1 per cpu, other processes shared the cores and the times "
        "are inflated)",
        flush=True,
    )
    C.write_json(
        args.json,
        {
            "benchmark": "attention",
            "environment": env,
            "loadavg_end_1_5_15": load_end,
            "config": dict(opts, quick=args.quick, wan_overrides=WAN_OVERRIDES),
            "world1": t1,
            "records": w2["records"],
            "wan": w2["wan"],
            "targets": [t.as_dict() for t in targets],
            "errors": errors,
            "tables": tables,
        },
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
