#!/usr/bin/env python3
"""The batched denoising step against one request at a time: four requests' trajectories of tiny Qwen-Image
(64x64) and tiny Wan (its default size), default steps, guidance on, in one process on one thread.

Each model runs the denoise steps of four requests (different prompts, so Qwen-Image's text lengths differ,
seeds and guidance scales; the same size and step count):

  * S: one request after another, ``model.denoise_step(state, k)`` for each request's every step (two
    transformer forwards per step: the conditional and unconditional passes);
  * B: one batched trajectory, ``model.denoise_batch(states)`` per step: one forward per pass over the four
    requests (NOTE [batched step] in gfdit.models.staged; Qwen-Image's texts padded to the longest and masked).

No gfdit world: the plain transformer, as a worker of one rank runs it. Timing: one warm-up call of each, then
S and B alternate for several repetitions; the table shows the medians and the throughput ratio S / B (> 1x:
batching is faster). |B-S| is the largest difference of the final latents (both compute the same steps).

    python bench/bench_batch_model.py             # a few seconds on a quiet core
    python bench/bench_batch_model.py --quick     # fewer repetitions
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from bench_attention import fmt_ms  # noqa: E402

# (model, height, width, num_frames); None: the model's default
SIZES = [("tiny-qwen-image", 64, 64, 1), ("tiny-wan", None, None, None)]
TARGET_MODEL = "tiny-qwen-image"
TARGET_RATIO = 1.5  # S / B for four requests
# (prompt, seed, guidance_scale): four requests
REQUESTS = [
    ("a lighthouse at dusk", 1, 4.0),
    ("a small red fox jumping over a lazy dog in the snow", 2, 3.5),
    ("cat", 3, 5.0),
    ("an old wooden boat on a quiet lake", 4, 4.0),
]


def _states(m: Any, h: int | None, w: int | None, f: int | None) -> list[Any]:
    shape = m.latent_shape(height=h, width=w, num_frames=f)
    out = []
    for prompt, seed, scale in REQUESTS:
        cond = m.encode(prompt, guidance_scale=scale)
        out.append(
            m.initial_state(cond, m.init_latent(seed, shape), guidance_scale=scale, grid=tuple(shape[2:]))
        )
    return out


def run(opts: dict[str, Any]) -> list[dict[str, Any]]:
    import gfdit.models as gm
    import torch

    torch.set_num_threads(1)
    records = []
    for name, h, w, f in opts["sizes"]:
        m = gm.load(name)
        start = _states(m, h, w, f)

        def sequential(m: Any = m, start: list[Any] = start) -> list[Any]:
            done = []
            for state in start:
                for k in range(state.num_steps):
                    state = m.denoise_step(state, k)
                done.append(state)
            return done

        def batched(m: Any = m, start: list[Any] = start) -> list[Any]:
            states = start
            while not states[0].done:
                states = m.denoise_batch(states)
            return states

        fns = [("s", sequential), ("b", batched)]
        outs = {name_: fn() for name_, fn in fns}  # warm-up
        times: dict[str, list[float]] = {name_: [] for name_, _ in fns}
        for _ in range(opts["reps"]):
            for name_, fn in fns:
                t0 = time.perf_counter_ns()
                fn()
                times[name_].append((time.perf_counter_ns() - t0) * 1e-9)
        diff = max(float((b.latent - s.latent).abs().max()) for b, s in zip(outs["b"], outs["s"]))
        rec = {
            "model": name,
            "latent": list(m.latent_shape(height=h, width=w, num_frames=f)),
            "requests": len(start),
            "steps": start[0].num_steps,
            "tokens": m.sequence_length(start[0].grid),
            "text_lengths": [int(s.prompt_embeds.shape[1]) for s in start],
            "max_diff_latent": diff,
            **{k: {"median_s": C.median(v), "times_s": v, "reps": len(v)} for k, v in times.items()},
        }
        records.append(rec)
        print(
            f"  {name}: S {fmt_ms(rec['s']['median_s'])} ms, B {fmt_ms(rec['b']['median_s'])} ms "
            f"({opts['reps']} reps)",
            flush=True,
        )
    return records


def report(records: list[dict[str, Any]]) -> tuple[list[str], list[C.Target]]:
    rows, targets = [], []
    for r in records:
        s, b = r["s"]["median_s"], r["b"]["median_s"]
        is_target = r["model"] == TARGET_MODEL
        targets.append(
            C.Target(
                f"{r['model']} {r['requests']} requests: batched vs one at a time (S / B)",
                s / b,
                f">= {TARGET_RATIO:g}x" if is_target else "none",
                s / b >= TARGET_RATIO if is_target else None,
            )
        )
        rows.append(
            [
                r["model"],
                "x".join(map(str, r["latent"][2:])),
                r["tokens"],
                ",".join(map(str, r["text_lengths"])),
                f"{r['requests']} x {r['steps']}",
                fmt_ms(s),
                fmt_ms(b),
                C.fmt_ratio(s / b),
                f"{r['max_diff_latent']:.0e}",
                r["s"]["reps"],
            ]
        )
    table = C.print_table(
        "Denoise steps of four requests: one at a time (S) vs batched (B), one process, one thread",
        ["model", "latent FxHxW", "tokens", "text lengths", "req x steps", "S", "B", "S/B", "|B-S|", "reps"],
        rows,
        [
            "times in ms for all the requests' steps, median over repetitions; S/B > 1x: batching is faster "
            f"(target >= {TARGET_RATIO:g}x for {TARGET_MODEL}); |B-S|: max difference of the final latents",
        ],
    )
    return [table], targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument(
        "--json",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "batch_model.json"),
        help="JSON output (default %(default)s)",
    )
    args = ap.parse_args(argv)
    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2
    opts = {"sizes": SIZES, "reps": 3 if args.quick else 9}
    env = C.environment()
    C.header("gfdit batched denoising step vs one request at a time", env)
    t_start = time.monotonic()
    records = run(opts)
    tables, targets = report(records)
    print(C.target_summary(targets), flush=True)
    print(f"total {time.monotonic() - t_start:.0f} s", flush=True)
    C.write_json(
        args.json,
        {
            "benchmark": "batch_model",
            "environment": env,
            "config": dict(opts, quick=args.quick),
            "records": records,
            "targets": [t.as_dict() for t in targets],
            "tables": tables,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
