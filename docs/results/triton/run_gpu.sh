#!/usr/bin/env bash
# The one GPU run behind docs/results/triton: benchmark, then tests, then ahead-of-time compiles.
#   bash docs/results/triton/run_gpu.sh --out results/triton     (from the repository root, on a CUDA machine)
# Each step has its own time limit so one slow step cannot hide the others' results.
set -u
DEST=results/triton
if [ "${1:-}" = "--out" ] && [ -n "${2:-}" ]; then DEST=$2; elif [ $# -gt 0 ]; then echo "usage: $0 [--out DIR]" >&2; exit 2; fi
mkdir -p "$DEST"
export PYTHONPATH=. PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; } > "$DEST/env.txt" 2>&1
cat "$DEST/env.txt"
# 1. performance: the benchmark's triton-vs-fa2 preset (writes $DEST/triton-vs-fa2/triton_vs_fa2.json / .md beside
#    the sweep's files; the rows so far in cases.jsonl)
timeout ${BENCH_S:-300} python3 -m benchmarks --preset triton-vs-fa2 --no-progress --out "$DEST/triton-vs-fa2" \
  ${BENCH_ARGS:-} > "$DEST/bench.log" 2>&1
echo "bench rc=$?"; tail -n 45 "$DEST/triton-vs-fa2/triton_vs_fa2.md"
TESTS="tests/test_harness.py tests/test_triton_kernels.py tests/test_triton_bad_input.py"
# 2. tests in parallel (compiles every variant on 12 cores and fills Triton's cache) ...
timeout ${XDIST_S:-240} python3 -m pytest -q -p no:cacheprovider -n 12 -k triton $TESTS > "$DEST/pytest_xdist.log" 2>&1
echo "xdist rc=$?"; tail -n 5 "$DEST/pytest_xdist.log"
# 3. ... then serially, from the cache, for the accuracy table (FA_ERROR_REPORT)
FA_ERROR_REPORT="$DEST/gpu_errors.json" timeout ${SERIAL_S:-100} python3 -m pytest -q -p no:cacheprovider -k triton $TESTS > "$DEST/pytest_serial.log" 2>&1
echo "serial rc=$?"; tail -n 25 "$DEST/pytest_serial.log"
# 4. ahead-of-time compile of the default variant set for sm_80 and sm_90, in parallel
TRITON_INTERPRET=0 timeout ${AOT_S:-90} python3 tools/triton_aot.py --jobs 12 --json "$DEST/aot.json" > /dev/null 2>&1
echo "aot rc=$?"
