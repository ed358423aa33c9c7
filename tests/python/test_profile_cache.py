"""The cached profile an engine plans with by default (NOTE [cached profiles] in gfdit.tools.profile_cache): its key,
entries measured once and read after, re-measured when corrupt, stale or asked (reprofile), an explicit cost model
or profile winning, and a second engine reusing the entry of the first. Measurements are counted, not timed: the
measurement is a stand-in here except in the engine test, which runs a reduced real one."""

from __future__ import annotations

import json
import os

import pytest
from gfdit._C import InvalidUsage
from gfdit.planning import cost
from gfdit.tools import profile, profile_cache

MODEL = "tiny-qwen-image"


def _profile(model: str, world_size: int, seconds: float) -> cost.Profile:
    """A profile as measure returns it: every stage at the model's default size, each taking ``seconds``."""
    p = cost.Profile()
    p.model, p.hardware, p.world_size, p.num_cores = model, "cpu", world_size, 2
    tokens = cost.model_arch(model).tokens(48, 80, 1)
    stages = ("encode", "denoise", "decode")
    p.entries = [cost.ProfileEntry(stage=cost.STAGES[s], tokens=tokens, seconds=seconds) for s in stages]
    return p


class _Counter:
    """A stand-in for gfdit.tools.profile.measure: counts its calls; each profile's seconds are the call's
    number, so a test can tell which measurement it reads."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, model: str, world_size: int, **kwargs) -> cost.Profile:
        self.calls.append((model, world_size))
        kwargs["progress"](1, 1)
        return _profile(model, world_size, float(len(self.calls)))


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """Measurements counted, the cache in a directory of this test's."""
    counter = _Counter()
    monkeypatch.setattr(profile, "measure", counter)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return counter


def _seconds(prof: cost.Profile) -> float:
    return prof.entries[0].seconds


def test_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert profile_cache.cache_dir() == tmp_path / "gfdit" / "profiles"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # not absolute: ignored, as the XDG spec says
    assert profile_cache.cache_dir() == profile_cache.Path.home() / ".cache" / "gfdit" / "profiles"


def test_key_names_model_world_and_cores(monkeypatch):
    base = profile_cache.key_for(MODEL, 2)
    assert base == profile_cache.key_for(MODEL, 2)
    assert base.devices == ("cpu", "cpu") and base.model_path is None
    names = {base.file_name()}
    names.add(profile_cache.key_for("tiny-wan", 2).file_name())
    names.add(profile_cache.key_for(MODEL, 3).file_name())
    names.add(profile_cache.key_for(MODEL, 2, model_path="weights").file_name())
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "cpu_count", lambda: cores + 6)
    other_machine = profile_cache.key_for(MODEL, 2)
    assert other_machine.machine != base.machine and f"{cores + 6} cores" in other_machine.machine
    names.add(other_machine.file_name())
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    pinned = profile_cache.key_for(MODEL, 2)
    assert "1 usable" in pinned.machine
    names.add(pinned.file_name())
    assert len(names) == 6


def test_measured_once_then_read(measured, tmp_path):
    prof, path = profile_cache.cached_profile(MODEL, 2)
    assert measured.calls == [(MODEL, 2)] and _seconds(prof) == 1.0
    assert path.parent == tmp_path / "gfdit" / "profiles"
    record = json.loads(path.read_text())["cache"]
    assert record["format"] == profile_cache.CACHE_FORMAT
    assert record["key"]["world_size"] == 2 and record["key"]["machine"] == profile_cache.machine()
    assert record["plan"]["shapes"] == [[48, 80, 1], [128, 128, 1], [256, 256, 1]]
    again, same = profile_cache.cached_profile(MODEL, 2)
    assert same == path and len(measured.calls) == 1 and _seconds(again) == 1.0
    assert cost.load_profile(path).model == MODEL  # an entry is a profile file, for --profile too
    profile_cache.cached_profile(MODEL, 1)  # another key: measured
    assert measured.calls[-1] == (MODEL, 1) and len(measured.calls) == 2


def test_reprofile_measures_again(measured):
    profile_cache.cached_profile(MODEL, 2)
    prof, path = profile_cache.cached_profile(MODEL, 2, reprofile=True)
    assert len(measured.calls) == 2 and _seconds(prof) == 2.0
    assert _seconds(profile_cache.cached_profile(MODEL, 2)[0]) == 2.0  # the new one replaced the entry
    assert len(measured.calls) == 2


