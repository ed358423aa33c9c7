"""Case functions of test_errors.py: bad arguments, ranks that disagree, ranks that die."""

from __future__ import annotations

import os
import signal
import time

import torch
from cases_common import Checker

FAST = 0.5  # a local refusal takes far less than this; a wait would take the world's timeout (>= 2 s)


def _bad_calls(ctx):
    """(name, thunk) pairs; each thunk must raise gfdit.InvalidUsage before any communication."""
    import gfdit

    n, me = ctx.world_size, ctx.rank
    other = (me + 1) % n
    x = torch.randn(4, 6)
    nc = x[:, ::2]  # 4x3, non-contiguous
    c = torch.randn(4, 3)
    i16 = torch.randint(-9, 9, (4, 3), dtype=torch.int16)
    heap = gfdit.empty((4, 3), dtype=torch.float32)
    calls = [
        # group validation
        # A non-member may form the group (as in torch) but not run its collectives.
        ("all_reduce on a group without self", lambda: gfdit.new_group([other]).all_reduce(c)),
        ("barrier on a group without self", lambda: gfdit.new_group([other]).barrier()),
        ("new_group duplicates", lambda: gfdit.new_group([me, other, me])),
        ("new_group duplicate self", lambda: gfdit.new_group([me, me])),
        ("new_group out of range", lambda: gfdit.new_group([me, n])),
        ("new_group negative rank", lambda: gfdit.new_group([-1, me])),
        ("new_group far out of range", lambda: gfdit.new_group([me, 1000])),
        ("new_group empty", lambda: gfdit.new_group([])),
        # all_gather
        ("all_gather non-contiguous input", lambda: gfdit.all_gather_into_tensor(torch.empty(n * 4, 3), nc)),
        (
            "all_gather non-contiguous output",
            lambda: gfdit.all_gather_into_tensor(torch.empty(n * 4, 6)[:, ::2], c),
        ),
        ("all_gather output too small", lambda: gfdit.all_gather_into_tensor(torch.empty(n * 12 - 1), c)),
        ("all_gather output too large", lambda: gfdit.all_gather_into_tensor(torch.empty(n * 12 + 3), c)),
        (
            "all_gather dtype mismatch",
            lambda: gfdit.all_gather_into_tensor(torch.empty(n * 4, 3, dtype=torch.float16), c),
        ),
        (
            "all_gather int16 2-D",
            lambda: gfdit.all_gather_into_tensor(torch.empty(n * 4, 3, dtype=torch.int16), i16),
        ),
        (
            "all_gather int16",
            lambda: gfdit.all_gather_into_tensor(
                torch.empty(n * 4, dtype=torch.int16), torch.ones(4, dtype=torch.int16)
            ),
        ),
        (
            "all_gather bool",
            lambda: gfdit.all_gather_into_tensor(
                torch.empty(n * 4, dtype=torch.bool), torch.ones(4, dtype=torch.bool)
            ),
        ),
        # all_to_all_single
        (
            "all_to_all rows not divisible",
            lambda: gfdit.all_to_all_single(torch.empty(n * 2 + 1, 3), torch.randn(n * 2 + 1, 3)),
        ),
        (
            "all_to_all output size",
            lambda: gfdit.all_to_all_single(torch.empty(n * 2 + 1, 3), torch.randn(n * 2, 3)),
        ),
        (
            "all_to_all dtype mismatch",
            lambda: gfdit.all_to_all_single(torch.empty(n * 2, 3, dtype=torch.int32), torch.randn(n * 2, 3)),
        ),
        (
            "all_to_all non-contiguous",
            lambda: gfdit.all_to_all_single(torch.empty(n * 2, 3), torch.randn(n * 2, 6)[:, ::2]),
        ),
        (
            "all_to_all split count",
            lambda: gfdit.all_to_all_single(
                torch.empty(n * 2, 3),
                torch.randn(n * 2, 3),
                output_split_sizes=[2] * n,
                input_split_sizes=[2] * (n + 1),
            ),
        ),
        (
            "all_to_all input splits sum",
            lambda: gfdit.all_to_all_single(
                torch.empty(n * 2, 3),
                torch.randn(n * 2, 3),
                output_split_sizes=[2] * n,
                input_split_sizes=[2] * (n - 1) + [3],
            ),
        ),
        (
            "all_to_all output splits sum",
            lambda: gfdit.all_to_all_single(
                torch.empty(n * 2, 3),
                torch.randn(n * 2, 3),
                output_split_sizes=[1] * n,
                input_split_sizes=[2] * n,
            ),
        ),
        (
            "all_to_all negative split",
            lambda: gfdit.all_to_all_single(
                torch.empty(n * 2, 3),
                torch.randn(n * 2, 3),
                output_split_sizes=[2] * n,
                input_split_sizes=[-1] + [2] * (n - 2) + [5],
            ),
        ),
        (
            "all_to_all int16",
            lambda: gfdit.all_to_all_single(
                torch.empty(n * 2, dtype=torch.int16), torch.randint(-9, 9, (n * 2,), dtype=torch.int16)
            ),
        ),
        # reduce_scatter
        (
            "reduce_scatter input size",
            lambda: gfdit.reduce_scatter_tensor(torch.empty(3), torch.randn(n * 3 + 1)),
        ),
        (
            "reduce_scatter output size",
            lambda: gfdit.reduce_scatter_tensor(torch.empty(4), torch.randn(n * 3)),
        ),
        (
            "reduce_scatter dtype mismatch",
            lambda: gfdit.reduce_scatter_tensor(torch.empty(3, dtype=torch.bfloat16), torch.randn(n * 3)),
        ),
        (
            "reduce_scatter bad op",
            lambda: gfdit.reduce_scatter_tensor(torch.empty(3), torch.randn(n * 3), op="bogus"),
        ),
        (
            "reduce_scatter int16",
            lambda: gfdit.reduce_scatter_tensor(
                torch.empty(3, dtype=torch.int16), torch.randint(-9, 9, (n * 3,), dtype=torch.int16)
            ),
        ),
        (
            "reduce_scatter non-contiguous",
            lambda: gfdit.reduce_scatter_tensor(torch.empty(2, 3), torch.randn(n * 2, 6)[:, ::2]),
        ),
        # all_reduce
        ("all_reduce non-contiguous", lambda: gfdit.all_reduce(nc)),
        ("all_reduce int16", lambda: gfdit.all_reduce(i16)),
        ("all_reduce complex64", lambda: gfdit.all_reduce(torch.randn(4, dtype=torch.complex64))),
        ("all_reduce bad op", lambda: gfdit.all_reduce(c, op="bogus")),
        # broadcast
        ("broadcast src out of range", lambda: gfdit.broadcast(c, n)),
        ("broadcast negative src", lambda: gfdit.broadcast(c, -1)),
        ("broadcast non-contiguous", lambda: gfdit.broadcast(nc, 0)),
        ("broadcast int16", lambda: gfdit.broadcast(i16, 0)),
        # send / recv
        ("send dst out of range", lambda: gfdit.send(c, n)),
        ("send negative dst", lambda: gfdit.send(c, -1)),
        ("send non-contiguous", lambda: gfdit.send(nc, other)),
        ("send int16", lambda: gfdit.send(i16, other)),
        ("recv src out of range", lambda: gfdit.recv(c, n)),
        ("recv non-contiguous", lambda: gfdit.recv(nc, other)),
        # all_to_all_4d
        (
            "all_to_all_4d 3-D input",
            lambda: gfdit.all_to_all_4d(torch.empty(2 * n, 2, 3), torch.randn(2, 2 * n, 3)),
        ),
        (
            "all_to_all_4d heads not divisible",
            lambda: gfdit.all_to_all_4d(torch.empty(1, 2 * n, 1, 4), torch.randn(1, 2, n + 1, 4)),
        ),
        (
            "all_to_all_4d wrong output shape",
            lambda: gfdit.all_to_all_4d(torch.empty(1, 2, n, 4), torch.randn(1, 2, n, 4)),
        ),
        (
            "all_to_all_4d dtype mismatch",
            lambda: gfdit.all_to_all_4d(
                torch.empty(1, 2 * n, 1, 4, dtype=torch.float16), torch.randn(1, 2, n, 4)
            ),
        ),
        (
            "all_to_all_4d non-contiguous",
            lambda: gfdit.all_to_all_4d(torch.empty(1, 2 * n, 1, 4), torch.randn(1, 2, n, 8)[..., ::2]),
        ),
        (
            "all_to_all_4d seq not divisible (reverse)",
            lambda: gfdit.all_to_all_4d(
                torch.empty(1, 1, n, 4), torch.randn(1, n + 1, 1, 4), scatter_dim=1, gather_dim=2
            ),
        ),
        (
            "all_to_all_4d unsupported dims",
            lambda: gfdit.all_to_all_4d(
                torch.empty(1, 2 * n, 1, 4), torch.randn(1, 2, n, 4), scatter_dim=3, gather_dim=0
            ),
        ),
        # one-sided
        ("put_with_signal non-heap destination", lambda: gfdit.put_with_signal(c, torch.empty(4, 3), other)),
        ("put_with_signal peer out of range", lambda: gfdit.put_with_signal(c, heap, n)),
        (
            "put_with_signal source larger than destination",
            lambda: gfdit.put_with_signal(torch.randn(5, 3), heap, other),
        ),
        ("wait_signal peer out of range", lambda: gfdit.wait_signal(n, 1)),
    ]
    return calls


