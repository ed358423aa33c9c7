#!/usr/bin/env bash
# One prepared run on a GPU machine: build gfdit, run the CUDA tests, measure, print a table last.
#
#   bash bench/gpu_check.sh                 # from the repository root, with .whl/ carried (bench/gpu_wheels.sh)
#
# Made for a machine without network: x86-64, python3 (3.12) with torch (CUDA), pybind11, scikit-build-core,
# cmake, ninja, nvcc, pytest, numpy, transformers; no diffusers, no GoogleTest. It fails soft: every step has
# a time limit and a status, a failed step does not stop the later ones (those that need its result say why
# they are skipped), and the table comes last. Everything it writes goes to $OUT when set (else
# bench/results/gpu_check/): logs/<step>.log, gpu_check.txt (the tables), gpu_check.json (steps),
# bench_gpu.json / bench_gpu.txt (measurements), pytest_cuda_<file>.xml and cpp_*.xml (test reports),
# logs/mps/ (the MPS daemon's and server's logs).
#
# Every rank is a process of its own and all of them share the one GPU. Without MPS the GPU time-slices
# between processes, so a kernel spinning on a signal that another process's kernel will store holds the
# GPU for a whole time slice; with MPS the processes' kernels run side by side. So when
# nvidia-cuda-mps-control exists, the run starts a private MPS daemon (pipe and log directories in a
# temporary directory, exported to every later step), checks that CUDA and CUDA IPC work through it (else
# goes on without it), and quits it when the script exits, however it exits. bench_gpu.py labels its tables
# with "N processes on 1 GPU" and whether MPS was on (GFDIT_BENCH_MPS).
#
# Steps and their time (the whole run stays under GFDIT_GPU_CHECK_BUDGET_S, default 465 s, < 8 min: each
# step's limit leaves the later steps their minimum (reserve_after), a step that ends early leaves its time
# to the later ones, each up to its cap; after the deadline only a step's 10 s kill grace, the table and the
# 5 s MPS quit remain):
#   env            5 s  the GPU (compute mode, the driver's CUDA version), torch, nvcc, cmake
#   mps          ~10 s  the private MPS daemon and its probe (a CUDA tensor shared with a spawned process)
#   wheels        10 s  .whl/*.whl that python3 lacks (diffusers and what it needs) into a --target folder
#   gtest         20 s  GoogleTest from Debian's googletest sources carried in .whl/debs (built with this compiler)
#   build       ~120 s  cmake + ninja: the _C module (CUDA on, NVSHMEM off; if that fails, again with CUDA off),
#                       copied into python/gfdit, PYTHONPATH=python:<wheels>
#   cpp           30 s  the C++ CUDA test binaries (gfdit_cuda*tests), when GoogleTest was built
#   pytest-*    ~300 s  tests/python/test_cuda_<file>.py, one pytest run per file, each with its own limit and
#                       report (coll 120 s, attn 40 s, models 90 s, args 60 s at most: what the first GPU run
#                       needed, the build taking 35 s rather than 120), worlds of 2 and 4 ranks
#                       sharing the GPU; GFDIT_TEST_RUN_S=45 and GFDIT_TEST_TIMEOUT_S=8 (defaults 150 and 20)
#                       fit the tests' world deadlines and gfdit timeouts to those limits
#   copy-table   ~20 s  gfdit profile --collectives: the copy paths timed on this GPU (40 s at most)
#   bench       ~100 s  bench/bench_gpu.py: copy baseline, group formation, collectives 4 KiB .. 256 MiB,
#                       attention in every mode, one tiny-wan step at world 2 against world 1
#   table          1 s
# Knobs: PYTHON (python3), GFDIT_GPU_CHECK_BUDGET_S, GFDIT_GPU_CHECK_SKIP (comma list of steps),
# GFDIT_GPU_CHECK_MPS=0 (no MPS daemon), GFDIT_TEST_RUN_S, GFDIT_TEST_TIMEOUT_S, OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
PYTHON=${PYTHON:-python3}
BUDGET=${GFDIT_GPU_CHECK_BUDGET_S:-465}
START=$(date +%s)
DEADLINE=$((START + BUDGET))
OUTDIR=${OUT:-$ROOT/bench/results/gpu_check}
LOGS=$OUTDIR/logs
mkdir -p "$LOGS"
SITE=${GFDIT_GPU_SITE:-${TMPDIR:-/tmp}/gfdit-gpu-site}
GTEST_SRC=${TMPDIR:-/tmp}/gfdit-gtest-src
GTEST_PREFIX=${TMPDIR:-/tmp}/gfdit-gtest
BUILD=$ROOT/build/gpu
JOBS=$(nproc 2>/dev/null || echo 8)
SKIP=",${GFDIT_GPU_CHECK_SKIP:-},"
export PYTHONUNBUFFERED=1
export TMPDIR=${TMPDIR:-/tmp}
mkdir -p "$TMPDIR"  # nvcc needs it to exist

