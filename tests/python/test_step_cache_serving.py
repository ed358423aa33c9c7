"""Step caches through the runtime (NOTE [step caches] in include/gfdit/step_cache.h): a request's ``cache``
checked at submit naming the field, the counts of cached steps in its result and timeline, a request moved
between groups (the control plane's gathers: NOTE [cache gathers]) ending with the output of the same request on
one rank, the server's ``cache`` field, default and switch, /metrics, traces and the simulator. The caches'
algorithms against cache-dit and a reference, and their sharding, are tests/python/test_step_cache.py's."""

from __future__ import annotations

import json

import gfdit
import pytest
import torch
from gfdit import Policy
from gfdit._C import runtime as rt
from gfdit.serving.engine import Engine
from gfdit.serving.request import Request

# tiny-wan's own weights change the first block's residual by 30-140% a step (NOTE [deep tiny models] in
# gfdit.models.tiny), so a threshold of 5 reuses the cache at every step it may: what these tests need is that
# steps are cached, at most two in a row, and where, not a realistic skip rate
FORCED = "fbcache:5,warmup=2,max_skip=2"


class Moves(Policy):
    """Runs every ready request one step per decision on the next group of ``plan`` (ranks, cfg), then on the
    last one: a request that moves between groups, orders and CFG splits."""

    def __init__(self, plan: list[tuple[list[int], int]]) -> None:
        super().__init__()
        self.plan = plan

    def name(self) -> str:
        return "moves"

    def schedule(self, view):
        out, free = [], set(view.free_ranks)
        for r in view.ready:
            ranks, cfg = self.plan[min(r.step, len(self.plan) - 1)]
            if not set(ranks) <= free:
                continue
            free -= set(ranks)
            layout = rt.Layout(ulysses=len(ranks) // cfg, cfg=cfg)
            out.append(rt.Decision(r.id, ranks, layout, 1, len(ranks) if r.step + 1 >= r.num_steps else 0))
        return out


@pytest.fixture(scope="module")
def engine():
    with Engine(model="tiny-wan", world_size=2, policy="fcfs", timeout_s=30.0) as eng:
        yield eng


def _request(**kw) -> Request:
    return Request(prompt="a fox in the snow", num_frames=5, height=32, width=32, seed=3, **kw)


@pytest.mark.parametrize(
    "cache",
    [
        "blockcache",
        "fbcache:-0.1",
        "fbcache:nan",
        "teacache:1e9",
        "fbcache,warmup=-1",
        "fbcache,warmup=100000",
        "fbcache,max_skip=-2",
        "fbcache,depth=3",
        3,
    ],
)
def test_a_bad_cache_is_refused_at_submit_naming_it(engine, cache):
    with pytest.raises(gfdit.InvalidUsage) as e:
        engine.submit(_request(cache=cache))
    assert e.value.param == "cache", e.value.message


def test_a_model_without_the_cache_refuses_it_naming_cache():
    info = rt.ModelInfo()  # an image model's hello: strides 8 x 2, one frame
    info.name = "tiny-qwen-image"
    info.cache_kinds = ["teacache"]  # what it implements
    limits = rt.RequestLimits.of_loaded("tiny-qwen-image", info)
    assert limits.check(32, 32, 1, 4, 5.0, cache="teacache") > 0
    for cache in ("fbcache", "fbcache:0.1"):
        with pytest.raises(gfdit.InvalidUsage, match="implements teacache") as e:
            limits.check(32, 32, 1, 4, 5.0, cache=cache)
        assert e.value.param == "cache"
    info.cache_kinds = []
    with pytest.raises(gfdit.InvalidUsage, match="no step cache"):
        rt.RequestLimits.of_loaded("tiny-qwen-image", info).check(32, 32, 1, 4, 5.0, cache="teacache")


def test_the_result_counts_the_steps_that_reused_the_cache(engine):
    cached = engine.submit(_request(num_inference_steps=8, cache=FORCED)).result(timeout=120)
    plain = engine.submit(_request(num_inference_steps=8)).result(timeout=120)
    assert plain.cached_steps == plain.cached_passes == 0
    steps = [s for s in cached.timeline if s.kind == "denoise"]
    by_step = {}
    for s in steps:  # one step per task here; a guided step runs two passes
        for k in range(s.step_begin, s.step_begin + s.num_steps):
            by_step[k] = (s.cached_steps, s.cached_passes)
    # warm-up steps 0 and 1 in full, then at most two cached steps in a row
    assert by_step[0] == by_step[1] == (0, 0)
    assert [by_step[k][0] for k in range(2, 8)] == [1, 1, 0, 1, 1, 0]
    assert cached.cached_steps == 4 and cached.cached_passes == 8
    # an output nonetheless, near the uncached one
    assert cached.output.shape == plain.output.shape
    assert 0 < float((cached.output - plain.output).abs().mean()) < 0.5


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_request_moved_between_groups_keeps_its_cache_and_its_one_rank_output(no_shm_leftovers):
    """Steps on {0, 1}, then {1} alone (a shrink: the cache's other shard is gathered first), {1, 0} (another
    order), {0, 1} with CFG-parallel (another split: one pass per rank), and {0}: every move keeps the cache
    (NOTE [cache gathers]), so the output is the one-rank run's and so are the steps that reused the cache."""
    plan = [([0, 1], 1), ([1], 1), ([1, 0], 1), ([1, 0], 1), ([0, 1], 2), ([0, 1], 2), ([0], 1)]
    req = _request(num_inference_steps=9, cache="fbcache:5,warmup=1,max_skip=1")
    with Engine(model="tiny-wan", world_size=2, policy=Moves(plan), timeout_s=30.0) as eng:
        moved = eng.submit(req).result(timeout=240)
        gathers = eng.stats()["cache_gathers"]
    with Engine(model="tiny-wan", world_size=1, policy="fcfs", timeout_s=30.0) as eng:
        alone = eng.submit(req).result(timeout=240)
    kinds = [s.kind for s in moved.timeline]
    assert kinds.count("gather") == gathers >= 3, kinds
    cached = lambda r: [(s.step_begin, s.cached_steps) for s in r.timeline if s.kind == "denoise"]  # noqa: E731
    assert cached(moved) == cached(alone)
    assert moved.cached_steps == alone.cached_steps == 4
    torch.testing.assert_close(moved.output, alone.output, rtol=0, atol=1e-5)


def test_the_server_takes_a_cache_a_default_and_a_switch_that_forbids_it(engine):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from gfdit.serving.server import create_app

    body = {"prompt": "a red fox", "size": "32x32", "num_inference_steps": 5, "seed": 1}
    with TestClient(create_app(engine, model="tiny-wan")) as c:
        # the schema the server publishes has the field
        schema = c.get("/openapi.json").json()["components"]["schemas"]
        assert "cache" in schema["ImageGenerationRequest"]["properties"]
        r = c.post("/v1/images/generations", json={**body, "cache": FORCED})
        assert r.status_code == 200, r.text
        for bad in ("blockcache", "fbcache:-1", "fbcache,warmup=x"):
            r = c.post("/v1/images/generations", json={**body, "cache": bad})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "cache"
        metrics = c.get("/metrics").text
        assert 'gfdit_denoise_steps_total{cached="true"} 2.0' in metrics, metrics
        assert "gfdit_cached_passes_total 4.0" in metrics
    # a default for requests that name none; a request may still turn it off
    with TestClient(create_app(engine, model="tiny-wan", cache=FORCED)) as c:
        c.post("/v1/images/generations", json=body)
        c.post("/v1/images/generations", json={**body, "cache": "none"})
        metrics = c.get("/metrics").text
        assert 'gfdit_denoise_steps_total{cached="true"} 2.0' in metrics, metrics
    # forbidden: the body's field is refused, the default applies
    with TestClient(create_app(engine, model="tiny-wan", cache=FORCED, request_cache=False)) as c:
        r = c.post("/v1/images/generations", json={**body, "cache": "none"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache", r.text
        assert c.post("/v1/images/generations", json=body).status_code == 200
    # a default the model refuses is refused when the app is made, not at every request
    with pytest.raises(gfdit.InvalidUsage):
        create_app(engine, model="tiny-wan", cache="fbcache,warmup=100000")


def test_a_trace_line_names_its_cache_and_the_simulator_draws_it(tmp_path):
    from gfdit.planning import simulate
    from gfdit.planning.trace import TraceRequest, load_trace, write_trace

    reqs = [
        TraceRequest(i, 0.5 * i, "qwen-image", 1024, 1024, 1, 50, None, cache="fbcache:0.12,max_skip=3")
        for i in range(4)
    ] + [TraceRequest(4, 2.0, "qwen-image", 1024, 1024, 1, 50, None)]
    path = tmp_path / "t.jsonl"
    write_trace(str(path), reqs)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["cache"] == "fbcache:0.12,max_skip=3" and "cache" not in lines[4]
    assert load_trace(str(path)) == reqs
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**lines[0], "cache": "fbcache:-1"}) + "\n")
    with pytest.raises(gfdit.InvalidUsage, match=r"bad.jsonl:1: cache: the threshold"):
        load_trace(str(bad))
    # cache-dit's published setting on Qwen-Image (NOTE [published skip rates]): faster than the same trace without
    cached = simulate.simulate_trace(reqs, model="qwen-image", cluster="h20x8", policy="static:1")
    plain = simulate.simulate_trace(
        [TraceRequest(**{**r.__dict__, "cache": None}) for r in reqs],
        model="qwen-image",
        cluster="h20x8",
        policy="static:1",
    )
    done = lambda rep: [o.finish_s - o.arrival_s for o in rep.outcomes]  # noqa: E731
    assert all(a < 0.7 * b for a, b in zip(done(cached)[:4], done(plain)[:4]))
    assert done(cached)[4] == pytest.approx(done(plain)[4], rel=0.05)  # no cache of its own