def case_bad_input(ctx):
    """Every bad call raises gfdit.InvalidUsage (a ValueError) at once; afterwards the world still works."""
    import gfdit

    chk = Checker(ctx.rank)
    for name, thunk in _bad_calls(ctx):
        start = time.monotonic()
        try:
            thunk()
        except gfdit.InvalidUsage as exc:
            took = time.monotonic() - start
            chk.true(isinstance(exc, ValueError), name, "InvalidUsage is not a ValueError")
            chk.true(isinstance(exc, gfdit.Error), name, "InvalidUsage is not a gfdit.Error")
            chk.true(took < FAST, name, f"refusal took {took:.2f}s: it waited for a peer")
            chk.true(bool(str(exc)), name, "empty message")
        except BaseException as exc:  # noqa: BLE001
            kind = f"{type(exc).__module__}.{type(exc).__name__}"
            chk.fail(name, f"raised {kind}: {exc} (expected gfdit.InvalidUsage)")
            if isinstance(exc, gfdit.Timeout):
                break  # the world is unusable now
        else:
            chk.fail(name, "did not raise")
    # No refusal may have consumed a sequence number: a real collective still agrees on every rank.
    n = ctx.world_size
    t = torch.arange(6, dtype=torch.int64) + ctx.rank
    gfdit.all_reduce(t)
    chk.equal(t, torch.arange(6, dtype=torch.int64) * n + n * (n - 1) // 2, "all_reduce after refusals")
    inp = torch.full((3,), ctx.rank, dtype=torch.int32)
    out = torch.empty(3 * n, dtype=torch.int32)
    gfdit.all_gather_into_tensor(out, inp)
    chk.equal(out, torch.arange(n, dtype=torch.int32).repeat_interleave(3), "all_gather after refusals")
    return chk.raise_if_any()


def _result(start, exc=None, extra=None):
    d = {"elapsed": time.monotonic() - start, "exc_types": (), "message": ""}
    if exc is not None:
        d["exc_types"] = tuple(cl.__name__ for cl in type(exc).__mro__)
        d["message"] = str(exc)
        d["is_timeout_error"] = isinstance(exc, TimeoutError)
    d.update(extra or {})
    return d


def _destroy_timed():
    import gfdit

    start = time.monotonic()
    gfdit.destroy()
    return {"destroy_s": time.monotonic() - start, "initialized_after_destroy": gfdit.is_initialized()}


def case_mismatch(ctx, kind):
    """Ranks disagree about a collective; returns how each rank's call ended (and destroys the world)."""
    import gfdit

    r = ctx.rank
    start = time.monotonic()
    exc = None
    try:
        if kind == "send_recv_size":  # rank 0 sends 1 KiB, rank 1 expects 2 KiB
            if r == 0:
                gfdit.send(torch.randn(256), 1)
            elif r == 1:
                gfdit.recv(torch.empty(512), 0)
        elif kind == "all_gather_size":  # 1 KiB from rank 0, 2 KiB from the others
            numel = 256 if r == 0 else 512
            gfdit.all_gather_into_tensor(torch.empty(numel * ctx.world_size), torch.randn(numel))
        elif kind == "all_reduce_dtype":  # same bytes, different dtypes
            t = torch.randn(256) if r == 0 else torch.ones(256, dtype=torch.int32)
            gfdit.all_reduce(t)
        elif kind == "broadcast_size":
            gfdit.broadcast(torch.randn(256 if r == 0 else 512), 0)
        else:
            raise ValueError(kind)
        # A rank whose part looked fine must not be left believing all is well for long: a next collective
        # either fails or (if its peer already failed) times out.
        gfdit.barrier()
    except gfdit.Error as e:
        exc = e
    res = _result(start, exc)
    res.update(_destroy_timed())
    return res


def case_killed_peer(ctx, victim, how, rounds_before=0):
    """The victim completes `rounds_before` all_reduces, then dies; the others keep calling all_reduce."""
    import gfdit

    start = time.monotonic()
    t = torch.ones(1024)
    try:
        for i in range(rounds_before + 20):
            if ctx.rank == victim and i == rounds_before:
                if how == "exit":
                    os._exit(3)
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(60)
            if ctx.rank != victim and i == rounds_before:
                time.sleep(0.3)  # let the victim die first
            gfdit.all_reduce(t)
    except gfdit.Error as e:
        res = _result(start, e)
        res.update(_destroy_timed())
        return res
    res = _result(start, None, {"completed": True})
    res.update(_destroy_timed())
    return res


def case_no_show(ctx, late_rank, op):
    """late_rank never enters the collective (it sleeps past the timeout); the others must time out."""
    import gfdit

    start = time.monotonic()
    if ctx.rank == late_rank:
        time.sleep(ctx.timeout + 1.5)
        res = _result(start)
    else:
        try:
            if op == "all_reduce":
                gfdit.all_reduce(torch.randn(64))
            elif op == "recv":
                gfdit.recv(torch.empty(64), late_rank)
            elif op == "barrier":
                gfdit.barrier()
            res = _result(start, None, {"completed": True})
        except gfdit.Error as e:
            res = _result(start, e)
    res.update(_destroy_timed())
    return res


def case_list_shm(ctx):
    """gfdit files in /dev/shm as seen from a live rank (the names are unlinked right after setup)."""
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("gfdit"))


def case_slow_peer(ctx, delay):
    """The last rank enters late, but within the timeout: every rank must succeed (no spurious Timeout)."""
    import gfdit

    chk = Checker(ctx.rank)
    n = ctx.world_size
    for i in range(3):
        if ctx.rank == n - 1:
            time.sleep(delay)
        t = torch.full((1000,), float(ctx.rank + i))
        gfdit.all_reduce(t)
        chk.equal(t, torch.full((1000,), float(n * (n - 1) // 2 + n * i)), f"all_reduce round {i}")
        if ctx.rank == 0:
            time.sleep(delay)
        out = torch.empty(2 * n, dtype=torch.int64)
        gfdit.all_gather_into_tensor(out, torch.tensor([ctx.rank, i]))
        chk.equal(out, torch.tensor([[r, i] for r in range(n)]).reshape(-1), f"all_gather round {i}")
    return chk.raise_if_any()
