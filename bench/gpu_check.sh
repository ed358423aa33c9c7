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
# bench_gpu.json / bench_gpu.txt (measurements), pytest_cuda.xml and cpp_*.xml (test reports).
#
# Steps and their time (the whole run stays under GFDIT_GPU_CHECK_BUDGET_S, default 465 s, < 8 min; a step
# that ends early leaves its time to the later ones, each up to its cap):
#   env      5 s    the GPU, torch, nvcc, cmake
#   wheels  10 s    .whl/*.whl that python3 lacks (diffusers and what it needs) into a --target folder
#   gtest   20 s    GoogleTest from Debian's googletest sources carried in .whl/debs (built with this compiler)
#   build  ~120 s   cmake + ninja: the _C module (CUDA on; if that fails, again with CUDA off), copied into
#                   python/gfdit, PYTHONPATH=python:<wheels>
#   cpp     30 s    the C++ CUDA test binaries (gfdit_cuda*tests), when GoogleTest was built
#   pytest ~150 s   tests/python/test_cuda_*.py, worlds of 2 and 4 ranks sharing the GPU
#   bench  ~120 s   bench/bench_gpu.py: copy baseline, group formation, collectives 4 KiB .. 256 MiB, attention
#                   in every mode, one tiny-wan step at world 2 against world 1
#   table    1 s
# Knobs: PYTHON (python3), GFDIT_GPU_CHECK_BUDGET_S, GFDIT_GPU_CHECK_SKIP (comma list of steps), OUT.
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

# Minimum useful time of the steps after each one: a step's limit leaves at least that much.
reserve_after() {
  case $1 in
    env) echo 270 ;; wheels) echo 265 ;; gtest) echo 255 ;; build | build-nocuda) echo 135 ;; cpp) echo 125 ;;
    pytest) echo 85 ;; copy-table) echo 55 ;; bench) echo 5 ;; *) echo 0 ;;
  esac
}

# step NAME CAP COMMAND: runs COMMAND (a bash string) with a limit, its output in logs/NAME.log.
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
  timeout --kill-after=10 "$limit" bash -c "$cmd" >"$LOGS/$name.log" 2>&1
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
step env 15 "
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true
  $PYTHON -c 'import sys, torch; print(sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"gpus\", torch.cuda.device_count())'
  nvcc --version | tail -n 1 || true
  cmake --version | head -n 1 || true
  ninja --version || true
"
note env "$(grep -m1 -v '^$' "$LOGS/env.log" | cut -c1-60); $(last_match env 'torch')"

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
  cmake -S . -B "$1" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGFDIT_ENABLE_CUDA="$2" -DGFDIT_BUILD_PYTHON=ON \
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

# ---- pytest: the Python CUDA tests ----------------------------------------------------------------------------
if ((GFDIT_OK)); then
  step pytest 200 "
    GFDIT_CUDA_WORLDS=2,4 $PYTHON -m pytest tests/python/test_cuda_args.py tests/python/test_cuda_collectives.py \
      tests/python/test_cuda_attention.py tests/python/test_cuda_models.py -q -rs -p no:cacheprovider --maxfail=5 \
      --junitxml='$OUTDIR/pytest_cuda.xml'
  "
  note pytest "$(last_match pytest '(passed|failed|skipped|error)')"
else
  STEPS+=(pytest); STATUS[pytest]="skipped"; SECS[pytest]=0; NOTE[pytest]="gfdit not importable"; LIMIT[pytest]=0
fi

# ---- copy-table: the copy paths timed on this GPU; the bench then runs with the measured table ------------------
if ((GFDIT_OK && CUDA_BUILD)); then
  if step copy-table 40 "$PYTHON -m gfdit.cli profile --collectives --out '$OUTDIR/copy_table.json'"; then
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
