#!/usr/bin/env bash
# Every check that needs a GPU, in one short run (about 5 minutes) on a machine with torch and numba-cuda
# but without this repository's packages installed and without network. From the repository root:
#     OUT=/some/dir bash tools/gpu_check.sh
# Python wheels missing there (pydantic for ds-config) are taken from .whl/ when present.
# Results in $OUT (7 files; the device tool returns at most 8): engine.txt/engine.json (tools/gpu/gpu_engine_check.py,
# then the packages' tests marked cuda), kernels/gpu_check.sh's sparse_tests.txt and sparse_bench.md/json,
# then zero.txt (tools/gpu/gpu_multirank_check.py: 2 ranks on one GPU over gloo) and zero_profile.txt
# (tools/gpu/profile_zero_gpu.py: where a ZeRO-3 step's time goes against ZeRO-2 and FSDP2).
# The whole run is held under 8 minutes: every step's timeout is its own ceiling or what is left of
# DS_GPU_CHECK_BUDGET_S (450 s), whichever is smaller, in order of what matters most.
set -u
BUDGET_S=${DS_GPU_CHECK_BUDGET_S:-450}
left() {  # seconds for the next step: min(its ceiling, what is left of the budget), at least 1
  local rest=$((BUDGET_S - SECONDS))
  local t=$(($1 < rest ? $1 : rest))
  echo $((t > 1 ? t : 1))
}
OUT=${OUT:-/tmp/ds-gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
PYTHONPATH=${PYTHONPATH:-}
for p in packages/*/src; do PYTHONPATH="$PWD/$p${PYTHONPATH:+:$PYTHONPATH}"; done
export PYTHONPATH="$PWD/testing:$PYTHONPATH"

echo "== engine on one GPU ==" >"$OUT/engine.txt"
timeout "$(left 150)" $PY tools/gpu/gpu_engine_check.py --json "$OUT/engine.json" >>"$OUT/engine.txt" 2>&1
echo "exit $?" >>"$OUT/engine.txt"
grep -E "^\||^model|^reference|exit|Error" "$OUT/engine.txt" | cut -c1-400

echo "== tests marked cuda ==" >>"$OUT/engine.txt"
timeout "$(left 45)" $PY -m pytest packages/ds-checkpoint/tests -m cuda -q -p no:cacheprovider -rs >>"$OUT/engine.txt" 2>&1
echo "exit $?" >>"$OUT/engine.txt"
tail -n 4 "$OUT/engine.txt"

# ---- ds-sparse-attn (issue 30, items 1-3): kernels/gpu_check.sh, about 5 minutes; its files are sparse_* ----
OUT="$OUT" DS_GPU_CHECK_BUDGET_S=$((BUDGET_S - SECONDS - 120)) bash kernels/gpu_check.sh
# ---- end of ds-sparse-attn ----

# ---- ZeRO with CUDA tensors at 2 ranks (gloo on one GPU), then the ZeRO-3 profile: zero.txt ----
echo "== 2 ranks on one GPU over gloo ==" >"$OUT/zero.txt"
timeout "$(left 80)" $PY tools/gpu/gpu_multirank_check.py >>"$OUT/zero.txt" 2>&1
echo "exit $?" >>"$OUT/zero.txt"
echo "== where a ZeRO-3 step's time goes ==" >>"$OUT/zero.txt"
timeout "$(left 60)" $PY tools/gpu/profile_zero_gpu.py --out "$OUT/zero_profile.txt" >>"$OUT/zero.txt" 2>&1
echo "exit $?" >>"$OUT/zero.txt"
grep -E "exit|FAIL|differ|Error" "$OUT/zero.txt" | head -20
echo "gpu_check: ${SECONDS} s"
