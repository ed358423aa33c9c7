"""Multi-process harness for the multi-rank gfdit tests.

A `World` is a set of persistent rank processes (started with the 'spawn' method, never fork-after-torch).
Each rank creates a `torch.distributed.TCPStore` (rank 0 is the master, on a free port it reports back),
calls `gfdit.init` and, for the reference, `torch.distributed.init_process_group("gloo")` on a
`PrefixStore("gloo", store)`. Then it waits for cases: `world.run(fn, *args)` runs the module-level
function `fn(ctx, *args)` on every rank at once and returns the per-rank return values, or fails with the
tracebacks of every rank that raised, died or hung. Starting a world costs a torch import per rank, so a
world is kept across many cases and restarted only after a failure (a gfdit Timeout or RemoteError leaves
the world unusable).

Every run has a hard deadline: ranks that have not answered by then are killed, so a test never hangs.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

_SPAWN = mp.get_context("spawn")

# Largest world the multi-rank tests may start (the CI machine has 2 cores; 8 ranks oversubscribe it).
MAX_WORLD = int(os.environ.get("GFDIT_TEST_MAX_WORLD", "8"))


@dataclasses.dataclass
class Ctx:
    """What a case function receives as its first argument, in the rank process."""

    rank: int
    world_size: int
    store: Any
    timeout: float


@dataclasses.dataclass
class Outcome:
    """How one rank finished one run."""

    rank: int
    status: str  # "ok" | "error" | "died" | "hung"
    value: Any = None
    exc_types: tuple = ()  # names along the exception's MRO, most derived first
    message: str = ""
    traceback: str = ""
    exitcode: int | None = None
    elapsed: float = 0.0

    def raised(self, name: str) -> bool:
        """Whether the rank raised an exception that is (a subclass of) the class called `name`."""
        return self.status == "error" and name in self.exc_types

    def describe(self) -> str:
        head = f"rank {self.rank}: {self.status}"
        if self.status == "error":
            return f"{head} {self.exc_types[0]}: {self.message}\n{self.traceback}"
        if self.status == "died":
            return f"{head} (exit code {self.exitcode})"
        if self.status == "hung":
            return f"{head} (no answer before the deadline; killed)"
        return head


class WorldFailure(AssertionError):
    """A run did not succeed on every rank."""


def _describe_exception(exc: BaseException) -> dict:
    return {
        "exc_types": tuple(c.__name__ for c in type(exc).__mro__),
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def _rank_main(rank: int, world_size: int, conn, opts: dict) -> None:
    """Body of one rank process."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store_timeout = datetime.timedelta(seconds=opts["start_timeout"])
    gfdit = None
    try:
        if rank == 0:
            store = dist.TCPStore(
                "127.0.0.1", 0, world_size, True, timeout=store_timeout, wait_for_workers=False
            )
            conn.send(("port", store.port))
        else:
            kind, port = conn.recv()
            assert kind == "port"
            store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=store_timeout)
        if opts["gfdit"]:
            import gfdit

            kwargs = {"timeout": opts["timeout"]}
            if opts["heap_bytes"] is not None:
                kwargs["heap_bytes"] = opts["heap_bytes"]
            if opts.get("device") is not None:  # e.g. "cuda": every rank on its default GPU (shared if one)
                kwargs["device"] = opts["device"]
            gfdit.init(rank, world_size, store, **kwargs)
        if opts["gloo"]:
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore("gloo", store),
                rank=rank,
                world_size=world_size,
                timeout=datetime.timedelta(seconds=opts["gloo_timeout"]),
            )
        conn.send(("ready", None, 0.0))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", _describe_exception(exc), 0.0))
        return
    ctx = Ctx(rank=rank, world_size=world_size, store=store, timeout=opts["timeout"])
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] == "close":
            break
        _, fn, args, kwargs = msg
        start = time.monotonic()
        try:
            value = fn(ctx, *args, **kwargs)
            conn.send(("ok", value, time.monotonic() - start))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            conn.send(("error", _describe_exception(exc), time.monotonic() - start))
    # Orderly shutdown; the parent kills whatever does not finish in time.
    try:
        if opts["gfdit"]:
            import gfdit

            if gfdit.is_initialized():
                gfdit.destroy()
    finally:
        if opts["gloo"] and dist.is_initialized():
            dist.destroy_process_group()
        try:
            conn.send(("closed", None, 0.0))
        except (OSError, EOFError, BrokenPipeError):
            pass
    # what had to end in order has ended: skip the interpreter's finalization (a second or more with torch and
    # diffusers loaded, as for gfdit.serving.worker)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class World:
    """Persistent rank processes; see the module docstring."""

    def __init__(
        self,
        world_size: int,
        *,
        timeout: float = 30.0,
        heap_bytes: int | None = None,
        gloo: bool = True,
        init_gfdit: bool = True,
        start_timeout: float = 90.0,
        device: str | None = None,
    ) -> None:
        if world_size > MAX_WORLD:
            raise ValueError(f"world size {world_size} above GFDIT_TEST_MAX_WORLD={MAX_WORLD}")
        self.world_size = world_size
        self._opts = {
            "timeout": timeout,
            "heap_bytes": heap_bytes,
            "gloo": gloo,
            "gfdit": init_gfdit,
            "start_timeout": start_timeout,
            "gloo_timeout": max(60.0, 4 * timeout),
            "device": device,
        }
        self._start_timeout = start_timeout
        self._procs: list = []
        self._conns: list = []
        self.starts = 0  # how many times the ranks were (re)started

    # -- life cycle ---------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    @property
    def pids(self) -> list:
        return [p.pid for p in self._procs]

    def start(self) -> None:
        self.close()
        self.starts += 1
        procs, conns = [], []
        for rank in range(self.world_size):
            parent_end, child_end = _SPAWN.Pipe()
            proc = _SPAWN.Process(
                target=_rank_main,
                args=(rank, self.world_size, child_end, self._opts),
                name=f"gfdit-test-rank{rank}",
                daemon=True,
            )
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        self._procs, self._conns = procs, conns
        deadline = time.monotonic() + self._start_timeout
        # Rank 0 reports the store's port; hand it to the others.
        first = self._collect(deadline, ranks=[0], expect=("port",))
        if first[0].status != "ok":
            self.kill()
            raise WorldFailure("world start failed:\n" + first[0].describe())
        for conn in conns[1:]:
            conn.send(("port", first[0].value))
        outcomes = self._collect(deadline)
        bad = [o for o in outcomes if o.status != "ok"]
        if bad:
            self.kill()
            raise WorldFailure("world start failed:\n" + "\n".join(o.describe() for o in bad))

    def ensure_started(self) -> World:
        if not self.alive:
            self.start()
        return self

    def kill(self) -> None:
        """Kills every rank process now."""
        for proc in self._procs:
            if proc.is_alive():
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self._procs:
            proc.join(timeout=10)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def close(self, timeout: float = 15.0) -> None:
        """Asks every rank to destroy gfdit and exit; kills whatever is left after `timeout` seconds."""
        if not self._procs:
            return
        for proc, conn in zip(self._procs, self._conns):
            if proc.is_alive():
                try:
                    conn.send(("close",))
                except (OSError, BrokenPipeError):
                    pass
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def __enter__(self) -> World:
        return self.ensure_started()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running cases ------------------------------------------------------------------------------
    def _collect(self, deadline: float, ranks=None, expect=("ok", "ready")) -> list:
        ranks = list(range(self.world_size)) if ranks is None else ranks
        pending = set(ranks)
        outcomes: dict = {}
        start = time.monotonic()
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waitables = []
            for r in pending:
                waitables += [self._conns[r], self._procs[r].sentinel]
            mpc.wait(waitables, timeout=left)
            for r in list(pending):
                conn, proc = self._conns[r], self._procs[r]
                got = None
                try:
                    if conn.poll():
                        got = conn.recv()
                except (EOFError, OSError):
                    got = None
                if got is not None:
                    kind, payload, elapsed = (got + (0.0,))[:3] if len(got) == 2 else got
                    if kind == "error":
                        outcomes[r] = Outcome(rank=r, status="error", elapsed=elapsed, **payload)
                    else:
                        outcomes[r] = Outcome(rank=r, status="ok", value=payload, elapsed=elapsed)
                    pending.discard(r)
                elif not proc.is_alive():
                    proc.join(timeout=1)
                    outcomes[r] = Outcome(
                        rank=r, status="died", exitcode=proc.exitcode, elapsed=time.monotonic() - start
                    )
                    pending.discard(r)
        for r in pending:
            outcomes[r] = Outcome(rank=r, status="hung", elapsed=time.monotonic() - start)
        return [outcomes[r] for r in ranks]

    def run_outcomes(self, fn: Callable, *args, timeout: float, per_rank_args=None, **kwargs) -> list:
        """Runs fn(ctx, *args, **kwargs) on every rank; returns one Outcome per rank.

        per_rank_args: optional list (one tuple per rank) appended to args. Ranks that have not answered
        after `timeout` seconds are killed (status "hung"). When any rank did not return normally the world
        is shut down, and the next run starts a fresh one.
        """
        self.ensure_started()
        for rank, conn in enumerate(self._conns):
            extra = tuple(per_rank_args[rank]) if per_rank_args is not None else ()
            conn.send(("run", fn, tuple(args) + extra, kwargs))
        outcomes = self._collect(time.monotonic() + timeout)
        if any(o.status != "ok" for o in outcomes):
            if any(o.status == "hung" for o in outcomes):
                self.kill()
            else:
                self.close(timeout=10)
        return outcomes

    def run(self, fn: Callable, *args, timeout: float, **kwargs) -> list:
        """Like run_outcomes, but returns the values; fails with every failed rank's traceback."""
        outcomes = self.run_outcomes(fn, *args, timeout=timeout, **kwargs)
        bad = [o for o in outcomes if o.status != "ok"]
        if bad:
            name = getattr(fn, "__qualname__", repr(fn))
            raise WorldFailure(
                f"{name}{args!r} failed on {len(bad)} of {self.world_size} ranks:\n"
                + "\n".join(o.describe() for o in bad)
            )
        return [o.value for o in outcomes]


