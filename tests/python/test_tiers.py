"""The fast tier (``make test-fast``, the tiers: conftest.py) keeps a test of every module.

Python: every tests/python/test_*.py has a test that ``-m "not slow"`` selects, but those in ALL_SLOW; every
pattern of SLOW still names a test (a renamed test does not leave a stale entry). C++: the ctest command of
``make test-cpp-fast`` (as ``make -n`` prints it) selects a test of every test source of tests/cpp that
the build compiled (the test binaries say which source each test is in, ``--gtest_list_tests`` as JSON).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import conftest
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CPP_BUILD = os.path.join(ROOT, "build", "cpp")
# ctest names of the tests that are no gtest (add_test in tests/cpp/CMakeLists.txt) and their sources
PLAIN_CPP_TESTS = {"collectives_only": "collectives_only.cpp", "find_package_consumer": "consumer"}


def _make_commands(target: str) -> list[str]:
    out = subprocess.run(
        ["make", "-n", "-s", "-C", ROOT, target], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if line.strip()]


def _collected(*args: str) -> list[str]:
    """Node ids pytest collects from tests/python with these options."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", HERE, "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    ).stdout
    return [line for line in out.splitlines() if "::" in line]


@pytest.fixture(scope="module")
def every_test() -> list[str]:
    return _collected()


def test_every_python_module_has_a_fast_test(every_test):
    (command,) = [c for c in _make_commands("test-python-fast") if "pytest" in c]
    args = shlex.split(command)
    options = args[args.index("tests/python") + 1 :]
    assert "-m" in options and options[options.index("-m") + 1] == "not slow", command
    fast = _collected(*[o for o in options if o != "-q"])
    assert 0 < len(fast) < len(every_test)
    modules = {os.path.basename(p) for p in glob.glob(os.path.join(HERE, "test_*.py"))}
    with_fast = {n.split("::")[0].rsplit("/", 1)[-1] for n in fast}
    assert sorted(modules - with_fast - set(conftest.ALL_SLOW)) == []
    assert set(conftest.ALL_SLOW) <= modules  # a removed module leaves no entry
    assert with_fast.isdisjoint(conftest.ALL_SLOW)


def test_every_slow_pattern_names_a_test(every_test):
    names: dict[str, list[str]] = {}
    for node in every_test:
        path, _, name = node.partition("::")
        names.setdefault(path.rsplit("/", 1)[-1], []).append(name)
    stale = [
        (module, p)
        for module, patterns in conftest.SLOW.items()
        for p in patterns
        if not fnmatch.filter(names.get(module, []), p)
    ]
    assert stale == []


def test_the_tables_mark_what_they_name():
    assert conftest.is_slow_by_table("test_stress.py", "test_overlapping_groups[ws4-2000]")
    assert not conftest.is_slow_by_table("test_stress.py", "test_schedule_is_mixed")
    assert conftest.is_slow_by_table("test_fidelity.py", "anything")
    assert not conftest.is_slow_by_table("test_unknown.py", "test_x")


def _gtest_sources(tmp: str) -> dict[str, str]:
    """ctest name -> the test source file it is in, for every gtest binary the build made."""
    sources: dict[str, str] = {}
    for binary in glob.glob(os.path.join(CPP_BUILD, "tests", "cpp", "gfdit_*tests")):
        out = os.path.join(tmp, os.path.basename(binary) + ".json")
        subprocess.run(
            [binary, "--gtest_list_tests", f"--gtest_output=json:{out}"], check=True, capture_output=True
        )
        with open(out, encoding="utf-8") as f:
            listing = json.load(f)
        for suite in listing["testsuites"]:
            for test in suite["testsuite"]:
                source = os.path.basename(test["file"])
                sources[f"{suite['name']}.{test['name']}"] = source
                if "value_param" in test:  # ctest names a parameterized test by its value, not its index
                    base = test["name"].rsplit("/", 1)[0]
                    sources[f"{suite['name']}.{base}/{test['value_param']}"] = source
    return sources


def _ctest_names(args: list[str]) -> list[str]:
    out = subprocess.run(["ctest", *args, "-N"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return re.findall(r"^\s*Test\s+#\d+: (\S+)$", out, re.MULTILINE)


def test_every_cpp_test_source_has_a_fast_test(tmp_path):
    if not os.path.exists(os.path.join(CPP_BUILD, "CTestTestfile.cmake")):
        pytest.skip("the C++ tests are not built (make build)")
    (command,) = [c for c in _make_commands("test-cpp-fast") if "ctest" in c]
    args = shlex.split(command)
    args = args[args.index("ctest") + 1 :]
    exclude = args.index("-E")
    sources = {**_gtest_sources(str(tmp_path)), **PLAIN_CPP_TESTS}
    every = _ctest_names(args[:exclude] + args[exclude + 2 :])  # the same command without its exclusion
    fast = _ctest_names(args)
    assert set(every) <= set(sources), "a ctest test whose source is unknown"
    assert 0 < len(fast) < len(every)
    built = {sources[n] for n in every} - {"consumer"}  # the consumer's build: slow, and no module of its own
    with_fast = {sources[n] for n in fast}
    assert sorted(built - with_fast) == []
    on_disk = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "tests", "cpp", "*.cpp"))}
    assert built <= on_disk
    # every test source on disk is built (the CUDA ones when the build has CUDA)
    cuda = {"test_cuda.cpp", "test_cuda_transport.cpp"}
    assert sorted(on_disk - built - (cuda if not built & cuda else set())) == []