STEPS=()
declare -A STATUS SECS NOTE LIMIT

# Minimum useful time of the steps after each one: a step's limit leaves at least that much. The minimums:
# mps 5, wheels 5, gtest 10, build 120, cpp 10, pytest-coll 15, pytest-attn 10, pytest-models 10,
# pytest-args 5, copy-table 30, bench 50 (what these sums add up).
reserve_after() {
  case $1 in
    env) echo 275 ;; mps) echo 270 ;; wheels) echo 265 ;; gtest) echo 255 ;; build | build-nocuda) echo 135 ;;
    cpp) echo 125 ;; pytest-coll) echo 110 ;; pytest-attn) echo 100 ;; pytest-models) echo 90 ;;
    pytest-args) echo 85 ;; copy-table) echo 55 ;; bench) echo 5 ;; *) echo 0 ;;
  esac
}

# step NAME CAP COMMAND: runs COMMAND (a bash string) with a limit, its output in logs/NAME.log; COMMAND
# sees its limit as $STEP_LIMIT.
step() {
  local name=$1 cap=$2 cmd=$3
  STEPS+=("$name")
  if [[ $SKIP == *",$name,"* ]]; then
    STATUS[$name]="skipped"; SECS[$name]=0; NOTE[$name]="GFDIT_GPU_CHECK_SKIP"; LIMIT[$name]=0
    return 0
  fi
  local now left limit
  now=$(date +%s)
  left=$((DEADLINE - now - $(reserve_after "$name")))
  limit=$((cap < left ? cap : left))
  LIMIT[$name]=$limit
  if ((limit < 5)); then
    STATUS[$name]="skipped"; SECS[$name]=0; NOTE[$name]="out of time"
    echo "== $name: skipped (out of time)"
    return 0
  fi
  echo "== $name (limit ${limit} s)"
  local t0=$SECONDS rc
  STEP_LIMIT=$limit timeout --kill-after=10 "$limit" bash -c "$cmd" >"$LOGS/$name.log" 2>&1
  rc=$?
  SECS[$name]=$((SECONDS - t0))
  if ((rc == 0)); then
    STATUS[$name]="ok"
  elif ((rc == 124 || rc == 137)); then
    STATUS[$name]="TIMEOUT"
  else
    STATUS[$name]="FAIL($rc)"
  fi
  if ((rc != 0)); then
    echo "-- $name: ${STATUS[$name]} after ${SECS[$name]} s; last lines of $LOGS/$name.log:"
    tail -n 30 "$LOGS/$name.log" | sed 's/^/   | /'
  fi
  return $rc
}

note() { NOTE[$1]=$2; }
last_match() { grep -E "$2" "$LOGS/$1.log" 2>/dev/null | tail -n 1 | cut -c1-90; }

# Tools that pip installs under python3's prefix may be off PATH.
for mod in ninja cmake; do
  if ! command -v "$mod" >/dev/null; then
    dir=$("$PYTHON" -c "import $mod, os; print(getattr($mod, 'BIN_DIR', None) or getattr($mod, 'CMAKE_BIN_DIR'))" 2>/dev/null)
    [ -n "$dir" ] && export PATH="$dir:$PATH"
  fi
done

