"""Profiles measured once per machine: the cost model ``gfdit.Engine`` and ``gfdit serve`` plan with by default.

NOTE [cached profiles]
The analytic CPU model is known to be wrong on a real machine (on 2 cores it says more ranks help; they do
not), and a policy that plans with it is slower than ``static:1``. So an engine given no cost model plans with
a profile of its model measured on this machine (``gfdit profile``'s ``measure``, with ``PLAN``), kept in the
user's cache directory ($XDG_CACHE_HOME, else ~/.cache; then gfdit/profiles) and measured on first use, with a
progress bar. An entry is one profile file (``gfdit.planning.cost.write_profile``, readable by ``--profile``)
whose ``cache`` record says what it was measured on (``ProfileKey``: model, weights, world size, each worker's
device, the CPU and the cores this process may use), how (``PLAN`` and the model's default shapes), by which
gfdit and in which format (CACHE_FORMAT). An entry whose record differs from what is asked, or that does not
read as a profile, is measured again and replaced, never trusted; ``reprofile`` measures again regardless.
Engines starting at once for the same key measure once: the others wait on the entry's lock, then read it.
``engine_default`` sets what an engine with no cost model takes instead, for a process that starts many engines
whose plans do not matter (a test suite).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gfdit._C import InvalidUsage
from gfdit._C import runtime as rt
from gfdit.planning import cost
from gfdit.serving.engine import worker_devices
from gfdit.tools import profile

CACHE_FORMAT = "gfdit-profile-cache/1"
# How a cached profile is measured (gfdit.tools.profile.measure's arguments besides the model's default shapes).
PLAN: dict[str, Any] = {"steps": 2, "repeats": 2, "batches": [2, 4]}

_engine_default: Any = None  # see engine_default


@dataclasses.dataclass(frozen=True)
class ProfileKey:
    """What a profile is valid for: the model (and its weights), the world size, each worker's device ("cpu" or
    "cuda:N NAME") and the machine (``machine()``)."""

    model: str
    model_path: str | None
    world_size: int
    devices: tuple[str, ...]
    machine: str

    def file_name(self) -> str:
        """The entry's file: the model and world size to read, a digest of the whole key to tell keys apart."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return f"{self.model}-w{self.world_size}-{digest}.json"


def machine() -> str:
    """The CPU's model name, its cores and the cores this process may run on (its affinity)."""
    name = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    name = name or platform.processor() or platform.machine()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}; {os.cpu_count()} cores, {usable} usable"


def key_for(model: str, world_size: int, model_path: str | None = None, device: Any = None) -> ProfileKey:
    """The key of an engine of these arguments (``gfdit.Engine``'s; device None: the GFDIT_DEVICE setting)."""
    devices = []
    for d in worker_devices(device, world_size):
        if d is None:
            devices.append("cpu")
        else:
            import torch

            devices.append(f"{d} {torch.cuda.get_device_name(int(d.split(':')[1]))}")
    path = str(Path(model_path).resolve()) if model_path is not None else None
    return ProfileKey(model, path, int(world_size), tuple(devices), machine())


