#!/usr/bin/env bash
# Every check that needs a GPU, in one short run (about 5 minutes) on a machine with torch and numba-cuda
# but without this repository's packages installed and without network. From the repository root:
#     OUT=/some/dir bash tools/gpu_check.sh
# Python wheels missing there (pydantic for ds-config) are taken from .whl/ when present.
# Results in $OUT: env.txt, engine.txt/engine.json (tools/gpu_engine_check.py), cuda_tests.txt (the
# packages' tests marked cuda), then kernels/gpu_check.sh's sparse_env.txt, sparse_tests.txt, sparse_bench.md/json.
set -u
OUT=${OUT:-/tmp/ds-gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
for p in packages/*/src; do PYTHONPATH="$PWD/$p:$PYTHONPATH"; done
export PYTHONPATH="$PWD/testing:$PYTHONPATH"

echo "== engine on one GPU ==" >"$OUT/engine.txt"
timeout 200 $PY tools/gpu_engine_check.py --json "$OUT/engine.json" >>"$OUT/engine.txt" 2>&1
echo "exit $?" >>"$OUT/engine.txt"
grep -E "^\||^model|^reference|exit|Error" "$OUT/engine.txt" | cut -c1-400

echo "== tests marked cuda ==" >"$OUT/cuda_tests.txt"
timeout 90 $PY -m pytest packages/ds-checkpoint/tests -m cuda -q -p no:cacheprovider -rs >>"$OUT/cuda_tests.txt" 2>&1
echo "exit $?" >>"$OUT/cuda_tests.txt"
tail -n 4 "$OUT/cuda_tests.txt"

# ---- ds-sparse-attn (issue 30, items 1-3): kernels/gpu_check.sh, about 5 minutes; its files are sparse_* ----
OUT="$OUT" bash kernels/gpu_check.sh
# ---- end of ds-sparse-attn ----
