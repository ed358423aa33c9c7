#!/usr/bin/env bash
# Fills .whl/ (ignored by git) with what bench/gpu_check.sh installs on the GPU machine, which has no network:
# diffusers 0.42.1 and the closure of its requirements (pinned to versions that work with it here; the GPU
# machine installs only those it lacks, see gpu_check.sh), and Debian's googletest sources (.whl/debs/), from
# which gpu_check.sh builds GoogleTest with that machine's compiler for the C++ CUDA tests.
#
#   bash bench/gpu_wheels.sh            # then carry .whl/ with the working tree to the GPU machine
#
# Wheels are for CPython 3.12 on x86-64 Linux (the GPU machine's python3); numpy is left out (the machine
# has it). Needs pip and, for the .deb, apt-get (Debian/Ubuntu); a missing .deb only skips the C++ tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ -x .venv/bin/python ] && [ "$PYTHON" = python3 ]; then PYTHON=.venv/bin/python; fi
DEST=.whl
mkdir -p "$DEST/debs"

# Pure-Python wheels (py3-none-any): any platform.
PURE=(
  diffusers==0.42.1
  importlib_metadata==10.2.0 zipp==4.1.2 lazy-importer==0.1.0
  filelock==4.3.1
  huggingface-hub==2.4.0 click==8.5.1 fsspec==2026.9.0 httpx2==2.16.2 httpcore2==2.16.2 anyio==4.16.0
  h11==0.16.0 truststore==0.10.5 typing-extensions==4.16.0 packaging==26.4 tqdm==4.70.1
  requests==2.34.2 urllib3==2.8.0 idna==3.20 certifi==2026.10.19.post1
)
# Compiled wheels: CPython 3.12, manylinux x86-64.
BINARY=(pillow==13.0.0 regex==2026.11.19 safetensors==0.8.0 hf-xet==1.8.0 pyyaml==6.0.4 charset-normalizer==3.5.3)

PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

quiet() { grep -v "^WARNING: Location .* is ignored" >&2 || true; }  # a pip index option of some machines
"$PYTHON" -m pip download -q --no-deps -d "$DEST" "${PURE[@]}" 2> >(quiet)
for spec in "${BINARY[@]}"; do
  "$PYTHON" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$DEST" "$spec" 2> >(quiet)
done

if command -v apt-get >/dev/null; then
  (cd "$DEST/debs" && apt-get download googletest >/dev/null 2>&1) ||
    echo "warning: apt-get download googletest failed: gpu_check.sh will skip the C++ CUDA tests" >&2
else
  echo "warning: no apt-get: no googletest sources; gpu_check.sh will skip the C++ CUDA tests" >&2
fi

echo "$DEST/:"
ls -l "$DEST" "$DEST/debs" | awk 'NF >= 9 {printf "  %-70s %8.1f KiB\n", $9, $5 / 1024}'
du -sh "$DEST"
