"""Shared plumbing of the Python benchmarks: rank processes, timing, tables and JSON.

Each benchmark spawns one process per rank. A rank process joins a TCPStore (rank 0 is the master, on a
free port), the gfdit world on that store, and a torch.distributed gloo world on a prefixed view of the same
store, so that gfdit and its baseline run on the same processes, tensors and cores.
"""

from __future__ import annotations

import datetime
import json
import math
import multiprocessing as mp
import os
import platform
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gfdit import stats

KIB = 1024
MIB = 1024 * 1024


# ----------------------------------------------------------------------------------------------------------
# sizes and formatting


def parse_size(text: str) -> int:
    """'4K', '4KiB', '1M', '64MiB', '4096' -> bytes."""
    t = text.strip().lower().replace("ib", "").replace("b", "")
    mult = 1
    if t.endswith("k"):
        mult, t = KIB, t[:-1]
    elif t.endswith("m"):
        mult, t = MIB, t[:-1]
    elif t.endswith("g"):
        mult, t = 1024 * MIB, t[:-1]
    return int(float(t) * mult)


def parse_sizes(text: str) -> list[int]:
    return [parse_size(s) for s in text.split(",") if s.strip()]


def parse_ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def fmt_size(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} B"


def fmt_us(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    us = seconds * 1e6
    if us >= 100_000:
        return f"{us:,.0f}"
    if us >= 100:
        return f"{us:.0f}"
    if us >= 10:
        return f"{us:.1f}"
    return f"{us:.2f}"


def fmt_ratio(x: float | None) -> str:
    if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))):
        return "-"
    if x >= 100:
        return f"{x:,.0f}x"
    if x >= 10:
        return f"{x:.1f}x"
    return f"{x:.2f}x"


def fmt_gbps(bytes_per_s: float | None) -> str:
    if bytes_per_s is None or math.isnan(bytes_per_s):
        return "-"
    return f"{bytes_per_s / 1e9:.2f}"


def fmt_pct(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{100 * x:.0f}%"


def print_table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = ()
) -> str:
    """Prints a plain-text table (right-aligned except the first column) and returns it."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(values: Sequence[str]) -> str:
        parts = []
        for i, v in enumerate(values):
            parts.append(v.ljust(widths[i]) if i == 0 else v.rjust(widths[i]))
        return "  ".join(parts).rstrip()

    out = [title, line(headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    out += list(notes)
    text = "\n".join(out)
    print(text + "\n", flush=True)
    return text


# ----------------------------------------------------------------------------------------------------------
# statistics


# One definition for every benchmark, the trace summaries and the live page: gfdit.stats (numpy's
# percentiles). median and percentile raise ValueError on no values.
median = stats.median
percentile = stats.percentile


# ----------------------------------------------------------------------------------------------------------
# environment and JSON


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        info["loadavg_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        info["affinity_cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        import torch

        info["torch"] = torch.__version__
    except Exception as e:  # pragma: no cover - reported, not fatal
        info["torch"] = f"unavailable: {e}"
    try:
        import gfdit

        info["gfdit_build_info"] = _jsonable(gfdit.build_info())
    except Exception as e:
        info["gfdit_build_info"] = f"unavailable: {type(e).__name__}: {e}"
    return info


def header(title: str, env: dict[str, Any]) -> None:
    """First line of a benchmark's output; warns when other work loads the machine (numbers will be noisy)."""
    load = env.get("loadavg_1_5_15")
    print(
        f"{title} | cpus {env.get('cpu_count')} | load {load} | torch {env.get('torch')} | "
        f"gfdit {env.get('gfdit_build_info')}",
        flush=True,
    )
    if load and load[0] > 0.5 * (env.get("cpu_count") or 1):
        print(
            f"warning: 1-minute load average {load[0]} on {env.get('cpu_count')} cpus: other processes compete "
            "for the cores, timings will be noisy",
            flush=True,
        )


def _jsonable(x: Any) -> Any:
    try:
        json.dumps(x)
        return x
    except TypeError:
        if isinstance(x, dict):
            return {str(k): _jsonable(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [_jsonable(v) for v in x]
        return repr(x)


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if not path:
        return
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(_jsonable(payload), f, indent=2, allow_nan=True)
        f.write("\n")
    print(f"wrote {path}", flush=True)


@dataclass
class Target:
    """One target line: what was measured, its value and whether it meets the target."""

    name: str
    value: float | None
    target: str
    met: bool | None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "target": self.target,
            "met": self.met,
            "detail": self.detail,
        }


def target_summary(targets: Sequence[Target], max_listed: int = 12) -> str:
    """'targets met: 7/9; missed: a (value), b (value)'."""
    judged = [t for t in targets if t.met is not None]
    missed = [t for t in judged if not t.met]
    text = f"targets met: {len(judged) - len(missed)}/{len(judged)}"
    if missed:
        names = [t.name for t in missed[:max_listed]]
        more = len(missed) - len(names)
        text += "; missed: " + "; ".join(names) + (f"; ... and {more} more" if more > 0 else "")
    return text


def verdict(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "NO")


# ----------------------------------------------------------------------------------------------------------
# rank processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankContext:
    """What a rank function receives: rank, world size, the store, helpers to agree across ranks."""

    def __init__(self, rank: int, world_size: int, store: Any, options: dict[str, Any]):
        self.rank = rank
        self.world_size = world_size
        self.store = store
        self.options = options

    def max_over_ranks(self, values: Sequence[float]) -> list[float]:
        """Element-wise max over ranks (through gloo, outside any timed region)."""
        import torch
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def gather_over_ranks(self, values: Sequence[float]) -> list[list[float]]:
        """values of every rank, indexed by rank."""
        import torch
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.float64)
        out = torch.empty(self.world_size * len(values), dtype=torch.float64)
        dist.all_gather_into_tensor(out, t)
        return out.view(self.world_size, len(values)).tolist()

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)


