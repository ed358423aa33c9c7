#!/usr/bin/env python3
"""Patch-parallel VAE decode at world 2 against the one-rank decode: tiny Wan videos and tiny Qwen-Image images.

Each size is decoded

  * D1: on one rank, as the pipelines (and gfdit before parallel decode) do: ``model.decode(latent)``; the
    other rank waits;
  * D2: on both ranks, each a band of the latent's rows with halo exchanges and a gathered mid-block
    attention: ``model.decode(latent, group)`` (NOTE [patch-parallel decode] in gfdit.models.patch_decode).

Both run the staged model's whole decode (the latent's un-normalisation, the VAE, the [0, 1] mapping) from the
same latent. Timing: one warm-up call of each, then alternating repetitions after a barrier; a repetition's
time is the max over the two ranks; the table shows the median. |D2-D1| is the largest difference of the two
outputs on [0, 1] pixels. The memory column is a proxy for peak activation memory per member: the largest
working set (inputs plus output) of any one decoder layer call, from forward hooks, at each degree. One
process per rank, one thread per process.

    python bench/bench_decode.py              # about two minutes on 2 quiet cores
    python bench/bench_decode.py --quick      # the target size only, fewer repetitions
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from bench_attention import fmt_ms, measure  # noqa: E402

# (model, height, width, num_frames)
SIZES = [
    ("tiny-wan", 256, 256, 9),
    ("tiny-wan", 128, 128, 9),
    ("tiny-qwen-image", 512, 512, 1),
    ("tiny-qwen-image", 1024, 1024, 1),
]
QUICK_SIZES = SIZES[:1]
TARGET = ("tiny-wan", 256, 256, 9)
TARGET_RATIO = 1.5  # D1 / D2 at the target size, on 2 cores


def _largest_layer_bytes(model: Any, run: Any) -> int:
    """The largest inputs-plus-output bytes of one decoder layer call while `run()` decodes."""
    import torch

    most = [0]

    def size(x: Any) -> int:
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, tuple | list):
            return sum(size(v) for v in x)
        return 0

    def hook(_m: Any, inp: Any, out: Any) -> None:
        most[0] = max(most[0], size(inp) + size(out))

    handles = [m.register_forward_hook(hook) for m in model.vae.decoder.modules() if not list(m.children())]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return most[0]


def world_fn(ctx: C.RankContext) -> dict[str, Any]:
    import gfdit
    import gfdit.models as gm
    import torch

    opts = ctx.options
    pair = gfdit.new_group([0, 1])
    records = []
    models: dict[str, Any] = {}
    for name, h, w, f in opts["sizes"]:
        m = models.get(name) or models.setdefault(name, gm.load(name))
        shape = m.latent_shape(height=h, width=w, num_frames=f)
        latent = m.init_latent(3, shape)
        z = m.vae_latent(m.initial_state(m.encode("a lighthouse at dusk"), latent, grid=tuple(shape[2:])))

        def d1(z=z, m=m) -> Any:
            return m.decode(z) if ctx.rank == 0 else None

        def d2(z=z, m=m) -> Any:
            return m.decode(z, pair)

        with torch.no_grad():
            res, outs = measure(ctx, [("d1", d1), ("d2", d2)], opts, opts["target_s"])
            mem1 = _largest_layer_bytes(m, d1) if ctx.rank == 0 else 0
            mem2 = _largest_layer_bytes(m, d2)
        diff = float((outs["d2"] - outs["d1"]).abs().max()) if ctx.rank == 0 else 0.0
        mems = ctx.gather_over_ranks([mem1, mem2])
        records.append(
            {
                "model": name,
                "size": [h, w, f],
                "latent": list(z.shape),
                "max_diff_pixels": ctx.max_over_ranks([diff])[0],
                "largest_layer_bytes_d1": mems[0][0],
                "largest_layer_bytes_d2": max(r[1] for r in mems),
                **res,
            }
        )
        ctx.log(
            f"  {name} {h}x{w}x{f}: D1 {fmt_ms(res['d1']['median_s'])} ms, D2 {fmt_ms(res['d2']['median_s'])} ms"
            f" ({res['d1']['reps']} reps)"
        )
    return {"records": records}


def report(records: list[dict[str, Any]]) -> tuple[list[str], list[C.Target]]:
    rows, targets = [], []
    for r in records:
        h, w, f = r["size"]
        d1, d2 = r["d1"]["median_s"], r["d2"]["median_s"]
        is_target = (r["model"], h, w, f) == TARGET
        targets.append(
            C.Target(
                f"{r['model']} {h}x{w}x{f} decode at degree 2 vs 1 (D1 / D2)",
                d1 / d2,
                f">= {TARGET_RATIO:g}x" if is_target else "none",
                d1 / d2 >= TARGET_RATIO if is_target else None,
            )
        )
        m1, m2 = r["largest_layer_bytes_d1"], r["largest_layer_bytes_d2"]
        rows.append(
            [
                r["model"],
                f"{h}x{w}" + (f"x{f}" if f > 1 else ""),
                "x".join(map(str, r["latent"][2:])),
                fmt_ms(d1),
                fmt_ms(d2),
                C.fmt_ratio(d1 / d2),
                f"{m1 / C.MIB:.1f} / {m2 / C.MIB:.1f}",
                C.fmt_ratio(m1 / m2 if m2 else None),
                f"{r['max_diff_pixels']:.0e}",
                r["d1"]["reps"],
            ]
        )
    table = C.print_table(
        "VAE decode at world 2: one rank (D1) vs patch-parallel on both (D2)",
        [
            "model",
            "size",
            "latent FxHxW",
            "D1",
            "D2",
            "D1/D2",
            "layer MiB D1 / D2",
            "ratio",
            "|D2-D1|",
            "reps",
        ],
        rows,
        [
            "times in ms, median over repetitions of the max over the two ranks; D1/D2 > 1x: the parallel decode "
            f"is faster (target >= {TARGET_RATIO:g}x for {TARGET[0]} {TARGET[1]}x{TARGET[2]}x{TARGET[3]})",
            "layer MiB: the largest working set of one decoder layer call per member (a proxy for peak "
            "activation memory); |D2-D1|: max difference on [0, 1] pixels",
        ],
    )
    return [table], targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the target size only, fewer repetitions")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds allowed for the run")
    ap.add_argument(
        "--json",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "decode.json"),
        help="JSON output (default %(default)s)",
    )
    args = ap.parse_args(argv)
    ok, why = C.gfdit_importable()
    if not ok:
        print(f"gfdit is not importable ({why}); build it first (make build)", file=sys.stderr)
        return 2
    opts = {
        "sizes": QUICK_SIZES if args.quick else SIZES,
        "warmup": 1,
        "min_reps": 3,
        "max_reps": 3 if args.quick else 7,
        "target_s": 4.0 if args.quick else 10.0,
        "heap_bytes": 256 * C.MIB,
    }
    env = C.environment()
    C.header("gfdit patch-parallel VAE decode vs one rank", env)
    return C.run_world_bench("decode", world_fn, 2, opts, report, args.json, args.timeout, env, args.quick)


if __name__ == "__main__":
    sys.exit(main())
