#!/usr/bin/env bash
# The project's GPU check, run on a CUDA machine from the repository root (nothing needs installing
# beyond torch, triton, cupy, pytest, pytest-xdist, matplotlib, tqdm):
#   bash .ci/gpu_run.sh --out results/gpu tests        # the whole pytest suite on the GPU, accuracy table in JSON
#                                                      # (TESTS="files ..." and PYTEST_K="expression": a subset;
#                                                      # WORKERS=n workers, default 12; XDIST_S, default 1500 s)
#   bash .ci/gpu_run.sh --out results/gpu seed         # benchmark: the seed documents' configuration (ROUNDS=3 rounds, each a pass over the run)
#   bash .ci/gpu_run.sh --out results/gpu seed-calling # the same backward rows, each backward on the calling thread
#                                                      # (--autograd-thread calling: autograd's multithreading off)
#   bash .ci/gpu_run.sh --out results/gpu sweep        # benchmark: the default GPU sweep
#   bash .ci/gpu_run.sh --out results/gpu cuda         # CUDA ladder and backward vs FA2 (with the config sweeps),
#                                                      # SASS counts, host time per call (benchmark presets)
#   bash .ci/gpu_run.sh --out results/gpu triton       # Triton vs FA2 and cuDNN (the triton-vs-fa2 preset); on a
#                                                      # Hopper also its two backwards and its two forwards beside
#                                                      # cuDNN (tools/hopper_backward_ab.py, hopper_forward_ab.py)
#   bash .ci/gpu_run.sh --out results/gpu hopper       # every GPU backend, fp16/bf16, fwd/bwd, beside FA2 and cuDNN:
#                                                      # hopper_summary.json (the hopper preset)
#   bash .ci/gpu_run.sh --out results/gpu variants     # window, GQA and dropout beside FlexAttention and SDPA
#                                                      # (python -m benchmarks.variants, ROUNDS=3 rounds, each a pass over the run)
#   bash .ci/gpu_run.sh --out results/gpu kernels      # the Hopper forward and backward kernels alone, every tile
#                                                      # config, beside FA2 and cuDNN (tools/cuda_*_kernels.py)
#   bash .ci/gpu_run.sh --out results/gpu backward     # the CUDA backward kernels alone (tools/cuda_backward_kernels.py)
#   bash .ci/gpu_run.sh --out results/gpu mma          # the mma.sync rung alone in every tile config, beside FA2 and
#                                                      # cuDNN: forward and backward at N = 1024, 4096 and the seeds'
#                                                      # shape (tools/cuda_forward_kernels.py --kernel mma, ...),
#                                                      # and its persistent grid off and on (tools/mma_persistent_ab.py)
#   bash .ci/gpu_run.sh --out results/gpu sanitizer    # compute-sanitizer memcheck + racecheck + synccheck, every CUDA kernel
#   bash .ci/gpu_run.sh --out results/gpu sanitizer-triton  # the same three tools over the Triton kernels (forward,
#                                                      # dQ, dK/dV: masks, GQA, dropout, small and forced large tiles)
#   bash .ci/gpu_run.sh --out results/gpu ncu          # Nsight Compute profile of every rung (tools/ncu_profile.py)
#   bash .ci/gpu_run.sh --out results/gpu breakdown    # one call's GPU time kernel by kernel, ours beside FlexAttention
#                                                      # and cuDNN (tools/kernel_breakdown.py)
#   bash .ci/gpu_run.sh --out results/gpu blockorder   # the CUDA backward's blocks in grid order against tile-major
#                                                      # (tools/ws_block_order.py)
#   bash .ci/gpu_run.sh --out results/gpu rounds       # the hopper preset's forward rows in rounds (cuda-wgmma-ws, FA2,
#                                                      # cuDNN; tools/forward_rounds.py), and the D = 128 forward held
#                                                      # for seconds at the GPU's power limit, with its SM clock and
#                                                      # power (tools/sustained_power.py)
# Several steps may be named in one call. The output folder may also be given as OUT=DIR; PACK=1 packs it into
# one archive, gpu_results.tgz (handy when the results are copied off a remote machine).
# Each step has its own time limit, so one slow step cannot hide the others' results.
set -u
OUT=${OUT:-gpu_out}
if [ "${1:-}" = "--out" ]; then OUT=$2; shift 2; fi
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 MPLBACKEND=Agg
{ nvidia-smi -L; python3 -c "import torch, triton, cupy; print('torch', torch.__version__, 'triton', triton.__version__, 'cupy', cupy.__version__, 'cuda', torch.version.cuda)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
for step in "$@"; do
  case "$step" in
    tests)
      # every test file in parallel (WORKERS pytest workers, default 12, which also compile the kernel variants side
      # by side); the workers' accuracy rows are merged into one table (tests/conftest.py), written to gpu_errors.json.
      # On an H200 with 16 CPU cores and WORKERS=15 (docs/results/gpu_tests/h200-full-suite/) the harness took 370 s,
      # the CUDA files 216 s and the other files with GPU cases 195 s; everything but the harness did not finish in
      # 545 s. On a machine that limits one command to 10 minutes, run it in calls like these:
      #   TESTS=tests/test_harness.py
      #   TESTS="tests/test_cuda_kernels.py tests/test_cuda_variants.py"
      #   TESTS="tests --ignore=tests/test_harness.py --ignore=tests/test_cuda_kernels.py --ignore=tests/test_cuda_variants.py"
      FA_ERROR_REPORT="$OUT/gpu_errors.json" timeout "${XDIST_S:-1500}" python3 -m pytest -q -p no:cacheprovider \
        -n "${WORKERS:-12}" -rfEs ${TESTS:-tests} ${PYTEST_K:+-k "$PYTEST_K"} > "$OUT/pytest_xdist.log" 2>&1
      echo "pytest -n ${WORKERS:-12} rc=$?"; grep -E "passed|failed|error" "$OUT/pytest_xdist.log" | tail -n 3
      grep -E "^(FAILED|ERROR)" "$OUT/pytest_xdist.log" | head -n 20
      grep -E "^SKIPPED" "$OUT/pytest_xdist.log" | sort | uniq -c | sort -rn | head -n 12
      grep -E "^E  |Error:|assert" "$OUT/pytest_xdist.log" | head -n 30 ;;
    seed)
      timeout "${SEED_S:-150}" python3 -m benchmarks --seed-config --causal both --mode both --rounds "${ROUNDS:-3}" --no-progress \
        --out "$OUT/h100-seed" > "$OUT/bench_seed.log" 2>&1
      echo "seed rc=$?"; tail -n 40 "$OUT/bench_seed.log" ;;
    seed-calling)
      timeout "${SEED_S:-150}" python3 -m benchmarks --seed-config --causal both --mode bwd --rounds "${ROUNDS:-3}" --autograd-thread calling \
        --no-progress --out "$OUT/h100-seed-calling-thread" > "$OUT/bench_seed_calling.log" 2>&1
      echo "seed (calling thread) rc=$?"; tail -n 40 "$OUT/bench_seed_calling.log" ;;
    sweep)
      timeout "${SWEEP_S:-500}" python3 -m benchmarks --no-progress --out "$OUT/h100-default" > "$OUT/bench_default.log" 2>&1
      echo "sweep rc=$?"; tail -n 60 "$OUT/bench_default.log" ;;
    cuda)
      # the benchmark's presets (python -m benchmarks --list names them); each folder holds the sweep's files and
      # the side-by-side summary the docs read (cuda_ladder.json, cuda_backward.json, launch_overhead.txt)
      mkdir -p "$OUT/cuda"
      timeout "${CUDA_S:-400}" python3 -m benchmarks --preset cuda-ladder --sweep --no-progress \
        --out "$OUT/cuda/cuda-ladder" > "$OUT/cuda_ladder.log" 2>&1
      echo "cuda ladder rc=$?"; grep -E "^sweep .*(best|failed)" "$OUT/cuda_ladder.log" | head -n 20; tail -n 20 "$OUT/cuda/cuda-ladder/cuda_ladder.md"
      timeout "${CUDA_BWD_S:-400}" python3 -m benchmarks --preset cuda-backward --sweep --no-progress \
        --out "$OUT/cuda/cuda-backward" > "$OUT/cuda_backward.log" 2>&1
      echo "cuda backward rc=$?"; tail -n 20 "$OUT/cuda/cuda-backward/cuda_backward.md"
      python3 tools/sass_summary.py --source mma.cu --source wgmma.cu --source tiled.cu > "$OUT/cuda/sass_summary.txt" 2>&1
      timeout "${LAUNCH_S:-120}" python3 -m benchmarks --preset launch-overhead --no-progress \
        --out "$OUT/cuda/launch-overhead" > "$OUT/launch_overhead.log" 2>&1
      echo "launch overhead rc=$?"; cat "$OUT/cuda/launch-overhead/launch_overhead.txt" ;;
    triton)
      timeout "${TRITON_S:-400}" python3 -m benchmarks --preset triton-vs-fa2 --no-progress \
        --out "$OUT/triton/triton-vs-fa2" > "$OUT/triton_vs_fa2.log" 2>&1
      echo "triton vs fa2 rc=$?"; tail -n 32 "$OUT/triton/triton-vs-fa2/triton_vs_fa2.md"
      if python3 -c "import sys, torch; sys.exit(torch.cuda.get_device_capability() != (9, 0))" 2>/dev/null; then
        timeout "${TRITON_S:-400}" python3 tools/hopper_backward_ab.py \
          --shapes 2x32x8x4096,2x32x1x4096,4x16x16x4096,1x32x8x16384,1x32x1x16384 --out "$OUT/triton/hopper_backward" \
          > "$OUT/hopper_backward_ab.log" 2>&1
        echo "hopper backward a/b rc=$?"; grep -E "^\|" "$OUT/triton/hopper_backward/hopper_backward_ab.md"
        timeout "${TRITON_S:-400}" python3 tools/hopper_forward_ab.py --configs "RESCALE_EARLY=0;RESCALE_EARLY=1" \
          --out "$OUT/triton/hopper_forward" \
          > "$OUT/hopper_forward_ab.log" 2>&1
        echo "hopper forward a/b rc=$?"; grep -E "^\|" "$OUT/triton/hopper_forward/hopper_forward_ab.md"
      fi ;;
    hopper)
      timeout "${HOPPER_S:-580}" python3 -m benchmarks --preset hopper --no-progress \
        --out "$OUT/hopper" > "$OUT/hopper.log" 2>&1
      echo "hopper rc=$?"; tail -n 30 "$OUT/hopper/hopper_summary.md" ;;
    variants)
      timeout "${VARIANTS_S:-900}" python3 -m benchmarks.variants --no-progress --rounds "${ROUNDS:-3}" \
        --out "$OUT/variants" > "$OUT/variants.log" 2>&1
      echo "variants rc=$?"; grep -E "^\|" "$OUT/variants/variants.md" | head -n 60 ;;
    kernels)
      timeout "${KERNELS_S:-300}" python3 tools/cuda_forward_kernels.py --out "$OUT/kernels" > "$OUT/forward_kernels.log" 2>&1
      echo "forward kernels rc=$?"; grep -E "^\|" "$OUT/kernels/forward_kernels.md" | head -n 30
      timeout "${KERNELS_S:-300}" python3 tools/cuda_backward_kernels.py --out "$OUT/kernels" > "$OUT/backward_kernels.log" 2>&1
      echo "backward kernels rc=$?"; grep -E "^\|" "$OUT/kernels/backward_kernels.md" | head -n 20 ;;
    backward)
      timeout "${KERNELS_S:-300}" python3 tools/cuda_backward_kernels.py --out "$OUT/kernels" > "$OUT/backward_kernels.log" 2>&1
      echo "backward kernels rc=$?"; grep -E "^\|" "$OUT/kernels/backward_kernels.md" | head -n 20 ;;
    mma)
      # shapes: batch heads head-dim N folder
      for shape in "4 32 64 1024,4096 b4h32-d64" "4 16 128 1024,4096 b4h16-d128" "8 12 64 1024 seed-b8h12-d64"; do
        read -r b h d n name <<< "$shape"
        timeout "${MMA_S:-150}" python3 tools/cuda_forward_kernels.py --kernel mma --batch "$b" --heads "$h" \
          --head-dims "$d" --n "$n" --out "$OUT/mma_forward/$name" > "$OUT/mma_forward_$name.log" 2>&1
        echo "mma forward $name rc=$?"; grep -E "^\|" "$OUT/mma_forward/$name/forward_kernels.md"
        timeout "${MMA_S:-150}" python3 tools/cuda_backward_kernels.py --mma-only --mma-configs --batch "$b" \
          --heads "$h" --head-dims "$d" --n "$n" --out "$OUT/mma_backward/$name" > "$OUT/mma_backward_$name.log" 2>&1
        echo "mma backward $name rc=$?"; grep -E "^\|" "$OUT/mma_backward/$name/backward_kernels.md"
      done
      timeout "${MMA_S:-150}" python3 tools/mma_persistent_ab.py --out "$OUT/mma_persistent" > "$OUT/mma_persistent.log" 2>&1
      echo "mma persistent grid off/on rc=$?"; grep -E "^\|" "$OUT/mma_persistent/mma_persistent_ab.md" ;;
    sanitizer)
      timeout "${SANITIZER_S:-300}" python3 tools/run_sanitizer.py --log-dir "$OUT/sanitizer"
      echo "sanitizer rc=$?" ;;
    sanitizer-triton)
      timeout "${SANITIZER_S:-300}" python3 tools/run_sanitizer.py --backend triton --tool-timeout "${SANITIZER_TOOL_S:-90}" \
        --log-dir "$OUT/sanitizer-triton"
      echo "sanitizer (triton) rc=$?" ;;
    ncu)
      timeout "${NCU_S:-420}" python3 tools/ncu_profile.py --out "$OUT/ncu" > "$OUT/ncu.log" 2>&1
      echo "ncu rc=$?"; tail -n 14 "$OUT/ncu.log" ;;
    breakdown)
      timeout "${BREAKDOWN_S:-300}" python3 tools/kernel_breakdown.py --out "$OUT/kernel_breakdown" > "$OUT/kernel_breakdown.log" 2>&1
      echo "kernel breakdown rc=$?"; grep -E "^(##|\| .*\*\*)" "$OUT/kernel_breakdown/kernel_breakdown.md" | head -n 40 ;;
    blockorder)
      timeout "${BLOCKORDER_S:-300}" python3 tools/ws_block_order.py --out "$OUT/ws_block_order" > "$OUT/ws_block_order.log" 2>&1
      echo "block order rc=$?"; grep -E "^\|" "$OUT/ws_block_order/ws_block_order.md" ;;
    rounds)
      timeout "${ROUNDS_S:-240}" python3 tools/forward_rounds.py --out "$OUT/forward_rounds" > "$OUT/forward_rounds.log" 2>&1
      echo "forward rounds rc=$?"; cat "$OUT/forward_rounds/forward_rounds.txt"
      timeout "${POWER_S:-150}" python3 tools/sustained_power.py --out "$OUT/sustained_power" > "$OUT/sustained_power.log" 2>&1
      echo "sustained power rc=$?"; grep -E "^\|" "$OUT/sustained_power/sustained_power.md" ;;
    *) echo "unknown step $step (tests | seed | seed-calling | sweep | cuda | triton | hopper | variants | kernels | backward | mma | sanitizer | sanitizer-triton | ncu | breakdown | blockorder | rounds)"; exit 2 ;;
  esac
done
# PACK=1: everything in one archive
if [ "${PACK:-0}" != 0 ]; then
  tar czf "/tmp/gpu_results.tgz" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/gpu_results.tgz "$OUT/gpu_results.tgz"
  ls -la "$OUT"
fi