class WorldPool:
    """Keeps at most one live World per key; used by module-scoped fixtures."""

    def __init__(self) -> None:
        self._worlds: dict = {}

    def get(self, world_size: int, **opts) -> World:
        key = (world_size, tuple(sorted(opts.items())))
        world = self._worlds.get(key)
        if world is None:
            # Free the cores and memory of other worlds first (the CI machine is small).
            self.close()
            world = World(world_size, **opts)
            self._worlds[key] = world
        return world.ensure_started()

    def close(self) -> None:
        for world in self._worlds.values():
            world.close()
        self._worlds.clear()


def run_batch(ctx, cases: list, run_case) -> list:
    """Runs run_case(ctx, case) for every case in order and collects the reports. An exception becomes a
    failed report and stops the batch on this rank, since the other ranks may then wait in a collective
    that never comes."""
    import torch

    torch.set_num_threads(1)
    reports = []
    for case in cases:
        try:
            rep = run_case(ctx, case)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            reports.append(
                {
                    "name": case["name"],
                    "rank": ctx.rank,
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}",
                }
            )
            break
        if rep is not None:
            reports.append(rep)
    return reports


def gfdit_shm_files() -> list:
    """Names in /dev/shm that start with 'gfdit' (the library must leave none behind)."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith("gfdit"))
    except FileNotFoundError:
        return []


def wait_no_new_gfdit_shm(before, timeout: float = 2.0) -> list:
    """Polls until no gfdit shm name outside `before` is left (names live only during a world's setup);
    returns the new names still there. Names that were there before belong to another run on the same
    machine (live, or killed without a chance to clean up) and are not this test's doing."""
    before = set(before)
    deadline = time.monotonic() + timeout
    left = [n for n in gfdit_shm_files() if n not in before]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [n for n in gfdit_shm_files() if n not in before]
    return left


EDGE_RE = re.compile(r"\d+\s*->\s*\d+")


def names_rank(message: str, rank: int) -> bool:
    """Whether an error message names `rank` as a peer or an end of an edge (not just any digit)."""
    r = str(rank)
    patterns = [
        rf"(?<!\d){r}\s*->\s*\d+",
        rf"\d+\s*->\s*{r}(?!\d)",
        rf"(?i)(rank|peer|src|dst|source|destination)\D{{0,4}}{r}(?!\d)",
    ]
    return any(re.search(p, message) for p in patterns)


def skip_if_too_big(world_size: int) -> None:
    import pytest

    if world_size > MAX_WORLD:
        pytest.skip(f"world size {world_size} > GFDIT_TEST_MAX_WORLD={MAX_WORLD}")
    if world_size > 4 * (os.cpu_count() or 1):
        pytest.skip(f"world size {world_size} oversubscribes {os.cpu_count()} cores more than 4x")


if __name__ == "__main__":  # pragma: no cover - manual smoke check
    sys.exit("import this module from the tests")