def test_the_cost_model_prices_cached_steps_and_predictions_read_them():
    from gfdit.planning import cost

    m = cost.cost_model("qwen-image", "h20x8")
    full = m.seconds(cost.Stage.DENOISE, 1024, 1024, guidance_scale=4.0)
    fb = m.seconds(cost.Stage.DENOISE, 1024, 1024, guidance_scale=4.0, cached="fbcache")
    tea = m.seconds(cost.Stage.DENOISE, 1024, 1024, guidance_scale=4.0, cached="teacache")
    assert tea < fb < full / 20  # one block of 60 and the decision
    assert m.skip_rate("fbcache", 0.12) == pytest.approx(0.9)
    assert "cache-dit" in m.skip_curve("fbcache").source
    assert m.skip_rate("teacache", 0.12) == 0  # nothing published: no gain assumed
    assert rt.cached_share(0.9, 3) == pytest.approx(2.439 / 3.439, abs=1e-3)
    # the migration carries the cache, the gather moves it among the holders
    base = m.seconds(cost.Stage.MIGRATE, 1024, 1024, guidance_scale=4.0, degree=2, num_new=1)
    with_cache = m.seconds(
        cost.Stage.MIGRATE, 1024, 1024, guidance_scale=4.0, degree=2, num_new=1, cache="fbcache"
    )
    assert with_cache > base
    assert m.seconds(cost.Stage.GATHER, 1024, 1024, guidance_scale=4.0, degree=2, cache="fbcache") > 0