# ---- env ------------------------------------------------------------------------------------------------
# compute_mode: Exclusive_Process lets one process at a time use the GPU without MPS (every world of this
# run would fail); the driver's CUDA version must be at least the build's for kernels to load.
step env 15 "
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_mode --format=csv,noheader || true
  echo \"driver \$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -n 1)\"
  $PYTHON -c 'import sys, torch; print(sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"gpus\", torch.cuda.device_count())'
  nvcc --version | tail -n 1 || true
  cmake --version | head -n 1 || true
  ninja --version || true
"
note env "$(grep -m1 -v '^$' "$LOGS/env.log" | cut -c1-70); $(last_match env '^driver CUDA'); $(last_match env 'torch')"

# ---- mps: a private MPS daemon for the rest of the run ---------------------------------------------------------
MPS_DIR=""
export GFDIT_BENCH_MPS=off
mps_stop() {  # idempotent; the EXIT trap runs it however the script ends
  [ -n "$MPS_DIR" ] || return 0
  # Bounded: a client that is still attached would keep `quit` waiting (it stops accepting new ones meanwhile).
  echo quit | timeout 5 nvidia-cuda-mps-control >/dev/null 2>&1
  mkdir -p "$LOGS/mps" && cp -r "$MPS_DIR/log/." "$LOGS/mps/" 2>/dev/null
  rm -rf "$MPS_DIR"
  MPS_DIR=""
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  GFDIT_BENCH_MPS=off
}
trap mps_stop EXIT
if [[ $SKIP == *",mps,"* || ${GFDIT_GPU_CHECK_MPS:-1} == 0 ]]; then
  STEPS+=(mps); STATUS[mps]="skipped"; SECS[mps]=0; LIMIT[mps]=0; NOTE[mps]="off (GFDIT_GPU_CHECK_MPS=0 or SKIP)"
elif ! command -v nvidia-cuda-mps-control >/dev/null; then
  STEPS+=(mps); STATUS[mps]="skipped"; SECS[mps]=0; LIMIT[mps]=0; NOTE[mps]="off: no nvidia-cuda-mps-control"
else
  MPS_DIR=$(mktemp -d "$TMPDIR/gfdit-mps.XXXXXX")
  mkdir -p "$MPS_DIR/pipe" "$MPS_DIR/log"
  export CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_DIR/log
  # The probe: CUDA through the MPS server, and a CUDA tensor shared with a spawned process (CUDA IPC, as the
  # transport's regions are); a daemon whose server cannot start would fail every later CUDA step. It lists
  # the MPS servers while it is still a client (an idle server may go away after it).
  cat >"$MPS_DIR/probe.py" <<'PY'
import subprocess
import sys

import torch
import torch.multiprocessing as mp


def child(q, r):
    t = q.get()
    r.put(bool(torch.equal(t, torch.arange(t.numel(), device=t.device, dtype=t.dtype))))


if __name__ == "__main__":
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, r))
    p.start()
    q.put(x)
    ok = r.get(timeout=60)
    p.join(30)
    assert ok, "the spawned process read other bytes through CUDA IPC"
    servers = subprocess.run(
        ["nvidia-cuda-mps-control"], input="get_server_list\n", capture_output=True, text=True, timeout=10
    ).stdout.strip()
    assert servers, "no MPS server runs: this process's CUDA did not go through MPS"
    with open(sys.argv[1], "w") as f:
        f.write(servers + "\n")
    print("probe ok: CUDA and CUDA IPC through the MPS server", servers)
PY
  step mps 40 "
    nvidia-cuda-mps-control -d || exit 1
    $PYTHON '$MPS_DIR/probe.py' '$MPS_DIR/servers'
  "
  if [ "${STATUS[mps]}" = ok ]; then
    GFDIT_BENCH_MPS=on
    note mps "on: server $(head -n 1 "$MPS_DIR/servers" 2>/dev/null), pipes in $MPS_DIR"
  else
    mps_stop
    note mps "off: ${STATUS[mps]} (the daemon or its probe; logs/mps.log, logs/mps/)"
  fi
fi

