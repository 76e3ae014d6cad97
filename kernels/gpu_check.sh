#!/usr/bin/env bash
# ds-sparse-attn on a real GPU, in one short run (< 5 minutes): the kernel tests on the device, then the
# benchmark (Numba kernels vs compiled FlexAttention vs dense SDPA; seq 4096 and 16384, 8 heads, head dim 64,
# block 64, fixed layout). Run from the repository root:   OUT=/some/dir bash kernels/gpu_check.sh
# Results land in $OUT: env.txt, kernel_tests.txt, bench.md, bench.json.
set -u
OUT=${OUT:-/tmp/ds-sparse-attn-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/packages/ds-sparse-attn/src:$PWD/packages/ds-config/src${PYTHONPATH:+:$PYTHONPATH}"
unset NUMBA_ENABLE_CUDASIM

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
} >"$OUT/env.txt" 2>&1

# numba-cuda (the [cuda] extra) and pytest, only if missing; the bindings extra matching the CUDA major.
if ! $PY -c "import numba.cuda, numba_cuda" >/dev/null 2>&1; then
  CUDA_MAJOR=$($PY -c "import torch; print((torch.version.cuda or '12').split('.')[0])")
  timeout 120 $PY -m pip install -q --retries 0 --timeout 5 "numba-cuda[cu${CUDA_MAJOR}]" >>"$OUT/env.txt" 2>&1 \
    || timeout 120 $PY -m pip install -q --retries 0 --timeout 5 numba-cuda >>"$OUT/env.txt" 2>&1
fi
$PY -c "import pytest" >/dev/null 2>&1 || timeout 60 $PY -m pip install -q pytest >>"$OUT/env.txt" 2>&1
$PY -c "import numba, numba_cuda; from numba import cuda; print('numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'gpu', cuda.is_available())" >>"$OUT/env.txt" 2>&1

echo "== kernel tests on the GPU ==" | tee "$OUT/kernel_tests.txt"
timeout 120 $PY -m pytest kernels/test_sparse_attn_kernels.py -q -p no:cacheprovider -rs >>"$OUT/kernel_tests.txt" 2>&1
echo "exit $?" >>"$OUT/kernel_tests.txt"

echo "== benchmark ==" >"$OUT/bench.md"
timeout 150 $PY kernels/bench_sparse_attn.py --device cuda --seqs 4096 16384 --repeats 10 \
  --json "$OUT/bench.json" >>"$OUT/bench.md" 2>&1
echo "exit $?" >>"$OUT/bench.md"
tail -n 3 "$OUT/kernel_tests.txt"
cat "$OUT/bench.md"
