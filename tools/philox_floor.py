#!/usr/bin/env python
"""Dropout's floor: every score's keep decision drawn alone, with no attention around it, beside SDPA's attention
with dropout and ours, in one run on a CUDA GPU.

    python tools/philox_floor.py --out results/philox_floor                  # the recorded run (about a minute)
    python tools/philox_floor.py --out results/philox_floor --shapes 4x32x4096x64 --rounds 1
    python tools/philox_floor.py --floor-only --shapes 4x32x4096x64          # the three kernels once each (for ncu)

The project's keep rule is ``tl.rand(seed, offset) >= p`` for every score (b, h, i, j): one Philox4x32-10 evaluation
a score, bit for bit in every backend (``flash_attention_cuda/kernels/philox.cuh``). However fast the attention
around it, a kernel under that rule cannot take less time than the draws alone. Three kernels time that floor over
the B·H·N·N scores of a shape, each warp walking tiles of 16 query rows by 128 keys in the layout of the tensor
cores' accumulator, as the forwards hold their scores, each compiled for 1, 4 and 8 blocks of 128 threads an SM
(``__launch_bounds__``: a thread's evaluations side by side, or more warps; the fastest is the floor):

    rule            the keep decisions as the kernels draw them (``frag::dropout_rows``: a tile's shared Philox work,
                    16 integer multiplies a score), counted so that none can be left out
    score by score  the same decisions, one whole evaluation a score (``frag::Dropout::scale``: 18 multiplies)
    FA2's rate      one Philox4x32-10 evaluation, all four of its 32-bit words, for every 16 scores, each score
                    a byte against an 8-bit threshold: the generator's work in FlashAttention-2's dropout (not the
                    project's rule: its keep decisions are others)

The two forms of the rule must keep exactly the same number of scores (checked, with the keep rate against 1 - p).
Beside them, with the one timer and the one SDPA pin of the benchmark (``benchmarks.variants.run_case``), the same
shapes' attention with dropout p: SDPA's kernels that take it, Triton and cuda-wgmma-ws, forward and backward.
``--rounds`` takes every timing that many times, in turn, and keeps the median.

Writes ``philox_floor.json`` (every row, the environment, the git commit), ``philox_floor.md`` (the table) and
``philox_floor.png`` (each shape's floors beside the attention calls, forward and backward) into ``--out``. Needs a
CUDA GPU (CuPy compiles the floor kernels with NVRTC); ``--replot DIR`` rebuilds the table and the plot from
``DIR/philox_floor.json`` on any machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SHAPES = "4x32x4096x64,4x16x4096x128"  # the dropout section of benchmarks.variants, not causal
SEED = 2**33 + 7                        # benchmarks.variants.SEED: both Philox key words in use
NT = (16, 4)  # tiles of 16 x 8 NT scores: 16 x 128 (Bc = 128, the Hopper forwards'), and 16 x 32 (fewer registers)

FLOOR_KERNELS = r"""
// The floor kernels: every score's keep decision and nothing else. A warp walks the 16 x 8NT score tiles of
// BH heads of Nq x Nk scores (tile t: head t / (row tiles * column tiles), rows block outer, keys inner), holds a
// tile as the tensor cores' accumulator lays it out (fragments.cuh: rows acc_row(e), keys acc_col(n, e)), and
// counts the scores it keeps, one atomic add a warp, so that the compiler can leave no draw out.
__device__ __forceinline__ void count_warp(unsigned count, unsigned long long* kept) {
    for (int d = 16; d > 0; d /= 2) count += __shfl_xor_sync(0xffffffffu, count, d);
    if (threadIdx.x % 32 == 0) atomicAdd(kept, static_cast<unsigned long long>(count));
}

