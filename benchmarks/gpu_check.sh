#!/usr/bin/env bash
# The GPU check, in under five minutes on one CUDA GPU: the suite's GPU-marked tests (bf16 and
# fp16 capture parity with float32, cached needle decoding, --device-map across GPU and CPU),
# then bf16-vs-fp32 throughput at SmolLM2-135M's shape with random weights (benchmarks/bench_scale_gpu.py:
# bare forward, capture, exact sweep; capture / bare bf16 forward >= 0.5, bf16 / fp32 >= 1.5, host
# synchronisations per capture batch <= 1, counted by CUDA's sync debug mode); one summary at the end.
# Without CUDA it says so and exits 0. Run from the repository root:  bash benchmarks/gpu_check.sh
set -uo pipefail
PY=${PY:-.venv/bin/python}
LOG=${GPU_CHECK_LOG:-$(mktemp -d)}  # the full logs: tests.txt, bench.txt

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA GPU on this machine: GPU tests and throughput skipped"
    exit 0
fi
"$PY" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(), 'torch', torch.__version__)"

start=$(date +%s)
timeout 120 "$PY" -m pytest -q -m gpu tests/test_scale_gpu.py -p no:cacheprovider --tb=short >"$LOG/tests.txt" 2>&1
tests_rc=$?
tests_s=$(( $(date +%s) - start ))
start=$(date +%s)
timeout 160 "$PY" benchmarks/bench_scale_gpu.py >"$LOG/bench.txt" 2>&1
bench_rc=$?
bench_s=$(( $(date +%s) - start ))

if [ "$tests_rc" -ne 0 ]; then tail -n 80 "$LOG/tests.txt"; else tail -n 3 "$LOG/tests.txt"; fi
echo
echo "| step | result | seconds |"
echo "|---|---|---|"
echo "| GPU tests (tests/test_scale_gpu.py) | $(tail -n 1 "$LOG/tests.txt" | tr '|' '/') (rc $tests_rc) | $tests_s |"
echo "| throughput (bench_scale_gpu.py) | rc $bench_rc | $bench_s |"
grep '^|' "$LOG/bench.txt"
[ "$bench_rc" -ne 0 ] && tail -n 20 "$LOG/bench.txt"
exit $(( tests_rc != 0 || bench_rc != 0 ))
