"""gfdit profile: a reduced run (one or two tiny shapes, world 2, one repeat) writes a valid profile; a batch
measurement (one shape, one rank) gives a profile that prices batches."""

from __future__ import annotations

import argparse
import json

import pytest
from gfdit._C import InvalidUsage
from gfdit._C import runtime as rt
from gfdit.planning import cost
from gfdit.tools import profile


def _cli(argv: list[str]) -> int:
    """What `gfdit profile ARGV` runs (gfdit.tools.cli dispatches to these two functions)."""
    parser = argparse.ArgumentParser(prog="gfdit profile")
    profile.add_arguments(parser, "profile")
    return profile.run(parser.parse_args(argv), "profile")


def test_layouts_cover_degrees_and_modes():
    got = {(s.ulysses, s.ring, s.mode) for s in profile.layouts_for(4, 4)}
    assert got == {
        (1, 1, "usp"),
        (2, 1, "usp"),
        (1, 2, "usp"),
        (3, 1, "usp"),  # 4 heads on 3 members: an uneven split
        (1, 3, "usp"),
        (4, 1, "usp"),
        (1, 4, "usp"),
        (2, 2, "usp"),
        (2, 2, "torus"),
    }
    assert {s.degree for s in profile.layouts_for(2, 4)} == {1, 2}
    # every degree up to the world; Ulysses at most one head per member
    assert {(s.ulysses, s.ring) for s in profile.layouts_for(4, 2) if s.degree == 4} == {(1, 4), (2, 2)}
    assert {s.degree for s in profile.layouts_for(3, 4)} == {1, 2, 3}
    assert profile.layouts_for(1, 4) == [profile.LayoutSpec(1, 1)]
    # with guidance also CFG-parallel: each per-pass layout on two halves, where twice its degree fits
    cfg = {(s.ulysses, s.ring, s.mode) for s in profile.layouts_for(4, 4, guidance=True) if s.cfg == 2}
    assert cfg == {(1, 1, "usp"), (2, 1, "usp"), (1, 2, "usp")}
    assert all(s.degree == 2 * s.ulysses * s.ring for s in profile.layouts_for(4, 4, True) if s.cfg == 2)
    assert [s for s in profile.layouts_for(2, 4, guidance=True) if s.cfg == 2] == [
        profile.LayoutSpec(1, 1, cfg=2)
    ]
    assert {s.degree for s in profile.layouts_for(3, 4, guidance=True) if s.cfg == 2} == {2}
    assert str(profile.LayoutSpec(2, 1, cfg=2)) == "usp 2x1 cfg2"


def test_default_shapes_span_what_an_image_model_serves():
    """An image model's default size up to the largest square its limits take (tiny-qwen-image: 65536 pixels,
    256 tokens of 16x16 pixels), so that the profile prices every size it is asked to serve."""
    facts = profile._ModelFacts("tiny-qwen-image")
    assert facts.default_shapes() == [(48, 80, 1), (128, 128, 1), (256, 256, 1)]
    for shape in facts.default_shapes():
        facts.check(*shape)
    with pytest.raises(InvalidUsage):
        facts.check(272, 272, 1)  # one stride larger
    qwen = profile._ModelFacts("qwen-image").default_shapes()
    assert qwen[0] == (1024, 1024, 1) and qwen[-1] == (2048, 2048, 1) and len(qwen) == 3


def test_parse_shapes():
    assert profile.parse_shapes("32x48x9, 64x96") == [(32, 48, 9), (64, 96, 1)]
    for bad in ("32", "32xx48", "0x16", "axb", ","):
        with pytest.raises(InvalidUsage, match="--shapes"):
            profile.parse_shapes(bad)


def test_parse_batches():
    assert profile.parse_batches("4, 2,4") == (2, 4)
    assert profile.parse_batches("") == ()
    for bad in ("1", "0", "two", "2,-3"):
        with pytest.raises(InvalidUsage, match="--batches"):
            profile.parse_batches(bad)