def cache_dir() -> Path:
    """Where cached profiles are: $XDG_CACHE_HOME (when absolute) or ~/.cache, then gfdit/profiles."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "gfdit" / "profiles"


def _record(key: ProfileKey) -> dict[str, Any]:
    """What an entry of ``key`` must say it was measured on and how (NOTE [cached profiles])."""
    shapes = [list(s) for s in profile._ModelFacts(key.model).default_shapes()]
    return {
        "format": CACHE_FORMAT,
        "key": dataclasses.asdict(key) | {"devices": list(key.devices)},
        "plan": PLAN | {"shapes": shapes},
        "gfdit": importlib.metadata.version("gfdit"),
    }


def load(key: ProfileKey, path: Path) -> tuple[Any, str]:
    """The profile of the entry at ``path`` and "", or None and why it cannot be used (absent, unreadable, not a
    profile, or measured on something else than ``key`` or otherwise than asked)."""
    if not path.exists():
        return None, "none yet"
    try:
        data = json.loads(path.read_text())
        record = data.get("cache") if isinstance(data, dict) else None
        prof = cost.load_profile(path)
    except (OSError, ValueError, InvalidUsage) as e:
        return None, f"unreadable ({getattr(e, 'message', e)})"
    want = _record(key)
    if not isinstance(record, dict) or record.get("format") != CACHE_FORMAT:
        return None, f"not a cache entry of format {CACHE_FORMAT}"
    for field, value in want.items():
        if record.get(field) != value:
            return None, f"stale: its {field} is {record.get(field)!r}, not {value!r}"
    if prof.model != key.model or prof.world_size != key.world_size:
        return None, f"stale: a profile of {prof.model} at world {prof.world_size}"
    return prof, ""


def _measure(key: ProfileKey, device: Any, why: str) -> Any:
    """Measures the profile of ``key`` with a progress bar on stderr."""
    from tqdm import tqdm

    print(
        f"gfdit: measuring the profile of {key.model} at world {key.world_size} on this machine ({why}); "
        "once, then cached",
        file=sys.stderr,
        flush=True,
    )
    with tqdm(desc=f"profile {key.model} w{key.world_size}", unit="run", file=sys.stderr) as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        return profile.measure(
            key.model,
            key.world_size,
            steps=PLAN["steps"],
            repeats=PLAN["repeats"],
            batches=PLAN["batches"],
            model_path=key.model_path,
            device=device,
            progress=progress,
        )


def _write(path: Path, prof: Any, record: dict[str, Any]) -> None:
    """Writes the entry so that a reader sees the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    try:
        cost.write_profile(tmp, prof, {"cache": record | {"measured_at": _now()}})
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def cached_profile(
    model: str,
    world_size: int,
    *,
    model_path: str | None = None,
    device: Any = None,
    reprofile: bool = False,
    directory: str | Path | None = None,
) -> tuple[Any, Path]:
    """The profile of ``model`` at ``world_size`` on this machine (a ``gfdit.planning.cost.Profile``) and its
    file: read from the cache (``directory``, default ``cache_dir()``), or measured there first when it has
    none that fits, or always with ``reprofile`` (NOTE [cached profiles])."""
    key = key_for(model, world_size, model_path, device)
    root = Path(directory) if directory is not None else cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    path = root / key.file_name()
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # an engine measuring this key now: wait for its entry
        prof, why = (None, "--reprofile") if reprofile else load(key, path)
        if prof is None:
            prof = _measure(key, device, why)
            _write(path, prof, _record(key))
    return prof, path


def engine_cost_model(
    cost_model: Any,
    model: str,
    world_size: Any,
    *,
    model_path: str | None = None,
    device: Any = None,
    policy: Any = None,
    reprofile: bool = False,
) -> Any:
    """The cost model an engine of these arguments plans with (``gfdit.Engine``'s ``cost_model``): a
    ``gfdit._C.cost.CostModel`` given; False: none; None: the cached profile's (``cached_profile``, measured
    again with ``reprofile``), or what ``engine_default`` set."""
    if cost_model is not None:
        if reprofile:
            raise InvalidUsage(
                "gfdit.Engine: reprofile measures the cached profile again; it takes no cost_model",
                param="reprofile",
            )
        return cost_model if cost_model is not False else None
    if not reprofile and _engine_default is not None:
        return _engine_default if _engine_default is not False else None
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        return None  # nothing to measure: the engine refuses the world size with its own message
    if isinstance(policy, str):
        rt.make_policy(policy)  # a bad name is refused before the minutes a measurement may take
    prof, _ = cached_profile(model, world_size, model_path=model_path, device=device, reprofile=reprofile)
    return cost.cost_model(model, profile=prof)


@contextlib.contextmanager
def engine_default(cost_model: Any) -> Iterator[None]:
    """Within the block an engine given no cost model takes ``cost_model`` (False: none) instead of the cached
    profile; None restores the cached profile. For a process that starts many engines whose plans do not
    matter: a test suite, which would otherwise measure a profile for each model and world size it uses."""
    global _engine_default
    previous, _engine_default = _engine_default, cost_model
    try:
        yield
    finally:
        _engine_default = previous
