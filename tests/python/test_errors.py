"""Errors: bad arguments are refused locally (gfdit.InvalidUsage) without communication; ranks that
disagree about a collective get gfdit.RemoteError or gfdit.Timeout instead of hanging; a killed peer makes
the survivors fail within a few seconds with a message naming it; and no file named gfdit* is ever left in
/dev/shm. Worlds here use timeout=2.0 s. Cases are in cases_errors.py."""

from __future__ import annotations

import cases_errors as ce
import mp_harness
import pytest

GFDIT_TIMEOUT = 2.0
# A failing rank must be done (error raised and world destroyed) well within this.
BOUND = 3 * GFDIT_TIMEOUT + 4.0


@pytest.fixture(autouse=True)
def no_shm_leftovers():
    """No gfdit* name that a test creates is left in /dev/shm after it."""
    before = mp_harness.gfdit_shm_files()
    yield
    left = mp_harness.wait_no_new_gfdit_shm(before, timeout=2.0)
    assert left == [], f"gfdit files left in /dev/shm: {left}"


def _fresh(n, **opts):
    return mp_harness.World(n, timeout=GFDIT_TIMEOUT, gloo=False, **opts)


def _check_failure(out, rank, what):
    """out: a case_* result dict of a rank that must have failed with Timeout or RemoteError."""
    assert out["exc_types"], f"{what}: rank {rank} completed without an error: {out}"
    assert "Timeout" in out["exc_types"] or "RemoteError" in out["exc_types"], (
        f"{what}: rank {rank} raised {out['exc_types'][0]} (expected gfdit.Timeout or gfdit.RemoteError): "
        f"{out['message']}"
    )
    assert out["is_timeout_error"], f"{what}: rank {rank}'s {out['exc_types'][0]} is not a TimeoutError"
    assert out["elapsed"] < BOUND, f"{what}: rank {rank} took {out['elapsed']:.1f}s to fail (bound {BOUND}s)"
    assert out["destroy_s"] < 5.0, f"{what}: gfdit.destroy() after the error took {out['destroy_s']:.1f}s"
    assert not out["initialized_after_destroy"]


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 3])
def test_bad_input_is_refused_locally(n):
    with _fresh(n) as world:
        world.run(ce.case_bad_input, timeout=60.0)


# -------------------------------------------------------------------------------------------- disagreements
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["send_recv_size", "all_gather_size", "all_reduce_dtype", "broadcast_size"])
def test_mismatch_across_ranks(kind):
    with _fresh(2) as world:
        outs = world.run(ce.case_mismatch, kind, timeout=BOUND + 15.0)
    failed = [r for r, o in enumerate(outs) if o["exc_types"]]
    assert failed, f"{kind}: no rank noticed the mismatch: {outs}"
    for r, o in enumerate(outs):
        assert o["elapsed"] < BOUND, f"{kind}: rank {r} took {o['elapsed']:.1f}s (bound {BOUND}s): {o}"
        if o["exc_types"]:
            _check_failure(o, r, kind)
            if "RemoteError" not in o["exc_types"]:  # a plain timeout names the edge and the instance
                assert mp_harness.EDGE_RE.search(o["message"]), f"{kind}: no edge in: {o['message']}"


# ------------------------------------------------------------------------------------------------ slow peer
@pytest.mark.timeout(120)
def test_slow_peer_within_timeout_is_not_an_error():
    with _fresh(3) as world:
        world.run(ce.case_slow_peer, 0.6 * GFDIT_TIMEOUT, timeout=60.0)


# ------------------------------------------------------------------------------------------------ no-show
@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", ["all_reduce", "recv", "barrier"])
def test_timeout_names_peer_edge_and_instance(op):
    with _fresh(2) as world:
        outs = world.run(ce.case_no_show, 1, op, timeout=BOUND + 15.0)
    out = outs[0]
    _check_failure(out, 0, op)
    msg = out["message"]
    assert out["elapsed"] >= 0.8 * GFDIT_TIMEOUT, f"timed out after {out['elapsed']:.2f}s < the 2 s timeout"
    assert mp_harness.names_rank(msg, 1), f"message does not name peer 1: {msg}"
    assert mp_harness.EDGE_RE.search(msg), f"message does not name an edge like '1->0': {msg}"
    assert "instance" in msg.lower() or "seq" in msg.lower(), f"message does not name the instance: {msg}"


# ------------------------------------------------------------------------------------------- killed peer
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "n,victim,how,rounds_before",
    [(2, 1, "exit", 0), (2, 1, "sigkill", 0), (2, 1, "sigkill", 5), (3, 0, "sigkill", 3), (3, 1, "exit", 0)],
)
def test_killed_peer(n, victim, how, rounds_before):
    world = _fresh(n)
    try:
        outcomes = world.run_outcomes(ce.case_killed_peer, victim, how, rounds_before, timeout=BOUND + 20.0)
    finally:
        world.close()
    assert outcomes[victim].status == "died", outcomes[victim].describe()
    survivors = [o for o in outcomes if o.rank != victim]
    for o in survivors:
        assert o.status == "ok", f"survivor did not return: {o.describe()}"
        _check_failure(o.value, o.rank, f"{how} of rank {victim}")
    named = [o.rank for o in survivors if mp_harness.names_rank(o.value["message"], victim)]
    assert named, "no survivor's error names the dead rank {}: {}".format(
        victim, [o.value["message"] for o in survivors]
    )
    if n == 2:
        assert named == [1 - victim], (
            f"the survivor's error does not name rank {victim}: {survivors[0].value}"
        )


# ------------------------------------------------------------------------------------------------- /dev/shm
@pytest.mark.timeout(120)
def test_no_shm_names_while_running():
    before = set(mp_harness.gfdit_shm_files())
    with _fresh(3) as world:
        seen = [sorted(set(names) - before) for names in world.run(ce.case_list_shm, timeout=30.0)]
        assert seen == [[]] * 3, f"gfdit names still in /dev/shm after setup: {seen}"
        assert sorted(set(mp_harness.gfdit_shm_files()) - before) == []