// FORM 0: as the kernels draw them (dropout_rows: a tile's shared Philox work); FORM 1: score by score.
// MIN_BLOCKS: blocks of 128 threads an SM must hold (the registers a thread may use: 65536 / (128 MIN_BLOCKS)):
// a thread's evaluations run side by side as far as its registers allow, and the warps of an SM hide the rest.
template <int NT, int FORM, int MIN_BLOCKS>
__global__ void __launch_bounds__(128, MIN_BLOCKS) keep_rule(long long BH, int Nq, int Nk, float p, unsigned seed_lo, unsigned seed_hi,
                          unsigned long long* kept) {
    frag::Dropout dp = frag::make_dropout(p, seed_lo, seed_hi, 0, Nq, Nk);
    const long long row_tiles = Nq / 16, col_tiles = Nk / (8 * NT), tiles = BH * row_tiles * col_tiles;
    const long long warps = static_cast<long long>(gridDim.x) * blockDim.x / 32;
    unsigned count = 0;
    for (long long t = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; t < tiles; t += warps) {
        dp.bh = t / (row_tiles * col_tiles);
        const int row0 = 16 * static_cast<int>(t / col_tiles % row_tiles), col0 = 8 * NT * static_cast<int>(t % col_tiles);
        float P[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) P[n][e] = 1.0f;
        if constexpr (FORM == 0) {
            frag::dropout_rows(P, dp, row0, col0);  // P_ij *= Z_ij / (1 - p)
        } else {
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) P[n][e] *= dp.scale(row0 + frag::acc_row(e), col0 + frag::acc_col(n, e));
        }
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) count += P[n][e] != 0.0f;
    }
    count_warp(count, kept);
}

// Philox4x32-10 with all four output words, counter (c0, c1, 0, 0), key (k0, k1): the rounds of philox.cuh
__device__ __forceinline__ uint4 philox4(unsigned k0, unsigned k1, unsigned c0, unsigned c1) {
    unsigned c2 = 0, c3 = 0;
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        const unsigned long long prod_a = static_cast<unsigned long long>(fa::PHILOX_ROUND_A) * c0;
        const unsigned long long prod_b = static_cast<unsigned long long>(fa::PHILOX_ROUND_B) * c2;
        c0 = static_cast<unsigned>(prod_b >> 32) ^ c1 ^ k0;  // c0, c1, c2, c3 = hi(B c2) ^ c1 ^ k0, lo(B c2),
        c1 = static_cast<unsigned>(prod_b);                   //                  hi(A c0) ^ c3 ^ k1, lo(A c0)
        c2 = static_cast<unsigned>(prod_a >> 32) ^ c3 ^ k1;
        c3 = static_cast<unsigned>(prod_a);
        k0 += fa::PHILOX_KEY_A;
        k1 += fa::PHILOX_KEY_B;
    }
    return make_uint4(c0, c1, c2, c3);
}

// FlashAttention-2's rate: one evaluation for 16 scores, each score one byte of its four words, kept when the byte
// is at most (1 - p) 255. A thread's 4NT scores of a tile take NT / 4 evaluations (counter: the thread's place).
template <int NT, int MIN_BLOCKS>
__global__ void __launch_bounds__(128, MIN_BLOCKS) keep_fa2_rate(long long BH, int Nq, int Nk, float p, unsigned seed_lo, unsigned seed_hi,
                              unsigned long long* kept) {
    const unsigned keep_max = static_cast<unsigned>((1.0f - p) * 255.0f);
    const long long tiles = BH * (Nq / 16) * (Nk / (8 * NT));
    const long long warps = static_cast<long long>(gridDim.x) * blockDim.x / 32;
    unsigned count = 0;
    for (long long t = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; t < tiles; t += warps) {
        const unsigned long long first = (static_cast<unsigned long long>(t) * 32 + threadIdx.x % 32) * (NT / 4);
#pragma unroll
        for (int q = 0; q < NT / 4; ++q) {
            const uint4 w = philox4(seed_lo, seed_hi, static_cast<unsigned>(first + q),
                                    static_cast<unsigned>((first + q) >> 32));
            const unsigned words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int k = 0; k < 16; ++k) count += ((words[k / 4] >> (8 * (k % 4))) & 0xFFu) <= keep_max;
        }
    }
    count_warp(count, kept);
}
"""
FORMS = ("rule", "score-by-score", "fa2-rate")
MIN_BLOCKS = (2, 4, 8)  # __launch_bounds__: at most 255, 128 and 64 registers a thread
# (form, NT, MIN_BLOCKS) -> the kernel's name
NAMES = {(form, nt, mb): (f"keep_rule<{nt}, {int(form != 'rule')}, {mb}>" if form != "fa2-rate" else
                          f"keep_fa2_rate<{nt}, {mb}>") for form in FORMS for nt in NT for mb in MIN_BLOCKS}
PARAMS = "(long long, int, int, float, unsigned, unsigned, unsigned long long*)"


def source() -> str:
    """The floor kernels with the project's headers inlined (what NVRTC compiles)."""
    from flash_attention_cuda.runtime import read_source

    return read_source("fragments.cuh") + FLOOR_KERNELS


