"""Shared fixtures of the Python tests.

Multi-rank tests run their case functions (in the `cases_*.py` modules beside this file) on persistent
rank processes from `mp_harness`. This directory is put on sys.path here, so that the spawned ranks can
import those modules whatever pytest's import mode is.
"""

from __future__ import annotations

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import mp_harness  # noqa: E402

# Every test is bounded by pytest-timeout (pinned in the Makefile; the default bound is in pyproject.toml,
# @pytest.mark.timeout(seconds) sets another): past it the test fails with its stacks and the session goes on.


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("timeout"):
        raise pytest.UsageError("the tests need pytest-timeout (make venv installs it)")
    config.addinivalue_line("markers", "multirank(n): the test starts an n-rank world")
    config.addinivalue_line("markers", "ws8: a test_collectives test that also runs at world size 8")


@pytest.fixture(scope="module")
def world_pool():
    """Persistent rank worlds for one test module (one live world at a time)."""
    pool = mp_harness.WorldPool()
    yield pool
    pool.close()


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("multirank")
        if marker and marker.args and int(marker.args[0]) > mp_harness.MAX_WORLD:
            reason = f"world size {marker.args[0]} > GFDIT_TEST_MAX_WORLD={mp_harness.MAX_WORLD}"
            item.add_marker(pytest.mark.skip(reason=reason))
