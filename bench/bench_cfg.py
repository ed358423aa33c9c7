#!/usr/bin/env python3
"""CFG-parallel against sequence parallelism at world 2: one denoising step of tiny Wan and tiny Qwen-Image.

A step with guidance runs two transformer passes (conditional and unconditional). At world 2 the step can
run them

  * U2: one after the other, each sequence-parallel over both ranks (Ulysses 2, ``ParallelSpec(ulysses=2)``),
    the way a step runs with cfg 1;
  * CFG2: at once, one pass per rank, then one exchange of the predictions (``ParallelSpec(cfg=2)``, NOTE
    [CFG-parallel] in gfdit.models.staged);

and, for reference, T1: both passes in turn on one rank (each rank runs its own copy at the same time, one
core each). Every variant is ``model.denoise_step(state, 0, group=..., spec=...)`` of the staged model
(gfdit.models.load("tiny-wan" / "tiny-qwen-image"), guidance 4.0, seeded weights), from the same state, at
about 1k, 2k, 4k and 8k image/video tokens.

Timing: one warm-up call of each variant, then the variants alternate for several repetitions, each call
after a barrier; a repetition's time is the max over the two ranks; the table shows the median. The ratio
U2 / CFG2 > 1x means CFG-parallel is faster; |CFG2-U2| is the largest difference of the two next latents
relative to the latent's largest value (both compute the same guided step). One process per rank, one thread
per process.

    python bench/bench_cfg.py              # 1k..8k tokens, both models: about a minute on 2 quiet cores
    python bench/bench_cfg.py --quick      # 1k and 2k tokens, fewer repetitions
    python bench/bench_cfg.py --models tiny-wan --json out.json
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from bench_attention import fmt_ms, fmt_tokens, measure  # noqa: E402

MODELS = ("tiny-wan", "tiny-qwen-image")
# (height, width, num_frames) per model and token count: Wan tokens = latent frames x H/16 x W/16 (VAE 4x8x8,
# patch 1x2x2); Qwen-Image tokens = H/16 x W/16 (VAE 8x8, patch 2x2).
SIZES = {
    "tiny-wan": {1024: (256, 256, 13), 2048: (256, 256, 29), 4096: (512, 512, 13), 8192: (512, 512, 29)},
    "tiny-qwen-image": {
        1024: (512, 512, 1),
        2048: (1024, 512, 1),
        4096: (1024, 1024, 1),
        8192: (2048, 1024, 1),
    },
}
DEFAULT_TOKENS = (1024, 2048, 4096, 8192)
QUICK_TOKENS = (1024, 2048)
VARIANTS = ("t1", "u2", "cfg2")
TARGET_RATIO = 1.0  # CFG2 at least as fast as U2 ...
TARGET_UP_TO = 2048  # ... where communication and per-pass overheads matter; past that compute dominates and
# both split it evenly over the two ranks (reported, no target)


def world_fn(ctx: C.RankContext) -> dict[str, Any]:
    """Every (model, tokens): T1, U2 and CFG2 alternating; the times and the two next latents' difference."""
    import gfdit
    import gfdit.models as gm
    import torch

    opts = ctx.options
    pair = gfdit.new_group([0, 1])
    alone = gfdit.new_group([ctx.rank])
    specs = {
        "t1": (alone, gfdit.ParallelSpec()),
        "u2": (pair, gfdit.ParallelSpec(ulysses=2)),
        "cfg2": (pair, gfdit.ParallelSpec(cfg=2)),
    }
    records = []
    for name in opts["models"]:
        m = gm.load(name)
        cond = m.encode("a paper boat drifting down a rainy street", guidance_scale=4.0)
        for tokens in opts["tokens"]:
            h, w, f = SIZES[name][tokens]
            shape = m.latent_shape(height=h, width=w, num_frames=f)
            state = m.initial_state(
                cond,
                m.init_latent(7, shape),
                grid=tuple(shape[2:]),
                guidance_scale=4.0,
                num_inference_steps=20,
            )

            def step(variant: str, state=state) -> Any:
                group, spec = specs[variant]
                return m.denoise_step(state, 0, group=group, spec=spec)

            with torch.no_grad():
                res, outs = measure(ctx, [(v, lambda v=v: step(v)) for v in VARIANTS], opts, opts["target_s"])
            ref = outs["u2"].latent.double()
            diff = float((outs["cfg2"].latent.double() - ref).abs().max() / ref.abs().max())
            records.append(
                {
                    "model": name,
                    "tokens": tokens,
                    "size": [h, w, f],
                    "latent": list(shape),
                    "max_rel_diff_cfg2_u2": diff,
                    **{v: res[v] for v in VARIANTS},
                }
            )
            ctx.log(
                f"  {name} {fmt_tokens(tokens)} tokens: "
                + ", ".join(f"{v} {fmt_ms(res[v]['median_s'])} ms" for v in VARIANTS)
                + f" ({res['u2']['reps']} reps)"
            )
    return {"records": records}