def nvcc_source() -> str:
    """source() with explicit instantiations, for nvcc (the tests' compile check)."""
    return source() + "".join(f"template __global__ void {name}{PARAMS};\n" for name in NAMES.values())


def parse_shape(text: str) -> tuple:
    """'BxHxNxD' -> (B, H, N, D), N a multiple of the widest tile's 8 NT keys."""
    try:
        B, H, N, D = (int(x) for x in text.split("x"))
    except ValueError:
        raise ValueError(f"philox_floor: --shapes: expected BxHxNxD (e.g. 4x32x4096x64), got {text!r}") from None
    if min(B, H, N, D) < 1 or N % (8 * max(NT)):
        raise ValueError(f"philox_floor: --shapes: expected positive sizes and N a multiple of {8 * max(NT)}, "
                         f"got {text!r}")
    return B, H, N, D


class Floor:
    """The floor kernels compiled once (CuPy, NVRTC), launched on torch's current stream; a kernel is named by its
    key in NAMES, (form, NT, MIN_BLOCKS)."""

    def __init__(self):
        import cupy

        self.cupy = cupy
        module = cupy.RawModule(code=source(), options=("--std=c++17",), name_expressions=list(NAMES.values()))
        self.kernels = {key: module.get_function(name) for key, name in NAMES.items()}
        self.sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        self.kept = cupy.zeros(1, dtype=cupy.uint64)
        import torch

        self.anchor = torch.empty(1, device="cuda")  # runtime.Stream reads torch's current stream off a tensor

    def launcher(self, key, BH, N, p, seed=SEED):
        """A call that draws the keep decisions of BH heads of N x N scores once with kernel ``key`` (the count
        adds up in self.kept)."""
        import numpy as np

        from flash_attention_cuda.runtime import Stream

        kern, nt = self.kernels[key], key[1]
        tiles = BH * (N // 16) * (N // (8 * nt))
        grid = (max(1, min(self.sms * 16, (tiles + 3) // 4)),)  # 4 warps a block, grid-stride over the tiles
        args = (np.int64(BH), np.int32(N), np.int32(N), np.float32(p), np.uint32(seed & 0xFFFFFFFF),
                np.uint32(seed >> 32), self.kept)

        def call():  # on torch's current stream at the time of the call (a CUDA graph's capture stream, say)
            Stream(self.anchor).run(kern, grid, (128,), args)
        return call

    def count(self, key, BH, N, p, seed=SEED) -> int:
        """The number of scores kernel ``key`` keeps over BH heads of N x N scores."""
        self.kept.fill(0)
        self.launcher(key, BH, N, p, seed)()
        self.cupy.cuda.runtime.deviceSynchronize()
        return int(self.kept.get()[0])


def check_counts(counts: dict, scores: int, p: float) -> list:
    """What is wrong with one shape's kept counts ({key: count}), as sentences (none: fine). Every kernel of the
    rule, either form, draws the same bits, so keeps the same scores; every kernel keeps about 1 - p of them
    (within 6 sigma; FA2's rate: a byte at most int((1 - p) 255), of 256 values)."""
    bad = []
    rule = {key: kept for key, kept in counts.items() if key[0] != "fa2-rate"}
    if len(set(rule.values())) > 1:
        bad.append(f"the rule's kernels kept different numbers of scores: {rule}")
    sigma = (scores * p * (1 - p)) ** 0.5
    for key, kept in counts.items():
        want = (1 - p) if key[0] != "fa2-rate" else (int((1 - p) * 255) + 1) / 256
        if abs(kept - want * scores) > 6 * sigma + 1:
            bad.append(f"{NAMES[key]} kept {kept} of {scores} scores, {kept / scores:.6f} where {want:.6f} was "
                       "expected")
    return bad


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output folder (philox_floor.json, philox_floor.md); required unless --floor-only")
    ap.add_argument("--shapes", default=SHAPES, help="BxHxNxD, comma-separated (default: %(default)s)")
    ap.add_argument("--p", type=float, default=0.1, help="dropout_p (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="timings of each row, in turn; the median is kept "
                                                          "(default: %(default)s)")
    ap.add_argument("--floor-only", action="store_true",
                    help="launch each floor kernel once per shape and time nothing (for a profiler)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--replot", metavar="DIR", help="run nothing: rebuild philox_floor.md and .png in DIR from its "
                                                    "philox_floor.json")
    args = ap.parse_args(argv)
    if args.replot:
        path = os.path.join(args.replot, "philox_floor.json")
        if not os.path.exists(path):
            ap.error(f"--replot: {path} does not exist")
        with open(path) as f:
            rec = json.load(f)
        write_views(args.replot, rec["summary"], rec["meta"])
        return 0
    try:
        shapes = [parse_shape(s) for s in args.shapes.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    if not 0.0 < args.p < 1.0:
        ap.error(f"--p: expected a dropout probability in (0, 1), got {args.p}")
    if args.rounds < 1:
        ap.error(f"--rounds: expected at least 1, got {args.rounds}")
    if not args.floor_only and not args.out:
        ap.error("--out is required (or --floor-only)")
    import torch

    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    floor = Floor()
    if args.floor_only:
        for B, H, N, _ in shapes:
            for key in NAMES:
                print(f"B{B} H{H} N{N} {NAMES[key]}: kept {floor.count(key, B * H, N, args.p)}", flush=True)
        return 0

    from tqdm.auto import tqdm

    from benchmarks import measure, report, variants
    from flash_attention_py.inputs import make_inputs

    meta = report.environment("cuda", argv)
    meta["command"] = "python tools/philox_floor.py " + " ".join(argv)
    meta.update(rounds=args.rounds, dropout_p=args.p, seed=SEED, kernels={NAMES[k]: list(k) for k in NAMES})
    by_name = variants.targets()
    names = variants.OURS + variants.ALTERNATIVES["dropout"]
    floors, attention, problems = [], [], []
    for B, H, N, D in tqdm(shapes, desc="philox floor", disable=args.no_progress):
        scores = B * H * N * N
        counts = {key: floor.count(key, B * H, N, args.p) for key in NAMES}
        problems += [f"B{B} H{H} N{N}: {s}" for s in check_counts(counts, scores, args.p)]
        calls = {key: floor.launcher(key, B * H, N, args.p) for key in NAMES}
        ms = {key: [] for key in NAMES}
        for _ in range(args.rounds):  # every kernel once a round, in turn
            for key, call in calls.items():
                ms[key].append(measure.time_call(call, device="cuda")[0])
        for key, t in ms.items():
            med = statistics.median(t)
            floors.append(dict(B=B, H=H, N=N, D=D, form=key[0], NT=key[1], min_blocks=key[2], kernel=NAMES[key],
                               scores=scores, kept=counts[key], time_ms=med, round_ms=t, ps_per_score=med * 1e9 / scores))
            print(f"floor B{B} H{H} N{N} {NAMES[key]:>24}: {med:.3f} ms ({med * 1e9 / scores:.2f} ps a score), "
                  f"kept {counts[key]} of {scores}", flush=True)
        x = make_inputs(B, H, N, N, D, dtype="float16", device="cuda", draw="device")
        for mode in ("fwd", "bwd"):
            case = variants._case("dropout", "dropout", B, H, H, N, D, False, mode, p=args.p)
            rows = variants.run_case(case, names, by_name, "cuda", x, repeats=10, rounds=args.rounds)
            for r in rows:
                r.pop("_out", None)
                if r["status"] == "ok":
                    print(f"{mode} B{B} H{H} N{N} D{D} {r['backend']:>15}: {r['time_ms']:.3f} ms", flush=True)
            attention += rows
        del x
        torch.cuda.empty_cache()
    summary = summarise(floors, attention)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "philox_floor.json"), "w") as f:
        json.dump(dict(meta=meta, floors=floors, attention=attention, summary=summary, problems=problems), f,
                  indent=1, default=str)
    write_views(args.out, summary, meta)
    print(markdown(summary, meta))
    for s in problems:
        print("PROBLEM:", s, file=sys.stderr)
    return 1 if problems else 0


def summarise(floors, attention) -> list:
    """One entry a shape: each form's floor (its fastest kernel), the best SDPA kernel with dropout and ours, forward
    and backward, and the most a kernel under the rule could reach against SDPA (SDPA's time over the rule's floor)."""
    out = []
    for key in dict.fromkeys((f["B"], f["H"], f["N"], f["D"]) for f in floors):
        mine = [f for f in floors if (f["B"], f["H"], f["N"], f["D"]) == key]
        best = {form: min((f for f in mine if f["form"] == form), key=lambda f: f["time_ms"]) for form in FORMS}
        fl = best["rule"]
        e = dict(B=fl["B"], H=fl["H"], N=fl["N"], D=fl["D"], scores=fl["scores"],
                 floor_ms={form: f["time_ms"] for form, f in best.items()},
                 floor_kernel={form: f["kernel"] for form, f in best.items()})
        for mode in ("fwd", "bwd"):
            rows = [r for r in attention if (r["B"], r["Hq"], r["N"], r["D"]) == key and r["mode"] == mode
                    and r["status"] == "ok"]
            alt = [r for r in rows if not r["ours"]]
            top = min(alt, key=lambda r: r["time_ms"]) if alt else None
            e[mode] = dict(best_alternative=top["backend"] if top else None,
                           best_alternative_ms=top["time_ms"] if top else None,
                           ours_ms={r["backend"]: r["time_ms"] for r in rows if r["ours"]},
                           reach=top["time_ms"] / fl["time_ms"] if top else None)
        out.append(e)
    return out


def write_views(out, summary, meta) -> None:
    """philox_floor.md and philox_floor.png in ``out`` from the summary."""
    with open(os.path.join(out, "philox_floor.md"), "w") as f:
        f.write(markdown(summary, meta))
    plot(summary, meta, os.path.join(out, "philox_floor.png"))


def plot(summary, meta, path) -> None:
    """One panel a pass (forward, backward): per shape, horizontal bars of the rule's floor, FA2's rate, the best
    SDPA kernel with dropout and ours, in ms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [("the rule alone (floor)", lambda e, m: e["floor_ms"]["rule"], "#4c4c4c"),
            ("FA2's rate alone", lambda e, m: e["floor_ms"]["fa2-rate"], "#a0a0a0"),
            ("best SDPA with dropout", lambda e, m: m["best_alternative_ms"], "#1f77b4"),
            ("cuda-wgmma-ws", lambda e, m: m["ours_ms"].get("cuda-wgmma-ws"), "#d62728"),
            ("triton", lambda e, m: m["ours_ms"].get("triton"), "#ff7f0e")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 1.2 + 1.6 * len(summary)), sharey=True)
    for ax, mode, title in zip(axes, ("fwd", "bwd"), ("forward", "backward")):
        for k, e in enumerate(summary):
            for b, (label, value, color) in enumerate(bars):
                v = value(e, e[mode])
                if v is None:
                    continue
                y = k * (len(bars) + 1) + b
                ax.barh(y, v, color=color, label=label if k == 0 else None)
                ax.text(v, y, f" {v:.2f}", va="center", fontsize=7)
        ax.set_title(f"{title}: ms, p = {meta['dropout_p']}")
        ax.set_xlabel("ms (lower is faster)")
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.15)
    ticks = [k * (len(bars) + 1) + (len(bars) - 1) / 2 for k in range(len(summary))]
    axes[0].set_yticks(ticks, [f"B{e['B']} H{e['H']}\nN{e['N']} D{e['D']}" for e in summary])
    axes[0].invert_yaxis()
    axes[1].legend(loc="lower right", fontsize=7)
    fig.suptitle(f"Dropout's keep decisions alone against whole attention calls ({meta.get('gpu', 'GPU')})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(summary, meta) -> str:
    """The record's table: per shape and mode, the floors, the best SDPA kernel, ours, and SDPA over the floor."""
    lines = [f"# Dropout's floor: the keep decisions alone ({meta.get('gpu', 'GPU')}, commit "
             f"{meta.get('git_commit', '?')})", "",
             f"`{meta['command']}`; p = {meta['dropout_p']}, fp16, not causal, the median of {meta['rounds']} rounds; "
             "each floor is its form's fastest kernel.", "",
             "| shape | scores | rule (ms) | score by score (ms) | FA2's rate (ms) | mode | best SDPA (ms) | "
             "cuda-wgmma-ws (ms) | triton (ms) | SDPA / rule's floor |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]

    def ms(x):
        return "–" if x is None else f"{x:.3f}"
    for e in summary:
        for mode in ("fwd", "bwd"):
            m = e[mode]
            lines.append(f"| B{e['B']} H{e['H']} N{e['N']} D{e['D']} | {e['scores'] / 1e9:.2f}e9 | "
                         f"{ms(e['floor_ms']['rule'])} | {ms(e['floor_ms']['score-by-score'])} | "
                         f"{ms(e['floor_ms']['fa2-rate'])} | {mode} | {ms(m['best_alternative_ms'])} "
                         f"({m['best_alternative']}) | {ms(m['ours_ms'].get('cuda-wgmma-ws'))} | "
                         f"{ms(m['ours_ms'].get('triton'))} | "
                         f"{'–' if m['reach'] is None else format(m['reach'], '.2f') + '×'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
