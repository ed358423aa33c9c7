"""gfdit.attention against a single-process float64 reference on worlds of 2 and 4 ranks.

Every mode (USP, Torus) and placement (ulysses-low, ring-low, auto), pure Ulysses, pure Ring and 2 x 2
grids, even and uneven shards (one member may hold nothing), joint tokens in front and at the rear,
float32 (relative error <= 1e-5) and bfloat16 (absolute error <= 1e-2), sub-groups in a non-sorted order;
bad input refused with gfdit.InvalidUsage on every member; the Topology and "auto" placement.

The ranks are persistent processes (mp_harness.World); each world runs its cases in a few batches.
"""

from __future__ import annotations

import itertools
import random

import attn_harness as ah
import mp_harness
import pytest

GFDIT_TIMEOUT = 30.0
RUN = 150.0


def _cases(n: int) -> list:
    """The cases of a world of n ranks: every (ulysses, ring, mode, placement) with several shapes."""
    rnd = random.Random(1000 + n)
    grids = [(n, 1), (1, n)] + ([(2, n // 2)] if n == 4 else [])
    cases = []
    seed = 0

    def add(**kw):
        nonlocal seed
        seed += 1
        kw.setdefault("seed", 100 * n + seed)
        kw["name"] = (
            f"n{n}-u{kw['spec']['ulysses']}r{kw['spec']['ring']}-{kw['spec']['mode']}-"
            f"{kw['spec'].get('placement', 'auto')}-{kw['shape']}-split{kw.get('splits')}-"
            f"j{kw.get('joint', 0)}{kw.get('joint_pos', '')}-{kw.get('dtype', 'float32')}"
            f"-g{kw.get('group')}"
        )
        cases.append(kw)

    for (u, r), mode in itertools.product(grids, ("usp", "torus")):
        placements = ["ulysses-low", "ring-low", "auto"] if u > 1 and r > 1 else ["auto"]
        for placement in placements:
            spec = {"ulysses": u, "ring": r, "mode": mode, "placement": placement}
            # Even shards, the small shape, without and with joint tokens (front and rear).
            add(spec=spec, shape=(1, 128, 4, 32))
            add(spec=spec, shape=(1, 128, 4, 32), joint=7, joint_pos=rnd.choice(["front", "rear"]))
            # Random shape with uneven shards (one member may be empty) and joint tokens.
            b, h, d = rnd.choice([1, 2]), 4 * rnd.choice([1, 2]), rnd.choice([8, 16, 32])
            splits = [rnd.randint(0, 40) for _ in range(n)]
            splits[rnd.randrange(n)] += 1
            add(
                spec=spec,
                shape=(b, sum(splits), h, d),
                splits=splits,
                joint=rnd.choice([0, 5]),
                joint_pos=rnd.choice(["front", "rear"]),
            )
            # bfloat16, uneven.
            splits = [rnd.randint(1, 30) for _ in range(n)]
            add(spec=spec, shape=(1, sum(splits), 4, 16), splits=splits, joint=3, dtype="bfloat16")
            # A random even shape, float32 and bfloat16.
            h = u * rnd.choice([1, 2, 3, 4])
            add(
                spec=spec,
                shape=(rnd.choice([1, 2]), n * rnd.randint(1, 48), h, rnd.choice([16, 64])),
                joint=rnd.choice([0, 9]),
                joint_pos=rnd.choice(["front", "rear"]),
                dtype=rnd.choice(["float32", "bfloat16"]),
            )
        # The large shape once per grid and mode, with the placement that crosses nodes in auto.
        big = {"ulysses": u, "ring": r, "mode": mode, "placement": "auto"}
        add(
            spec=big,
            shape=(1, 1024, 32, 64),
            node_ids=[0, 0, 1, 1] if n == 4 else None,
            joint=16 if mode == "torus" else 0,
        )
    # The same grid on a sub-group in a non-sorted order, and a one-member group.
    if n == 4:
        add(spec={"ulysses": 2, "ring": 1, "mode": "usp"}, shape=(1, 40, 4, 8), group=[3, 1], joint=2)
        add(
            spec={"ulysses": 1, "ring": 2, "mode": "torus"}, shape=(1, 36, 2, 8), splits=[30, 6], group=[2, 0]
        )
        add(
            spec={"ulysses": 2, "ring": 2, "mode": "torus", "placement": "ring-low", "torus_chunks": 1},
            shape=(2, 64, 4, 16),
            group=[2, 0, 3, 1],
            splits=[10, 20, 30, 4],
        )
    add(spec={"ulysses": 1, "ring": 1, "mode": "usp"}, shape=(1, 24, 2, 8), group=[n - 1], joint=4)
    # Heap history differs between members: Torus falls back to USP (with a warning), same result.
    add(spec={"ulysses": n, "ring": 1, "mode": "torus"}, shape=(1, 8 * n, n, 8), skew_heap=True)
    return cases


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"ws{n}")
def world(request, world_pool):
    mp_harness.skip_if_too_big(request.param)
    return world_pool.get(request.param, timeout=GFDIT_TIMEOUT, gloo=False)


def _run_batches(world, cases, batches=3):
    per = (len(cases) + batches - 1) // batches
    reports = []
    for i in range(0, len(cases), per):
        for rank_reports in world.run(ah.case_batch, cases[i : i + per], timeout=RUN):
            reports += rank_reports
    return reports


@pytest.mark.timeout(300)
def test_attention_matches_reference(world):
    cases = _cases(world.world_size)
    reports = _run_batches(world, cases)
    bad = [r for r in reports if not r["ok"]]
    assert not bad, "\n".join(
        f"{r['name']} rank {r['rank']}: " + (r.get("error") or f"err {r['err']:.3g} joint {r.get('jerr')}")
        for r in bad
    )
    # Torus must not have fallen back to USP (its workspace sits at one heap offset on every member).
    skewed = {c["name"] for c in cases if c.get("skew_heap")}
    warned = [
        f"{r['name']} rank {r['rank']}: {r['warnings']}"
        for r in reports
        if r.get("warnings") and r["name"] not in skewed
    ]
    assert not warned, "\n".join(warned)
    fell_back = [r for r in reports if r["name"] in skewed and any("using USP" in w for w in r["warnings"])]
    assert len(fell_back) == world.world_size, "Torus did not detect the skewed heap offsets on every member"
    seen = {r["name"] for r in reports}
    assert seen == {c["name"] for c in cases}, "some cases did not run"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "kind,needle",
    [
        ("heads", "not divisible by the Ulysses degree"),
        ("spec_size", "members, but the group"),
        ("mismatch", "mismatched shard shapes"),
        ("qkv_shapes", "q, k and v shards have different shapes"),
        ("torus_chunks", "torus_chunks=3"),
        ("joint_partial", "joint_q, joint_k, joint_v or none"),
    ],
)
def test_bad_input_refused_on_every_rank(world, kind, needle):
    results = world.run(ah.case_bad_input, kind, timeout=60)
    for rank, res in enumerate(results):
        assert "InvalidUsage" in res["types"], f"rank {rank}: {res}"
        assert "ValueError" in res["types"]
        assert needle in res["message"], f"rank {rank}: {res['message']}"
        assert res["after"] == [float(world.world_size)] * 4


@pytest.mark.timeout(60)
def test_auto_placement_from_env(world):
    if world.world_size != 4:
        pytest.skip("needs a 2 x 2 grid")
    # Nodes {0,1},{2,3}: ring-low keeps the rings (0,1),(2,3) inside nodes.
    assert world.run(ah.case_env_topology, "0,0,1,1", timeout=30) == ["ring-low"] * 4
    # Nodes {0,2},{1,3}: ulysses-low's rings (0,2),(1,3) stay inside nodes.
    assert world.run(ah.case_env_topology, "0,1,0,1", timeout=30) == ["ulysses-low"] * 4


# ------------------------------------------------------------------------ single-process (no world needed)
def test_parallel_spec_validation():
    import gfdit
    import gfdit.attention as ga

    assert ga.ParallelSpec(ulysses=2, ring=3).degree == 6
    for kwargs in (
        {"ulysses": 0},
        {"ring": -1},
        {"ulysses": 1.5},
        {"mode": "zigzag"},
        {"placement": "low"},
        {"torus_chunks": 0},
    ):
        with pytest.raises(gfdit.InvalidUsage):
            ga.ParallelSpec(**kwargs)


def test_grid_layout_placements():
    from gfdit.attention.spec import GridLayout

    lay = GridLayout.build(2, 3, "ulysses-low", 3)  # member 3 = ring_idx 1 * 2 + ulysses_idx 1
    assert (lay.ulysses_idx, lay.ring_idx) == (1, 1)
    assert lay.ulysses_members == (2, 3) and lay.ring_members == (1, 3, 5)
    lay = GridLayout.build(2, 3, "ring-low", 3)  # member 3 = ulysses_idx 1 * 3 + ring_idx 0
    assert (lay.ulysses_idx, lay.ring_idx) == (1, 0)
    assert lay.ulysses_members == (0, 3) and lay.ring_members == (3, 4, 5)


def test_topology_and_auto_placement(monkeypatch):
    import gfdit
    import gfdit.attention as ga
    from gfdit.attention.spec import resolve_placement

    monkeypatch.delenv("GFDIT_NODE_IDS", raising=False)
    assert ga.Topology.from_env(4).node_ids == (0, 0, 0, 0)
    monkeypatch.setenv("GFDIT_NODE_IDS", "0,0,1,1")
    topo = ga.Topology.from_env(4)
    assert (
        topo.num_nodes == 2 and topo.node_of(2) == 1 and topo.same_node([0, 1]) and not topo.same_node([1, 2])
    )
    with pytest.raises(gfdit.InvalidUsage):
        ga.Topology.from_env(8)  # 4 ids for 8 ranks
    with pytest.raises(gfdit.InvalidUsage):
        ga.Topology.from_string("0,a")
    spec = ga.ParallelSpec(ulysses=2, ring=2, placement="auto")
    assert resolve_placement(spec, [0, 1, 2, 3], topo) == "ring-low"  # rings {0,1} {2,3} inside nodes
    assert resolve_placement(spec, [0, 2, 1, 3], topo) == "ulysses-low"  # group order interleaves the nodes
    assert resolve_placement(spec, [0, 1, 2, 3], ga.Topology((0, 0, 0, 0))) == "ulysses-low"
    # 8 ranks on 2 nodes of 4, ulysses 2 x ring 4: rings of 4 consecutive members stay inside nodes.
    spec8 = ga.ParallelSpec(ulysses=2, ring=4, placement="auto")
    assert resolve_placement(spec8, list(range(8)), ga.Topology((0,) * 4 + (1,) * 4)) == "ring-low"
    assert (
        resolve_placement(ga.ParallelSpec(2, 2, placement="ulysses-low"), [0, 1, 2, 3], topo) == "ulysses-low"
    )


def test_partial_merge_matches_full_attention():
    import torch
    from gfdit.attention.local import PartialMerger, block_attention

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 17, 8, generator=g) for _ in range(3))
    full, _ = block_attention(q.double(), k.double(), v.double())
    m = PartialMerger()
    for lo, hi in ((0, 5), (5, 5), (5, 16), (16, 17)):  # includes an empty block
        m.add_block(q, k[:, :, lo:hi], v[:, :, lo:hi])
    out, _ = m.result(q)
    assert (out.double() - full).abs().max().item() <= 1e-5 * full.abs().max().item()
