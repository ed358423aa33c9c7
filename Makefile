# Set-up, tests and benchmarks on a fresh machine. `make test` is what CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
JOBS ?= $(shell nproc)
CPP_BUILD := build/cpp
TORCH_VERSION := 2.13.0
# diffusers builds Wan and Qwen-Image transformers from configs (random weights, no download).
MODEL_DEPS := diffusers==0.42.1 transformers==5.24.0
# Third-party parallel DiT code that the torch.distributed backend's tests run unchanged (yunchang's USP attention;
# its flash-attn extra is not needed on CPU).
BACKEND_TEST_DEPS := yunchang==0.6.4
# cache-dit: the step caches' tests compare gfdit's FBCache with cache-dit's own on the same diffusers pipelines
CACHE_TEST_DEPS := cache-dit==1.5.3
# plots of the simulator and the experiments; the linters and the type checker CI runs, and the stub generator
# of gfdit._C (pinned: formatting and types must not drift); pytest-timeout bounds every test; Schemathesis fuzzes
# the server against its published OpenAPI schema (tests/python/test_openapi.py).
TOOL_DEPS := matplotlib==3.10.9 ruff==0.16.9 clang-format==23.1.3 mypy==1.20.2 pybind11-stubgen==2.5.5 pytest-timeout==2.4.0 \
  schemathesis==4.32.5