@pytest.mark.parametrize(
    "spoil",
    [
        lambda d: "{ not json",
        lambda d: json.dumps({**d, "entries": []}),  # not a profile
        lambda d: json.dumps({k: v for k, v in d.items() if k != "cache"}),  # a plain profile file
        lambda d: json.dumps({**d, "cache": {**d["cache"], "format": "gfdit-profile-cache/0"}}),
        lambda d: json.dumps({**d, "cache": {**d["cache"], "gfdit": "0.0.0"}}),
        lambda d: json.dumps({**d, "cache": {**d["cache"], "plan": {**d["cache"]["plan"], "repeats": 1}}}),
        lambda d: json.dumps(
            {**d, "cache": {**d["cache"], "key": {**d["cache"]["key"], "machine": "another CPU; 64 cores"}}}
        ),
        lambda d: json.dumps({**d, "world_size": 4}),  # the profile itself of another world
    ],
    ids=["corrupt", "no-entries", "no-record", "format", "version", "plan", "machine", "world"],
)
def test_corrupt_or_stale_entry_is_measured_again(measured, spoil):
    _, path = profile_cache.cached_profile(MODEL, 2)
    path.write_text(spoil(json.loads(path.read_text())))
    prof, _ = profile_cache.cached_profile(MODEL, 2)
    assert len(measured.calls) == 2 and _seconds(prof) == 2.0
    assert profile_cache.load(profile_cache.key_for(MODEL, 2), path)[1] == ""  # replaced by a good entry


def test_explicit_cost_model_wins(measured):
    analytic = cost.cost_model(MODEL, "cpu")
    assert profile_cache.engine_cost_model(analytic, MODEL, 2) is analytic
    assert profile_cache.engine_cost_model(False, MODEL, 2) is None
    with pytest.raises(InvalidUsage, match="reprofile") as e:
        profile_cache.engine_cost_model(analytic, MODEL, 2, reprofile=True)
    assert e.value.param == "reprofile"
    with profile_cache.engine_default(False):
        assert profile_cache.engine_cost_model(None, MODEL, 2) is None
        with profile_cache.engine_default(None):  # the cached profile again
            assert "profile" in profile_cache.engine_cost_model(None, MODEL, 2).describe()
        assert profile_cache.engine_cost_model(None, MODEL, 2) is None
    assert len(measured.calls) == 1
    with profile_cache.engine_default(None), pytest.raises(InvalidUsage):
        profile_cache.engine_cost_model(None, MODEL, 3, policy="no-such-policy")
    assert len(measured.calls) == 1  # refused before measuring


def test_serve_refuses_reprofile_with_an_explicit_cost_model(measured, capsys):
    from gfdit.tools import cli

    assert cli.main(["serve", "--reprofile", "--cluster", "cpu"]) == 2
    assert "--reprofile" in capsys.readouterr().err
    assert measured.calls == []


@pytest.mark.timeout(300)
def test_second_engine_reuses_the_first_ones_profile(monkeypatch, tmp_path):
    """Engine() with no cost model plans with the cached profile: the first engine in an empty cache measures
    it (a reduced real measurement here), the second reads it; a given cost model is used as it is."""
    from gfdit.serving.engine import Engine

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []
    real = profile.measure

    def reduced(model, world_size, **kwargs):
        calls.append((model, world_size))
        kwargs.update(steps=2, repeats=1, batches=())
        return real(model, world_size, [(48, 80, 1)], **kwargs)

    monkeypatch.setattr(profile, "measure", reduced)
    with profile_cache.engine_default(None):  # whatever the test session set
        with Engine(model=MODEL, world_size=1) as eng:
            assert calls == [(MODEL, 1)]
            assert "profile" in eng.cost_model.describe()
            first = eng.cost_model.describe()
        with Engine(model=MODEL, world_size=1) as eng:
            assert calls == [(MODEL, 1)]
            assert eng.cost_model.describe() == first
    entries = list((tmp_path / "gfdit" / "profiles").glob("*.json"))
    assert len(entries) == 1 and entries[0].name.startswith(f"{MODEL}-w1-")
