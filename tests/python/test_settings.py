"""The one registry of settings (include/gfdit/settings.h, gfdit.settings): every GFDIT_* variable the Python
package reads is registered, is read through gfdit.settings only, and `gfdit info` prints them all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from gfdit import settings
from gfdit._C import InvalidUsage

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "gfdit")
NAME = re.compile(r"\bGFDIT_[A-Z0-9_]+\b")


def _sources() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                with open(os.path.join(folder, f), encoding="utf-8") as fh:
                    out[os.path.relpath(os.path.join(folder, f), PACKAGE)] = fh.read()
    return out


def test_every_variable_the_package_names_is_registered():
    registered = {e["name"] for e in settings.entries()}
    named = {n for text in _sources().values() for n in NAME.findall(text)}
    assert named, "the scan found no setting at all"
    assert named - registered == set()


def test_the_package_reads_the_environment_through_the_registry_only():
    direct = re.compile(r"(os\.environ(\.get)?|os\.getenv)\s*[\[(]\s*['\"]GFDIT_")
    assert [path for path, text in _sources().items() if direct.search(text)] == []


def test_values_defaults_and_unknown_names(monkeypatch):
    monkeypatch.delenv("GFDIT_HEAP_BYTES", raising=False)
    assert settings.value("GFDIT_HEAP_BYTES") is None
    assert settings.get_int("GFDIT_HEAP_BYTES") == 256 << 20
    monkeypatch.setenv("GFDIT_HEAP_BYTES", "1048576")
    assert settings.value("GFDIT_HEAP_BYTES") == "1048576" and settings.get_int("GFDIT_HEAP_BYTES") == 1 << 20
    monkeypatch.setenv("GFDIT_HEAP_BYTES", "lots")
    with pytest.raises(InvalidUsage, match="GFDIT_HEAP_BYTES"):
        settings.get_int("GFDIT_HEAP_BYTES")
    for off in ("0", "false", "off", "no", ""):
        monkeypatch.setenv("GFDIT_ATTENTION_PLAN_CACHE", off)
        assert not settings.get_bool("GFDIT_ATTENTION_PLAN_CACHE")
    monkeypatch.setenv("GFDIT_ATTENTION_PLAN_CACHE", "1")
    assert settings.get_bool("GFDIT_ATTENTION_PLAN_CACHE")
    with pytest.raises(InvalidUsage, match="GFDIT_NO_SUCH"):
        settings.get("GFDIT_NO_SUCH")


def test_gfdit_info_prints_every_setting():
    out = subprocess.run([sys.executable, "-m", "gfdit", "info"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert "version" in info  # what the build supports, as before
    names = [s["name"] for s in info["settings"]]
    assert names == [e["name"] for e in settings.entries()] and len(names) == len(set(names))
    assert all(s["meaning"] and s["type"] for s in info["settings"])