# gfdit serve: the HTTP front end, PNG and H.264 MP4 encoding, metrics; httpx (FastAPI's TestClient and gfdit bench's client), tqdm (gfdit bench's progress bar) and the openai client for its tests.
SERVE_DEPS := fastapi==0.163.2 uvicorn==0.54.0 pillow==13.0.0 prometheus-client==0.26.0 av==18.1.0 httpx==0.28.1 tqdm==4.70.1 openai==3.51.0
# gfdit serve --ray and its test (tests/python/test_ray_nodes.py): Ray, optional at run time (pip install 'gfdit[ray]').
RAY_DEPS := ray==2.40.0
CXX_SOURCES = $(shell git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')

.PHONY: serve build venv system-deps python-package cpp nvshmem test test-cpp test-python test-fast test-cpp-fast test-python-fast bench experiments lint format stubs clean

build: python-package cpp

# Debian's GoogleTest and Google Benchmark, and Chromium (the live page's tests and screenshot), when we may install
# them and they are missing.
system-deps:
	@if [ ! -f /usr/include/gtest/gtest.h ] || [ ! -f /usr/include/benchmark/benchmark.h ]; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev libbenchmark-dev; \
	  else echo "warning: libgtest-dev/libbenchmark-dev missing and not root: C++ tests are skipped"; fi; \
	fi
	@if ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "warning: chromium missing and not root: the live page's browser tests are skipped"; fi; \
	fi

# torch first, pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
$(VENV)/.stamp-deps: Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q "scikit-build-core>=0.10" "pybind11>=2.12" ninja "cmake>=3.20" numpy pytest
	$(PIP) install -q torch==$(TORCH_VERSION) $(MODEL_DEPS) $(TOOL_DEPS) $(SERVE_DEPS) $(BACKEND_TEST_DEPS) $(CACHE_TEST_DEPS)
	$(PIP) install -q $(RAY_DEPS)
	touch $@

venv: $(VENV)/.stamp-deps

python-package: venv
	$(PIP) install -q --no-build-isolation --no-deps -e .

cpp: system-deps venv
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH cmake -S . -B $(CPP_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -Dpybind11_DIR=$$($(PY) -m pybind11 --cmakedir) >/dev/null
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH cmake --build $(CPP_BUILD) -j $(JOBS)

# NVSHMEM for edges that cross nodes (optional, about 180 MB, so not part of the default set-up): puts the wheel in
# the venv, where cmake/nvshmem.cmake finds it (a find that failed is retried at every configure), and rebuilds.
NVSHMEM_DEPS := nvidia-nvshmem-cu13==3.8.0
nvshmem: venv
	$(PIP) install -q $(NVSHMEM_DEPS)
	$(MAKE) build

test: build test-cpp test-python

# The fast tier (README, "Set-up and tests"; the tiers: tests/python/conftest.py): at most 3 minutes on a 2-core
# machine, every module still tested. C++: every test but the slow ones below (timeouts, worlds of 3 and 4 ranks,
# simulated overloads, the oversubscribed stress, the find_package consumer's build); Python: every test not
# marked slow. tests/python/test_tiers.py checks that each test module and C++ test source keeps a fast test.
CTEST_SLOW := ^(Stress\.OverlappingGroupsSixRanksOversubscribed|ReadyOrder\.(SimulatedOverload|RandomEvents)DecidesAsTheFullList|Failures\.(SilentPeerTimesOutNamingEdgeAndPeer|DeadPeerIsNamedWithinASecond|HeartbeatsTellADeadPeerWherePidsCannot)|ControlPlane\.MemoryStaysFlatOverManyRequests|WorldSizes/Collectives\..*/[34]|find_package_consumer)$$

test-fast: build test-cpp-fast test-python-fast

test-cpp-fast:
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH ctest --test-dir $(CPP_BUILD) --output-on-failure --timeout 600 -E '$(CTEST_SLOW)'

test-python-fast:
	$(PY) -m pytest tests/python -q -m "not slow"

# an OpenAI-compatible server on a tiny model with 4 CPU ranks at http://127.0.0.1:8000 (README, "Serving over HTTP").
# Its policy reads a profile of this machine, measured once (about 20 s) and kept in build/.
# the policies plan with the cached profile of this machine, measured on the first run (gfdit serve --reprofile)
serve: build
	$(PY) -m gfdit serve --model tiny-qwen-image --world-size 4 --policy fcfs --host 127.0.0.1 --port 8000

test-cpp:
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH ctest --test-dir $(CPP_BUILD) --output-on-failure --timeout 600

test-python:
	$(PY) -m pytest tests/python -q --durations=25

# The checked-in type stubs of the extension (python/gfdit/_C/*.pyi), as pybind11-stubgen writes them from the
# built module and ruff formats them; `make lint` fails when they no longer match the bindings.
STUBGEN = $(VENV)/bin/pybind11-stubgen gfdit._C --enum-class-locations LayoutMode:gfdit._C.runtime \
  --enum-class-locations Placement:gfdit._C.runtime --enum-class-locations LayoutFamily:gfdit._C.runtime \
  --enum-class-locations Stage:gfdit._C.cost --enum-class-locations CacheKind:gfdit._C.runtime

stubs: python-package
	rm -rf build/stubs && $(STUBGEN) -o build/stubs && $(VENV)/bin/ruff format -q build/stubs
	rm -rf python/gfdit/_C && cp -r build/stubs/gfdit/_C python/gfdit/_C

lint: python-package
	$(VENV)/bin/ruff check python tests bench examples
	$(VENV)/bin/ruff format --check python tests bench examples
	rm -rf build/stubs-check && $(STUBGEN) -o build/stubs-check >/dev/null && $(VENV)/bin/ruff format -q build/stubs-check
	diff -r build/stubs-check/gfdit/_C python/gfdit/_C || { echo "the stubs of gfdit._C are stale: make stubs"; exit 1; }
	$(VENV)/bin/mypy
	$(VENV)/bin/clang-format --dry-run -Werror $(CXX_SOURCES)

format: venv
	$(VENV)/bin/ruff format python tests bench examples
	$(VENV)/bin/ruff check --fix python tests bench examples
	$(VENV)/bin/clang-format -i $(CXX_SOURCES)

bench: build
	$(PY) bench/run_all.py

# Scheduling experiments in simulation, then real CPU runs (about 15 min; bench/experiments.py --skip-real leaves
# them out): bench/results/experiments.md, .json and experiments/*.png.
experiments: build
	$(PY) bench/experiments.py

clean:
	rm -rf build $(VENV)