def test_bad_arguments_exit_2(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert _cli(["--model", "tiny-wan", "--world-size", "2", "--out", str(out), "--shapes", "33x48x1"]) == 2
    assert "33x48x1" in capsys.readouterr().err
    assert _cli(["--model", "tiny-wan", "--world-size", "0", "--out", str(out), "--shapes", "32x48"]) == 2
    assert "world-size" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.timeout(120)
def test_reduced_profile_run(tmp_path, capsys):
    out = tmp_path / "profile.json"
    shapes = [(32, 48, 1), (32, 48, 9)]
    argv = [
        "--model",
        "tiny-wan",
        "--world-size",
        "2",
        "--out",
        str(out),
        "--steps",
        "2",
        "--repeats",
        "1",
        "--batches",
        "",  # none: test_batch_profile_prices_batches measures them
        "--shapes",
        ",".join(f"{h}x{w}x{f}" for h, w, f in shapes),
    ]
    assert _cli(argv) == 0
    table = capsys.readouterr().out
    assert "stage" in table and "migrate" in table
    p = json.loads(out.read_text())
    assert p["format"] == "gfdit-profile/2" and p["model"] == "tiny-wan" and p["hardware"] == "cpu"
    assert p["world_size"] == 2 and p["num_cores"] >= 1
    assert 0 < p["dispatch_s"] < 1 and 0 < p["completion_s"] < 1
    entries = p["entries"]
    keys = {
        "stage",
        "tokens",
        "degree",
        "ulysses",
        "ring",
        "mode",
        "cfg",
        "guidance",
        "num_new",
        "batch",
        "seconds",
        "samples",
    }
    assert all(set(e) == keys for e in entries)
    assert all(e["batch"] == 1 for e in entries)  # --batches "": one request at a time
    assert all(e["seconds"] > 0 and e["samples"] >= 1 and e["guidance"] for e in entries)
    assert {e["stage"] for e in entries} == {"encode", "denoise", "migrate", "decode"}
    facts = profile._ModelFacts("tiny-wan")
    tokens = {facts.tokens(*s) for s in shapes}
    assert len(tokens) == 2
    for stage in ("encode", "denoise", "decode", "migrate"):
        assert {e["tokens"] for e in entries if e["stage"] == stage} == tokens, stage
    steps = {
        (e["tokens"], e["degree"], e["ulysses"], e["ring"], e["mode"], e["cfg"])
        for e in entries
        if e["stage"] == "denoise"
    }
    layouts = ((1, 1, 1, 1), (2, 2, 1, 1), (2, 1, 2, 1), (2, 1, 1, 2))  # the last: CFG-parallel
    assert steps == {(t, d, u, r, "usp", c) for t in tokens for d, u, r, c in layouts}
    assert all(e["samples"] == 2 for e in entries if e["stage"] == "denoise")  # --steps 2 x --repeats 1
    assert {(e["degree"], e["num_new"]) for e in entries if e["stage"] == "migrate"} == {(2, 1)}
    # the decode split over each measured group (NOTE [parallel decode] in control.cpp), keyed by its degree
    assert {(e["degree"], e["ulysses"]) for e in entries if e["stage"] == "decode"} == {(1, 1), (2, 1)}


@pytest.mark.timeout(120)
def test_batch_profile_prices_batches(tmp_path, monkeypatch):
    """Batches of 2 and 4 step together on rank 0; the profile written loads, and its cost model prices a batch
    up to 4 (interpolating 3), refuses 5, and a batch of 4 small images costs less than 4 requests alone. No
    request has one step (a one-step tiny-qwen-image schedule divides by zero: NOTE [profile requests]), and
    the progress reaches its total."""
    model, (h, w) = "tiny-qwen-image", (64, 64)
    steps_of = []
    request = profile._request

    def recorded(shape, steps, seed, prompt):
        steps_of.append(steps)
        return request(shape, steps, seed, prompt)

    monkeypatch.setattr(profile, "_request", recorded)
    progress = []
    prof = profile.measure(
        model, 1, [(h, w, 1)], steps=1, repeats=2, batches=(2, 4), progress=lambda *p: progress.append(p)
    )
    assert steps_of and min(steps_of) >= 2, steps_of
    assert progress[-1][0] == progress[-1][1] == len(progress)
    denoise = {e.batch: e for e in prof.entries if e.stage == cost.Stage.DENOISE}
    assert sorted(denoise) == [1, 2, 4]
    for b, e in denoise.items():
        assert (e.degree, e.ulysses, e.ring, e.cfg) == (1, 1, 1, 1) and e.seconds > 0
        assert e.samples == 2, b  # --steps 1 x --repeats 2: each batched step once, not once per member
    assert all(e.batch == 1 for e in prof.entries if e.stage != cost.Stage.DENOISE)
    assert "batch" in profile.format_table(prof).splitlines()[1]
    path = tmp_path / "profile.json"
    cost.write_profile(path, prof)
    cm = cost.cost_model(model, "cpu", profile=cost.load_profile(path))
    g = cost.model_arch(model).default_guidance

    def step(b: int) -> float:
        return cm.seconds(cost.Stage.DENOISE, h, w, 1, guidance_scale=g, batch=b)

    assert step(1) == pytest.approx(denoise[1].seconds) and step(4) == pytest.approx(denoise[4].seconds)
    assert step(3) == pytest.approx((step(2) + step(4)) / 2)  # linear between measured batches
    with pytest.raises(InvalidUsage, match="batch 5 is outside the measured batches"):
        step(5)  # the profile's max_batch is the largest measured: 4
    assert step(4) < 4 * step(1), (step(1), step(4))  # tiny-qwen-image 64x64: ~2.4x for 4 on this machine


@pytest.mark.timeout(120)
def test_cache_profile_measures_skip_curves(tmp_path):
    """--caches: per kind and threshold one request on rank 0 whose timeline says which passes reused the cache.
    tiny-wan's own weights change their first block's residual by 30-140% a step (NOTE [deep tiny models]), so a
    threshold of 0.01 reuses nothing and one of 5 every pass it may; the curve and the cached step's share travel
    through the profile file into the profiled cost model (NOTE [step caches])."""
    prof = profile.measure(
        "tiny-wan",
        1,
        [(32, 32, 5)],
        steps=1,
        repeats=1,
        batches=(),
        caches=("fbcache", "teacache"),
        cache_thresholds=(0.01, 5.0),
        cache_steps=6,
    )
    curves = {rt.cache_kind_name(c.kind): dict(c.points) for c in prof.skip_curves}
    assert curves["fbcache"] == {0.01: 0.0, 5.0: 1.0}
    assert curves["teacache"][0.01] == 0.0 and curves["teacache"][5.0] > 0.5
    assert 0 < prof.fbcache_step_ratio < 1 and 0 < prof.teacache_step_ratio < 1
    path = tmp_path / "profile.json"
    cost.write_profile(path, prof)
    back = cost.load_profile(path)
    assert [tuple(c.points) for c in back.skip_curves] == [tuple(c.points) for c in prof.skip_curves]
    cm = cost.cost_model("tiny-wan", "cpu", profile=back)
    assert cm.skip_rate("fbcache", 5.0) == 1.0 and cm.skip_rate("fbcache", 2.5) == pytest.approx(2.49 / 4.99)
    g = cost.model_arch("tiny-wan").default_guidance
    full = cm.seconds(cost.Stage.DENOISE, 32, 32, 5, guidance_scale=g)
    cached = cm.seconds(cost.Stage.DENOISE, 32, 32, 5, guidance_scale=g, cached="fbcache")
    assert cached == pytest.approx(full * prof.fbcache_step_ratio)
    with pytest.raises(InvalidUsage, match="--caches"):
        profile.measure("tiny-wan", 1, [(32, 32, 5)], caches=("blockcache",))


def test_collectives_profile_needs_a_gpu_and_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the measurement would run")
    assert _cli(["--collectives"]) == 2
    assert "--collectives" in capsys.readouterr().err
    assert _cli(["--model", "tiny-wan"]) == 2  # a model profile still needs its arguments
    assert "required" in capsys.readouterr().err