def _rank_main(
    fn: Callable[[RankContext], Any],
    rank: int,
    world_size: int,
    port: int,
    options: dict[str, Any],
    results: Any,
) -> None:
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        import warnings

        # torch 2.13 deprecates dist.all_gather_into_tensor (the baseline keeps the name gfdit mirrors)
        warnings.filterwarnings(
            "ignore", message=".*all_gather_into_tensor.*deprecated", category=FutureWarning
        )
        timeout = datetime.timedelta(seconds=float(options.get("store_timeout_s", 120)))
        store = dist.TCPStore(
            "127.0.0.1", port, world_size, rank == 0, timeout=timeout, wait_for_workers=True
        )
        import gfdit

        # default_backend "gfdit": the default process group is gfdit's torch.distributed backend (which makes
        # its own world) instead of gloo beside gfdit.init.
        backend = options.get("default_backend", "gloo")
        if backend != "gfdit":
            extra = {"device": options["device"]} if options.get("device") is not None else {}
            gfdit.init(
                rank,
                world_size,
                store,
                timeout=float(options.get("gfdit_timeout_s", 60.0)),
                heap_bytes=options.get("heap_bytes"),
                **extra,  # "cuda": every rank on its default GPU (bench_gpu.py)
            )
        dist.init_process_group(
            backend, store=dist.PrefixStore(backend, store), rank=rank, world_size=world_size, timeout=timeout
        )
        ctx = RankContext(rank, world_size, store, options)
        try:
            out = fn(ctx)
        finally:
            try:
                dist.barrier()
            except Exception:
                pass
        results.put((rank, "ok", out))
        try:
            gfdit.destroy()
        except Exception:
            pass
        dist.destroy_process_group()
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def run_ranks(
    fn: Callable[[RankContext], Any], world_size: int, options: dict[str, Any], timeout_s: float = 900.0
) -> list[Any]:
    """Runs fn(ctx) in world_size fresh processes; returns every rank's return value, by rank.

    fn must be a module-level function (processes are spawned). Raises RuntimeError with the traceback of
    the first failing rank, or on timeout (the rank processes are then killed).
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(fn, r, world_size, port, options, results), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    error: str | None = None
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < world_size and error is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                error = f"timed out after {timeout_s:.0f} s waiting for ranks {sorted(set(range(world_size)) - set(out))}"
                break
            try:
                rank, status, value = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in out]
                if dead:
                    # give the dying rank a moment to deliver its traceback
                    try:
                        rank, status, value = results.get(timeout=2.0)
                    except queue.Empty:
                        error = f"rank(s) {dead} exited with code(s) {[procs[i].exitcode for i in dead]}"
                        break
                else:
                    continue
            if status == "ok":
                out[rank] = value
            else:
                error = f"rank {rank} failed:\n{value}"
    finally:
        for p in procs:
            p.join(timeout=10.0 if error is None else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
    if error is not None:
        raise RuntimeError(error)
    return [out[r] for r in range(world_size)]


def gfdit_importable() -> tuple[bool, str]:
    try:
        import gfdit  # noqa: F401
        import gfdit._C  # noqa: F401

        return True, ""
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"


def run_world_bench(
    name: str,
    world_fn: Callable[[RankContext], dict[str, Any]],
    world_size: int,
    opts: dict[str, Any],
    report: Callable[[list[dict[str, Any]]], tuple[list[str], list[Target]]],
    json_path: str,
    timeout_s: float,
    env: dict[str, Any],
    quick: bool,
) -> int:
    """Runs `world_fn` on a world of `world_size` (its rank 0 returns {"records": [...]}), prints `report`'s
    tables and the targets, and writes the JSON of a one-world benchmark; the exit status (1 if the world
    failed)."""
    t_start = time.monotonic()
    errors: dict[str, str] = {}
    records: list[dict[str, Any]] = []
    try:
        records = run_ranks(world_fn, world_size, opts, timeout_s=timeout_s)[0]["records"]
    except Exception as e:
        errors[f"world_size={world_size}"] = str(e)
        print(f"world of {world_size} FAILED: {e}", file=sys.stderr, flush=True)
    tables, targets = report(records) if records else ([], [])
    if targets:
        print(target_summary(targets), flush=True)
    load_end = [round(x, 2) for x in os.getloadavg()]
    print(
        f"total {time.monotonic() - t_start:.0f} s; load average at the end {load_end} on {env.get('cpu_count')} "
        "cpus (above ~1 per cpu, other processes shared the cores and the times are inflated)",
        flush=True,
    )
    write_json(
        json_path,
        {
            "benchmark": name,
            "environment": env,
            "loadavg_end_1_5_15": load_end,
            "config": dict(opts, quick=quick),
            "records": records,
            "targets": [t.as_dict() for t in targets],
            "errors": errors,
            "tables": tables,
        },
    )
    return 1 if errors else 0
