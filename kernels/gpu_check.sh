#!/usr/bin/env bash
# ds-sparse-attn on a real GPU, in one short run (at most DS_GPU_CHECK_BUDGET_S, 330 s alone): the Numba kernel tests on the
# device (NUMBA_ENABLE_CUDASIM=0), compiled FlexAttention against the torch path on CUDA, then the full
# benchmark table (kernels/bench_sparse_attn.py: dense SDPA, FlexAttention with ds's BlockMask, ds auto and
# Numba; 16384, 65536 and 4096 tokens, 16 heads, head dim 64 and 128, bf16, fixed/bigbird/bslongformer).
# Called by tools/gpu_check.sh; alone, from the repository root:   OUT=/some/dir bash kernels/gpu_check.sh
# The image has torch 2.11, triton 3.6, numba-cuda and pytest (KINDS.md): no wheel is needed for this part.
# Results in $OUT: sparse_tests.txt (environment, tests, the benchmark's log), sparse_bench.md, sparse_bench.json (rows written as
# measured: a timeout keeps what was measured).
set -u
OUT=${OUT:-/tmp/ds-sparse-attn-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/packages/ds-sparse-attn/src:$PWD/packages/ds-config/src${PYTHONPATH:+:$PYTHONPATH}"
export NUMBA_ENABLE_CUDASIM=0
BUDGET_S=${DS_GPU_CHECK_BUDGET_S:-330}  # tools/gpu_check.sh passes what is left of its own budget
left() {  # seconds for the next step: min(its ceiling, what is left of the budget), at least 1
  local rest=$((BUDGET_S - SECONDS))
  local t=$(($1 < rest ? $1 : rest))
  echo $((t > 1 ? t : 1))
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  $PY -c "import numba, numba_cuda; from numba import cuda; print('numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'gpu', cuda.is_available())"
} >"$OUT/sparse_tests.txt" 2>&1

echo "== sparse tests on the GPU ==" >>"$OUT/sparse_tests.txt"
timeout "$(left 70)" $PY -m pytest kernels/test_sparse_attn_kernels.py -q -p no:cacheprovider -rs >>"$OUT/sparse_tests.txt" 2>&1
echo "kernels exit $?" >>"$OUT/sparse_tests.txt"
timeout "$(left 50)" $PY -m pytest packages/ds-sparse-attn/tests/test_flex_attention.py -q -p no:cacheprovider -rs \
  -k cuda --log-level=INFO >>"$OUT/sparse_tests.txt" 2>&1
echo "flex exit $?" >>"$OUT/sparse_tests.txt"
grep -E "passed|failed|exit" "$OUT/sparse_tests.txt"

echo "== sparse benchmark ==" >"$OUT/sparse_bench.md"
timeout "$(left 110)" $PY kernels/bench_sparse_attn.py --device cuda --seqs 16384 65536 4096 --dims 64 128 \
  --methods sdpa-dense flex ds-auto ds-numba --repeats 5 --json "$OUT/sparse_bench.json" \
  >>"$OUT/sparse_bench.md" 2>>"$OUT/sparse_tests.txt"
status=$?
echo "exit $status" >>"$OUT/sparse_bench.md"
if [ "$status" -ne 0 ] && [ -s "$OUT/sparse_bench.json" ]; then  # a timeout: the table of the rows measured
  $PY kernels/bench_sparse_attn.py --device cuda --repeats 5 --table-from "$OUT/sparse_bench.json" >>"$OUT/sparse_bench.md" 2>&1
fi
grep -v "^done" "$OUT/sparse_tests.txt" | tail -n 5
cat "$OUT/sparse_bench.md"
