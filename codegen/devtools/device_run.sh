#!/usr/bin/env bash
# One device session: GPU tests, compute-sanitizer on derived kernels, then the benchmark.
# Run through the device tool with carry [.whl]; writes logs, bench.json and bench.png to $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DERIVC_CACHE_DIR=/tmp/derivc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
part=${1:-all}
if [[ $part == all || $part == tests ]]; then
  timeout 240 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi
if [[ $part == all || $part == bench ]]; then
  timeout 300 python3 -m compiler bench --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -40
fi
if [[ $part == all || $part == sanitize ]]; then
  for tool in memcheck racecheck; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m compiler run examples/gemm.yaml --check --sizes M=200,N=300,K=100 2>&1 | tail -4
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m compiler run examples/flash_attention.yaml --check --sizes B=1,H=2,N=200 2>&1 | tail -4
  done 2>&1 | tee "$OUT/sanitizer.log"
  timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m compiler run examples/gemm_wgmma.yaml --check --sizes M=256,N=512,K=256 2>&1 | tail -4 | tee -a "$OUT/sanitizer.log"
fi