def report(records: list[dict[str, Any]]) -> tuple[list[str], list[C.Target]]:
    tables, targets = [], []
    for name in dict.fromkeys(r["model"] for r in records):
        rows = []
        for r in (r for r in records if r["model"] == name):
            t1, u2, cfg2 = (r[v]["median_s"] for v in VARIANTS)
            ratio = u2 / cfg2
            judged = r["tokens"] <= TARGET_UP_TO
            targets.append(
                C.Target(
                    f"{name} {fmt_tokens(r['tokens'])} tokens: CFG-parallel 2 vs Ulysses 2 (U2 / CFG2)",
                    ratio,
                    f">= {TARGET_RATIO:g}x" if judged else "none (compute-bound)",
                    ratio >= TARGET_RATIO if judged else None,
                )
            )
            h, w, f = r["size"]
            rows.append(
                [
                    fmt_tokens(r["tokens"]),
                    f"{h}x{w}" + (f"x{f}" if f > 1 else ""),
                    fmt_ms(t1),
                    fmt_ms(u2),
                    fmt_ms(cfg2),
                    C.fmt_ratio(ratio),
                    C.fmt_ratio(t1 / cfg2),
                    C.fmt_ratio(t1 / u2),
                    f"{r['max_rel_diff_cfg2_u2']:.0e}",
                    r["u2"]["reps"],
                ]
            )
        tables.append(
            C.print_table(
                f"{name}: one denoising step with guidance at world 2, CFG-parallel vs Ulysses 2",
                ["tokens", "size", "T1", "U2", "CFG2", "U2/CFG2", "T1/CFG2", "T1/U2", "|CFG2-U2|", "reps"],
                rows,
                [
                    "times in ms, median over repetitions of the max over the two ranks; T1: both passes in turn on "
                    "one rank; U2: both passes in turn, each Ulysses 2 over the two ranks; CFG2: one pass per rank "
                    "at once plus one exchange (ParallelSpec(cfg=2))",
                    "U2/CFG2 > 1x: CFG-parallel is faster (target >= 1x up to 2k tokens; past that compute "
                    "dominates and both split it evenly); T1/x: speedup over one rank; |CFG2-U2|: max difference "
                    "of the next latents relative to the latent's largest value",
                ],
            )
        )
    return tables, targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"tokens {QUICK_TOKENS}, fewer repetitions")
    ap.add_argument("--models", default=",".join(MODELS), help="comma separated: tiny-wan,tiny-qwen-image")
    ap.add_argument("--tokens", default=None, help="comma separated token counts of " + str(DEFAULT_TOKENS))
    ap.add_argument(
        "--min-reps", type=int, default=None, help="fewest timed repetitions (default 5, quick 3)"
    )
    ap.add_argument("--max-reps", type=int, default=None, help="most timed repetitions (default 9, quick 3)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds allowed for the run")
    ap.add_argument(
        "--json",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cfg.json"),
        help="JSON output (default %(default)s)",
    )
    args = ap.parse_args(argv)
    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m}; choose from {MODELS}")
    tokens = (
        [int(t) for t in args.tokens.split(",")]
        if args.tokens
        else list(QUICK_TOKENS if args.quick else DEFAULT_TOKENS)
    )
    for t in tokens:
        if t not in DEFAULT_TOKENS:
            ap.error(f"tokens {t}: choose from {DEFAULT_TOKENS}")
    opts = {
        "models": models,
        "tokens": tokens,
        "warmup": 1,
        "min_reps": args.min_reps or (3 if args.quick else 5),
        "max_reps": args.max_reps or (3 if args.quick else 9),
        "target_s": 1.0 if args.quick else 4.0,  # seconds of timed repetitions aimed at per measurement
        "heap_bytes": 256 * C.MIB,
    }
    env = C.environment()
    C.header("gfdit CFG-parallel vs Ulysses 2 (one denoising step)", env)
    print(f"config: models {models}, tokens {[fmt_tokens(t) for t in tokens]}, world 2, one thread per rank")
    return C.run_world_bench("cfg", world_fn, 2, opts, report, args.json, args.timeout, env, args.quick)


if __name__ == "__main__":
    sys.exit(main())