# ---- wheels: what python3 lacks of diffusers' closure -------------------------------------------------------
step wheels 60 "
  rm -rf '$SITE' && mkdir -p '$SITE'
  ls .whl/*.whl >/dev/null 2>&1 || { echo 'no .whl/*.whl (run bench/gpu_wheels.sh where there is network)'; exit 1; }
  $PYTHON - > '$LOGS/wheels.list' <<'PY'
import glob, importlib.metadata as md, os, re
# diffusers 0.42.1's lower bounds that an older installed copy may miss (then the carried one shadows it)
MIN = {'huggingface-hub': '1.32.0', 'safetensors': '0.8.0'}
def norm(n): return re.sub(r'[-_.]+', '-', n).lower()
def older(a, b):
    try:
        from packaging.version import Version
        return Version(a) < Version(b)
    except Exception:
        return tuple(int(x) for x in re.findall(r'\d+', a)[:3]) < tuple(int(x) for x in re.findall(r'\d+', b)[:3])
for w in sorted(glob.glob('.whl/*.whl')):
    name, ver = os.path.basename(w).split('-')[:2]
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    need = have is None or (norm(name) in MIN and older(have, MIN[norm(name)])) or (norm(name) == 'diffusers' and have != ver)
    print(('install' if need else 'have'), w, have or '-')
PY
  cat '$LOGS/wheels.list'
  todo=\$(awk '\$1 == \"install\" {print \$2}' '$LOGS/wheels.list')
  if [ -n \"\$todo\" ]; then $PYTHON -m pip install -q --no-index --no-deps --no-compile --target '$SITE' \$todo; fi
  PYTHONPATH='$SITE' $PYTHON -c 'import diffusers, transformers; print(\"diffusers\", diffusers.__version__, \"transformers\", transformers.__version__)'
"
note wheels "$(awk '$1 == "install"' "$LOGS/wheels.list" 2>/dev/null | wc -l) installed; $(last_match wheels '^diffusers|Error')"
export PYTHONPATH="$ROOT/python:$SITE${PYTHONPATH:+:$PYTHONPATH}"

# ---- gtest: GoogleTest from the carried Debian sources ------------------------------------------------------
HAVE_GTEST=0
if [ -f /usr/include/gtest/gtest.h ]; then
  HAVE_GTEST=1
  STEPS+=(gtest); STATUS[gtest]="ok"; SECS[gtest]=0; NOTE[gtest]="system GoogleTest"; LIMIT[gtest]=0
else
  step gtest 60 "
    deb=\$(ls .whl/debs/googletest_*.deb 2>/dev/null | head -n 1)
    [ -n \"\$deb\" ] || { echo 'no .whl/debs/googletest_*.deb carried'; exit 1; }
    rm -rf '$GTEST_SRC' && mkdir -p '$GTEST_SRC'
    $PYTHON - \"\$deb\" '$GTEST_SRC' <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, 'rb').read()
assert data[:8] == b'!<arch>\n', 'not a .deb'
pos = 8
while pos < len(data):
    name = data[pos:pos + 16].decode().strip().rstrip('/')
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith('data.tar'):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(dest)
    pos += 60 + size + (size % 2)
PY
    src='$GTEST_SRC/usr/src/googletest'
    cmake -S \"\$src\" -B '$GTEST_SRC/build' -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON \
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX='$GTEST_PREFIX'
    cmake --build '$GTEST_SRC/build' -j $JOBS && cmake --install '$GTEST_SRC/build'
  " && HAVE_GTEST=1
  note gtest "$( ((HAVE_GTEST)) && echo "GoogleTest built into $GTEST_PREFIX" || echo "none: C++ CUDA tests skipped")"
fi

# ---- build ------------------------------------------------------------------------------------------------
CUDA_BUILD=0
configure_and_build() {  # $1: build dir, $2: ON/OFF for CUDA
  local tests=OFF
  ((HAVE_GTEST)) && [ "$2" = ON ] && tests=ON
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # NVSHMEM off: nothing here uses it, and a wheel's copy in site-packages (torch's CUDA wheels bring one,
  # maybe for another CUDA major) must not break the build.
  cmake -S . -B "$1" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGFDIT_ENABLE_CUDA="$2" -DGFDIT_ENABLE_NVSHMEM=OFF \
    -DGFDIT_BUILD_PYTHON=ON \
    -DGFDIT_BUILD_TESTS=$tests -DGFDIT_BUILD_BENCH=OFF -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -Dpybind11_DIR="$("$PYTHON" -m pybind11 --cmakedir)" -DCMAKE_PREFIX_PATH="$GTEST_PREFIX" -DGTEST_ROOT="$GTEST_PREFIX" &&
    cmake --build "$1" -j "$JOBS" --target _C &&
    rm -f python/gfdit/_C*.so && cp "$(find "$1" -maxdepth 2 -name '_C*.so' | head -n 1)" python/gfdit/
}
export -f configure_and_build
export HAVE_GTEST PYTHON JOBS GTEST_PREFIX
step build 240 "configure_and_build '$BUILD' ON"
if [ "${STATUS[build]}" = ok ]; then
  CUDA_BUILD=1
  note build "CUDA on"
elif [ "${STATUS[build]}" != skipped ]; then
  if step build-nocuda 150 "configure_and_build '$BUILD-nocuda' OFF"; then
    note build "CUDA build failed (see logs/build.log); built with CUDA off"
  else
    note build "failed (logs/build.log, logs/build-nocuda.log)"
  fi
fi
GFDIT_OK=0
if "$PYTHON" -c "import gfdit" >/dev/null 2>&1; then
  GFDIT_OK=1
  note build "${NOTE[build]:-}; $("$PYTHON" -c 'import gfdit; i = gfdit.build_info(); print("cuda", i["cuda"], "devices", i["cuda_devices"], "transport", gfdit.cuda_transport_available())' 2>&1 | tail -n 1)"
fi

# ---- cpp: the C++ CUDA tests ---------------------------------------------------------------------------------
if ((CUDA_BUILD && HAVE_GTEST)); then
  step cpp 90 "
    targets=\$(cmake --build '$BUILD' --target help | sed -n 's/^\\.* *\\(gfdit_cuda[A-Za-z0-9_]*tests*\\)\\(: .*\\)*\$/\\1/p' | sort -u)
    [ -n \"\$targets\" ] || { echo 'no gfdit_cuda*test* targets'; exit 1; }
    cmake --build '$BUILD' -j $JOBS --target \$targets || exit 1
    rc=0
    for t in \$targets; do
      exe=\$(find '$BUILD' -type f -name \"\$t\" -perm -u+x | head -n 1)
      echo \"## \$exe\"
      \"\$exe\" --gtest_output=xml:'$OUTDIR'/cpp_\$t.xml || rc=1
    done
    exit \$rc
  "
  note cpp "$(grep -hE '^\[  (PASSED|FAILED)  \]|tests? ran' "$LOGS/cpp.log" 2>/dev/null | tr '\n' ' ' | cut -c1-90)"
else
  STEPS+=(cpp); STATUS[cpp]="skipped"; SECS[cpp]=0; LIMIT[cpp]=0
  NOTE[cpp]=$( ((CUDA_BUILD)) && echo "no GoogleTest" || echo "no CUDA build")
fi

# ---- pytest: the Python CUDA tests, one pytest run per file ------------------------------------------------------
# A file that hangs costs its own limit, not the others'. pytest gets SIGINT 8 s before the step's limit (its
# own process group: the ranks it spawned get it too, and KILL 5 s later): an interrupted pytest still writes
# the junit report of the tests that finished, which the step's TERM would lose. The tests' world deadline
# (RUN) and gfdit timeout shrink to fit those limits.
export GFDIT_TEST_RUN_S=${GFDIT_TEST_RUN_S:-45} GFDIT_TEST_TIMEOUT_S=${GFDIT_TEST_TIMEOUT_S:-8}
for entry in coll:collectives:120 attn:attention:40 models:models:90 args:args:60; do
  IFS=: read -r short file cap <<<"$entry"
  name=pytest-$short
  if ((GFDIT_OK)); then
    step "$name" "$cap" "
      GFDIT_CUDA_WORLDS=2,4 timeout -s INT -k 5 \$((STEP_LIMIT > 18 ? STEP_LIMIT - 8 : STEP_LIMIT - 3)) \
        $PYTHON -m pytest tests/python/test_cuda_$file.py -q -rs -p no:cacheprovider --maxfail=5 \
        --junitxml='$OUTDIR/pytest_cuda_$file.xml'
    "
    note "$name" "$(last_match "$name" '(passed|failed|skipped|error|no tests ran)')"
  else
    STEPS+=("$name"); STATUS[$name]="skipped"; SECS[$name]=0; NOTE[$name]="gfdit not importable"; LIMIT[$name]=0
  fi
done

# ---- copy-table: the copy paths timed on this GPU; the bench then runs with the measured table ------------------
if ((GFDIT_OK && CUDA_BUILD)); then
  if step copy-table 40 "$PYTHON -m gfdit.tools.cli profile --collectives --out '$OUTDIR/copy_table.json'"; then
    table=$(sed -n 's/^export GFDIT_CUDA_COPY_TABLE=//p' "$LOGS/copy-table.log" | tail -n 1)
    if [ -n "$table" ]; then
      export GFDIT_CUDA_COPY_TABLE=$table
      note copy-table "measured: $table"
    fi
  fi
else
  STEPS+=(copy-table); STATUS[copy-table]="skipped"; SECS[copy-table]=0; LIMIT[copy-table]=0
  NOTE[copy-table]="no CUDA build"
fi

# ---- bench ----------------------------------------------------------------------------------------------------
if ((GFDIT_OK)); then
  now=$(date +%s)
  left=$((DEADLINE - now - $(reserve_after bench)))
  cap=$((left < 170 ? left : 170))
  step bench 170 "$PYTHON bench/bench_gpu.py --budget-s $((cap > 40 ? cap - 15 : 25)) --json '$OUTDIR/bench_gpu.json' --table '$OUTDIR/bench_gpu.txt'"
  note bench "$(last_match bench 'targets met|no GPU|not importable')"
else
  STEPS+=(bench); STATUS[bench]="skipped"; SECS[bench]=0; NOTE[bench]="gfdit not importable"; LIMIT[bench]=0
fi

# ---- table (last) ---------------------------------------------------------------------------------------------
TOTAL=$(($(date +%s) - START))
{
  if [ -s "$OUTDIR/bench_gpu.txt" ]; then cat "$OUTDIR/bench_gpu.txt"; echo; fi
  echo "gpu_check: $TOTAL s of $BUDGET s; logs in $LOGS"
  printf '%-13s %-10s %6s %6s  %s\n' step status secs limit note
  printf '%-13s %-10s %6s %6s  %s\n' ------------- ---------- ------ ------ ----------------------------------------
  for s in "${STEPS[@]}"; do
    printf '%-13s %-10s %6s %6s  %s\n' "$s" "${STATUS[$s]}" "${SECS[$s]}" "${LIMIT[$s]}" "${NOTE[$s]:-}"
  done
} >"$OUTDIR/gpu_check.txt"
{
  for s in "${STEPS[@]}"; do printf '%s\t%s\t%s\t%s\t%s\n' "$s" "${STATUS[$s]}" "${SECS[$s]}" "${LIMIT[$s]}" "${NOTE[$s]:-}"; done
} | "$PYTHON" -c '
import json, sys
steps = [dict(zip(("step", "status", "secs", "limit", "note"), l.rstrip("\n").split("\t"))) for l in sys.stdin if l.strip()]
json.dump({"total_s": int(sys.argv[1]), "budget_s": int(sys.argv[2]), "steps": steps}, open(sys.argv[3], "w"), indent=1)
' "$TOTAL" "$BUDGET" "$OUTDIR/gpu_check.json" 2>/dev/null
echo
cat "$OUTDIR/gpu_check.txt"
for s in "${STEPS[@]}"; do
  case ${STATUS[$s]} in ok | skipped) ;; *) exit 1 ;; esac
done
exit 0
