"""Generate every table of recorded figures in the docs from the result files, and check the figures quoted in prose.

    python tools/docs_tables.py            # rewrite every generated table in place
    python tools/docs_tables.py --check    # change nothing; list stale tables and prose figures, exit 1 if any

A generated table sits between two markers in a Markdown page (README.md, docs/*.md, docs/zh/*.md,
docs/results/*/README.md, benchmarks/README.md):

    <!-- BEGIN GENERATED: fa2-forward -->
    ... rewritten from docs/results/** by this script ...
    <!-- END GENERATED: fa2-forward -->

The name picks a function of TABLES below; pages under docs/zh/ get the same numbers with Chinese column
headers. A figure quoted in prose is listed in PROSE: (page, text built from the result files); --check
fails when the page no longer contains that text (white space aside), i.e. when the page or the result file changed
without the other. Every figure comes from the JSON files under docs/results/ (the .md tables beside them
are written by the benchmark scripts from the same JSON).
"""
from __future__ import annotations

import argparse
import csv
import difflib
import glob
import json
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE_GLOBS = ("README.md", "docs/*.md", "docs/zh/*.md", "docs/results/*/README.md", "benchmarks/README.md")
# a block may be indented (a table inside a list item): the generated lines get the BEGIN marker's indent
MARKER = re.compile(r"^([ \t]*)(<!-- BEGIN GENERATED: ([\w.-]+) -->\n)(.*?)^([ \t]*<!-- END GENERATED: \3 -->)",
                    re.S | re.M)
DASH = "–"


# ------------------------------------------------------------------------------------ result files
class Results:
    """The recorded result files under ``root``/docs/results, loaded on first use."""

    def __init__(self, root):
        self.root, self._cache = root, {}

    def json(self, rel):
        if rel not in self._cache:
            with open(os.path.join(self.root, "docs", "results", rel)) as f:
                self._cache[rel] = json.load(f)
        return self._cache[rel]

    def text(self, rel):
        with open(os.path.join(self.root, "docs", "results", rel)) as f:
            return f.read()

    # the files
    def ladder(self):
        return self.json("cuda/cuda_ladder.json")["rows"]

    def backward(self):
        return self.json("cuda/cuda_backward.json")["rows"]

    def triton(self):
        return self.json("triton/triton_vs_fa2.json")["rows"]

    def bench(self, run):
        return self.json(f"benchmark/{run}/results.json")

    def cpu(self):
        return self.json("cpu/measurements.json")


# ------------------------------------------------------------------------------------ formatting
def f0(x):
    return f"{x:.0f}"


def f2(x):
    return f"{x:.2f}"


def g3(x):
    return f"{x:.3g}"


def span(values, fmt=f0, unit=""):
    """'lo–hi' (or one value when they agree after formatting)."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}{DASH}{hi}{unit}"


def table(header, rows, right=()):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def H(lang, en, zh):
    """A column header in the page's language."""
    return zh if lang == "zh" else en


def shape(r):
    return f"B={r['B']} H={r['H']} D={r['D']}"


# ------------------------------------------------------------------------------------ derived figures
def ladder_stats(R):
    rows = R.ladder()
    wg = [r["wgmma_vs_fa2"] for r in rows]
    mma = [r["mma_vs_fa2"] for r in rows]
    slow = [r for r in rows if r.get("tiled_tflops") is not None]
    return dict(
        n=len(rows),
        wg_ratio=span(wg, f2, "×"), wg_tflops=span([r["wgmma_tflops"] for r in rows]),
        wg_median=f2(statistics.median(wg)) + "×",
        mma_ratio=span(mma, f2, "×"), mma_tflops=span([r["mma_tflops"] for r in rows]),
        mma_at_least_1=sum(1 for x in mma if x >= 1.0),
        tiled_ratio=span([r["tiled_tflops"] / r["fa2_tflops"] for r in slow], f2, "×"),
        tiled_tflops=span([r["tiled_tflops"] for r in slow], lambda x: f"{x:.1f}"),
        naive_ratio=span([r["naive_tflops"] / r["fa2_tflops"] for r in slow], f2, "×"),
        naive_tflops=span([r["naive_tflops"] for r in slow], lambda x: f"{x:.1f}"),
        naive_tflops_d128=span([r["naive_tflops"] for r in slow if r["D"] == 128], lambda x: f"{x:.1f}"),
        mma_over_tiled=span([r["mma_tflops"] / r["tiled_tflops"] for r in slow], f0, ""),
        wg_over_mma=span([r["wgmma_tflops"] / r["mma_tflops"] for r in rows], lambda x: f"{x:.1f}", ""),
    )


def fa2_agreement(R):
    """The largest relative difference, in whole per cent rounded up, between the FA2 figures of the CUDA
    ladder run and of the Triton run at the same shapes."""
    tri = {(r["B"], r["H"], r["D"], r["N"], r["causal"]): r for r in R.triton() if r["mode"] == "fwd"}
    worst = max(abs(r["fa2_tflops"] / tri[(r["B"], r["H"], r["D"], r["N"], r["causal"])]["fa2_tflops"] - 1)
                for r in R.ladder())
    return int(-(-worst * 100 // 1))


def backward_stats(R):
    rows = R.backward()
    tiled = [r["tiled_tflops"] for r in rows if r.get("tiled_tflops") is not None]
    return dict(ratio=span([r["mma_vs_fa2"] for r in rows], f2, "×"),
                tflops=span([r["mma_tflops"] for r in rows]),
                tiled=span(tiled, lambda x: f"{x:.1f}"))


def triton_stats(R):
    rows = R.triton()
    big = [r for r in rows if r["N"] >= 2048]
    fwd = [r for r in big if r["mode"] == "fwd"]
    bwd = [r for r in big if r["mode"] == "bwd"]
    small_bwd = [r for r in rows if r["N"] < 2048 and r["mode"] == "bwd"]
    return dict(fwd_ratio=span([r["vs_fa2"] for r in fwd], f2, "×"), fwd_tflops=span([r["triton_tflops"] for r in fwd]),
                bwd_ratio=span([r["vs_fa2"] for r in bwd], f2, "×"),
                small_bwd_ratio=span([r["vs_fa2"] for r in small_bwd], f2, "×"),
                fwd_vs_cudnn=span([r["vs_cudnn"] for r in fwd], f2, "×"),
                bwd_vs_cudnn=span([r["vs_cudnn"] for r in bwd], f2, "×"),
                all_vs_cudnn=span([r["vs_cudnn"] for r in big], f2, "×"))


def bench_row(R, run, backend, dtype, N, mode="fwd", causal=False):
    for r in R.bench(run)["results"]:
        if (r["backend"], r["dtype"], r["Nk"], r["Nq"], r["mode"], r["causal"]) == (backend, dtype, N, N, mode, causal):
            return r
    raise KeyError(f"{run}: no row {backend} {dtype} N={N} {mode} causal={causal}")


def pytest_summary(R, rel):
    """(passed, skipped) from the last line of a pytest log (0 skipped where the line names none)."""
    last = [line for line in R.text(rel).splitlines() if " passed" in line][-1]
    passed = int(re.search(r"(\d+) passed", last).group(1))
    skipped = re.search(r"(\d+) skipped", last)
    return passed, int(skipped.group(1)) if skipped else 0


def launch_overhead(R, path="cuda/launch_overhead.txt"):
    """Host microseconds per call by line name; a causal backward's name ends in ' backward (causal)'."""
    out = {}
    for line in R.text(path).splitlines():
        m = re.match(r"^((?:sdpa FLASH_ATTENTION \(FA2\)|flash_attn_cuda kernel=[\w-]+|flash_attn_triton)"
                     r"(?: backward \(causal\))?)\s+([\d.]+)$", line.strip())
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


# ------------------------------------------------------------------------------------ tables
SEED_ROWS = [  # (backend, dtype, English label, Chinese label)
    ("naive-torch", "float16", "naive-torch (standard attention)", "naive-torch（标准注意力）"),
    ("naive-torch", "float32", "naive-torch (standard attention)", "naive-torch（标准注意力）"),
    ("torch-split", "float16", "torch-split (Python loop over tiles)", "torch-split（Python 分块循环）"),
    ("cuda-naive", "float32", "cuda-naive (one thread per row)", "cuda-naive（每行一个线程）"),
    ("cuda-tiled", "float32", "cuda-tiled (block-cooperative)", "cuda-tiled（线程块协作）"),
    ("cuda-mma", "float16", "cuda-mma (tensor cores, mma.sync)", "cuda-mma（张量核心，mma.sync）"),
    ("cuda-wgmma", "float16", "cuda-wgmma (Hopper tensor cores, wgmma)", "cuda-wgmma（Hopper 张量核心，wgmma）"),
    ("triton", "float16", "triton", "triton"),
    ("sdpa-flash", "float16", "SDPA FLASH_ATTENTION (FlashAttention-2)", "SDPA FLASH_ATTENTION（FlashAttention-2）"),
    ("sdpa-cudnn", "float16", "SDPA CUDNN_ATTENTION", "SDPA CUDNN_ATTENTION"),
]
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}


def t_h100_seed(R, lang):
    """The seeds' configuration on the H100, forward, not causal (docs/results/benchmark/h100-seed)."""
    rows = []
    for backend, dtype, en, zh in SEED_ROWS:
        r = bench_row(R, "h100-seed", backend, dtype, 1024)
        x = r["speedup_vs_naive"]
        x_text = (f"{x:.2f}" if x >= 0.1 else f"{x:.1g}") if x is not None else ""
        if dtype != "float16" and backend != "naive-torch":
            x_text += H(lang, " (vs naive fp32)", "（相对 naive fp32）")
        rows.append([zh if lang == "zh" else en, SHORT_DTYPE[dtype], g3(r["time_ms"]), g3(r["tflops"]),
                     g3(r["mem_extra_mb"]), x_text])
    header = [H(lang, "backend", "后端"), H(lang, "dtype", "数据类型"), H(lang, "time (ms)", "时间 (ms)"), "TFLOP/s",
              H(lang, "peak memory above inputs (MiB)", "输入之外的峰值内存 (MiB)"), H(lang, "× naive", "× naive")]
    return table(header, rows, right={2, 3, 4, 5})


def t_fa2_forward(R, lang):
    """Forward TFLOP/s at N = 2048 and 16384: FA2 and cuDNN (Triton run), triton, cuda-wgmma, cuda-mma."""
    tri = {(r["B"], r["H"], r["D"], r["N"], r["causal"]): r for r in R.triton() if r["mode"] == "fwd"}
    lad = {(r["B"], r["H"], r["D"], r["N"], r["causal"]): r for r in R.ladder()}
    rows = []
    for (B, Hh, D) in sorted({k[:3] for k in lad}, key=lambda s: s[2]):
        for causal in (False, True):
            for i, N in enumerate((2048, 16384)):
                t, c = tri[(B, Hh, D, N, causal)], lad[(B, Hh, D, N, causal)]
                label = ""
                if i == 0:
                    label = f"B={B} H={Hh} D={D}, " + (H(lang, "causal", "因果") if causal else H(lang, "not causal", "非因果"))
                rows.append([label, N, f0(t["fa2_tflops"]), f0(t["cudnn_tflops"]), f0(t["triton_tflops"]),
                             f0(c["wgmma_tflops"]), f0(c["mma_tflops"])])
    header = [H(lang, "shape", "形状"), "N", "FA2", "cuDNN", "triton", "cuda-wgmma", "cuda-mma"]
    return table(header, rows, right={1, 2, 3, 4, 5, 6})


def t_gpu_summary(R, lang):
    """README: forward fp16 against FA2 on the H100, per fast backend."""
    L, T = ladder_stats(R), triton_stats(R)
    rows = [
        ["`cuda-wgmma` " + H(lang, "(Hopper `wgmma`, asynchronous products)", "（Hopper `wgmma`，异步乘积）"),
         L["wg_ratio"], L["wg_tflops"]],
        ["`triton`", T["fwd_ratio"], T["fwd_tflops"]],
        ["`cuda-mma` " + H(lang, "(`mma.sync`, FA2's own instruction)", "（`mma.sync`，FA2 自己用的指令）"),
         L["mma_ratio"], L["mma_tflops"]],
    ]
    return table([H(lang, "backend", "后端"), H(lang, "vs FA2", "相对 FA2"), "TFLOP/s"], rows)


H200_HOPPER = "benchmark/h200-hopper/hopper_summary.json"
# the README's order: the fastest of ours first, then the other rungs, then the two references
GPU_NOW_BACKENDS = (("cuda-wgmma-ws", "TMA producer, ping-pong consumers, persistent", "TMA 生产者、乒乓消费者、常驻网格"),
                    ("cuda-wgmma", "Hopper `wgmma`, asynchronous products", "Hopper `wgmma`，异步乘积"),
                    ("triton", "", ""),
                    ("cuda-mma", "`mma.sync`, FA2's instruction", "`mma.sync`，FA2 的指令"),
                    ("sdpa-cudnn", "cuDNN, the reference", "cuDNN，参照"),
                    ("sdpa-flash", "FlashAttention-2, the reference", "FlashAttention-2，参照"))


def t_gpu_now(R, lang):
    """README: every GPU backend on the H200 hopper record at N >= 4096, forward and backward: TFLOP/s, x FA2, x cuDNN."""
    rows = [r for r in R.json(H200_HOPPER)["rows"] if r["N"] >= 4096]
    out = []
    for name, en, zh in GPU_NOW_BACKENDS:
        cells = [f"`{name}`" + (f" ({en})" if lang != "zh" and en else f"（{zh}）" if zh else "")]
        for mode in ("fwd", "bwd"):
            sel = [r["tflops"] for r in rows if r["mode"] == mode]
            cells += [span([t[name] for t in sel]), span([t[name] / t["sdpa-flash"] for t in sel], f2, "×"),
                      span([t[name] / t["sdpa-cudnn"] for t in sel], f2, "×")]
        out.append(cells)
    header = [H(lang, "backend", "后端"), H(lang, "forward TFLOP/s", "前向 TFLOP/s"), H(lang, "× FA2", "× FA2"),
              H(lang, "× cuDNN", "× cuDNN"), H(lang, "backward TFLOP/s", "反向 TFLOP/s"), H(lang, "× FA2", "× FA2"),
              H(lang, "× cuDNN", "× cuDNN")]
    return table(header, out)


def t_cuda_ladder(R, lang):
    """Every row of cuda_ladder.json."""
    rows = []
    for r in R.ladder():
        slow = r.get("tiled_tflops") is not None
        rows.append([r["B"], r["H"], r["D"], r["N"], r["causal"], f"{r['fa2_tflops']:.1f}",
                     f"{r['wgmma_tflops']:.1f}", f"{r['wgmma_vs_fa2']:.2f}x", f"{r['mma_tflops']:.1f}",
                     f"{r['mma_vs_fa2']:.2f}x", f"{r['tiled_tflops']:.2f}" if slow else DASH,
                     f"{r['naive_tflops']:.2f}" if slow else DASH])
    header = ["B", "H", "D", "N", H(lang, "causal", "因果"), "FA2", "wgmma", "wgmma / FA2", "mma", "mma / FA2",
              "tiled", "naive"]
    return table(header, rows)


def t_cuda_ladder_summary(R, lang):
    L = ladder_stats(R)
    n = L["n"]
    rows = [
        ["wgmma", "`wgmma.mma_async` (Hopper, sm_90a)", f"**{L['wg_ratio']}** ({H(lang, 'median', '中位数')} {L['wg_median']})",
         L["wg_tflops"]],
        ["mma", "`mma.sync.m16n8k16` (sm_80+)",
         f"{L['mma_ratio']} (" + H(lang, f"≥ 1.0× on {L['mma_at_least_1']} of {n}",
                                   f"{n} 个中有 {L['mma_at_least_1']} 个 ≥ 1.0×") + ")",
         L["mma_tflops"]],
        ["tiled", "fp32 FFMA", L["tiled_ratio"], L["tiled_tflops"]],
        ["naive", "fp32 FFMA", L["naive_ratio"], L["naive_tflops"]],
    ]
    header = [H(lang, "rung", "阶梯"), H(lang, "instruction", "指令"), H(lang, f"vs FA2, {n} shapes", f"相对 FA2，{n} 个形状"),
              "TFLOP/s"]
    return table(header, rows)


def t_cuda_backward(R, lang):
    rows = []
    for r in R.backward():
        d = r["max_abs_vs_fa2"]
        rows.append([r["B"], r["H"], r["D"], r["N"], r["causal"], f"{r['fa2_tflops']:.1f}", f"{r['mma_tflops']:.1f}",
                     f"{r['mma_vs_fa2']:.2f}x", f"{r['tiled_tflops']:.2f}" if r.get("tiled_tflops") is not None else DASH,
                     f"{d['dq']:.1e}, {d['dk']:.1e}, {d['dv']:.1e}"])
    header = ["B", "H", "D", "N", H(lang, "causal", "因果"), "FA2", "mma", "mma / FA2", "tiled",
              H(lang, "max-abs diff vs FA2 (dq, dk, dv)", "与 FA2 的最大绝对差 (dq, dk, dv)")]
    return table(header, rows)


def t_triton_perf(R, lang):
    """Triton / FA2 / cuDNN TFLOP/s per shape, mode and N, with the ratio to FA2 against its target."""
    rows_by = {}
    for r in R.triton():
        rows_by.setdefault((r["B"], r["H"], r["D"], r["mode"], r["causal"]), []).append(r)
    Ns = sorted({r["N"] for r in R.triton()})
    names = {("fwd", False): H(lang, "fwd full", "前向 非因果"), ("fwd", True): H(lang, "fwd causal", "前向 因果"),
             ("bwd", True): H(lang, "bwd causal", "反向 因果"), ("bwd", False): H(lang, "bwd full", "反向 非因果")}
    out = []
    for key in sorted(rows_by, key=lambda k: (-k[1], k[2], k[3] != "fwd", k[4])):
        B, Hh, D, mode, causal = key
        rs = {r["N"]: r for r in rows_by[key]}
        label = names[(mode, causal)]
        if not out:
            label += H(lang, ", Triton / FA2 / cuDNN", "，Triton / FA2 / cuDNN")
        out.append([f"B{B} H{Hh} D{D}", label] + [
            f"{r['triton_tflops']:.0f} / {r['fa2_tflops']:.0f} / {r['cudnn_tflops']:.0f}" if r else ""
            for r in (rs.get(N) for N in Ns)])
        ratios = []
        for N in Ns:
            r = rs.get(N)
            if r is None:
                ratios.append("")
                continue
            text = f"{r['vs_fa2']:.2f}"
            if r.get("target") is not None:
                text = f"**{text}**" if r.get("meets_target") else f"**{text} ({H(lang, 'missed', '未达到')})**"
            ratios.append(text)
        out.append(["", "×FA2"] + ratios)
    header = [H(lang, "shape", "形状"), H(lang, "mode", "模式")] + [f"N={Ns[0]}"] + [str(N) for N in Ns[1:]]
    return table(header, out)


ACCURACY_DTYPES = (("float16", "float16"), ("bfloat16", "bfloat16"), ("float32", "float32 (3xTF32)"))


def t_triton_accuracy(R, lang):
    """Worst errors of the Triton backend on the GPU (docs/results/triton/gpu_errors.json)."""
    errs = {(e["dtype"], e["quantity"]): e for e in R.json("triton/gpu_errors.json") if e["backend"] == "triton"}
    rows = []
    for dtype, label in ACCURACY_DTYPES:
        if (dtype, "o") not in errs:
            continue
        rows.append([label] + [f"{errs[(dtype, q)]['max_abs']:.1e}" for q in ("o", "lse", "dq", "dk", "dv")]
                    + [f"{errs[(dtype, 'o')]['naive_max_abs']:.1e}"])
    header = [H(lang, "dtype", "数据类型"), H(lang, "O max-abs", "O 最大绝对误差"), "lse", "dQ", "dK", "dV",
              H(lang, "naive (same dtype) O max-abs", "同 dtype 朴素实现 O 最大绝对误差")]
    return table(header, rows)


def t_triton_n1024(R, lang):
    """The N = 1024 causal-backward diagnostics of the Triton run (JSON meta.diagnostics)."""
    diag = R.json("triton/triton_vs_fa2.json")["meta"]["diagnostics"]
    tri = {r["N"]: r for r in R.triton() if r["mode"] == "bwd" and r["D"] == 64}
    names = ("triton", "fa2", "cudnn")

    def us(x):
        return f"{x:.0f} µs"

    def attn_kernels(name):
        k = diag[name]["kernels_bwd_causal_B4H32D64_N1024"]
        parts = {n: t for n, t in k.items() if t > 0 and "elementwise" not in n}
        return sum(parts.values())

    rows = [
        [H(lang, "summed GPU kernel time per call (torch.profiler), B4 H32 D64", "每次调用的 GPU kernel 时间之和（torch.profiler），B4 H32 D64")]
        + [us(diag[n]["gpu_us_bwd_causal_B4H32D64_N1024"]) for n in names],
        [H(lang, "of which not elementwise copies (the attention kernels)", "其中非逐元素拷贝（注意力 kernel 本身）")]
        + [us(attn_kernels(n)) for n in names],
        [H(lang, "summed GPU kernel time per call, B4 H16 D128", "每次调用的 GPU kernel 时间之和，B4 H16 D128")]
        + [us(diag[n]["gpu_us_bwd_causal_B4H16D128_N1024"]) for n in names],
        [H(lang, "host time per backward call (tiny problem, CPU-bound)", "每次反向调用的主机时间（极小问题，受 CPU 限制）")]
        + [us(diag[n]["host_us_per_call_bwd_tiny"]) for n in names],
        [H(lang, "do_bench median, B4 H32 D64", "do_bench 中位数，B4 H32 D64")]
        + [us(tri[1024][f"{n}_ms"] * 1e3) for n in names],
    ]
    return table([H(lang, "N = 1024, causal backward", "N = 1024，因果反向"), "Triton", "FA2", "cuDNN"], rows)


def t_cpu_memory(R, lang):
    """Peak Python-tracked memory of NumPy standard attention against flash_attn_numpy (M1)."""
    rows = [[r["N"], f"{r['standard_mib']:.1f} MiB", f"{r['flash_numpy_mib']:.2f} MiB"] for r in R.cpu()["memory"]]
    return table(["N", H(lang, "standard attention peak", "标准注意力峰值"),
                  H(lang, "`flash_attn_numpy` peak (Br = Bc = 64)", "`flash_attn_numpy` 峰值（Br = Bc = 64）")], rows)


def t_cpu_accuracy(R, lang):
    """Errors against the float64 reference on the CPU, per dtype (M7)."""
    acc = {(r["dtype"], r["function"]): r for r in R.cpu()["accuracy"]["rows"]}
    rows = []
    for dtype in ("float16", "bfloat16", "float32"):
        cells = []
        for fn in ("attention_naive", "flash_attn_torch", "flash_attn_numpy"):
            r = acc.get((dtype, fn))
            if r is None:
                cells.append("—")
            elif not rows and fn == "attention_naive":
                cells.append(H(lang, f"max-abs {r['max_abs']:.2e}, rel-norm {r['rel_norm']:.1e}",
                               f"最大绝对误差 {r['max_abs']:.2e}，相对范数误差 {r['rel_norm']:.1e}"))
            else:
                cells.append(f"{r['max_abs']:.1e}, {r['rel_norm']:.1e}")
        rows.append([SHORT_DTYPE[dtype]] + cells)
    return table([H(lang, "dtype", "数据类型"), H(lang, "standard attention in that dtype", "同 dtype 的标准注意力"),
                  "`flash_attn_torch`", "`flash_attn_numpy`"], rows)


# ------------------------------------------------------------------------------------ the Hopper table, profiles, variants
def _hopper(R):
    return R.json("cuda/hopper_summary.json")["rows"]


def _ratio_span(rows, num, den, pick=max):
    """span of (best of ``num`` backends) / ``den`` over ``rows`` (None where a figure is missing)."""
    vals = []
    for r in rows:
        t = r["tflops"]
        mine = [t[n] for n in num if t.get(n)]
        if mine and t.get(den):
            vals.append(pick(mine) / t[den])
    return vals


OURS_FWD = ("triton", "cuda-wgmma-ws", "cuda-wgmma")  # our fastest forwards on a Hopper


def _verdict(lang, vals, target):
    """'met', or by how much the worst of ``vals`` falls short of ``target``."""
    lo = min(vals)
    if lo >= target:
        return H(lang, "met", "达到")
    digits = 2 if round(target - lo, 2) > 0 else 3  # a shortfall under 0.005 is shown, not rounded to 0.00
    return H(lang, f"no: {lo:.{digits}f}× at worst, {target - lo:.{digits}f} short",
             f"否：最差 {lo:.{digits}f}×，差 {target - lo:.{digits}f}")


def _preset_targets(R, path, lang):
    """The targets one run of the hopper preset decides (``path``: its hopper_summary.json): the forward against
    cuDNN, the stretch, the CUDA backward against FA2 and cuDNN, Triton's backward, and N = 1024 per backend."""
    summary = R.json(path)
    rows = summary["rows"]
    big = [r for r in rows if r["N"] >= 4096]
    fwd, bwd = [r for r in big if r["mode"] == "fwd"], [r for r in big if r["mode"] == "bwd"]
    small = [r for r in rows if r["N"] == 1024]
    out = []
    ours_fwd = _ratio_span(fwd, OURS_FWD, "sdpa-cudnn")
    n, spread = summary.get("rounds", 1), summary.get("round_order") == "run"
    out.append([H(lang, "forward, best of ours ≥ 1.0× cuDNN (D 64/128, N ≥ 4096, fp16/bf16, causal and not)"
                        + ("" if n == 1 else f", {n} rounds {'over the whole run' if spread else 'in turn'}"),
                  "前向，我们最快者 ≥ 1.0× cuDNN（D 64/128，N ≥ 4096，fp16/bf16，因果与否）"
                  + ("" if n == 1 else (f"，{n} 轮分布于整个运行" if spread else f"，依次 {n} 轮"))),
                span(ours_fwd, f2, "×"), _verdict(lang, ours_fwd, 1.0)])
    d128 = [r for r in fwd if r["D"] == 128 and r["dtype"] == "float16" and not r["causal"]]
    best = max(max(r["tflops"].get(n) or 0 for n in OURS_FWD) for r in d128)
    out.append([H(lang, "stretch: 648 TFLOP/s forward at D128 fp16, not causal (FlashAttention-3's paper)",
                  "延伸目标：D128 fp16 非因果前向 648 TFLOP/s（FlashAttention-3 论文）"),
                f"{best:.0f} TFLOP/s", H(lang, f"no: {best / 648:.2f}× of it", f"否：为其 {best / 648:.2f}×")])
    cb_fa2 = _ratio_span(bwd, ("cuda-wgmma",), "sdpa-flash")
    cb_cudnn = _ratio_span(bwd, ("cuda-wgmma",), "sdpa-cudnn")
    out.append([H(lang, "CUDA backward ≥ 1.2× FA2 (N ≥ 4096)", "CUDA 反向 ≥ 1.2× FA2（N ≥ 4096）"),
                span(cb_fa2, f2, "×"), _verdict(lang, cb_fa2, 1.2)])
    out.append([H(lang, "CUDA backward ≥ 0.8× cuDNN (N ≥ 4096)", "CUDA 反向 ≥ 0.8× cuDNN（N ≥ 4096）"),
                span(cb_cudnn, f2, "×"), _verdict(lang, cb_cudnn, 0.8)])
    tb = _ratio_span(bwd, ("triton",), "sdpa-flash")
    out.append([H(lang, "(Triton backward against FA2, N ≥ 4096, for comparison)", "（Triton 反向相对 FA2，N ≥ 4096，作对照）"),
                span(tb, f2, "×"), ""])
    for name in ("triton", "cuda-wgmma-ws", "cuda-wgmma", "cuda-mma"):
        vals = _ratio_span(small, (name,), "sdpa-flash")
        if not vals:  # a rung the record predates
            continue
        below = sum(v < 1.0 for v in vals)
        out.append([H(lang, f"N = 1024: {name} ≥ 1.0× FA2, forward and backward, causal and not",
                      f"N = 1024：{name} ≥ 1.0× FA2，前向与反向，因果与否"),
                    span(vals, f2, "×"), H(lang, "met", "达到") if not below else
                    H(lang, f"no: {below} of {len(vals)} cases below 1.0×", f"否：{len(vals)} 个中 {below} 个低于 1.0×")])
    return out


TARGETS_HEADER = (("target", "目标"), ("measured", "实测"), ("met?", "达到？"))


def _rounds_target(R, lang, path):
    """The forward target's row from a rounds record (tools/forward_rounds.py) at ``path``."""
    rounds = _forward_rounds(R, path)
    return [H(lang, "the same, cuda-wgmma-ws beside FA2 and cuDNN alone, 3 rounds in turn, each with a whole "
                    "timing's budget (tools/forward_rounds.py)",
              "同上，只有 cuda-wgmma-ws、FA2 和 cuDNN，依次 3 轮，每轮都有一次完整计时的预算（tools/forward_rounds.py）"),
            span(rounds, f2, "×"), _verdict(lang, rounds, 1.0)]


def t_hopper_targets(R, lang):
    """The performance targets against the recorded Hopper table (docs/results/cuda/hopper_summary.json), with the
    rounds record, the head dims, the seeds' configuration and the host time."""
    out = _preset_targets(R, "cuda/hopper_summary.json", lang)
    out.insert(1, _rounds_target(R, lang, FORWARD_ROUNDS))
    out.append(_head_dim_target(lang))
    out += _seed_targets(R, lang)
    out.append(_host_time_target(R, lang))
    return table([H(lang, *h) for h in TARGETS_HEADER], out)


H200_HOPPER = "benchmark/h200-hopper/hopper_summary.json"  # the hopper preset on an H200 (commit 3f0431c)
FORWARD_ROUNDS = "cuda/forward_rounds/forward_rounds.json"  # tools/forward_rounds.py on an H100 (commit a15eac2)
FORWARD_ROUNDS_H200 = "cuda/forward_rounds_h200/forward_rounds.json"  # ... on an H200 (commit dd51fa5)


def t_hopper_targets_h200(R, lang):
    """The targets the hopper preset decides, from its run on an H200 (H200_HOPPER), with the H200's rounds record
    and the seeds' configuration there (benchmark/h200-seed, h200-seed-calling-thread: commit 04bf2ff, whose kernels
    are 345603b's; the mma forward and wgmma-ws's D = 128 forward changed since)."""
    out = _preset_targets(R, H200_HOPPER, lang)
    out.insert(1, _rounds_target(R, lang, FORWARD_ROUNDS_H200))
    out += _seed_targets(R, lang, "h200")
    return table([H(lang, *h) for h in TARGETS_HEADER], out)


def _forward_rounds(R, path=FORWARD_ROUNDS):
    """cuda-wgmma-ws's forward over cuDNN's in a rounds record (tools/forward_rounds.py), every row."""
    return [r["tflops"]["cuda-wgmma-ws"] / r["tflops"]["sdpa-cudnn"] for r in R.json(path)["rows"]]


def t_forward_rounds(R, lang):
    """The hopper preset's forward rows at N >= 4096 taken in rounds (tools/forward_rounds.py): TFLOP/s of the
    median of the rounds, and cuda-wgmma-ws over cuDNN."""
    out = []
    for r in R.json(FORWARD_ROUNDS)["rows"]:
        t = r["tflops"]
        out.append([{"float16": "fp16", "bfloat16": "bf16"}[r["dtype"]], r["D"], r["N"],
                    H(lang, "yes" if r["causal"] else "no", "是" if r["causal"] else "否"),
                    f0(t["sdpa-flash"]), f0(t["sdpa-cudnn"]), f0(t["cuda-wgmma-ws"]),
                    f"{f2(t['cuda-wgmma-ws'] / t['sdpa-cudnn'])}×"])
    header = [H(lang, "dtype", "类型"), "D", "N", H(lang, "causal", "因果"), "FA2", "cuDNN", "cuda-wgmma-ws",
              H(lang, "÷ cuDNN", "÷ cuDNN")]
    return table(header, out, right={4, 5, 6, 7})


def _rounds_text(R, path):
    vals = _forward_rounds(R, path)
    best = max(r["tflops"]["cuda-wgmma-ws"] for r in R.json(path)["rows"])
    return (f"{span(vals, f2, '×')} cuDNN, at or above 1.0× in {sum(v >= 1.0 for v in vals)} of {len(vals)} cases "
            f"(up to {best:.0f} TFLOP/s)")


def forward_rounds_figures(R):
    """The rounds records' figures quoted in prose (the H100's, and the H200's in performance.md)."""
    text, h200 = _rounds_text(R, FORWARD_ROUNDS), _rounds_text(R, FORWARD_ROUNDS_H200)
    return [("docs/performance.md", text), ("README.md", text), ("docs/results/cuda/README.md", text),
            ("docs/performance.md", h200), ("docs/results/cuda/README.md", h200)]


def _head_dim_target(lang):
    """Issue 16's head dims: 32, 64, 96, 128 and 256 compiled on every CUDA tensor-core kernel, forward and backward
    (the others padded), read from the capability tables (capabilities.TENSOR_CORE_HEAD_DIMS, BACKWARD_HEAD_DIMS)."""
    from flash_attention_cuda.capabilities import BACKWARD_HEAD_DIMS, TENSOR_CORE_HEAD_DIMS, TENSOR_CORE_KERNELS

    want = (32, 64, 96, 128, 256)
    dims = {k: tuple(TENSOR_CORE_HEAD_DIMS) for k in TENSOR_CORE_KERNELS}
    dims.update({f"{k} backward": tuple(v) for k, v in BACKWARD_HEAD_DIMS.items()})
    groups = {}
    for k, v in dims.items():
        groups.setdefault(v, []).append(k)
    measured = "; ".join(f"{', '.join(ks)}: {', '.join(map(str, v))}" for v, ks in groups.items())
    short = {k: [d for d in want if d not in v and d <= max(v)] for k, v in dims.items()}
    short = {k: v for k, v in short.items() if v}
    verdict = H(lang, "met", "达到") if not short else H(
        lang, "no: " + "; ".join(f"{k} pads {', '.join(map(str, v))}" for k, v in short.items()),
        "否：" + "；".join(f"{k} 对 {'、'.join(map(str, v))} 补零" for k, v in short.items()))
    return [H(lang, "head dims 32, 64, 96, 128 and 256 compiled on every CUDA tensor-core kernel, the others padded",
              "每个 CUDA tensor core 内核为 head 维度 32、64、96、128 和 256 编译，其余补零"), measured, verdict]


# the launch-overhead preset's latest record (cedd63f: C++ launch plans for the CUDA rungs and Triton, their autograd
# function timed in the backward, the forward lines on the public function itself): four runs with plans, each read
# against SDPA's FA2 of the same run (the machine's host was not steady between runs)
HOST_TIME_RECORDS = tuple(f"cuda/launch_overhead_public/run{i}_plans.txt" for i in (1, 3, 4, 5))


def _host_time_target(R, lang):
    """Issue 16's host time per call against SDPA's FA2: the CUDA rungs' and Triton's forward and causal backward
    (through autograd) at B=H=1 N=64 D=64 fp16, each over FA2's of the same mode in the same run, from every run
    of the launch-overhead preset's latest record ('met' only when none is slower)."""
    back = " backward (causal)"
    fa2 = "sdpa FLASH_ATTENTION (FA2)"
    us = {("cuda", False): [], ("cuda", True): [], ("triton", False): [], ("triton", True): [], ("fa2", False): [],
          ("fa2", True): []}
    ratios = {key: [] for key in us if key[0] != "fa2"}
    per_line = {key: {} for key in ratios}  # each line's ratios over the runs
    for path in HOST_TIME_RECORDS:
        host = launch_overhead(R, path)
        for name, value in host.items():
            bwd = name.endswith(back)
            who = "fa2" if name.startswith("sdpa") else "triton" if "triton" in name else "cuda"
            us[(who, bwd)].append(value)
            if who != "fa2":
                ratio = value / host[fa2 + (back if bwd else "")]
                ratios[(who, bwd)].append(ratio)
                per_line[(who, bwd)].setdefault(name, []).append(ratio)
    measured = H(lang, f"forward: CUDA rungs {span(us['cuda', False], f0)} µs, Triton {span(us['triton', False], f0)} "
                       f"(FA2 {span(us['fa2', False], f0)}); backward: CUDA rungs {span(us['cuda', True], f0)}, "
                       f"Triton {span(us['triton', True], f0)} (FA2 {span(us['fa2', True], f0)})",
                 f"前向：CUDA 各级 {span(us['cuda', False], f0)} µs，Triton {span(us['triton', False], f0)}"
                 f"（FA2 {span(us['fa2', False], f0)}）；反向：CUDA 各级 {span(us['cuda', True], f0)}，"
                 f"Triton {span(us['triton', True], f0)}（FA2 {span(us['fa2', True], f0)}）")
    parts = []
    for (who, bwd), vals in ratios.items():
        above = sum(v > 1.0 for v in vals)
        mode = ("backward" if bwd else "forward", "反向" if bwd else "前向")
        label = ("CUDA rungs" if who == "cuda" else "Triton", "CUDA 各级" if who == "cuda" else "Triton ")
        medians = [statistics.median(r) for r in per_line[(who, bwd)].values()]  # a line's typical run
        verdict = H(lang, "met" if not above else f"{above} of {len(vals)} above; each line's median over the runs "
                                                  f"{span(medians, f2)}×",
                    "达到" if not above else f"{len(vals)} 个中 {above} 个更慢；每一行在各次运行上的中位数为 "
                                           f"{span(medians, f2)}×")
        parts.append(H(lang, f"{label[0]} {mode[0]} {span(vals, f2)}× ({verdict})",
                       f"{label[1]}{mode[1]} {span(vals, f2)}×（{verdict}）"))
    met = all(v <= 1.0 for vals in ratios.values() for v in vals)
    verdict = H(lang, "met", "达到") if met else H(lang, "no: " + "; ".join(parts), "否：" + "；".join(parts))
    return [H(lang, "host time per call ≤ SDPA's FA2 (B=H=1 N=64 D=64 fp16; forward, and causal backward through "
                    "autograd; launch-overhead preset, each run against its own FA2)",
              "每次调用的主机时间 ≤ SDPA 的 FA2（B=H=1 N=64 D=64 fp16；前向，以及经 autograd 的因果反向；"
              "launch-overhead 预设，每次运行与同一次运行的 FA2 比）"),
            measured, verdict]


def _seed_targets(R, lang, gpu="h100"):
    """Issue 16's seeds' configuration rows (B8 H12 N1024 D64 fp16, {gpu}-seed), with the backward on the calling
    thread beside them ({gpu}-seed-calling-thread, --autograd-thread calling), for each rung."""
    def ratios(run, name, modes):
        return [bench_row(R, run, name, "float16", 1024, mode=m, causal=c)["tflops"]
                / bench_row(R, run, "sdpa-flash", "float16", 1024, mode=m, causal=c)["tflops"]
                for m in modes for c in (False, True)]

    out = []
    for name in ("triton", "cuda-wgmma-ws", "cuda-wgmma", "cuda-mma"):
        vals = ratios(f"{gpu}-seed", name, ("fwd", "bwd"))
        calling = ratios(f"{gpu}-seed-calling-thread", name, ("bwd",))
        below = sum(v < 1.0 for v in vals)
        out.append([H(lang, f"seeds' configuration: {name} ≥ 1.0× FA2, forward and backward, causal and not "
                            "(backward on the calling thread)",
                      f"种子配置：{name} ≥ 1.0× FA2，前向与反向，因果与否（反向在调用线程上）"),
                    f"{span(vals, f2, '×')} ({span(calling, f2, '×')})",
                    H(lang, "met", "达到") if not below else
                    H(lang, f"no: {below} of {len(vals)} cases below 1.0×", f"否：{len(vals)} 个中 {below} 个低于 1.0×")])
    return out


def t_hopper_table(R, lang):
    """Every row at N = 4096 of hopper_summary.json: TFLOP/s per backend, and best-of-ours over cuDNN."""
    names = ("sdpa-flash", "sdpa-cudnn", "triton", "cuda-wgmma-ws", "cuda-wgmma", "cuda-mma")
    out = []
    for r in _hopper(R):
        if r["N"] != 4096:
            continue
        t = r["tflops"]
        best = max(t.get(n) or 0 for n in OURS_FWD)
        out.append([r["mode"], SHORT_DTYPE[r["dtype"]], r["D"], H(lang, "yes", "是") if r["causal"] else H(lang, "no", "否")]
                   + [f0(t[n]) if t.get(n) else DASH for n in names] + [f"{best / t['sdpa-cudnn']:.2f}×"])
    header = [H(lang, "mode", "模式"), H(lang, "dtype", "数据类型"), "D", H(lang, "causal", "因果"), "FA2", "cuDNN",
              "triton", "cuda-wgmma-ws", "cuda-wgmma", "cuda-mma", H(lang, "best of ours / cuDNN", "我们最快者 / cuDNN")]
    return table(header, out, right=set(range(4, 11)))


def t_forward_kernels(R, lang):
    """The Hopper forward kernels alone (docs/results/cuda/forward_kernels.json): wgmma, wgmma-ws in its library
    config (launch_specs.WGMMA_WS_CONFIGS), FA2 and cuDNN, and wgmma-ws over wgmma and over cuDNN."""
    out = []
    for r in R.json("cuda/forward_kernels.json")["rows"]:
        t = r["tflops"]
        ws = t[_ws_name(r["D"])]
        out.append([SHORT_DTYPE[r["dtype"]], r["D"], r["N"], H(lang, "yes", "是") if r["causal"] else H(lang, "no", "否"),
                    f0(t["sdpa-flash"]), f0(t["sdpa-cudnn"]), f0(t["wgmma"]), f0(ws), f"{ws / t['wgmma']:.2f}×",
                    f"{ws / t['sdpa-cudnn']:.2f}×"])
    header = [H(lang, "dtype", "数据类型"), "D", "N", H(lang, "causal", "因果"), "FA2", "cuDNN", "cuda-wgmma",
              "cuda-wgmma-ws", H(lang, "ws / wgmma", "ws / wgmma"), H(lang, "ws / cuDNN", "ws / cuDNN")]
    return table(header, out, right=set(range(4, 10)))


def t_forward_persistent(R, lang):
    """wgmma-ws's grids side by side (docs/results/cuda/forward_persistent/forward_kernels.json): the library's
    (persistent up to WGMMA_WS_PERSISTENT_UNITS_PER_SM units per SM), always persistent and a block per unit,
    with cuDNN, and persistent over a block per unit."""
    out = []
    for r in R.json("cuda/forward_persistent/forward_kernels.json")["rows"]:
        t, ws = r["tflops"], _ws_name(r["D"])
        pers, unit = t[ws + " persistent"], t[ws + " a block per unit"]
        out.append([SHORT_DTYPE[r["dtype"]], r["D"], r["N"], H(lang, "yes", "是") if r["causal"] else H(lang, "no", "否"),
                    f0(t["sdpa-cudnn"]), f0(t[ws]), f0(pers), f0(unit), f"{pers / unit:.2f}×"])
    header = [H(lang, "dtype", "数据类型"), "D", "N", H(lang, "causal", "因果"), "cuDNN",
              H(lang, "library grid", "库的网格"), H(lang, "persistent", "持久"), H(lang, "a block per unit", "每单元一个块"),
              H(lang, "persistent / a block per unit", "持久 / 每单元一个块")]
    return table(header, out, right=set(range(4, 9)))


def ab_lines(R, rel):
    """The lines of a tools/ws_forward_ab.py log: {(label, dtype, B, H, N, D, mask): [TFLOP/s, ...]}."""
    out = {}
    for line in R.text(rel).splitlines():
        f = line.split()
        if len(f) == 10 and f[1] in ("fwd", "bwd"):
            out.setdefault((f[0], f[2], *map(int, f[3:7]), f[7]), []).append(float(f[9]))
    return out


RESCALE_AB = ("cuda/forward_rescale_order/ab_fp16.txt", "cuda/forward_rescale_order/ab_bf16.txt")


def rescale_ab(R):
    """[(dtype, B, H, N, D, mask, old TFLOP/s list, new list)] of the rescale-order A/B (commit 02ad5bd 'new'
    against 1e37aaf 'old', forward_rescale_order/)."""
    rows = []
    for rel in RESCALE_AB:
        runs = ab_lines(R, rel)
        for key in runs:
            if key[0] == "new":
                rows.append((*key[1:], runs[("old", *key[1:])], runs[key]))
    return rows


def t_forward_rescale_order(R, lang):
    """wgmma-ws's forward alone, commit 02ad5bd (acc's rescale inside the turn at D = 128) against 1e37aaf, timed in
    turn in one call (forward_rescale_order/ab_*.txt): TFLOP/s of each checkout's runs and the change of the means."""
    out = []
    for dtype, b, h, N, D, mask, old, new in rescale_ab(R):
        change = 100 * (sum(new) / len(new) / (sum(old) / len(old)) - 1)
        out.append([SHORT_DTYPE[dtype], f"B{b} H{h} N{N}", D, H(lang, mask.replace("-", " "), "否" if mask == "not-causal" else "是"),
                    span(old), span(new), f"{change:+.1f} %".replace("-", "−")])
    header = [H(lang, "dtype", "数据类型"), H(lang, "shape", "形状"), "D", H(lang, "mask", "因果"),
              H(lang, "before (1e37aaf)", "之前（1e37aaf）"), H(lang, "after (02ad5bd)", "之后（02ad5bd）"),
              H(lang, "change of the means", "均值的变化")]
    return table(header, out, right={4, 5, 6})


def rescale_order_figures(R):
    """The figures quoted in prose from forward_rescale_order/: the A/B at D = 128, the kernels alone beside cuDNN
    and the Nsight Compute profiles."""
    d128 = [(old, new) for _, _, _, N, D, _, old, new in rescale_ab(R) if D == 128 and N >= 4096]
    gain = span([100 * (sum(n) / len(n) / (sum(o) / len(o)) - 1) for o, n in d128], lambda x: f"{x:.1f}", " %")
    rows = [r for r in R.json("cuda/forward_rescale_order/forward_kernels.json")["rows"] if r["N"] >= 4096
            and not r["causal"]]
    lib = _ws_name(128)
    alone = span([r["tflops"][lib] / r["tflops"]["sdpa-cudnn"] for r in rows], f2, "×")
    pers = span([r["tflops"][lib + " persistent"] / r["tflops"]["sdpa-cudnn"] for r in rows], f2, "×")
    ncu = R.text("cuda/forward_rescale_order/ncu_rescale_order.md")
    ws = re.findall(r"\| cuda-wgmma-ws-fwd-d128 \| (\d+) \| \d+ \| [^|]+\| (\d+) \|", ncu)
    cud = re.search(r"\| sdpa-cudnn-fwd-d128 \| (\d+) \| \d+ \| [^|]+\| (\d+) \|", ncu)
    prof = (f"{ws[1][1]} % to {ws[0][1]} % busy, {ws[1][0]} to {ws[0][0]} TFLOP/s under the profiler, against "
            f"cuDNN's {cud.group(2)} % and {cud.group(1)}")
    fig = f"{gain} faster at D = 128, N ≥ 4096"
    hop = R.json("cuda/forward_rescale_order/hopper_fwd_d128/hopper_summary.json")["rows"]
    ratio = [r["tflops"]["cuda-wgmma-ws"] / r["tflops"]["sdpa-cudnn"] for r in hop]
    nc = [r["tflops"]["cuda-wgmma-ws"] / r["tflops"]["sdpa-cudnn"] for r in hop if not r["causal"]]
    again = (f"cuda-wgmma-ws {span(ratio, f2, '×')} cuDNN (at or above 1.0× in {sum(x >= 1.0 for x in ratio)} of "
             f"{len(ratio)} cases; not causal {span(nc, f2, '×')})")
    return [("docs/performance.md", fig), ("docs/performance.md", f"library's grid {alone} cuDNN"),
            ("docs/performance.md", again), ("docs/results/cuda/README.md", again),
            ("README.md", f"inside the ping-pong's turn (FlashAttention-3's order): {span(ratio, f2, '×')}"),
            ("docs/performance.md", f"persistent grid {pers}"), ("docs/performance.md", prof),
            ("docs/backend_cuda.md", fig)]


WS_TILES = (("wgmma-ws 160x2x2", "160"), ("wgmma-ws 176x2x2", "176"), ("wgmma-ws 192x2x2", "192"),
            ("wgmma-ws 128x2x3", "128, 3 stages"))


def t_forward_tiles(R, lang):
    """wgmma-ws's K/V tile candidates at D = 128 timed alone (docs/results/cuda/forward_tiles/forward_kernels.json,
    CONFIG_CANDIDATES['wgmma-ws']): TFLOP/s of the library's tile, the wider ones and three stages, with cuDNN."""
    lib, out = _ws_name(128), []
    for r in R.json("cuda/forward_tiles/forward_kernels.json")["rows"]:
        t = r["tflops"]
        out.append([SHORT_DTYPE[r["dtype"]], r["N"], H(lang, "yes", "是") if r["causal"] else H(lang, "no", "否"),
                    f0(t["sdpa-cudnn"]), f0(t[lib])] + [f0(t[name]) for name, _ in WS_TILES])
    keys = H(lang, "keys", "个键")
    header = [H(lang, "dtype", "数据类型"), "N", H(lang, "causal", "因果"), "cuDNN",
              H(lang, "128 keys (library)", "128 个键（库）")] + [
              f"{label} {keys}" if "stages" not in label else H(lang, "128 keys, 3 stages", "128 个键，3 级") for _, label in WS_TILES]
    return table(header, out, right=set(range(3, 9)))


def forward_tiles_figures(R):
    """The figures performance.md §7 and backend_cuda.md quote from forward_tiles/ (the kernels alone) and from the
    SASS record beside it (ptxas's spill stores per tile)."""
    rows, lib = R.json("cuda/forward_tiles/forward_kernels.json")["rows"], _ws_name(128)

    def rel(name, pick):
        return span([r["tflops"][name] / r["tflops"][lib] for r in rows if pick(r)], f2, "×")
    full16k = lambda r: r["N"] == 16384 and not r["causal"]  # noqa: E731
    full4k = lambda r: r["N"] == 4096 and not r["causal"]  # noqa: E731
    spills = {int(bc): int(b) for bc, b in re.findall(
        r"_Z12wgmma_ws_fwdILi128ELi(\d+)ELi2ELi2ELb0ELb0E\S*: \d+ registers, (\d+) bytes spill stores",
        R.text("cuda/forward_tiles/sass_summary_wgmma_ws.txt"))}
    return [
        ("docs/performance.md", f"192 keys are {rel('wgmma-ws 192x2x2', full16k)} the 128-key tile and 160 keys "
                                f"{rel('wgmma-ws 160x2x2', full16k)}"),
        ("docs/performance.md", f"at N = 4096 {rel('wgmma-ws 192x2x2', full4k)} and {rel('wgmma-ws 160x2x2', full4k)}"),
        ("docs/performance.md", f"176 keys, FlashAttention-3's tile, are {rel('wgmma-ws 176x2x2', lambda r: r['N'] >= 4096 and not r['causal'])}"),
        ("docs/performance.md", f"every wider tile loses at N = 1024 ({rel('wgmma-ws 160x2x2', lambda r: r['N'] == 1024)}, "
                                f"{rel('wgmma-ws 176x2x2', lambda r: r['N'] == 1024)} and {rel('wgmma-ws 192x2x2', lambda r: r['N'] == 1024)})"),
        ("docs/performance.md", "N = 16384, causal, the three are " + span(
            [r["tflops"][name] / r["tflops"][lib] for r in rows if r["N"] == 16384 and r["causal"]
             for name in ("wgmma-ws 160x2x2", "wgmma-ws 176x2x2", "wgmma-ws 192x2x2")], f2, "×")),
        ("docs/performance.md", f"ptxas reports {spills[160]}, {spills[176]} and {spills[192]} bytes of spill stores at 160, 176 and 192 "
                                f"keys ({spills[128]} at 128"),
        ("docs/performance.md", f"Three stages of 128 keys: {rel('wgmma-ws 128x2x3', full16k)} at N = 16384 not causal, "
                                f"{rel('wgmma-ws 128x2x3', lambda r: r['N'] == 4096)} at N = 4096"),
        ("docs/performance.md", "the library's tile is " + span([r["tflops"][lib] / r["tflops"]["sdpa-cudnn"] for r in rows
                                                               if r["N"] >= 4096 and not r["causal"]], f2, "×")
         + " cuDNN at D = 128, N ≥ 4096, not causal"),
        ("docs/backend_cuda.md", f"176 keys, FlashAttention-3's tile at this head dim without a mask, ran at "
                                 f"{rel('wgmma-ws 176x2x2', lambda r: r['N'] >= 4096 and not r['causal'])} the 128-key tile"),
    ]


def _ws_name(D):
    """The forward_kernels.json column of wgmma-ws in the library's config for head dim D."""
    from flash_attention_cuda.launch_specs import WGMMA_WS_CONFIGS

    return "wgmma-ws " + "x".join(map(str, WGMMA_WS_CONFIGS[D]))


def t_ncu_profiles(R, lang, path="cuda/ncu/profiles.json"):
    """The Nsight Compute table (docs/results/cuda/ncu/profiles.json): the longest kernel of each profiled call."""
    out = []
    for p in R.json(path)["profiles"]:
        if "error" in p:
            continue
        k = max(p["kernels"], key=lambda k: k["time_us"])

        def pct(x):
            return DASH if x is None else f0(x)
        out.append([p["label"], f0(p["tflops"]), pct(k["tensor_pipe_pct"]), pct(k["fma_pipe_pct"]),
                    pct(k["dram_throughput_pct"]), pct(k.get("l1_shared_throughput_pct")),
                    pct(k["achieved_occupancy_pct"]), pct(k["registers_per_thread"]), f0(k["local_bytes"]),
                    f"{k['smem_bank_conflicts']:.3g}"])
    header = [H(lang, "profile", "剖析"), "TFLOP/s", H(lang, "tensor pipe %", "张量管线 %"), H(lang, "FMA pipe %", "FMA 管线 %"),
              "DRAM %", H(lang, "L1/shared %", "L1/共享内存 %"), H(lang, "occupancy %", "占用率 %"),
              H(lang, "registers", "寄存器"), H(lang, "spill bytes", "溢出字节"),
              H(lang, "shared-memory bank conflicts", "共享内存 bank 冲突")]
    return table(header, out, right=set(range(1, 10)))


def _variants(R, part):
    return R.json(f"benchmark/h100-variants/{part}/variants.json")["summary"]


def _variants_cuda(rows):
    """The CUDA rung a variants record timed (the fastest on its GPU: cuda-wgmma-ws, or cuda-wgmma before it)."""
    seen = {n for e in rows for n in list(e.get("time_vs_full", {})) + list(e.get("vs_best_alternative", {}))}
    return next(n for n in ("cuda-wgmma-ws", "cuda-wgmma", "cuda-mma") if n in seen)


def t_variants_window(R, lang):
    """Window scaling at N = 16384: time over full attention's against the visible fraction."""
    rows = [e for e in _variants(R, "window") if e["section"] == "window-scaling"]
    names = ("triton", _variants_cuda(rows), "flex")
    out = []
    for e in rows:
        w = e["window"]
        label = H(lang, "full", "全部") if tuple(w) == (-1, -1) else f"({w[0]}, {w[1]})"
        out.append([e["mode"], label, f"{e['visible_fraction']:.3f}"]
                   + [f"{e['time_vs_full'][n]:.3f}" if n in e.get("time_vs_full", {}) else DASH for n in names])
    header = [H(lang, "mode", "模式"), H(lang, "window", "窗口"), H(lang, "visible fraction", "可见比例")] + \
        [H(lang, f"{n}: time / full", f"{n}：时间 / 全注意力") for n in names]
    return table(header, out, right={2, 3, 4, 5})


def t_variants_compare(R, lang):
    """Each variant case: our time against the best PyTorch alternative's (window, GQA, dropout)."""
    rows = [e for e in _variants(R, "window") if e["section"] == "window"] + _variants(R, "gqa") + _variants(R, "dropout")
    cuda = _variants_cuda(rows)
    out = []
    for e in rows:
        w = e["window"]
        what = {"window": f"window ({w[0]}, {w[1]})", "gqa": f"GQA Hq={e['Hq']} Hk={e['Hk']}",
                "dropout": f"dropout p={e['dropout_p']}"}[e["section"]]
        x = e["vs_best_alternative"]
        out.append([what, e["mode"], e["N"], e["D"], H(lang, "yes", "是") if e["causal"] else H(lang, "no", "否"),
                    e["best_alternative"], f"{e['best_alternative_ms']:.3f}",
                    f"{x['triton']:.2f}×" if "triton" in x else DASH,
                    f"{x[cuda]:.2f}×" if cuda in x else DASH])
    header = [H(lang, "variant", "变体"), H(lang, "mode", "模式"), "N", "D", H(lang, "causal", "因果"),
              H(lang, "best PyTorch alternative", "最快的 PyTorch 方案"), "ms",
              H(lang, "triton ×", "triton ×"), f"{cuda} ×"]
    return table(header, out, right={2, 3, 6, 7, 8})


def t_variants_targets(R, lang):
    """Issue 13's speed target per variant: Triton and the fastest CUDA rung at least 1.0x the best PyTorch
    alternative in every recorded case (the rows of variants-compare), forward and backward."""
    sections = {"window": [e for e in _variants(R, "window") if e["section"] == "window"], "gqa": _variants(R, "gqa"),
                "dropout": _variants(R, "dropout")}
    return _variants_targets_table(sections, lang)


H200_VARIANTS = "benchmark/h200-variants"  # the variants benchmark on an H200: window-dropout/, gqa/, dropout/, ...
H200_GQA_WINDOW = f"{H200_VARIANTS}/gqa-window/variants.json"  # the run after the Triton forward's Hopper kernel
# the runs after the Triton backward's Hopper kernel (hopper_backward.py) became the default
H200_GQA = f"{H200_VARIANTS}/gqa-gluon-backward/variants.json"
H200_WINDOW = f"{H200_VARIANTS}/window-gluon-backward/variants.json"
# the run of both sections with the current Gluon kernels (the forward's persistent programs, one-fma exponent and
# rescale after S_ij's issue; the backward's causal program order, row loads, dQ sums in register order and split rule)
H200_TUNED = f"{H200_VARIANTS}/gqa-window-rescale/variants.json"


def _section(R, rec, name):
    return [e for e in R.json(rec)["summary"] if e["section"] == name]


def t_variants_targets_h200(R, lang):
    """The same targets from the H200 records of the current kernels (GQA and window from gqa-window-rescale/; dropout
    from dropout/, the run after the kernels' keep test became an integer test)."""
    sections = {"window": _section(R, H200_TUNED, "window"), "gqa": _section(R, H200_TUNED, "gqa"),
                "dropout": R.json(f"{H200_VARIANTS}/dropout/variants.json")["summary"]}
    return _variants_targets_table(sections, lang)


def _variant_case(e, lang):
    return (f"GQA Hq={e['Hq']} Hk={e['Hk']}" if e["section"] == "gqa" else
            H(lang, f"window {tuple(e['window'])}", f"窗口 {tuple(e['window'])}"))


def _variant_key(e):
    return e["section"], e["Hk"], e["N"], e["causal"], tuple(e["window"]), e["mode"]


def _hopper_kernel_rows(R, mode, before, first, heads, lang):
    """One row per case of gqa-window-rescale/ in ``mode`` ('fwd' or 'bwd'): the Triton rung's x the best alternative
    in the records ``before`` and ``first`` (dicts by _variant_key), and its ms and x now; ``heads`` names those three
    columns (English, Chinese)."""
    out = []
    for e in R.json(H200_TUNED)["summary"]:
        if e["mode"] != mode:
            continue
        a, b = before[_variant_key(e)], first[_variant_key(e)]
        out.append([_variant_case(e, lang), e["N"], H(lang, "yes", "是") if e["causal"] else H(lang, "no", "否"),
                    f"{a['vs_best_alternative']['triton']:.2f}×", f"{b['vs_best_alternative']['triton']:.2f}×",
                    f"{e['ms']['triton']:.3f}", f"{e['vs_best_alternative']['triton']:.2f}×", e["best_alternative"]])
    header = [H(lang, "case", "情形"), "N", H(lang, "causal", "因果"), *(H(lang, *h) for h in heads),
              H(lang, "now: ×", "现在：×"), H(lang, "best alternative", "最快方案")]
    return table(header, out)


def t_triton_hopper_backward(R, lang):
    """The Triton rung's backward on the H200: the GQA and window backwards of gqa-window/ (commit ea72f4a,
    backward_kernels.py's two kernels), of gqa-gluon-backward/ (0f76612) and window-gluon-backward/ (8b75c71),
    hopper_backward.py's first runs, and of gqa-window-persistent/ (7a0c194), each as x the best PyTorch alternative
    timed in the same run."""
    two = {_variant_key(e): e for e in R.json(H200_GQA_WINDOW)["summary"]}
    first = {_variant_key(e): e for rec in (H200_WINDOW, H200_GQA) for e in R.json(rec)["summary"]}
    return _hopper_kernel_rows(R, "bwd", two, first, [("two kernels: ×", "两个内核：×"),
                                                      ("first Gluon runs: ×", "Gluon 首次运行：×"),
                                                      ("hopper_backward now: ms", "hopper_backward 现在：ms")], lang)


def t_triton_hopper_forward(R, lang):
    """The Triton rung's forward on the H200 before and after hopper_forward.py (Gluon): the GQA and window forwards
    of gqa/ (commit 9d8e0a2) and window-dropout/ (c2a73a0), forward_kernel.py, against gqa-window/ (ea72f4a), the
    Gluon kernel's first run, and gqa-window-persistent/ (7a0c194), each as x the best PyTorch alternative timed in the
    same run."""
    before = {_variant_key(e): e for rec in ("gqa", "window-dropout")
              for e in R.json(f"{H200_VARIANTS}/{rec}/variants.json")["summary"]}
    first = {_variant_key(e): e for e in R.json(H200_GQA_WINDOW)["summary"]}
    return _hopper_kernel_rows(R, "fwd", before, first, [("before: ×", "之前：×"),
                                                         ("first Gluon run: ×", "Gluon 首次运行：×"),
                                                         ("hopper_forward now: ms", "hopper_forward 现在：ms")], lang)


def _variants_targets_table(sections, lang):
    names = {"window": ("sliding window (FlexAttention with a block mask)", "滑动窗口（带块掩码的 FlexAttention）"),
             "gqa": ("GQA/MQA (SDPA with enable_gqa)", "GQA/MQA（enable_gqa 的 SDPA）"),
             "dropout": ("dropout (SDPA's kernels with dropout_p)", "dropout（带 dropout_p 的 SDPA kernel）")}
    out = []
    for section, rows in sections.items():
        cuda = _variants_cuda(rows)
        for backend in ("triton", cuda):
            vals = [e["vs_best_alternative"][backend] for e in rows if backend in e["vs_best_alternative"]]
            below = sum(v < 1.0 for v in vals)
            out.append([H(lang, *names[section]), backend, span(vals, f2, "×"),
                        H(lang, "met", "达到") if not below else
                        H(lang, f"no: {below} of {len(vals)} cases below 1.0×, {min(vals):.2f}× at worst",
                          f"否：{len(vals)} 个中 {below} 个低于 1.0×，最差 {min(vals):.2f}×")])
    header = [H(lang, "variant (best PyTorch alternative)", "变体（最快的 PyTorch 方案）"), H(lang, "ours", "我们的"),
              H(lang, "× the alternative", "为该方案的 ×"), H(lang, "≥ 1.0× in every case?", "每个情形都 ≥ 1.0×？")]
    return table(header, out)


HDIM256 = "cuda/hdim256/hopper_summary.json"  # head dim 256, every GPU backend beside FA2 and cuDNN
CUDA_RUNGS = ("cuda-wgmma-ws", "cuda-wgmma", "cuda-mma")


def t_hdim256(R, lang):
    """Head dim 256 (docs/results/cuda/hdim256/hopper_summary.json), N >= 4096: TFLOP/s per backend and the
    fastest CUDA rung over FA2 and over cuDNN."""
    names = ("sdpa-flash", "sdpa-cudnn", "triton") + CUDA_RUNGS
    out = []
    for r in R.json(HDIM256)["rows"]:
        if r["N"] < 4096:
            continue
        t = r["tflops"]
        best = max(t.get(n) or 0 for n in CUDA_RUNGS)
        out.append([r["mode"], SHORT_DTYPE[r["dtype"]], r["N"], H(lang, "yes", "是") if r["causal"] else H(lang, "no", "否")]
                   + [f0(t[n]) if t.get(n) else DASH for n in names]
                   + [f"{best / t['sdpa-flash']:.2f}×", f"{best / t['sdpa-cudnn']:.2f}×"])
    header = [H(lang, "mode", "模式"), H(lang, "dtype", "数据类型"), "N", H(lang, "causal", "因果"), "FA2", "cuDNN",
              "triton", "cuda-wgmma-ws", "cuda-wgmma", "cuda-mma", H(lang, "best CUDA / FA2", "CUDA 最快者 / FA2"),
              H(lang, "best CUDA / cuDNN", "CUDA 最快者 / cuDNN")]
    return table(header, out, right=set(range(4, 12)))


def hdim256_figures(R):
    """The head-dim-256 figures quoted in performance.md §7, backend_cuda.md and the README."""
    rows = [r for r in R.json(HDIM256)["rows"] if r["N"] >= 4096]

    def vs(mode, name, den):
        return span(_ratio_span([r for r in rows if r["mode"] == mode], (name,), den), f2, "×")

    fwd = f"{vs('fwd', 'cuda-wgmma-ws', 'sdpa-flash')} FA2 and {vs('fwd', 'cuda-wgmma-ws', 'sdpa-cudnn')} cuDNN"
    bwd = f"{vs('bwd', 'cuda-wgmma', 'sdpa-flash')} FA2 and {vs('bwd', 'cuda-wgmma', 'sdpa-cudnn')} cuDNN"
    mma = vs("bwd", "cuda-mma", "sdpa-flash")
    # N = 1024 in the hopper run, where host time matters: cuda-wgmma-ws against FA2
    small = {mode: [r["tflops"]["cuda-wgmma-ws"] / r["tflops"]["sdpa-flash"] for r in _hopper(R)
                    if r["N"] == 1024 and r["mode"] == mode] for mode in ("fwd", "bwd")}
    n1024 = " and ".join(f"{span(small[mode], f2, '×')} FA2 {word} ({sum(v >= 1.0 for v in small[mode])} of "
                         f"{len(small[mode])} at or above 1.0×)" for mode, word in (("fwd", "forward"), ("bwd", "backward")))
    return [("docs/performance.md", fwd), ("docs/performance.md", bwd), ("docs/performance.md", f"{mma} FA2"),
            ("docs/backend_cuda.md", fwd), ("docs/backend_cuda.md", bwd), ("README.md", fwd),
            ("docs/performance.md", n1024)]


HEAD_DIMS = "cuda/head_dims_32_96"  # D = 32 and 96 compiled (e7780d6) and zero-padded (3c96b59), hopper preset rows


def _head_dim_rows(R, run, D):
    """The rows of head_dims_32_96/<run>_<D>/hopper_summary.json (run 'head_dim' or 'padded_head_dim')."""
    return R.json(f"{HEAD_DIMS}/{run}_{D}/hopper_summary.json")["rows"]


def _head_dim_ab(R, D):
    """{(mode, causal): (padded row's tflops, compiled row's tflops)} at fp16 N = 4096, the shapes both runs timed."""
    pick = lambda run: {(r["mode"], r["causal"]): r["tflops"] for r in _head_dim_rows(R, run, D)  # noqa: E731
                        if r["dtype"] == "float16" and r["N"] == 4096}
    old, new = pick("padded_head_dim"), pick("head_dim")
    return {k: (old[k], new[k]) for k in new}


def t_head_dims(R, lang):
    """D = 32 and 96, fp16 B4 H16 N4096, through the public functions: each CUDA rung's TFLOP/s zero-padded to 64
    and 128 (commit 3c96b59) -> compiled for D (e7780d6), and FA2's and cuDNN's in the compiled run."""
    out = []
    for D in (32, 96):
        ab = sorted(_head_dim_ab(R, D).items(), key=lambda kv: (kv[0][0] != "fwd", kv[0][1]))  # fwd first, not causal
        for (mode, causal), (old, new) in ab:
            row = [D, mode, H(lang, "yes" if causal else "no", "是" if causal else "否"), f0(new["sdpa-flash"]),
                   f0(new["sdpa-cudnn"])]
            row += [f"{f0(old[b])} → {f0(new[b])} ({f2(new[b] / old[b])}×)" for b in CUDA_RUNGS]
            out.append(row)
    header = ["D", H(lang, "mode", "模式"), H(lang, "causal", "因果"), "FA2", "cuDNN"] + list(CUDA_RUNGS)
    return table(header, out, right={3, 4, 5, 6, 7})


def head_dims_figures(R):
    """The D = 32 / 96 figures quoted in prose: the forward against FA2 and cuDNN (every row of the compiled run),
    and what compiling them gained over padding (fp16 N = 4096)."""
    def vs(D, mode, name, den):
        return span([r["tflops"][name] / r["tflops"][den] for r in _head_dim_rows(R, "head_dim", D)
                     if r["mode"] == mode], f2, "×")

    def gain(mode, name):
        return span([new[name] / old[name] for D in (32, 96) for (m, _), (old, new) in _head_dim_ab(R, D).items()
                     if m == mode], f2, "×")

    fwd = " and ".join(f"{vs(D, 'fwd', 'cuda-wgmma-ws', 'sdpa-flash')} FA2, "
                       f"{vs(D, 'fwd', 'cuda-wgmma-ws', 'sdpa-cudnn')} cuDNN at D = {D}" for D in (96, 32))
    won = (f"{gain('fwd', 'cuda-wgmma-ws')} the padded forward (cuda-wgmma-ws), {gain('fwd', 'cuda-mma')} (cuda-mma); "
           f"the mma backward {gain('bwd', 'cuda-mma')}")
    mma_bwd = (f"{vs(32, 'bwd', 'cuda-mma', 'sdpa-flash')} FA2 at D = 32 and "
               f"{vs(96, 'bwd', 'cuda-mma', 'sdpa-flash')} at D = 96")
    ws_bwd = (f"{vs(96, 'bwd', 'cuda-wgmma-ws', 'sdpa-flash')} FA2 at D = 96 but "
              f"{vs(32, 'bwd', 'cuda-wgmma-ws', 'sdpa-flash')} at D = 32")
    # the two-kernel wgmma backward compiled for D = 32, 96 against the one-kernel wgmma-ws padded, kernels alone
    alone = R.json(f"{HEAD_DIMS}/backward_kernels.json")["rows"]
    wins = [r for r in alone if r["tflops"]["wgmma 2x64"] > r["tflops"]["wgmma-ws"]]
    two = (f"faster than the padded one-kernel wgmma-ws in {len(wins)} of {len(alone)} cases ("
           + ", ".join(f"D = {r['D']} N = {r['N']}{' causal' if r['causal'] else ''}" for r in wins) + ")")
    return [("docs/performance.md", fwd), ("docs/performance.md", won), ("docs/performance.md", mma_bwd),
            ("docs/performance.md", ws_bwd), ("docs/performance.md", two), ("docs/backend_cuda.md", two),
            ("README.md", fwd), ("docs/backend_cuda.md", fwd), ("docs/backend_cuda.md", won),
            ("docs/results/cuda/README.md", fwd)]


ONE_KERNEL_BWD = "cuda/one_kernel_backward_32_96"  # wgmma-fused, wgmma-ws compiled for D = 32, 96 (3f8bd56), padded (4fbba50)


def _one_kernel_rows(R):
    """[(row of the compiled run, tflops of the padded run)] of the backward kernels alone at D = 32 and 96."""
    old = {(r["D"], r["N"], r["causal"]): r["tflops"]
           for r in R.json(f"{ONE_KERNEL_BWD}/padded_backward_kernels.json")["rows"]}
    return [(r, old[(r["D"], r["N"], r["causal"])]) for r in R.json(f"{ONE_KERNEL_BWD}/backward_kernels.json")["rows"]]


def t_one_kernel_backward(R, lang):
    """The one-kernel wgmma backwards at D = 32 and 96, the kernels alone (B4 H16 fp16, tools/cuda_backward_kernels.py):
    zero-padded to 64 and 128 (commit 4fbba50) -> compiled for D (3f8bd56), in one GPU session, with FA2's and
    cuDNN's backward of the compiled run and wgmma-ws's ratios to them."""
    out = []
    for r, old in _one_kernel_rows(R):
        t = r["tflops"]
        out.append([r["D"], r["N"], H(lang, "yes" if r["causal"] else "no", "是" if r["causal"] else "否"),
                    f0(t["sdpa-flash"]), f0(t["sdpa-cudnn"])]
                   + [f"{f0(old[k])} → {f0(t[k])} ({f2(t[k] / old[k])}×)" for k in ("wgmma-ws", "wgmma-fused")]
                   + [f"{f2(t['wgmma-ws'] / t['sdpa-flash'])}×", f"{f2(t['wgmma-ws'] / t['sdpa-cudnn'])}×"])
    header = ["D", "N", H(lang, "causal", "因果"), "FA2", "cuDNN", "wgmma-ws", "wgmma-fused",
              H(lang, "wgmma-ws ÷ FA2", "wgmma-ws ÷ FA2"), H(lang, "wgmma-ws ÷ cuDNN", "wgmma-ws ÷ cuDNN")]
    return table(header, out, right={3, 4, 5, 6, 7, 8})


def one_kernel_backward_figures(R):
    """The figures quoted in prose about the one-kernel wgmma backwards compiled for D = 32 and 96: what compiling
    gained (kernels alone), tiles of 128 against 64 queries at D = 32, and the public functions' backward against
    FA2 and cuDNN (every row: fp16 and bf16, N 4096 and 16384, causal and not)."""
    rows = _one_kernel_rows(R)

    def gain(k, D):
        return span([r["tflops"][k] / old[k] for r, old in rows if r["D"] == D], f2, "×")

    def public(D, den):
        return span([r["tflops"]["cuda-wgmma-ws"] / r["tflops"][den]
                     for r in R.json(f"{ONE_KERNEL_BWD}/head_dim_{D}/hopper_summary.json")["rows"] if r["mode"] == "bwd"],
                    f2, "×")

    won = (f"{gain('wgmma-ws', 32)} the padded wgmma-ws at D = 32 and {gain('wgmma-ws', 96)} at D = 96 "
           f"(wgmma-fused {gain('wgmma-fused', 32)} and {gain('wgmma-fused', 96)})")
    tiles = span([r["tflops"]["wgmma-ws"] / r["tflops"]["wgmma-ws Br64"] for r, _ in rows if r["D"] == 32], f2, "×")
    tiles = f"tiles of 128 queries {tiles} tiles of 64"
    pub = " and ".join(f"{public(D, 'sdpa-flash')} FA2, {public(D, 'sdpa-cudnn')} cuDNN at D = {D}" for D in (96, 32))
    return [("docs/performance.md", won), ("docs/performance.md", tiles), ("docs/performance.md", pub),
            ("docs/backend_cuda.md", won), ("docs/backend_cuda.md", pub), ("README.md", pub),
            ("docs/results/cuda/README.md", won), ("docs/results/cuda/README.md", pub),
            (f"docs/results/{ONE_KERNEL_BWD}/README.md", won), (f"docs/results/{ONE_KERNEL_BWD}/README.md", tiles),
            (f"docs/results/{ONE_KERNEL_BWD}/README.md", pub)]


ROWS_PAD_TOP = "cuda/forward_rows_pad_top"  # tools/ws_forward_ab.py, 3526fd2 ("old") against 3f0431c ("new"), H200


def _rows_pad_top(R):
    """{(dtype, B, H, N, D, mask): {label: [TFLOP/s per run]}} from the A/B's lines (label fwd dtype B H N D mask ms
    TFLOP/s), both dtypes' files."""
    out = {}
    for name in ("ab_fp16.txt", "ab_bf16.txt"):
        for line in R.text(f"{ROWS_PAD_TOP}/{name}").splitlines():
            f = line.split()
            if len(f) == 10 and f[1] == "fwd":
                key = (f[2], int(f[3]), int(f[4]), int(f[5]), int(f[6]), f[7])
                out.setdefault(key, {}).setdefault(f[0], []).append(float(f[9]))
    return out


def t_ws_rows_pad_top(R, lang):
    """wgmma-ws's forward, causal, with its rows blocks aligned to row 0 (old) and to the last query row (new):
    the mean TFLOP/s of each checkout's runs and new over old (ROWS_PAD_TOP)."""
    out = []
    for (dtype, B, Hh, N, D, mask), runs in _rows_pad_top(R).items():
        if mask != "causal":
            continue
        old, new = (sum(runs[k]) / len(runs[k]) for k in ("old", "new"))
        Br = 192 if D in (32, 64) else 128
        out.append([SHORT_DTYPE[dtype], f"B{B} H{Hh}", N, D, Br, -N % Br, f0(old), f0(new), f"{new / old:.3f}×"])
    header = [H(lang, "dtype", "数据类型"), H(lang, "shape", "形状"), "N", "D", "Br",
              H(lang, "padding rows", "填充行"), H(lang, "rows from row 0", "从第 0 行排"),
              H(lang, "rows to the last", "排到最后一行"), H(lang, "new / old", "新 / 旧")]
    return table(header, out, right=set(range(2, 9)))


PHILOX_WIDE = {"cuda-wgmma-ws": "cuda/philox_wide/ab_cuda_dropout.txt",  # tools/ws_forward_ab.py --dropout 0.1,
               "triton": "triton/philox_wide/ab_triton_dropout.txt",  # new (05e73cb) and old (abd3e9a) in turn
               "": "cuda/philox_wide/ab_wgmma_mma_dropout.txt"}  # labels new_wgmma, old_mma, ...: one run each


def _philox_wide(R, records=PHILOX_WIDE):
    """{(backend, mode, D, mask): {label: [ms per run]}} from the A/B records (PHILOX_WIDE, or PHILOX_SHARED); a label
    with a rung (new_mma) names the backend (cuda-mma) and is new or old."""
    out = {}
    for backend, rel in records.items():
        for line in R.text(rel).splitlines():
            f = line.split()
            if len(f) == 11 and f[1] in ("fwd", "bwd"):
                label, _, rung = f[0].partition("_")
                name = f"cuda-{rung}" if rung else backend
                out.setdefault((name, f[1], int(f[6]), f[7]), {}).setdefault(label, []).append(float(f[9]))
    return out


def t_philox_wide(R, lang):
    """Dropout's kernels with each Philox product as a low and a high multiply (old) and as one wide multiply (new):
    the median time of each checkout's runs and old over new (PHILOX_WIDE), fp16, p = 0.1, N = 4096."""
    return _philox_ab_table(R, lang, PHILOX_WIDE, before=H(lang, "two multiplies (ms)", "两条乘法（ms）"),
                            now=H(lang, "one wide multiply (ms)", "一条宽乘法（ms）"))


PHILOX_SHARED = {"cuda-wgmma-ws": "cuda/philox_shared/ab_cuda_dropout.txt",  # new (c083af2) and old (2771f5a) in turn
                 "triton": "triton/philox_keep_test/ab_triton_dropout.txt",
                 "": "cuda/philox_shared/ab_wgmma_mma_dropout.txt"}  # labels new_wgmma, old_mma, ...: one run each


def _philox_ab_table(R, lang, records, before=None, now=None):
    """Old and new kernels with dropout from A/B records (PHILOX_WIDE, PHILOX_SHARED, PHILOX_KEY_ROWS): the median
    time of each checkout's runs and old over new, fp16, p = 0.1, N = 4096; ``before`` and ``now`` name the two
    time columns."""
    out = []
    for (backend, mode, D, mask), runs in _philox_wide(R, records).items():
        old, new = (statistics.median(runs[k]) for k in ("old", "new"))
        shape = "B4 H32" if D == 64 else "B4 H16"
        out.append([backend, mode, f"{shape} D{D}", H(lang, "causal", "因果") if mask == "causal" else
                    H(lang, "not causal", "非因果"), f"{old:.3f}", f"{new:.3f}", f"{old / new:.3f}×"])
    header = [H(lang, "kernels", "内核"), H(lang, "mode", "模式"), H(lang, "shape", "形状"), H(lang, "mask", "掩码"),
              before or H(lang, "before (ms)", "之前（ms）"), now or H(lang, "now (ms)", "现在（ms）"),
              H(lang, "speed-up", "加速")]
    return table(header, out, right={4, 5, 6})


def t_philox_shared(R, lang):
    """Dropout's keep test in integers and, in the CUDA kernels, round 2's product shared by a tile (new, c083af2)
    against the kernels before (old, 2771f5a)."""
    return _philox_ab_table(R, lang, PHILOX_SHARED)


PHILOX_KEY_ROWS = {"cuda-wgmma-ws": "cuda/philox_key_rows/ab_cuda_dropout.txt",  # new (76fc5de), old (fe0ce47)
                   "": "cuda/philox_key_rows/ab_wgmma_mma_dropout.txt"}  # labels new_wgmma, old_mma, ...


def t_philox_key_rows(R, lang):
    """The shared form reaching the S_ij^T tiles (new, 76fc5de: A * lo of the first offset and A * Nk opaque to the
    compiler) against the kernels before (old, fe0ce47)."""
    return _philox_ab_table(R, lang, PHILOX_KEY_ROWS)


COLD_L2 = "cuda/cold_l2"  # tools/cold_warm.py on an H200: mma/ (this rung), experiments-*/ (tags), wgmma-ws/


def _cold_warm(R, name):
    """{(B, H, N, D, causal): {backend: {"cold": µs, "warm": µs}}} of COLD_L2/name/cold_warm.json."""
    return {(r["B"], r["H"], r["N"], r["D"], r["causal"]): r["us"] for r in R.json(f"{COLD_L2}/{name}/cold_warm.json")["rows"]}


def _mma_x_fa2(us, kind):
    """cuda-mma's speed over FA2's in one row of _cold_warm, "cold" or "warm"."""
    return us["sdpa-flash"][kind] / us["cuda-mma"][kind]


def t_cold_l2(R, lang):
    """cuda-mma's forward beside FA2 with L2 flushed before every call (cold, the benchmark's timer) and back to back
    (warm), and the two changes tried (experiments/mma-one-barrier, experiments/mma-l2-prefetch)."""
    now = _cold_warm(R, "mma")
    tried = [_cold_warm(R, "experiments-mma-one-barrier"), _cold_warm(R, "experiments-mma-l2-prefetch")]
    both = lambda us: f"{_mma_x_fa2(us, 'cold'):.3f} / {_mma_x_fa2(us, 'warm'):.3f}"  # noqa: E731
    out = []
    for (B, heads, N, D, causal), us in now.items():
        fa2, mma = us["sdpa-flash"], us["cuda-mma"]
        out.append([f"B{B} H{heads}", str(N), str(D), H(lang, "yes", "是") if causal else H(lang, "no", "否"),
                    f"{fa2['cold']:.1f} / {fa2['warm']:.1f}", f"{mma['cold']:.1f} / {mma['warm']:.1f}", both(us)]
                   + [both(t[(B, heads, N, D, causal)]) for t in tried])
    header = [H(lang, "shape", "形状"), "N", "D", H(lang, "causal", "因果"), H(lang, "FA2 µs, cold / warm", "FA2 µs，冷 / 热"),
              H(lang, "cuda-mma µs, cold / warm", "cuda-mma µs，冷 / 热"),
              H(lang, "cuda-mma × FA2, cold / warm", "cuda-mma 相对 FA2，冷 / 热"),
              H(lang, "tried: one barrier a tile, × FA2", "试过：每块一个屏障，相对 FA2"),
              H(lang, "tried: tile j+2 into L2, × FA2", "试过：把第 j+2 块预取进 L2，相对 FA2")]
    return table(header, out, right={4, 5, 6, 7, 8})


def cold_l2_figures(R):
    """The cold/warm record (COLD_L2) in prose: the target row, what both pay elsewhere at N = 1024, the two changes
    tried (cold, over this rung's own), and cuDNN's N = 4096 forward read faster cold than warm."""
    now = _cold_warm(R, "mma")
    row = (4, 16, 1024, 128, False)
    x = _mma_x_fa2
    pay = lambda us, n: us[n]["cold"] - us[n]["warm"]  # noqa: E731
    others = [pay(us, n) for k, us in now.items() if k[2] == 1024 and k != row for n in ("cuda-mma", "sdpa-flash")]
    g, f1 = (lambda v: f"{v:.3f}"), (lambda v: f"{v:.1f}".replace("-", "−"))
    ob, l2 = _cold_warm(R, "experiments-mma-one-barrier"), _cold_warm(R, "experiments-mma-l2-prefetch")
    rel = lambda t, k: x(t[k], "cold") / x(now[k], "cold")  # noqa: E731
    d64 = [rel(ob, k) for k in now if k[3] == 64]
    pre = [rel(l2, k) for k in now]
    ws = {(r["D"], r["causal"]): r["us"] for r in R.json(f"{COLD_L2}/wgmma-ws/cold_warm.json")["rows"] if r["N"] == 4096}
    cud = ws[(128, False)]["sdpa-cudnn"]
    en = (f"{x(now[row], 'cold'):.3f}× FA2 with L2 flushed before every call, as the benchmark times it, and "
          f"{x(now[row], 'warm'):.3f}× back to back in a CUDA graph. Cold, a call takes {f1(pay(now[row], 'cuda-mma'))} µs "
          f"longer than warm; FA2's takes {f1(pay(now[row], 'sdpa-flash'))} µs longer at that shape, that is, no longer, "
          f"and in the other N = 1024 rows both take {span(others, f1)} µs longer")
    en2 = (f"one block barrier a tile instead of two ran that row {rel(ob, row):.3f}× as fast cold and the D = 64 rows "
           f"{span(d64, g, '×')}; asking L2 for tile j + 2 beside tile j + 1's copies ran every row "
           f"{span(pre, g, '×')}")
    en3 = f"cuDNN's forward at N = 4096, D = 128, not causal, reads {cud['cold']:.0f} µs cold against {cud['warm']:.0f} warm"
    zh = (f"按基准测试的方式（每次调用前清空 L2）计时为 FA2 的 {x(now[row], 'cold'):.3f}×，在 CUDA graph 中背靠背计时为 "
          f"{x(now[row], 'warm'):.3f}×。冷时一次调用比热时多花 {f1(pay(now[row], 'cuda-mma'))} µs；FA2 在这个形状上多花 "
          f"{f1(pay(now[row], 'sdpa-flash'))} µs，也就是没有多花；在 N = 1024 的其他行里两者都多花 {span(others, f1)} µs")
    zh2 = (f"每块一个线程块屏障（原来是两个）让那一行冷时快到 {rel(ob, row):.3f}×，D = 64 的各行则为 {span(d64, g, '×')}；"
           f"在第 j + 1 块的拷贝旁边请求 L2 预取第 j + 2 块，让每一行变为 {span(pre, g, '×')}")
    zh3 = f"cuDNN 在 N = 4096、D = 128、非因果时的前向冷时为 {cud['cold']:.0f} µs，热时为 {cud['warm']:.0f} µs"
    return [("docs/performance.md", en), ("docs/performance.md", en2), ("docs/performance.md", en3),
            ("docs/zh/performance.md", zh), ("docs/zh/performance.md", zh2), ("docs/zh/performance.md", zh3),
            ("docs/results/cuda/README.md", en)]


def ncu_h200_figures(R):
    """The H200 profiles (cuda/ncu-h200/profiles.json) in prose: the D = 128 forward beside cuDNN, and cuda-mma's
    forward at N = 1024 beside FA2."""
    prof = {p["label"]: p for p in R.json("cuda/ncu-h200/profiles.json")["profiles"]}
    k = lambda label: max(prof[label]["kernels"], key=lambda k: k["time_us"])  # noqa: E731
    pipe = lambda label: f0(k(label)["tensor_pipe_pct"])  # noqa: E731
    l1 = lambda label: f0(k(label)["l1_shared_throughput_pct"])  # noqa: E731
    tf = lambda label: f0(prof[label]["tflops"])  # noqa: E731
    ws, cu, mma, fa2 = "cuda-wgmma-ws-fwd-d128", "sdpa-cudnn-fwd-d128", "cuda-mma-fwd-d128-n1024", "sdpa-flash-fwd-d128-n1024"
    en = (f"cuda-wgmma-ws's D = 128 forward keeps the tensor pipe {pipe(ws)} % busy at {tf(ws)} TFLOP/s under the "
          f"profiler, beside cuDNN's {pipe(cu)} % and {tf(cu)}")
    en2 = (f"cuda-mma's D = 128 forward at N = 1024 keeps shared memory {l1(mma)} % busy and the tensor pipe "
           f"{pipe(mma)} %, FA2's {l1(fa2)} % and {pipe(fa2)} %")
    zh = (f"cuda-wgmma-ws 的 D = 128 前向在剖析器下以 {tf(ws)} TFLOP/s 让张量管线 {pipe(ws)} % 忙碌，cuDNN 为 {pipe(cu)} % 和 "
          f"{tf(cu)}")
    zh2 = (f"cuda-mma 的 D = 128 前向在 N = 1024 时共享内存 {l1(mma)} % 忙碌、张量管线 {pipe(mma)} %，FA2 为 "
           f"{l1(fa2)} % 和 {pipe(fa2)} %")
    return [("docs/performance.md", en), ("docs/performance.md", en2), ("docs/zh/performance.md", zh),
            ("docs/zh/performance.md", zh2)]


WS_BWD_DQ_ALONE = "cuda/ws_bwd_dq_alone"  # tools/ws_forward_ab.py --backward, a3ecba4 ("old") against 9cd962a / 3320be4


def t_ws_bwd_dq_alone(R, lang):
    """wgmma_bwd_ws with a warpgroup's wholly hidden tiles given dQ_i's product alone (ws_bwd_dq_alone/): new over
    old in TFLOP/s (the mean of each checkout's runs), the branch as written and the branch known warp-uniform."""
    runs = {name: ab_lines(R, f"{WS_BWD_DQ_ALONE}/ab_{name}.txt") for name in ("branch", "uniform")}
    keys = []
    for r in runs.values():
        keys += [k[1:] for k in r if k[0] == "new" and k[1:] not in keys]
    out = []
    for dtype, B, Hh, N, D, mask in keys:
        cells = []
        for name in ("branch", "uniform"):
            r = runs[name]
            new, old = r.get(("new", dtype, B, Hh, N, D, mask)), r.get(("old", dtype, B, Hh, N, D, mask))
            cells.append(DASH if not new else f"{(sum(new) / len(new)) / (sum(old) / len(old)):.3f}×")
        out.append([f"B{B} H{Hh}", N, D, H(lang, mask.replace("-", " "), "因果" if mask == "causal" else "非因果"), *cells])
    header = [H(lang, "shape", "形状"), "N", "D", H(lang, "mask", "掩码"),
              H(lang, "branch as written: new / old", "按原样分支：新 / 旧"),
              H(lang, "branch known uniform: new / old", "已知一致的分支：新 / 旧")]
    return table(header, out, right={1, 2, 4, 5})


def ncu_causal_backward_figures(R):
    """The causal backward beside cuDNN's under the profiler (cuda/ncu-causal-backward/profiles.json), in prose."""
    prof = {p["label"]: p for p in R.json("cuda/ncu-causal-backward/profiles.json")["profiles"]}
    k = lambda label: max(prof[label]["kernels"], key=lambda k: k["time_us"])  # noqa: E731
    pipe = lambda label: f0(k(label)["tensor_pipe_pct"])  # noqa: E731
    us = lambda label: f0(prof[label]["time_us"])  # noqa: E731
    ws, cu = "cuda-wgmma-ws-bwd-d128-causal", "sdpa-cudnn-bwd-d128-causal"
    wg, cg = "cuda-wgmma-ws-bwd-d128-gqa-causal", "sdpa-cudnn-bwd-d128-gqa-causal"
    ratio = lambda a, b: f"{prof[b]['time_us'] / prof[a]['time_us']:.2f}×"  # noqa: E731
    en = (f"the causal backward at B4 H16 N4096 takes {us(ws)} µs against cuDNN's {us(cu)} ({ratio(ws, cu)}), the tensor "
          f"pipe {pipe(ws)} % busy against {pipe(cu)} %; with grouped query heads at N = 16384 {us(wg)} against "
          f"{us(cg)} µs ({ratio(wg, cg)}), {pipe(wg)} % against {pipe(cg)} %")
    zh = (f"B4 H16 N4096 的因果反向用 {us(ws)} µs，cuDNN 为 {us(cu)}（{ratio(ws, cu)}），张量管线 {pipe(ws)} % 忙碌，"
          f"cuDNN 为 {pipe(cu)} %；N = 16384 的分组查询头为 {us(wg)} µs 对 {us(cg)} µs（{ratio(wg, cg)}），"
          f"{pipe(wg)} % 对 {pipe(cg)} %")
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh)]


PHILOX_FLOOR = "cuda/philox_floor"  # python tools/philox_floor.py --out results/philox_floor, and ncu over its kernels


def _philox_floor_ncu(R):
    """{kernel: {metric: value}} from the floor kernels' Nsight Compute CSVs (ncu_floor.csv, ncu_floor_inst.csv)."""
    out = {}
    for name in ("ncu_floor.csv", "ncu_floor_inst.csv"):
        lines = [ln for ln in R.text(f"{PHILOX_FLOOR}/{name}").splitlines() if ln.startswith('"')]
        rows = list(csv.reader(lines))
        col = {c: i for i, c in enumerate(rows[0])}
        for r in rows[1:]:
            kernel = r[col["Kernel Name"]].split("(")[0].removeprefix("void ").strip()
            out.setdefault(kernel, {})[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
    return out


def t_philox_floor(R, lang):
    """Dropout's floor (cuda/philox_floor/philox_floor.json): the keep decisions alone in the rule's two forms and at
    FlashAttention-2's rate, beside the best SDPA kernel with dropout and ours, and what the floor leaves within reach."""
    out = []
    for e in R.json(f"{PHILOX_FLOOR}/philox_floor.json")["summary"]:
        for mode in ("fwd", "bwd"):
            m = e[mode]
            out.append([f"B{e['B']} H{e['H']} D{e['D']}", H(lang, {"fwd": "forward", "bwd": "backward"}[mode],
                                                            {"fwd": "前向", "bwd": "反向"}[mode]),
                        f"{e['floor_ms']['rule']:.2f}", f"{e['floor_ms']['score-by-score']:.2f}",
                        f"{e['floor_ms']['fa2-rate']:.2f}", f"{m['best_alternative_ms']:.2f} ({m['best_alternative']})",
                        f"{m['ours_ms']['cuda-wgmma-ws']:.2f}", f"{m['ours_ms']['triton']:.2f}", f"{m['reach']:.2f}×"])
    header = [H(lang, "shape (N 4096)", "形状（N 4096）"), H(lang, "pass", "方向"),
              H(lang, "the rule alone (ms)", "仅规则（ms）"), H(lang, "score by score (ms)", "逐分数（ms）"),
              H(lang, "FA2's rate (ms)", "FA2 的速率（ms）"),
              H(lang, "best SDPA with dropout (ms)", "带 dropout 的最佳 SDPA（ms）"),
              "cuda-wgmma-ws (ms)", "triton (ms)",
              H(lang, "most within reach: SDPA / the rule alone", "上限：SDPA / 仅规则")]
    return table(header, out, right={2, 3, 4, 5, 6, 7, 8})


def t_philox_floor_ncu(R, lang):
    """The floor kernels under Nsight Compute (B4 H32 N4096, 2^31 scores): registers, warps, the FMA-heavy pipe (the
    integer multiplies), the issue slots, and FMA-heavy instructions a score."""
    prof = _philox_floor_ncu(R)
    scores = 4 * 32 * 4096 * 4096
    out = []
    for kernel, m in prof.items():
        out.append([f"`{kernel}`", f0(m["launch__registers_per_thread"]),
                    f0(m["sm__warps_active.avg.pct_of_peak_sustained_active"]),
                    f0(m["sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active"]),
                    f0(m["sm__inst_issued.avg.pct_of_peak_sustained_active"]),
                    f"{m['sm__inst_executed_pipe_fmaheavy.sum'] * 32 / scores:.1f}",
                    f"{m['gpu__time_duration.sum'] / 1e6:.2f}"])
    header = [H(lang, "kernel", "kernel"), H(lang, "registers", "寄存器"),
              H(lang, "warps active %", "活跃 warp %"), H(lang, "FMA-heavy pipe %", "FMA-heavy 管线 %"),
              H(lang, "issue slots %", "发射槽 %"), H(lang, "FMA-heavy instructions a score", "每个分数的 FMA-heavy 指令"),
              H(lang, "time (ms)", "时间（ms）")]
    return table(header, out, right={1, 2, 3, 4, 5, 6})


def philox_floor_figures(R):
    """The floor's figures quoted in prose (performance.md §9, en and zh)."""
    summ = R.json(f"{PHILOX_FLOOR}/philox_floor.json")["summary"]
    prof = _philox_floor_ncu(R)
    rule = [m for k, m in prof.items() if k.startswith("keep_rule")]
    pipe = span([m["sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active"] for m in rule])
    fwd = {e["D"]: e["fwd"]["reach"] for e in summ}
    bwd = {e["D"]: e["bwd"]["reach"] for e in summ}
    d64 = next(e for e in summ if e["D"] == 64)
    over = [e["fwd"]["ours_ms"]["cuda-wgmma-ws"] / e["floor_ms"]["rule"] for e in summ]
    en = (f"the rule's keep decisions alone take {d64['floor_ms']['rule']:.2f} ms at B4 H32 N4096 (D does not enter), "
          f"where SDPA's whole forward with dropout takes {d64['fwd']['best_alternative_ms']:.2f}: no forward under the "
          f"rule can reach more than {fwd[64]:.2f}× SDPA at D = 64 and {fwd[128]:.2f}× at D = 128, nor a backward more "
          f"than {bwd[64]:.2f}× and {bwd[128]:.2f}×")
    zh = (f"仅规则的保留判定在 B4 H32 N4096 就要 {d64['floor_ms']['rule']:.2f} ms（与 D 无关），而 SDPA 带 dropout "
          f"的整个前向只要 {d64['fwd']['best_alternative_ms']:.2f} ms：遵循该规则的前向在 D = 64 最多达到 SDPA 的 "
          f"{fwd[64]:.2f}×，D = 128 最多 {fwd[128]:.2f}×；反向最多 {bwd[64]:.2f}× 和 {bwd[128]:.2f}×")
    en2 = f"the FMA-heavy pipe is {pipe} % busy in the rule's kernels"
    zh2 = f"规则的各 kernel 中 FMA-heavy 管线忙碌 {pipe} %"
    en3 = f"cuda-wgmma-ws's forward with dropout takes {span(over, f2, '×')} the floor's time"
    zh3 = f"cuda-wgmma-ws 带 dropout 的前向耗时为下限的 {span(over, f2, '×')}"
    floors = R.json(f"{PHILOX_FLOOR}/philox_floor.json")["floors"]
    kept = {f["kept"] for f in floors if f["form"] != "fa2-rate" and (f["H"], f["D"]) == (32, 64)}
    assert len(kept) == 1, kept  # every kernel of the rule keeps the same scores
    kept = f"{kept.pop():,}".replace(",", " ")
    en4 = f"({kept} of 2^31 at B4 H32)"
    zh4 = f"（B4 H32 下 2^31 个中保留 {kept} 个）"
    fa2 = d64["floor_ms"]["rule"] / d64["floor_ms"]["fa2-rate"]
    en5 = (f"FA2's rate draws as many scores' decisions {fa2:.1f} times faster ({d64['floor_ms']['fa2-rate']:.2f} against "
           f"{d64['floor_ms']['rule']:.2f} ms)")
    zh5 = (f"FA2 的速率为同样数量的分数做判定要快 {fa2:.1f} 倍（{d64['floor_ms']['fa2-rate']:.2f} 对 "
           f"{d64['floor_ms']['rule']:.2f} ms）")
    hop = R.bench("h200-hopper")["results"]

    def plain(e):  # cuda-wgmma-ws's forward without dropout at the floor's shape, in the H200 hopper record
        return next(r["time_ms"] for r in hop if r["backend"] == "cuda-wgmma-ws" and r["dtype"] == "float16"
                    and r["mode"] == "fwd" and not r["causal"] and (r["B"], r["H"], r["Nq"], r["D"]) ==
                    (e["B"], e["H"], e["N"], e["D"]))
    a, b = summ
    sums = " and ".join(f"{e['fwd']['ours_ms']['cuda-wgmma-ws']:.2f} against {e['floor_ms']['rule']:.2f} + "
                        f"{plain(e):.2f} ms at D = {e['D']}" for e in (a, b))
    sums_zh = "，".join(f"D = {e['D']} 时为 {e['fwd']['ours_ms']['cuda-wgmma-ws']:.2f} 对 {e['floor_ms']['rule']:.2f} + "
                       f"{plain(e):.2f} ms" for e in (a, b))
    en6 = f"more than the floor and its own forward without dropout added together ({sums}"
    zh6 = f"比下限与它自己不带 dropout 的前向之和还多（{sums_zh}"
    twice = " and ".join(f"{2 * e['floor_ms']['rule']:.2f} ms against {e['bwd']['ours_ms']['triton']:.2f} measured at "
                         f"D = {e['D']}" for e in summ)
    twice_zh = "，".join(f"D = {e['D']} 时为 {2 * e['floor_ms']['rule']:.2f} ms，实测 {e['bwd']['ours_ms']['triton']:.2f}"
                         for e in summ)
    en8 = (f"take longer than SDPA's whole forward with dropout on an H200 ({d64['floor_ms']['rule']:.2f} against "
           f"{d64['fwd']['best_alternative_ms']:.2f} ms at B4 H32 N4096")
    zh8 = (f"比 H200 上 SDPA 带 dropout 的整个前向还慢（B4 H32 N4096 下 {d64['floor_ms']['rule']:.2f} 对 "
           f"{d64['fwd']['best_alternative_ms']:.2f} ms")
    en7 = f"so its floor is twice the rule's ({twice})"
    zh7 = f"所以它的下限是规则的两倍（{twice_zh}）"
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh), ("docs/performance.md", en2),
            ("docs/zh/performance.md", zh2), ("docs/performance.md", en3), ("docs/zh/performance.md", zh3),
            ("docs/performance.md", en7), ("docs/zh/performance.md", zh7), ("docs/algorithm.md", en8),
            ("docs/zh/algorithm.md", zh8),
            ("docs/performance.md", en4), ("docs/zh/performance.md", zh4), ("docs/performance.md", en5),
            ("docs/zh/performance.md", zh5), ("docs/performance.md", en6), ("docs/zh/performance.md", zh6)]


DROPOUT_GROUPED = "cuda/dropout_grouped_mask"  # tools/ws_forward_ab.py --dropout 0.1, 37ec437 (new) and b0a2a49 (old)
DROPOUT_GROUPED_RUNS = ["cuda-wgmma-ws"] * 4 + ["cuda-wgmma"] * 2 + ["cuda-mma"] * 2  # the log's runs in order
DROPOUT_BITS = "cuda/dropout_bits_before_wait"  # the same, 1823eae (new) and 2082c72 (old), wgmma-ws alone


def _dropout_grouped(R, folder=DROPOUT_GROUPED, runs=DROPOUT_GROUPED_RUNS, mode="fwd"):
    """{(backend, D, mask): {"new" or "old": [ms per run]}} of a dropout A/B log, ab_dropout_forward.txt (mode "fwd")
    or ab_dropout_backward.txt ("bwd"): its runs four lines each, their backends in the order of ``runs``."""
    name = "ab_dropout_forward.txt" if mode == "fwd" else "ab_dropout_backward.txt"
    lines = [ln.split() for ln in R.text(f"{folder}/{name}").splitlines()]
    lines = [f for f in lines if len(f) == 11 and f[1] == mode]
    assert len(lines) == 4 * len(runs), len(lines)
    out = {}
    for k, f in enumerate(lines):
        out.setdefault((runs[k // 4], int(f[6]), f[7]), {}).setdefault(f[0], []).append(float(f[9]))
    return out


def _dropout_ab_table(R, lang, ab, now):
    """Rows of an A/B of the forwards with dropout (from _dropout_grouped): old and new median ms, old over new."""
    out = []
    for (backend, D, mask), runs in ab.items():
        old, new = (statistics.median(runs[k]) for k in ("old", "new"))
        out.append([backend, f"{'B4 H32' if D == 64 else 'B4 H16'} D{D}",
                    H(lang, "causal", "因果") if mask == "causal" else H(lang, "not causal", "非因果"),
                    f"{old:.3f}", f"{new:.3f}", f"{old / new:.3f}×"])
    header = [H(lang, "kernels", "内核"), H(lang, "shape (N 4096)", "形状（N 4096）"), H(lang, "mask", "掩码"),
              H(lang, "as they are (ms)", "现有（ms）"), now, H(lang, "speed-up", "加速")]
    return table(header, out, right={3, 4, 5})


def t_dropout_bits_before_wait(R, lang):
    """wgmma-ws's forward drawing its keep decisions as bits while S_ij is computed (new, 1823eae) against the kernel
    as it is (old, 2082c72)."""
    return _dropout_ab_table(R, lang, _dropout_grouped(R, DROPOUT_BITS, ["cuda-wgmma-ws"] * 4),
                             H(lang, "drawn beside S_ij (ms)", "与 S_ij 并行抽取（ms）"))


DROPOUT_BWD_BITS = "cuda/dropout_bwd_bits_before_wait"  # the backward's bits beside S and dP, 79da6c8 (new), 2ccd7ce


def t_dropout_bwd_bits_before_wait(R, lang):
    """wgmma-ws's backward drawing its keep decisions as bits while S and dP are computed (new, 79da6c8) against the
    backward as it is (old, 2ccd7ce)."""
    return _dropout_ab_table(R, lang, _dropout_grouped(R, DROPOUT_BWD_BITS, ["cuda-wgmma-ws"] * 4, "bwd"),
                             H(lang, "drawn beside S and dP (ms)", "与 S、dP 并行抽取（ms）"))


def t_dropout_grouped_mask(R, lang):
    """The forwards with dropout drawing their keep decisions straight into P (old, b0a2a49) and four accumulator tiles
    at a time into a bit mask (new, 37ec437): the median of each checkout's runs, old over new."""
    return _dropout_ab_table(R, lang, _dropout_grouped(R), H(lang, "grouped bit mask (ms)", "分组位掩码（ms）"))


def dropout_grouped_figures(R):
    """The figures in prose of the two dropout forward experiments: the grouped mask's spill bytes before and after and
    speed-up span, and the bits drawn beside S_ij's speed-up span."""
    spills = {}
    for line in R.text(f"{DROPOUT_GROUPED}/registers.txt").splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) == 4 and f[1].startswith("wgmma_ws_fwd<") and ", false, true," in f[1]:
            D = int(f[1][len("wgmma_ws_fwd<"):].split(",")[0])
            spills[D] = (f[2].split(", ")[1].split("/")[0], f[3].split(", ")[1].split("/")[0])
    ups = [statistics.median(r["old"]) / statistics.median(r["new"]) for r in _dropout_grouped(R).values()]
    en = (f"the wgmma-ws forward with dropout spills {spills[64][1]} bytes a thread instead of {spills[64][0]} at D = 64 "
          f"and {spills[128][1]} instead of {spills[128][0]} at D = 128, and runs at {span(ups, lambda x: f'{x:.2f}')}× "
          "the kernels as they are")
    zh = (f"带 dropout 的 wgmma-ws 前向在 D = 64 每线程溢出 {spills[64][1]} 字节（原为 {spills[64][0]}），D = 128 溢出 "
          f"{spills[128][1]} 字节（原为 {spills[128][0]}），速度为现有 kernel 的 {span(ups, lambda x: f'{x:.2f}')}×")
    bits = [statistics.median(r["old"]) / statistics.median(r["new"]) for r in
            _dropout_grouped(R, DROPOUT_BITS, ["cuda-wgmma-ws"] * 4).values()]
    en2 = f"ran at {span(bits, lambda x: f'{x:.2f}')}× the kernel as it is"
    zh2 = f"速度为现有 kernel 的 {span(bits, lambda x: f'{x:.2f}')}×"
    bwd = [statistics.median(r["old"]) / statistics.median(r["new"]) for r in
           _dropout_grouped(R, DROPOUT_BWD_BITS, ["cuda-wgmma-ws"] * 4, "bwd").values()]
    en3 = f"its backward ran at {span(bwd, lambda x: f'{x:.2f}')}× the backward as it is"
    zh3 = f"反向的速度为现有反向的 {span(bwd, lambda x: f'{x:.2f}')}×"
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh), ("docs/performance.md", en2),
            ("docs/zh/performance.md", zh2), ("docs/performance.md", en3), ("docs/zh/performance.md", zh3)]



WAIT_BLOCK = "cuda/forward_wait_own_block"  # sass_summary.py --overlap records and the A/B, 73501e4 (new), ab317dc (old)


def _overlap_table_rows(R, rel):
    """The rows of a tools/sass_summary.py --overlap record: [(source or rung, kernel, exp2s, on every path)]."""
    rows = []
    for line in R.text(rel).splitlines():
        f = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(f) == 7 and f[2].isdigit():
            rows.append((f[0], f[1], int(f[4]), int(f[5].split()[0])))
    return rows


# (label, kernel name, index of the BF16 and of the DROPOUT template argument) of the CUDA kernels --overlap reports
_OVERLAP_CUDA = (("cuda-wgmma forward", "wgmma_fwd", 3, 4), ("cuda-wgmma-ws forward", "wgmma_ws_fwd", 4, 5),
                 ("wgmma-ws backward (both rungs' backward)", "wgmma_bwd_ws", 3, 4))


def _overlap_cuda(R, rel, dropout):
    """{(label, D): [share of the exp2s beside a product on every path, one per fp16 instantiation]} of a CUDA
    --overlap record, the kernels with (dropout True) or without dropout."""
    out = {}
    for _, name, ex2, every in _overlap_table_rows(R, rel):
        kernel, args = name.split("<", 1)
        args = [a.strip() for a in args.rstrip(">").split(",")]
        for label, k, bf, dr in _OVERLAP_CUDA:
            if kernel == k and args[bf] == "false" and args[dr] == str(dropout).lower() and args[0] in ("64", "128"):
                out.setdefault((label, int(args[0])), []).append(every / ex2)
    order = [label for label, *_ in _OVERLAP_CUDA]
    return dict(sorted(out.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])))


def t_wgmma_overlap(R, lang):
    """How many of each kernel's exp2s run beside a product of its own warpgroup, read off the SASS
    (tools/sass_summary.py --overlap): the CUDA Hopper kernels at HEAD and with the wait in its own block (73501e4),
    fp16, D 64 and 128 (every instantiation); the Triton kernels compiled by the H200's Triton, every candidate."""
    pct = lambda xs: span([100 * x for x in xs], f0, " %")  # noqa: E731
    yes, no = H(lang, "yes", "是"), H(lang, "no", "否")
    out = []
    for dropout in (False, True):
        for (label, D), shares in _overlap_cuda(R, f"{WAIT_BLOCK}/overlap_cuda.md", dropout).items():
            out.append([label, D, yes if dropout else no, H(lang, "as it is", "现有"), pct(shares)])
    for (label, D), shares in _overlap_cuda(R, f"{WAIT_BLOCK}/overlap_cuda_own_block.md", False).items():
        out.append([label, D, no, H(lang, "the wait in a block of its own (73501e4)", "等待单独成块（73501e4）"),
                    pct(shares)])
    tri = {}
    for _, name, ex2, every in _overlap_table_rows(R, f"{WAIT_BLOCK}/overlap_triton_h200.md"):
        kernel, D = name.split()[0], int(name.rsplit("D=", 1)[1])
        tri.setdefault((kernel, D), []).append(every / ex2)
    tri = dict(sorted(tri.items(), key=lambda kv: (["fwd", "dq", "dkdv"].index(kv[0][0]), kv[0][1])))
    names = {"fwd": H(lang, "triton forward", "triton 前向"), "dq": H(lang, "triton dQ", "triton dQ"),
             "dkdv": H(lang, "triton dK/dV", "triton dK/dV")}
    for (kernel, D), shares in tri.items():
        out.append([names[kernel], D, no, H(lang, f"every candidate config ({len(shares)})", f"每个候选配置（{len(shares)} 个）"),
                    pct(shares)])
    header = [H(lang, "kernels", "内核"), "D", "dropout", H(lang, "compiled", "编译的版本"),
              H(lang, "exp2s beside a product of their warpgroup, on every path", "在每条路径上都与本 warpgroup 的乘积同时运行的 exp2")]
    return table(header, out, right={1, 4})


def _wait_block_ab(R):
    """[(backend, B, H, N, D, mask, old TFLOP/s list, new list)] of the own-block A/B (73501e4 new, ab317dc old)."""
    rows = []
    for backend in ("cuda-wgmma-ws", "cuda-wgmma"):
        runs = ab_lines(R, f"{WAIT_BLOCK}/ab_{backend}.txt")
        for key in runs:
            if key[0] == "new":
                rows.append((backend, *key[2:], runs[("old", *key[1:])], runs[key]))
    return rows


def t_forward_wait_own_block(R, lang):
    """The forwards with the wait for P_ij V_j in a block of its own (new, 73501e4) against HEAD (old, ab317dc), fp16,
    timed alone in turn: TFLOP/s of each checkout's runs and new over old (means)."""
    out = []
    for backend, b, h, N, D, mask, old, new in _wait_block_ab(R):
        ratio = (sum(new) / len(new)) / (sum(old) / len(old))
        out.append([backend, f"B{b} H{h} N{N}", D, H(lang, mask.replace("-", " "), "否" if mask == "not-causal" else "是"),
                    span(old), span(new), f"{ratio:.3f}×"])
    header = [H(lang, "kernels", "内核"), H(lang, "shape", "形状"), "D", H(lang, "causal", "因果"),
              H(lang, "as it is (ab317dc)", "现有（ab317dc）"), H(lang, "wait in its own block (73501e4)", "等待单独成块（73501e4）"),
              H(lang, "new / old", "新 / 旧")]
    return table(header, out, right={2, 4, 5, 6})


def wait_own_block_figures(R):
    """The span of new over old of the own-block A/B, quoted in performance.md §8 and backend_cuda.md."""
    r = [(sum(n) / len(n)) / (sum(o) / len(o)) for *_, o, n in _wait_block_ab(R)]
    en = f"ran at {span(r, lambda x: f'{x:.2f}')}× the kernels as they are"
    zh = f"速度为现有内核的 {span(r, lambda x: f'{x:.2f}')}×"
    return [(page, en) for page in ("docs/performance.md", "docs/backend_cuda.md")] + \
        [(page, zh) for page in ("docs/zh/performance.md", "docs/zh/backend_cuda.md")]

TABLES = {
    "wgmma-overlap": t_wgmma_overlap,
    "dropout-bwd-bits-before-wait": t_dropout_bwd_bits_before_wait,
    "forward-wait-own-block": t_forward_wait_own_block,
    "philox-wide": t_philox_wide,
    "philox-shared": t_philox_shared,
    "philox-key-rows": t_philox_key_rows,
    "hdim256": t_hdim256,
    "ws-rows-pad-top": t_ws_rows_pad_top,
    "cpu-memory": t_cpu_memory,
    "cpu-accuracy": t_cpu_accuracy,
    "gpu-summary": t_gpu_summary,
    "gpu-now": t_gpu_now,
    "h100-seed": t_h100_seed,
    "fa2-forward": t_fa2_forward,
    "cuda-ladder": t_cuda_ladder,
    "cuda-ladder-summary": t_cuda_ladder_summary,
    "cuda-backward": t_cuda_backward,
    "triton-perf": t_triton_perf,
    "triton-accuracy": t_triton_accuracy,
    "triton-n1024": t_triton_n1024,
    "hopper-targets": t_hopper_targets,
    "hopper-targets-h200": t_hopper_targets_h200,
    "variants-targets": t_variants_targets,
    "variants-targets-h200": t_variants_targets_h200,
    "triton-hopper-forward": t_triton_hopper_forward,
    "triton-hopper-backward": t_triton_hopper_backward,
    "hopper-table": t_hopper_table,
    "ncu-profiles": t_ncu_profiles,
    "ncu-wgmma-ws": lambda R, lang: t_ncu_profiles(R, lang, "cuda/ncu-wgmma-ws/profiles.json"),
    "ncu-h200": lambda R, lang: t_ncu_profiles(R, lang, "cuda/ncu-h200/profiles.json"),
    "ncu-causal-backward": lambda R, lang: t_ncu_profiles(R, lang, "cuda/ncu-causal-backward/profiles.json"),
    "ws-bwd-dq-alone": t_ws_bwd_dq_alone,
    "philox-floor": t_philox_floor,
    "philox-floor-ncu": t_philox_floor_ncu,
    "dropout-grouped-mask": t_dropout_grouped_mask,
    "dropout-bits-before-wait": t_dropout_bits_before_wait,
    "cold-l2": t_cold_l2,
    "forward-kernels": t_forward_kernels,
    "forward-persistent": t_forward_persistent,
    "forward-tiles": t_forward_tiles,
    "forward-rescale-order": t_forward_rescale_order,
    "head-dims-32-96": t_head_dims,
    "one-kernel-backward-32-96": t_one_kernel_backward,
    "forward-rounds": t_forward_rounds,
    "variants-window": t_variants_window,
    "variants-compare": t_variants_compare,
}


# ------------------------------------------------------------------------------------ figures quoted in prose
def variants_figures(R):
    """The figures of performance.md §7 and §9 quoted in prose, from hopper_summary.json and the variants runs."""
    win = [e for e in _variants(R, "window") if e["section"] == "window"]
    gd = _variants(R, "gqa") + _variants(R, "dropout")
    cuda = _variants_cuda(win)
    ws_fwd = [e["vs_best_alternative"][cuda] for e in win if e["mode"] == "fwd"]
    tri_fwd = [e["vs_best_alternative"]["triton"] for e in win if e["mode"] == "fwd"]
    tri_bwd = [e["vs_best_alternative"]["triton"] for e in win if e["mode"] == "bwd"]
    cuda_bwd = [e["vs_best_alternative"][cuda] for e in win if e["mode"] == "bwd"]
    drop = [x for e in gd if e["section"] == "dropout" for x in e["vs_best_alternative"].values()]
    mqa = [e["vs_best_alternative"]["triton"] for e in gd if e["section"] == "gqa" and e["mode"] == "bwd" and e["Hk"] == 1]
    gqa = [e for e in gd if e["section"] == "gqa"]
    gcuda = _variants_cuda(gqa)

    def gspan(backend, mode, hk=None):
        return span([e["vs_best_alternative"][backend] for e in gqa if e["mode"] == mode and hk in (None, e["Hk"])],
                    f2, "×")
    w512 = next(e for e in _variants(R, "window") if e["section"] == "window-scaling" and e["mode"] == "fwd"
                and tuple(e["window"]) == (512, 512))
    scal = [e for e in _variants(R, "window") if e["section"] == "window-scaling" and e["mode"] == "bwd"]
    cuda_b = {tuple(e["window"]) if e["window"] != "full" else "full": e["time_vs_full"][cuda] for e in scal}
    hop = [r for r in _hopper(R) if r["N"] >= 4096 and r["mode"] == "bwd"]
    tri_hop = _ratio_span(hop, ("triton",), "sdpa-flash")
    big = [r for r in R.json("cuda/forward_kernels.json")["rows"] if r["N"] >= 4096]
    ws_cudnn = [r["tflops"][_ws_name(r["D"])] / r["tflops"]["sdpa-cudnn"] for r in big]
    ws_best = max(r["tflops"][_ws_name(r["D"])] for r in big)
    ws_wgmma = [r["tflops"][_ws_name(r["D"])] / r["tflops"]["wgmma"] for r in R.json("cuda/forward_kernels.json")["rows"]]
    hop_fwd = [r for r in _hopper(R) if r["N"] >= 4096 and r["mode"] == "fwd"]
    ws_hop = _ratio_span(hop_fwd, ("cuda-wgmma-ws",), "sdpa-cudnn")
    return [
        ("docs/performance.md", f"alone it is {span(ws_cudnn, f2, '×')} cuDNN at N ≥ 4096 (at or above 1.0× in "
                                f"{sum(x >= 1.0 for x in ws_cudnn)} of {len(ws_cudnn)} cases) and "
                                f"{span(ws_wgmma, f2, '×')} cuda-wgmma at every shape"),
        ("docs/performance.md", f"up to {ws_best:.0f} TFLOP/s"),
        ("docs/performance.md", f"cuda-wgmma-ws is {span(ws_hop, f2, '×')} cuDNN at N ≥ 4096"),
        ("README.md", f"is {span(ws_hop, f2, '×')} cuDNN's forward at N ≥ 4096"),
        ("docs/performance.md", f"forward {span(ws_fwd, f2, '×')} FlexAttention for {cuda} and {span(tri_fwd, f2, '×')} "
                                f"for Triton; backward\n  {span(tri_bwd, f2, '×')} (Triton) and {span(cuda_bwd, f2, '×')} "
                                f"(the CUDA backward"),
        ("docs/performance.md", f"**Dropout** is {span(drop, lambda x: f'{x:.2g}', '×')} of SDPA's"),
        ("docs/performance.md", f"(Triton {span(mqa, f2, '×')} at Hk = 1"),
        ("docs/performance.md", f"Forward: {gcuda} {gspan(gcuda, 'fwd')} of it,\n  Triton {gspan('triton', 'fwd')}"),
        ("docs/performance.md", f"Backward: Triton {gspan('triton', 'bwd')}."),
        ("docs/performance.md", f"{gspan(gcuda, 'bwd', 1)} cuDNN at Hk = 1"),
        ("docs/performance.md", f"and {gspan(gcuda, 'bwd', 8)} at Hk = 8."),
        ("docs/performance.md", f"({w512['time_vs_full']['triton']:.3f} against {w512['visible_fraction']:.3f} at w = 512)"),
        ("docs/performance.md", f"({cuda_b[(512, 512)]:.3f} at w = 512, {cuda_b[(8192, 8192)]:.3f} at w = 8192)"),
        ("docs/performance.md", f"Triton's backward is {span(tri_hop, lambda x: f'{x:.1f}', '×')} FA2 at N ≥ 4096"),
    ]


def gqa_rounds_figures(R):
    """The GQA record taken in rounds (benchmarks.variants --rounds): the rounds' times of its weakest forward rows
    beside cuDNN's, and wgmma-ws's causal forward alone under every walk (tools/ws_causal_walks.py)."""
    rows = R.json("benchmark/h100-variants/gqa/variants.json")["rows"]

    def rounds(backend, hk, causal):
        r = next(r for r in rows if (r["backend"], r["Hk"], r["N"], r["causal"], r["mode"]) ==
                 (backend, hk, 16384, causal, "fwd"))
        return span(r["round_ms"], lambda x: f"{x:.2f}"), r["time_ms"]

    def row(hk, causal):
        (ours, ms), (cudnn, ms_c) = rounds("cuda-wgmma-ws", hk, causal), rounds("sdpa-cudnn", hk, causal)
        return f"{ours} ms against {cudnn} ({f2(ms_c / ms)}×)"

    walks = R.json("cuda/ws_causal_walks/ws_causal_walks.json")["rows"]
    w = next(r for r in walks if (r["B"], r["Hq"], r["Hk"], r["N"]) == (1, 32, 8, 16384))
    ours = [v for k, v in w["ms"].items() if k != "cudnn"]
    walk = f"within {span(ours, lambda x: f'{x:.2f}')} ms, beside cuDNN's {w['ms']['cudnn']:.2f}"
    return [("docs/performance.md", row(8, True)), ("docs/performance.md", row(1, False)),
            ("docs/performance.md", walk)]


def gqa_h200_figures(R):
    """The GQA section on an H200 (benchmark/h200-variants/gqa, commit 7c0ef42): Triton's and cuda-wgmma-ws's time
    over the best PyTorch alternative's, and how many rows are below it."""
    rows = R.json("benchmark/h200-variants/gqa/variants.json")["summary"]
    tri = [r["vs_best_alternative"]["triton"] for r in rows]
    ws = [r["vs_best_alternative"]["cuda-wgmma-ws"] for r in rows]
    en = (f"Triton {span(tri, f2, '×')} and cuda-wgmma-ws {span(ws, f2, '×')} the best alternative, "
          f"{sum(v < 1.0 for v in ws)} of {len(ws)} rows of cuda-wgmma-ws below 1.0×")
    zh = (f"Triton 为最佳替代的 {span(tri, f2, '×')}，cuda-wgmma-ws 为 {span(ws, f2, '×')}，"
          f"cuda-wgmma-ws 的 {len(ws)} 行中 {sum(v < 1.0 for v in ws)} 行低于 1.0×")
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh)]


def h200_hopper_figures(R):
    """The H200 hopper preset's run (H200_HOPPER) in prose: how many forward rows at N >= 4096 have the best of ours
    below cuDNN, and the weakest row's TFLOP/s."""
    rows = [r for r in R.json(H200_HOPPER)["rows"] if r["mode"] == "fwd" and r["N"] >= 4096]
    best = [(max(r["tflops"][n] for n in OURS_FWD) / r["tflops"]["sdpa-cudnn"], r) for r in rows]
    below = sorted(v for v, _ in best if v < 1.0)
    worst = min(best, key=lambda x: x[0])[1]
    ws, cudnn = worst["tflops"]["cuda-wgmma-ws"], worst["tflops"]["sdpa-cudnn"]
    en = (f"{len(below)} of its {len(rows)} forward rows at N ≥ 4096 are below 1.0× cuDNN "
          f"({below[0]:.3f}–{below[-1]:.3f}×)", f"cuda-wgmma-ws {ws:.0f} TFLOP/s against cuDNN's {cudnn:.0f}")
    zh = (f"N ≥ 4096 的 {len(rows)} 行前向中有 {len(below)} 行低于 cuDNN 的 1.0×（{below[0]:.3f}–{below[-1]:.3f}×）",
          f"cuda-wgmma-ws {ws:.0f} TFLOP/s，cuDNN {cudnn:.0f}")
    return [("docs/performance.md", t) for t in en] + [("docs/zh/performance.md", t) for t in zh]


MMA_PERSISTENT = "cuda/mma_forward/persistent/mma_persistent_ab.json"  # tools/mma_persistent_ab.py on an H200


def mma_persistent_figures(R):
    """The mma forward's persistent grid (MMA_PERSISTENT): on over off and over FA2 at N = 1024 where the grid walks
    (D 96 and 128, not causal), and on over off where it does at N >= 2048."""
    rows = [r for r in R.json(MMA_PERSISTENT)["rows"] if r["grid"]["on"] != r["grid"]["off"]]
    gain = lambda rs: [r["tflops"]["on"] / r["tflops"]["off"] for r in rs]  # noqa: E731
    short = [r for r in rows if r["N"] == 1024]
    d128 = [r["tflops"]["on"] / r["tflops"]["sdpa-flash"] for r in short if r["D"] == 128]
    long = [r for r in rows if r["N"] >= 2048]
    en = (f"{span(gain(short), lambda x: f'{x:.3f}', '×')} at N = 1024 (D = 128 at {span(d128, f2, '×')} FA2), "
          f"{span(gain(long), lambda x: f'{x:.3f}', '×')} at N ≥ 2048")
    zh = (f"N = 1024 时为 {span(gain(short), lambda x: f'{x:.3f}', '×')}（D = 128 为 FA2 的 {span(d128, f2, '×')}），"
          f"N ≥ 2048 时为 {span(gain(long), lambda x: f'{x:.3f}', '×')}")
    return [("docs/performance.md", en), ("docs/backend_cuda.md", en), ("docs/results/cuda/README.md", en),
            ("docs/zh/performance.md", zh), ("docs/zh/backend_cuda.md", zh)]


def rows_pad_top_figures(R):
    """The A/B in prose: causal rows with padding, and the rows that did not change (not causal, or no padding)."""
    ab = _rows_pad_top(R)
    ratio = lambda runs: (sum(runs["new"]) / len(runs["new"])) / (sum(runs["old"]) / len(runs["old"]))  # noqa: E731
    padded = [ratio(v) for k, v in ab.items() if k[5] == "causal" and k[3] % 192]
    control = [ratio(v) for k, v in ab.items() if k[5] != "causal"]
    g = lambda x: f"{x:.3f}"  # noqa: E731
    en = (f"causal, with padding rows, {span(padded, g, '×')}; not causal (nothing moves) {span(control, g, '×')}")
    zh = (f"有填充行的因果情形为 {span(padded, g, '×')}；非因果（什么都没变）为 {span(control, g, '×')}")
    return [("docs/performance.md", en), ("docs/backend_cuda.md", en), ("docs/results/cuda/README.md", en),
            ("docs/zh/performance.md", zh), ("docs/zh/backend_cuda.md", zh)]


PHILOX_SASS = "cuda/philox_sass/philox_sass.txt"  # tools/sass_summary.py --philox over every dropout kernel
PHILOX_SASS_C083AF2 = "cuda/philox_sass/philox_sass_c083af2.txt"  # the same before the S_ij^T tiles shared
PHILOX_SASS_TRITON = "triton/philox_sass/philox_sass_triton.txt"  # ... --triton --philox
# the same counts before each product was written as one wide multiply (philox.cuh's __umulhi and low multiply;
# tl.rand's umulhi and mul)
PHILOX_SASS_BEFORE = "cuda/philox_sass/philox_sass_umulhi.txt"
PHILOX_SASS_TRITON_BEFORE = "triton/philox_sass/philox_sass_tl_rand.txt"


def _philox_counts(R, cuda_rel, triton_rel):
    """(forward totals, backward totals, Triton totals) per Philox evaluation in one CUDA and one Triton record."""
    rows = [line.split(" | ") for line in R.text(cuda_rel).splitlines() if not line.startswith("#")]
    fwd = [float(r[4]) for r in rows if "_bwd_" not in r[1]]
    bwd = [float(r[4]) for r in rows if "_bwd_" in r[1]]
    tri = [float(x) for x in re.findall(r": ([\d.]+) multiplies", R.text(triton_rel))]
    return fwd, bwd, tri


def philox_sass_figures(R):
    """Integer multiplies by Philox's round multipliers per evaluation in the SASS of the kernels with dropout, now
    (PHILOX_SASS, PHILOX_SASS_TRITON: the CUDA SASS holds each evaluation in a tile's shared form, 16, and in the
    score-by-score fallback, 18), at c083af2 (PHILOX_SASS_C083AF2: the S_ij^T tiles' sums still multiplies) and
    with each product as two multiplies (the *_BEFORE records)."""
    fwd, bwd, tri = _philox_counts(R, PHILOX_SASS, PHILOX_SASS_TRITON)
    fwd0, bwd0, tri0 = _philox_counts(R, PHILOX_SASS_BEFORE, PHILOX_SASS_TRITON_BEFORE)
    fwd1, bwd1, _ = _philox_counts(R, PHILOX_SASS_C083AF2, PHILOX_SASS_TRITON)
    g = lambda x: f"{x:.0f}"  # noqa: E731
    g1 = lambda x: f"{x:.1f}"  # noqa: E731
    cuda = fwd + bwd
    high = [v for v in fwd1 + bwd1 if v >= 17.5]
    en = (f"the SASS of every CUDA kernel with dropout ({len(fwd)} forward and {len(bwd)} backward instantiations) "
          f"holds each evaluation twice, in a tile's shared form (16 integer multiplies by the round multipliers) and "
          f"in the score-by-score fallback (18): all of them read {span(cuda, g1)} an evaluation on average (at commit "
          f"c083af2, before the tiles that hold S_ij^T took the shared form, {len(high)} of them read "
          f"{span(high, g1)}: below); Triton's forward, dQ and dK/dV kernels issue {span(tri, g)}; with each product "
          f"written as a high and a low multiply, the forwards issued {span(fwd0, g)}, the backwards {span(bwd0, g)} "
          f"and Triton's kernels {span(tri0, g)}")
    zh = (f"每个带 dropout 的 CUDA 内核（前向 {len(fwd)} 个、反向 {len(bwd)} 个实例）的 SASS 都把每次求值写了两遍：一块共享的形式"
          f"（16 条乘以轮乘数的整数乘法）和逐个分数的回退形式（18 条）：它们平均每次求值都是 {span(cuda, g1)} 条"
          f"（在提交 c083af2，放 S_ij^T 的块还没用上共享形式时，其中 {len(high)} 个为 {span(high, g1)} 条，见下）；"
          f"Triton 的前向、dQ 和 dK/dV 内核为 {span(tri, g)} 条；"
          f"每个乘积写成一条高位乘法加一条低位乘法时，前向为 {span(fwd0, g)} 条，反向为 {span(bwd0, g)} 条，"
          f"Triton 的内核为 {span(tri0, g)} 条")
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh), ("docs/results/cuda/README.md", en)]


def philox_wide_figures(R):
    """The A/B of the wide multiplies (PHILOX_WIDE) in prose: old over new per backend and mode."""
    x = _philox_ab_span(R, PHILOX_WIDE)
    en = (f"Triton's forward {x('triton', 'fwd')} and backward {x('triton', 'bwd')} as fast as before; cuda-wgmma-ws's "
          f"forward {x('cuda-wgmma-ws', 'fwd')} and backward {x('cuda-wgmma-ws', 'bwd')}")
    zh = (f"Triton 的前向为之前的 {x('triton', 'fwd')}，反向为 {x('triton', 'bwd')}；cuda-wgmma-ws 的前向为 "
          f"{x('cuda-wgmma-ws', 'fwd')}，反向为 {x('cuda-wgmma-ws', 'bwd')}")
    en_rungs = (f"cuda-wgmma's forward {x('cuda-wgmma', 'fwd')}, cuda-mma's forward {x('cuda-mma', 'fwd')} and its "
                f"backward {x('cuda-mma', 'bwd')}")
    zh_rungs = (f"cuda-wgmma 的前向为 {x('cuda-wgmma', 'fwd')}，cuda-mma 的前向为 {x('cuda-mma', 'fwd')}，"
                f"它的反向为 {x('cuda-mma', 'bwd')}")
    tri_en = f"forward {x('triton', 'fwd')} and backward {x('triton', 'bwd')} as fast as with `tl.rand`"
    tri_zh = f"前向为使用 `tl.rand` 时的 {x('triton', 'fwd')}，反向为 {x('triton', 'bwd')}"
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh), ("docs/backend_triton.md", tri_en),
            ("docs/zh/backend_triton.md", tri_zh), ("docs/performance.md", en_rungs), ("docs/zh/performance.md", zh_rungs)]


def _philox_ab_span(R, records):
    """x(backend, mode): the span of old over new (medians of each checkout's runs) in A/B records."""
    ab = _philox_wide(R, records)

    def x(backend, mode):
        return span([statistics.median(v["old"]) / statistics.median(v["new"]) for k, v in ab.items()
                     if k[:2] == (backend, mode)], lambda r: f"{r:.3f}", "×")
    return x


def philox_shared_figures(R):
    """The A/B of the integer keep test and the shared round-2 product (PHILOX_SHARED) in prose: old over new."""
    x = _philox_ab_span(R, PHILOX_SHARED)
    en = (f"cuda-wgmma-ws's forward {x('cuda-wgmma-ws', 'fwd')} and backward {x('cuda-wgmma-ws', 'bwd')} as fast as "
          f"before, cuda-wgmma's forward {x('cuda-wgmma', 'fwd')}, cuda-mma's {x('cuda-mma', 'fwd')}; Triton's forward "
          f"{x('triton', 'fwd')} and backward {x('triton', 'bwd')}")
    zh = (f"cuda-wgmma-ws 的前向为之前的 {x('cuda-wgmma-ws', 'fwd')}，反向为 {x('cuda-wgmma-ws', 'bwd')}；cuda-wgmma 的前向为 "
          f"{x('cuda-wgmma', 'fwd')}，cuda-mma 的前向为 {x('cuda-mma', 'fwd')}；Triton 的前向为 {x('triton', 'fwd')}，"
          f"反向为 {x('triton', 'bwd')}")
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh), ("docs/results/cuda/README.md", en)]


PHILOX_REGISTERS_SHARED = "cuda/philox_sass/registers_shared.txt"  # 05e73cb against c083af2, per kernel


def _spill_moves(R, rel):
    """[(spill stores at the second commit - at the first, kernel name)] per instantiation of a registers record."""
    moves = []
    for line in R.text(rel).splitlines():
        if not line.startswith("#"):
            _, kernel, old, new = line.split(" | ")
            moves.append((int(new.split(", ")[1].split("/")[0]) - int(old.split(", ")[1].split("/")[0]),
                          re.match(r"_Z\d+([a-z_]+)I", kernel).group(1)))
    return moves


def philox_shared_registers_figures(R):
    """What the shared form cost the Hopper forwards in spills (PHILOX_REGISTERS_SHARED)."""
    hopper = [m for m, kernel in _spill_moves(R, PHILOX_REGISTERS_SHARED) if kernel in ("wgmma_fwd", "wgmma_ws_fwd")]
    more = [m for m in hopper if m > 0]
    return [("docs/performance.md", f"{len(more)} of the {len(hopper)} Hopper forward instantiations with dropout "
                                    f"spill {span(more, str)} bytes a thread more"),
            ("docs/zh/performance.md", f"{len(hopper)} 个带 dropout 的 Hopper 前向实例中有 {len(more)} 个每线程多溢出 "
                                       f"{span(more, str)} 字节")]


PHILOX_REGISTERS_KEY_ROWS = "cuda/philox_sass/registers_key_rows.txt"  # fe0ce47 against 76fc5de, per kernel


def philox_key_rows_sass_figures(R):
    """The SASS after the S_ij^T tiles took the shared form (PHILOX_SASS, PHILOX_REGISTERS_KEY_ROWS): multiplies an
    evaluation, and how many instantiations spill more or less than at fe0ce47."""
    fwd, bwd, _ = _philox_counts(R, PHILOX_SASS, PHILOX_SASS_TRITON)
    moves = _spill_moves(R, PHILOX_REGISTERS_KEY_ROWS)
    less, more = [m for m in moves if m[0] < 0], [m for m in moves if m[0] > 0]
    worst = max(more) if more else (0, "")
    best = min(less) if less else (0, "")
    en = (f"Every one of the {len(fwd) + len(bwd)} kernel instantiations with dropout now reads "
          f"{span(fwd + bwd, lambda x: f'{x:.1f}')} an evaluation, and their spills move little: "
          f"{len(moves) - len(less) - len(more)} spill as much as before, {len(less)} less (at most {-best[0]} bytes "
          f"a thread, {best[1]}) and {len(more)} more (at most {worst[0]}, {worst[1]})")
    zh = (f"全部 {len(fwd) + len(bwd)} 个带 dropout 的内核实例现在每次求值都是 {span(fwd + bwd, lambda x: f'{x:.1f}')} 条，"
          f"溢出变化不大：{len(moves) - len(less) - len(more)} 个与之前相同，{len(less)} 个更少（每线程最多少 {-best[0]} 字节，"
          f"{best[1]}），{len(more)} 个更多（最多多 {worst[0]} 字节，{worst[1]}）")
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh),
            ("docs/results/cuda/philox_sass/README.md", en)]


def philox_key_rows_figures(R):
    """The A/B of the shared form in the S_ij^T tiles (PHILOX_KEY_ROWS) in prose: old over new."""
    x = _philox_ab_span(R, PHILOX_KEY_ROWS)
    en = (f"cuda-wgmma-ws's backward {x('cuda-wgmma-ws', 'bwd')} and cuda-mma's {x('cuda-mma', 'bwd')} as fast as "
          f"before; the forwards, whose tiles had the shared form already, move little: cuda-wgmma-ws's "
          f"{x('cuda-wgmma-ws', 'fwd')}, cuda-mma's {x('cuda-mma', 'fwd')}, cuda-wgmma's {x('cuda-wgmma', 'fwd')}")
    zh = (f"cuda-wgmma-ws 的反向为之前的 {x('cuda-wgmma-ws', 'bwd')}，cuda-mma 的反向为 {x('cuda-mma', 'bwd')}；"
          f"前向的块原本就用共享形式，变化不大：cuda-wgmma-ws 为 {x('cuda-wgmma-ws', 'fwd')}，cuda-mma 为 "
          f"{x('cuda-mma', 'fwd')}，cuda-wgmma 为 {x('cuda-wgmma', 'fwd')}")
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh), ("docs/results/cuda/README.md", en)]


def dropout_cost_figures(R):
    """algorithm.md's sentence on what the exact keep rule costs: Triton and cuda-wgmma-ws with dropout over SDPA's
    fastest kernel with dropout, on an H200 (h200-variants/dropout)."""
    rows = R.json(f"{H200_VARIANTS}/dropout/variants.json")["summary"]
    vals = [e["vs_best_alternative"][b] for e in rows for b in ("triton", "cuda-wgmma-ws")]
    return [("docs/algorithm.md", f"That is why dropout runs at {span(vals, f2, '×')} the speed of SDPA's kernels here"),
            ("docs/zh/algorithm.md", f"这就是本项目的 dropout 只有 SDPA 内核 {span(vals, f2, '×')} 的原因")]


def gqa_repeat_figures(R):
    """The GQA section run again on the H200 (h200-variants/gqa-repeat, commit 05e73cb; the GQA kernels of gqa/)."""
    rows = R.json(f"{H200_VARIANTS}/gqa-repeat/variants.json")["summary"]
    tri = [r["vs_best_alternative"]["triton"] for r in rows]
    ws = [r["vs_best_alternative"]["cuda-wgmma-ws"] for r in rows]
    low = [v for v in ws if v < 1.0]
    en = (f"Triton {span(tri, f2, '×')} and cuda-wgmma-ws {span(ws, f2, '×')}, {len(low)} of {len(ws)} rows of "
          f"cuda-wgmma-ws below 1.0× ({span(low, lambda x: f'{x:.3f}', '×')})")
    zh = (f"Triton 为 {span(tri, f2, '×')}，cuda-wgmma-ws 为 {span(ws, f2, '×')}，cuda-wgmma-ws 的 {len(ws)} 行中 "
          f"{len(low)} 行低于 1.0×（{span(low, lambda x: f'{x:.3f}', '×')}）")
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh),
            ("docs/results/benchmark/h200-variants/README.md", en)]


def h200_window_figures(R):
    """The window section on an H200 (benchmark/h200-variants/window-dropout, commit c2a73a0): Triton and cuda-wgmma-ws
    over FlexAttention, forward and backward, as performance.md's *Window* bullet quotes them."""
    rows = [e for e in R.json(f"{H200_VARIANTS}/window-dropout/variants.json")["summary"] if e["section"] == "window"]

    def x(backend, mode):
        return span([e["vs_best_alternative"][backend] for e in rows if e["mode"] == mode], f2, "×")

    en = (f"forward {x('cuda-wgmma-ws', 'fwd')} FlexAttention for cuda-wgmma-ws and {x('triton', 'fwd')} for Triton; "
          f"backward {x('triton', 'bwd')} (Triton) and {x('cuda-wgmma-ws', 'bwd')} (the CUDA backward)")
    zh = (f"前向 cuda-wgmma-ws 为 FlexAttention 的 {x('cuda-wgmma-ws', 'fwd')}，Triton 为 {x('triton', 'fwd')}；"
          f"反向 Triton 为 {x('triton', 'bwd')}，CUDA 反向为 {x('cuda-wgmma-ws', 'bwd')}")
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh)]


def ws_block_order_h200_figures(R):
    """wgmma_bwd_ws's block order and split on an H200 (cuda/ws_block_order/: h200_rules_before at b301c0a, h200 at
    9d8e0a2, tools/ws_block_order.py --cudnn), and the GQA section's causal backwards at N = 16384 of the run at
    9d8e0a2, as performance.md quotes them."""
    def rows(folder):
        return {(r["Hk"], r["N"], r["causal"]): r["ms"] for r in R.json(f"cuda/ws_block_order/{folder}/ws_block_order.json")["rows"]}

    before, after = rows("h200_rules_before"), rows("h200")
    b8, b1, b4 = before[(8, 16384, True)], before[(1, 16384, True)], before[(8, 4096, True)]
    a8, a1, a4 = after[(8, 16384, True)], after[(1, 16384, True)], after[(8, 4096, True)]
    old = "tile-major MORE_BLOCKS=512"  # the rules before: no split past 512 blocks, tile-major (per > 1, causal)
    var = {(r["Hk"], r["mode"], r["causal"], r["N"]): r for r in R.json("benchmark/h200-variants/gqa/variants.json")["summary"]}
    v8, v1 = var[(8, "bwd", True, 16384)], var[(1, "bwd", True, 16384)]
    en = [
        f"tile-major is the slower order at N = 16384 (Hk = 8: {b8['tile-major']:.2f} ms against {b8['grid']:.2f} in grid order)",
        f"ran faster split into 16 blocks a tile of keys than into 4 ({b1['grid m2048']:.2f} against {b1['grid']:.2f} ms)",
        f"timed alone {a8['grid']:.2f} and {a1['grid']:.2f} ms against cuDNN's {a8['sdpa-cudnn']:.2f} and "
        f"{a1['sdpa-cudnn']:.2f} (Hk = 8 and 1, causal, N = 16384), where the rules before gave {a8[old]:.2f} and {a1[old]:.2f}",
        f"({a4['tile-major']:.2f} against {a4['grid']:.2f} ms at Hk = 8)",
        f"{v8['ms']['cuda-wgmma-ws']:.2f} and {v1['ms']['cuda-wgmma-ws']:.2f} ms against cuDNN's "
        f"{v8['ms']['sdpa-cudnn']:.2f} and {v1['ms']['sdpa-cudnn']:.2f}",
    ]
    zh = [
        f"在 N = 16384 时键块优先是较慢的顺序（Hk = 8：{b8['tile-major']:.2f} ms，网格顺序为 {b8['grid']:.2f}）",
        f"每个键块拆成 16 个线程块比拆成 4 个更快（{b1['grid m2048']:.2f} ms 对 {b1['grid']:.2f}）",
        f"单独计时为 {a8['grid']:.2f} 和 {a1['grid']:.2f} ms，cuDNN 为 {a8['sdpa-cudnn']:.2f} 和 {a1['sdpa-cudnn']:.2f}"
        f"（Hk = 8 和 1，因果，N = 16384），之前的规则为 {a8[old]:.2f} 和 {a1[old]:.2f}",
        f"（Hk = 8 时 {a4['tile-major']:.2f} ms 对 {a4['grid']:.2f}）",
        f"{v8['ms']['cuda-wgmma-ws']:.2f} 和 {v1['ms']['cuda-wgmma-ws']:.2f} ms，cuDNN 为 "
        f"{v8['ms']['sdpa-cudnn']:.2f} 和 {v1['ms']['sdpa-cudnn']:.2f}",
    ]
    rows = {(r["backend"], r["Hk"]): r["round_ms"] for r in R.json("benchmark/h200-variants/gqa/variants.json")["rows"]
            if (r["mode"], r["N"], r["causal"]) == ("bwd", 16384, True) and r.get("round_ms")}
    first = [rows[("cuda-wgmma-ws", hk)][0] for hk in (8, 1)]
    later = span([t for hk in (8, 1) for t in rows[("cuda-wgmma-ws", hk)][1:]], lambda x: f"{x:.2f}")
    cudnn = span([t for hk in (8, 1) for t in rows[("sdpa-cudnn", hk)]], lambda x: f"{x:.2f}")
    en.append(f"{first[0]:.2f} and {first[1]:.2f} ms, as alone, the other two {later}, while cuDNN's rounds stayed "
              f"within {cudnn}")
    zh.append(f"{first[0]:.2f} 和 {first[1]:.2f} ms，与单独计时相同，另外两轮为 {later}，而 cuDNN 各轮都在 {cudnn} 之内")
    return [("docs/performance.md", t) for t in en] + [("docs/zh/performance.md", t) for t in zh]


def mma_backward_figures(R):
    """The mma rung's two backwards (kernel 'mma', two kernels; 'mma-fused', one kernel with atomic dQ) beside FA2,
    from cuda/mma_backward/backward_kernels.json (tools/cuda_backward_kernels.py --mma-only)."""
    rows = R.json("cuda/mma_backward/backward_kernels.json")["rows"]
    fused = span([r["tflops"]["mma-fused"] / r["tflops"]["mma"] for r in rows], f2, "×")
    fa2 = span([r["tflops"]["sdpa-flash"] / max(r["tflops"]["mma"], r["tflops"]["mma-fused"]) for r in rows
                if r["N"] >= 4096], f2, "×")
    return [
        ("docs/performance.md", f"products per tile pair instead of 7 and is {fused} the two kernels"),
        ("docs/performance.md", f"FA2 is {fa2} the faster of the two (N ≥ 4096)"),
        ("docs/backend_cuda.md", f"{fused} the two kernels (FA2: {fa2} the faster"),
    ]


FUSED_LAYOUT = "cuda/mma_backward/fused_layout"  # mma_bwd_fused in FlashAttention-2's warp layout (H200; b428d89, 6cc81f0)


def mma_fused_layout_figures(R):
    """The one-kernel mma backward in FlashAttention-2's warp layout against the two kernels and FA2, the kernels
    alone (FUSED_LAYOUT/*/backward_kernels.json), and against its first version with plain lse/Delta loads
    (FUSED_LAYOUT/sync_rows_61c8429)."""
    shapes = ("b4h32-d64", "b4h16-d128", "seed-b8h12-d64", "b4h16-d32-d96")
    rows = [r for shape in shapes for r in R.json(f"{FUSED_LAYOUT}/{shape}/backward_kernels.json")["rows"]]
    ratio = lambda r, other: r["tflops"]["mma-fused"] / r["tflops"][other]  # noqa: E731
    wide = [r for r in rows if r["D"] != 32]
    two = span([ratio(r, "mma") for r in wide], f2, "×")
    two32 = span([ratio(r, "mma") for r in rows if r["D"] == 32], f2, "×")
    fa2_1k = span([ratio(r, "sdpa-flash") for r in wide if r["N"] == 1024], f2, "×")
    fa2_4k = span([ratio(r, "sdpa-flash") for r in wide if r["N"] == 4096], f2, "×")
    sync = [r["tflops"]["mma-fused"] / s["tflops"]["mma-fused"]
            for shape in shapes[:3]
            for r, s in zip(R.json(f"{FUSED_LAYOUT}/{shape}/backward_kernels.json")["rows"],
                            R.json(f"{FUSED_LAYOUT}/sync_rows_61c8429/{shape}/backward_kernels.json")["rows"])]
    sync = f"{(min(sync) - 1) * 100:.1f}–{(max(sync) - 1) * 100:.0f} %"
    paired = span([r["tflops"]["mma-fused paired"] / r["tflops"]["mma-fused"] for shape in ("b4h32-d64", "b4h16-d128")
                   for r in R.json(f"{FUSED_LAYOUT}/paired_1f3b48f/{shape}/backward_kernels.json")["rows"]], f2, "×")
    en = [("docs/backend_cuda.md", f"the one kernel is {two} the two at D =\n64, 96 and 128"),
          ("docs/backend_cuda.md", f"and {two32} at D = 32, where a tile of 32 columns"),
          ("docs/backend_cuda.md", f"Against FA2 it was then at {fa2_1k} at N = 1024 and {fa2_4k} at N = 4096"),
          ("docs/backend_cuda.md", f"the one kernel was {sync} slower"),
          ("docs/results/cuda/mma_backward/fused_layout/README.md", f"{two} at D = 64, 96 and 128"),
          ("docs/results/cuda/mma_backward/fused_layout/README.md", f"{two32} at D = 32"),
          ("docs/results/cuda/mma_backward/fused_layout/README.md", f"{sync} faster in every row"),
          ("docs/results/cuda/mma_backward/fused_layout/README.md", f"{paired} the kernel as it is"),
          ("docs/backend_cuda.md", f"measured {paired} and was taken out again")]
    zh = [("docs/zh/backend_cuda.md", f"单 kernel 是两个 kernel 的 {two}"),
          ("docs/zh/backend_cuda.md", f"D = 32 时为 {two32}"),
          ("docs/zh/backend_cuda.md", f"它当时在 N = 1024 时为 {fa2_1k}，N = 4096 时为 {fa2_4k}"),
          ("docs/zh/backend_cuda.md", f"单 kernel 这样做时慢 {sync}"),
          ("docs/zh/backend_cuda.md", f"实测为 {paired}，又被移除了")]
    return en + zh


def mma_forward_figures(R):
    """The mma rung's forward tile at D = 64 (launch_specs.MMA_CONFIGS): the kernels alone in every candidate config
    (cuda/mma_forward/*/forward_kernels.json, tools/cuda_forward_kernels.py --kernel mma) and cuda-mma beside FA2 in
    the recorded Hopper table (cuda/hopper_summary.json)."""
    rows = [r for shape in ("b4h32-d64", "seed-b8h12-d64")
            for r in R.json(f"cuda/mma_forward/{shape}/forward_kernels.json")["rows"] if r["D"] == 64]
    old = span([r["tflops"]["mma"] / r["tflops"]["mma 64x4x2"] for r in rows], f2, "×")
    fa2 = span([r["tflops"]["mma"] / r["tflops"]["sdpa-flash"] for r in rows], f2, "×")
    hop = [r for r in R.json("cuda/hopper_summary.json")["rows"] if r["mode"] == "fwd"]
    d64 = span([r["tflops"]["cuda-mma"] / r["tflops"]["sdpa-flash"] for r in hop if r["D"] == 64], f2, "×")
    d128 = span([r["tflops"]["cuda-mma"] / r["tflops"]["sdpa-flash"] for r in hop if r["D"] == 128 and not r["causal"]],
                f2, "×")
    sass = {}
    for name, line in re.findall(r"_Z7mma_fwdILi64ELi(\d+)ELi4ELi2ELb0ELb0E\S*: .*\n\s+(.*)",
                                 R.text("cuda/mma_forward/sass_summary_mma.txt")):
        sass[int(name)] = {op: int(n) for op, n in re.findall(r"([A-Za-z0-9]+) (\d+)", line)}
    per_hmma = {bc: f"{sass[bc]['total'] / sass[bc]['HMMA']:.1f}" for bc in sass}
    return [
        ("docs/backend_cuda.md", f"{per_hmma[64]} instructions per `HMMA` in the 64-key kernel's SASS against "
                                 f"{per_hmma[128]} in the\n128-key one, with the same {sass[64]['FMUL']} `FMUL` in both"
                                 if sass[64]["FMUL"] == sass[128]["FMUL"] else "FMUL counts differ"),
        ("docs/backend_cuda.md", f"ran it at {old} the 64-key tile the sweep had chosen (which lacked it), and at {fa2} FA2"),
        ("docs/performance.md", f"{d64} FA2 in this run at every N"),
        ("docs/performance.md", f"timed alone, {old} the 64-key tile it replaces"),
        ("docs/performance.md", f"forward not causal ({d128})"),
    ]


def triton_window_configs_figures(R):
    """performance.md §9: the Triton window backward timed with every config (triton/window_backward_configs.txt,
    tools/triton_backward_configs.py --window): the tuned pair, and no other config more than 1 % faster."""
    text, quotes = R.text("triton/window_backward_configs.txt"), []
    tuned = re.findall(r"triton alone: ([0-9.]+) .*'dq': (\([0-9, ]+\)), 'dkdv': (\([0-9, ]+\))", text)
    assert len(tuned) == 2 and len({(dq, kv) for _, dq, kv in tuned}) == 1, "two runs, one tuned pair"
    for part, (alone, _, _) in zip(text.split("# PYTHONPATH")[1:], tuned):
        best = min(float(ms) for ms in re.findall(r"^  d(?:kdv|q) \([0-9, ]+\): ([0-9.]+) ms", part, re.M))
        if best < 0.99 * float(alone):
            quotes.append(("docs/performance.md", f"a config {best:.4f} ms against the tuned {alone}"))
    _, dq, kv = tuned[0]
    return quotes + [("docs/performance.md", f"beats the tuned pair, dQ {dq} and dK/dV {kv}, by more than 1 %")]


def mma_backward_regs_figures(R):
    """backend_cuda.md: the mma backward with K_w, V_w in registers (cuda/mma_backward/<shape>/, D = 64): the two
    kernels against the unchanged mma-fused and against FA2, in the same runs."""
    rows = [r for shape in ("b4h32-d64", "seed-b8h12-d64")
            for r in R.json(f"cuda/mma_backward/{shape}/backward_kernels.json")["rows"]]
    fused = span([r["tflops"]["mma"] / r["tflops"]["mma-fused"] for r in rows], f2, "×")
    fa2 = span([r["tflops"]["mma"] / r["tflops"]["sdpa-flash"] for r in rows], f2, "×")
    return [("docs/backend_cuda.md", f"the two kernels went from 0.95–1.01× to {fused} of it; against FA2\n"
                                     f"in the same runs they are at {fa2}")]


def ws_window_walk_figures(R):
    """wgmma-ws's forward with wide windows, a block per item against the persistent walk forced
    (cuda/forward_persistent/ws_window_walk.txt, tools/ws_window_walk.py): performance.md §9, backend_cuda.md."""
    rows = {}
    for line in R.text("cuda/forward_persistent/ws_window_walk.txt").splitlines():
        m = re.match(r"\((\d+), \d+\) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+)$", line)
        if m:
            rows[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    wide = [8192, 4096, 2048]
    ws = ", ".join(f"{rows[w][0]:.2f}" for w in wide[:-1]) + f" and {rows[wide[-1]][0]:.2f}"
    forced = ", ".join(f"{rows[w][1]:.2f}" for w in wide[:-1]) + f" and {rows[wide[-1]][1]:.2f}"
    ratio = span([rows[w][0] / rows[w][1] for w in wide], f2, "×")
    return [
        ("docs/performance.md", f"{ws} ms against {forced} for the persistent walk\nat w = 8192, 4096 and 2048"),
        ("docs/backend_cuda.md", f"{ratio} the persistent walk's time at windows (w, w) of 2048 to 8192 keys"),
    ]


def dropout_profile_figures(R):
    """performance.md §9's reading of the dropout profiles (cuda/ncu-dropout/profiles.json, tools/ncu_profile.py)."""
    prof = {p["label"]: max(p["kernels"], key=lambda k: k["time_us"]) for p in R.json("cuda/ncu-dropout/profiles.json")["profiles"]}

    def pct(label, key):
        return f"{prof[label][key]:.0f} %"

    ws, tri, fa = "cuda-wgmma-ws-fwd-d64", "triton-fwd-d64-dropout", "sdpa-flash-fwd-d64-dropout"
    return [("docs/performance.md",
             f"is {pct(ws + '-dropout', 'fmaheavy_pipe_pct')} busy in cuda-wgmma-ws and {pct(tri, 'fmaheavy_pipe_pct')} in "
             f"Triton, and the tensor pipe {pct(ws + '-dropout', 'tensor_pipe_pct')}, against "
             f"{pct(ws, 'fmaheavy_pipe_pct')} and {pct(ws, 'tensor_pipe_pct')} for\n  cuda-wgmma-ws without dropout; SDPA's "
             f"FA2 with its dropout keeps the tensor pipe {pct(fa, 'tensor_pipe_pct')} busy and the FMA-heavy\n  pipe "
             f"{pct(fa, 'fmaheavy_pipe_pct')}")]


def dropout_profile_h200_figures(R):
    """performance.md §9's reading of the dropout profiles on an H200 with the wide multiplies
    (cuda/ncu-dropout-h200/profiles.json): the FMA-heavy pipe and the issue slots, forward and backward."""
    prof = {p["label"]: max(p["kernels"], key=lambda k: k["time_us"])
            for p in R.json("cuda/ncu-dropout-h200/profiles.json")["profiles"]}

    def pct(label, key):
        return f"{prof[label][key]:.0f} %"

    wf, tf, fa = "cuda-wgmma-ws-fwd-d64-dropout", "triton-fwd-d64-dropout", "sdpa-flash-fwd-d64-dropout"
    wb, tb = "cuda-wgmma-ws-bwd-d64-dropout", "triton-bwd-d64-dropout"
    en = (f"the FMA-heavy pipe is {pct(wf, 'fmaheavy_pipe_pct')} busy in cuda-wgmma-ws's forward and "
          f"{pct(tf, 'fmaheavy_pipe_pct')} in Triton's, and the issue slots {pct(wf, 'issue_slots_pct')} and "
          f"{pct(tf, 'issue_slots_pct')} (SDPA's FA2 with its dropout: {pct(fa, 'issue_slots_pct')}); in the "
          f"backward's longest kernels {pct(wb, 'fmaheavy_pipe_pct')} and {pct(tb, 'fmaheavy_pipe_pct')}, the issue "
          f"slots {pct(wb, 'issue_slots_pct')} and {pct(tb, 'issue_slots_pct')}, at an occupancy of "
          f"{pct(wf, 'achieved_occupancy_pct')}–{pct(tf, 'achieved_occupancy_pct')} in the forwards")
    zh = (f"FMA-heavy 流水线在 cuda-wgmma-ws 的前向中 {pct(wf, 'fmaheavy_pipe_pct')} 忙碌，在 Triton 的前向中 "
          f"{pct(tf, 'fmaheavy_pipe_pct')}，发射槽为 {pct(wf, 'issue_slots_pct')} 和 {pct(tf, 'issue_slots_pct')}"
          f"（SDPA 的 FA2 带它自己的 dropout：{pct(fa, 'issue_slots_pct')}）；反向最长的内核中为 "
          f"{pct(wb, 'fmaheavy_pipe_pct')} 和 {pct(tb, 'fmaheavy_pipe_pct')}，发射槽为 {pct(wb, 'issue_slots_pct')} "
          f"和 {pct(tb, 'issue_slots_pct')}，前向的占用率为 {pct(wf, 'achieved_occupancy_pct')}–"
          f"{pct(tf, 'achieved_occupancy_pct')}")
    return [("docs/performance.md", en), ("docs/zh/performance.md", zh)]


def triton_host_figures(R):
    """Triton's backward at N = 1024 (performance.md §7): host time per call with and without the call plans
    (triton/host_profile_triton.txt, tools/host_profile.py --triton) and the causal backward through autograd
    (triton/n1024_backward_autograd.txt, tools/triton_backward_configs.py)."""
    host = {}
    for line in R.text("triton/host_profile_triton.txt").splitlines():
        m = re.match(r"\s*(.+?)\s{2,}([0-9.]+)$", line)
        if m:
            host[m.group(1)] = float(m.group(2))
    plan_b, full_b = host["launch._backward (its call plan)"], host["launch._backward_full (the full path)"]
    plan_f, full_f = host["launch._forward (its call plan)"], host["launch._forward (the full path: no call plans)"]
    ours = host["flash_attn_triton backward (causal, autograd.grad of a kept graph)"]
    fa2 = host["sdpa FA2 backward (causal, autograd.grad of a kept graph)"]
    autograd = {}
    shape = None
    for line in R.text("triton/n1024_backward_autograd.txt").splitlines():
        if line.startswith("Triton backward, B="):
            shape = line.split(";")[0]
        m = re.match(r"float16 causal=(yes|no) (triton|sdpa-flash) autograd: (.*); host", line)
        if m and "B=4 H=32" in shape:
            autograd[(m.group(1), m.group(2))] = [int(x) for x in re.findall(r"= ([0-9]+) TFLOP/s", m.group(3))]
    c, n, f = autograd[("yes", "triton")], autograd[("no", "triton")], autograd[("no", "sdpa-flash")]
    f0 = lambda x: f"{x:.0f}"  # noqa: E731
    return [
        ("docs/performance.md", f"`launch._backward` {f0(plan_b)} µs with its plan against {f0(full_b)} without, "
                                f"`launch._forward`\n{f0(plan_f)} against {f0(full_f)}; the causal backward through autograd "
                                f"{f0(ours)} µs against {f0(fa2)} for\nFA2's"),
        ("docs/backend_triton.md", f"launcher {f0(plan_b)} µs with its plan against {f0(full_b)} without, the forward's "
                                   f"{f0(plan_f)} against {f0(full_f)}"),
        ("docs/performance.md", f"the causal\nbackward then read {c[0]}, {c[1]} and {c[2]} TFLOP/s and the not-causal one "
                                f"{min(n)}–{max(n)} (FA2 {min(f)}–{max(f)})"),
    ]


def autograd_thread_figures(R):
    """The seeds' causal backward on autograd's device thread (h100-seed) and on the calling thread
    (h100-seed-calling-thread, --autograd-thread calling) against FA2: faq.md Q3 and performance.md §7."""
    def ratios(folder, backends):
        fa2 = bench_row(R, folder, "sdpa-flash", "float16", 1024, mode="bwd", causal=True)["tflops"]
        return {b: bench_row(R, folder, b, "float16", 1024, mode="bwd", causal=True)["tflops"] / fa2 for b in backends}

    ours = ("triton", "cuda-mma", "cuda-wgmma", "cuda-wgmma-ws")
    device = ratios("h100-seed", ours)
    calling = ratios("h100-seed-calling-thread", ours)
    fast = [calling[b] for b in ours if b != "cuda-mma"]
    return [
        ("docs/faq.md", f"is {span(list(device.values()), f2, '×')} FA2 that way (`results/benchmark/h100-seed/`) and "
                        f"{span(fast, f2, '×')} on the calling\n   thread, cuda-mma aside"),
        ("docs/performance.md", f"backward is {calling['triton']:.2f}× FA2 on Triton, {span([calling['cuda-wgmma'], calling['cuda-wgmma-ws']], f2, '×')} "
                                f"on cuda-wgmma and cuda-wgmma-ws and {calling['cuda-mma']:.2f}× on cuda-mma"),
    ]


def triton_descriptor_figures(R):
    """backend_triton.md's figures of the tensor-descriptor forward (tools/triton_descriptor_probe.py)."""
    rows = R.json("triton/descriptors/descriptor_probe.json")["rows"]

    def best(r, ws):
        return max(v for k, v in r.items() if k.startswith("desc") and isinstance(v, float) and k.endswith(" ws") == ws)

    def gain(D):
        return span([best(r, False) / r["triton (ours)"] for r in rows if r["D"] == D], f2, "×")

    ws = span([best(r, True) / best(r, False) for r in rows], f2, "×")
    return [("docs/backend_triton.md", f"{gain(64)} this kernel at D = 64 and {gain(128)} at D = 128"),
            ("docs/backend_triton.md", f"on its K/V loop changes that by {ws} on Hopper")]


def backward_kernel_figures(R):
    """The one-kernel and warp-specialised wgmma backwards in performance.md §7 and backend_cuda.md, from
    backward_kernels.json (the kernels alone) and hopper_summary.json (beside FA2 and cuDNN)."""
    rows = R.json("cuda/backward_kernels.json")["rows"]

    def ratio(num, den, D):
        return span([r["tflops"][num] / r["tflops"][den] for r in rows if r["D"] == D], f2, "×")

    hop = [r for r in _hopper(R) if r["N"] >= 4096 and r["mode"] == "bwd"]

    def vs(D, den):
        return span(_ratio_span([r for r in hop if r["D"] == D], ("cuda-wgmma-ws",), den), f2, "×")

    def tf(D):
        return span([r["tflops"]["cuda-wgmma-ws"] for r in hop if r["D"] == D])

    ws_best = max(r["tflops"]["wgmma-ws"] for r in rows)
    return [
        ("docs/performance.md", f"{ratio('wgmma-fused', 'wgmma 2x64', 128)} at\nD = 128 and "
                                f"{ratio('wgmma-fused', 'wgmma 2x64', 64)} at D = 64"),
        ("docs/performance.md", f"{ratio('wgmma-ws', 'wgmma-fused', 128)} the\none kernel at D = 128 and "
                                f"{ratio('wgmma-ws', 'wgmma-fused', 64)} at D = 64, up to {ws_best:.0f} TFLOP/s"),
        ("docs/performance.md", f"is {vs(128, 'sdpa-flash')} FA2 at D = 128 and {vs(64, 'sdpa-flash')} at D = 64 "
                                f"({tf(128)} and {tf(64)} TFLOP/s), against cuDNN\n{vs(128, 'sdpa-cudnn')} and "
                                f"{vs(64, 'sdpa-cudnn')}"),
        ("docs/backend_cuda.md", f"{ratio('wgmma-ws', 'wgmma-fused', 128)} the one kernel at D = 128 and "
                                 f"{ratio('wgmma-ws', 'wgmma-fused', 64)} at D = 64"),
        ("README.md", f"{vs(128, 'sdpa-flash')} FA2 at D = 128 and {vs(64, 'sdpa-flash')} at D = 64, N ≥ 4096"),
        ("docs/backend_cuda.md", f"{vs(128, 'sdpa-flash')} FA2's backward at D = 128 and {vs(64, 'sdpa-flash')} at D = 64 "
                                 f"(N ≥ 4096), {vs(128, 'sdpa-cudnn')} and {vs(64, 'sdpa-cudnn')} of cuDNN's"),
    ]


def prose(R):
    """[(page, text)]: each text, built from the result files, must occur verbatim in its page."""
    L, T, B = ladder_stats(R), triton_stats(R), backward_stats(R)
    peak = R.bench("h100-default")["matmul_peak_tflops"]
    peak_seed = R.bench("h100-seed")["matmul_peak_tflops"]
    seed = {(b, d): bench_row(R, "h100-seed", b, d, 1024) for b, d, *_ in SEED_ROWS}
    naive16 = seed[("naive-torch", "float16")]
    flash_seed = [seed[(b, "float16")] for b in ("cuda-mma", "cuda-wgmma", "triton", "sdpa-flash", "sdpa-cudnn")]
    fast_cuda = [seed[(b, "float16")]["speedup_vs_naive"] for b in ("cuda-mma", "cuda-wgmma")]
    seed_times = [r["time_ms"] for r in flash_seed] + [naive16["time_ms"]]
    spread = max(seed[k]["spread_pct"] for k in seed)
    mem = {N: bench_row(R, "h100-default", "naive-torch", "float16", N) for N in (2048, 8192, 16384)}
    flash16k = bench_row(R, "h100-default", "triton", "float16", 16384)
    harness, all_files = pytest_summary(R, "gpu_tests/pytest_harness.log"), pytest_summary(R, "gpu_tests/pytest_all_files.log")
    tri_log = pytest_summary(R, "triton/gpu_pytest.log")
    h200 = {k: pytest_summary(R, f"gpu_tests/h200-full-suite/pytest_{k}.log") for k in ("harness", "cuda", "gpu_files", "three_files")}
    host = launch_overhead(R)
    cuda_host = span([host["flash_attn_cuda kernel=mma"], host["flash_attn_cuda kernel=wgmma"]])
    driver = launch_overhead(R, "cuda/launch_overhead_driver.txt")  # with the direct driver launch
    plans = launch_overhead(R, "cuda/launch_overhead_plans.txt")  # with the backward's plans, Triton's direct launch
    plans_cuda = span([plans[f"flash_attn_cuda kernel={k}"] for k in ("mma", "wgmma", "wgmma-ws")], f0)
    driver_host = span([driver[f"flash_attn_cuda kernel={k}"] for k in ("mma", "wgmma", "wgmma-ws")])
    diag = R.json("triton/triton_vs_fa2.json")["meta"]["diagnostics"]
    tri_host_bwd = f0(diag["triton"]["host_us_per_call_bwd_tiny"])
    aot = R.json("triton/aot.json")
    cpu = R.cpu()
    m1 = cpu["memory"]
    m1_std = " → ".join(f"{r['standard_mib']:.0f}" for r in m1)
    m1_flash = " → ".join(f"{r['flash_numpy_mib']:.2f}" for r in m1)
    hbm = {r["loop_order"]: r["elements"] for r in cpu["hbm"]["rows"]}
    std = cpu["hbm"]["standard_elements"]
    tail = cpu["tail_bug"]
    acc16 = {r["function"]: r for r in cpu["accuracy"]["rows"] if r["dtype"] == "float16"}

    def spaced(n):
        return f"{n:,}".replace(",", " ")

    return variants_figures(R) + backward_kernel_figures(R) + mma_backward_figures(R) + mma_fused_layout_figures(R) + mma_forward_figures(R) + forward_tiles_figures(R) + triton_window_configs_figures(R) + mma_backward_regs_figures(R) + ws_window_walk_figures(R) + triton_host_figures(R) + autograd_thread_figures(R) + triton_descriptor_figures(R) + dropout_profile_figures(R) + dropout_profile_h200_figures(R) + hdim256_figures(R) + rescale_order_figures(R) + head_dims_figures(R) + one_kernel_backward_figures(R) + gqa_rounds_figures(R) + gqa_h200_figures(R) + ws_block_order_h200_figures(R) + h200_window_figures(R) + forward_rounds_figures(R) + h200_hopper_figures(R) + mma_persistent_figures(R) + rows_pad_top_figures(R) + philox_sass_figures(R) + philox_wide_figures(R) + philox_shared_figures(R) + philox_key_rows_figures(R) + philox_key_rows_sass_figures(R) + philox_shared_registers_figures(R) + gqa_repeat_figures(R) + dropout_cost_figures(R) + cold_l2_figures(R) + ncu_h200_figures(R) + ncu_causal_backward_figures(R) + philox_floor_figures(R) + dropout_grouped_figures(R) + wait_own_block_figures(R) + [
        # CPU measurements (docs/results/cpu/measurements.json)
        ("docs/performance.md", f"({m1_std} MiB for\nstandard attention, {m1_flash} MiB for the NumPy tiled loop"),
        ("docs/faq.md", f"Measured on a CPU (M1): {m1_std} MiB for standard attention against {m1_flash} MiB for `flash_attn_numpy`"),
        ("docs/faq.md", f"has a relative-norm error of {100 * tail['rel_norm']:.1f}% and would pass, although its max-abs error, "
                        f"{tail['max_abs']:.2f}, is about {tail['times_bound']:.0f} times our fp16 bound (2 × "
                        f"{acc16['attention_naive']['max_abs'] * 1e3:.2f}·10⁻³ + 2·10⁻³ ≈ {tail['fp16_bound'] * 1e3:.1f}·10⁻³)"),
        ("docs/faq.md", f"Relative errors of ~{acc16['flash_attn_torch']['rel_norm'] * 1e4:.0f}·10⁻⁴ in fp16"),
        ("docs/algorithm.md", f"| standard attention | 4N² + 4Nd | {spaced(std)} |"),
        ("docs/algorithm.md", f"(measured) | 2Nd + Tc(3Nd + 4N) | {spaced(hbm['v1'])} |"),
        ("docs/algorithm.md", f"(measured) | 2Nd + 2Nd·Tr + N | {spaced(hbm['v2'])} |"),
        ("docs/algorithm.md", f"move {std / hbm['v1']:.1f}x (v1) and {std / hbm['v2']:.1f}x (v2) fewer elements"),
        # README.md
        ("README.md", f"Backward, fp16, same shapes: `triton` (causal) {T['bwd_ratio']} FA2 at N ≥ 2048"),
        ("README.md", f"which `cuda-mma` runs) {B['ratio']} ({B['tflops']} TFLOP/s)"),
        # docs/performance.md
        ("docs/performance.md", f"fp16 matmul {f0(peak['float16'])} TFLOP/s, tf32 matmul {f0(peak['float32 (tf32)'])} TFLOP/s, "
                                f"plain fp32 matmul {f0(peak['float32'])} TFLOP/s"),
        ("docs/performance.md", f"measured {f0(peak_seed['float16'])} and {f0(peak_seed['float32 (tf32)'])}"),
        ("docs/performance.md", f"the CUDA tensor-core kernels are {span(fast_cuda, lambda x: f'{x:.1f}', '×')} faster"),
        ("docs/performance.md", f"needs {span([r['mem_extra_mb'] for r in flash_seed], g3)} MiB above the inputs against "
                                f"{g3(naive16['mem_extra_mb'])} MiB for the score matrix"),
        ("docs/performance.md", f"one call takes {span(seed_times, lambda x: f'{x:.2g}')} ms"),
        ("docs/performance.md", f"spread up to {f0(spread)} %"),
        ("docs/performance.md", f"FA2 in the CUDA run measured within {fa2_agreement(R)} % of these"),
        ("docs/performance.md", f"Triton: forward {T['fwd_ratio']} FA2 at N ≥ 2048 and causal backward {T['bwd_ratio']} FA2"),
        ("docs/performance.md", f"causal backward is {T['small_bwd_ratio']} FA2 because each call costs about "
                                f"{tri_host_bwd} µs of host time"),
        ("docs/performance.md", f"cuDNN stays ahead at N ≥ 2048 (Triton {T['all_vs_cudnn']} of it)"),
        ("docs/performance.md", f"cuda-wgmma: **{L['wg_ratio']} FA2** on all {L['n']} shapes of the CUDA run "
                                f"({L['wg_tflops']} TFLOP/s)"),
        ("docs/performance.md", f"cuda-mma: {L['mma_ratio']} FA2 (at or above 1.0× on {L['mma_at_least_1']} of {L['n']} shapes)"),
        ("docs/performance.md", f"{B['tflops']} TFLOP/s,\n  **{B['ratio']} FA2's backward**"),
        ("docs/performance.md", f"up from the\n  {B['tiled']} TFLOP/s of the fp32 tiled backward"),
        ("docs/performance.md", f"tiled reaches {L['tiled_tflops']} TFLOP/s and naive {L['naive_tflops']}"),
        ("docs/performance.md", f"naive drops to {L['naive_tflops_d128']} at D = 128"),
        ("docs/performance.md", f"standard attention needs {f0(mem[2048]['mem_extra_mb'])} MiB above the inputs at N = 2048 and "
                                f"{f0(mem[8192]['mem_extra_mb'])} MiB at N = 8192"),
        ("docs/performance.md", f"({g3(flash16k['mem_extra_mb'])} MiB at N = 16384)"),
        ("docs/performance.md", f"({harness[0]} passed; the {harness[1]} skipped"),
        ("docs/performance.md", f"the whole suite: {all_files[0]} passed, {all_files[1]} skipped"),
        ("docs/performance.md", f"the harness {h200['harness'][0]} passed and {h200['harness'][1]} skipped (its "
                                f"CPU-interpreter cases), the CUDA test files {h200['cuda'][0]} passed, and the other "
                                f"files with GPU cases {h200['gpu_files'][0]} passed, {h200['gpu_files'][1]} skipped"),
        ("docs/performance.md", f"commit a3ecba4: {h200['three_files'][0]} passed, {h200['three_files'][1]} skipped (Triton's"),
        ("docs/zh/performance.md", f"提交 a3ecba4 的干净克隆：{h200['three_files'][0]} 个通过、\n{h200['three_files'][1]} 个跳过"),
        ("docs/performance.md", f"{plans_cuda} µs per forward call on the CUDA rungs and {f0(plans['flash_attn_triton'])} µs "
                                f"for Triton's, against {f0(plans['sdpa FLASH_ATTENTION (FA2)'])} µs for SDPA's C++ path;\n"
                                f"`launch_overhead.txt` beside it is the first such run, {cuda_host} and "
                                f"{f0(host['flash_attn_triton'])} µs against {f0(host['sdpa FLASH_ATTENTION (FA2)'])}"),
        # docs/backend_torch_split.md
        ("docs/backend_torch_split.md", f"{g3(seed[('torch-split', 'float16')]['time_ms'])} ms against "
                                        f"{g3(naive16['time_ms'])} ms for\n  standard attention in fp16"),
        # docs/faq.md
        ("docs/faq.md", f"{L['wg_ratio']} the\n   forward TFLOP/s of FlashAttention-2 on an H100, against {L['mma_ratio']} for `cuda-mma`"),
        # docs/backend_cuda.md
        ("docs/backend_cuda.md", f"Measured on an H100: {L['wg_ratio']} the TFLOP/s of FlashAttention-2"),
        ("docs/backend_cuda.md", f"{B['ratio']} FlashAttention-2's backward on an H100 ({B['tflops']} TFLOP/s"),
        ("docs/backend_cuda.md", f"CUDA-core FFMA throughout ({B['tiled']} TFLOP/s"),
        ("docs/backend_cuda.md", f"a forward call costs {driver_host} µs of Python on an H100"),
        ("docs/backend_cuda.md", f"against {f0(driver['sdpa FLASH_ATTENTION (FA2)'])} µs\n  for SDPA's FA2"),
        ("docs/backend_cuda.md", f"the two kernels run at {B['ratio']}\n  FA2 (H100)"),
        # benchmarks/README.md
        ("benchmarks/README.md", f"the recorded run took {R.bench('cpu-default')['meta']['wall_s']:.1f} s on "
                                 f"{R.bench('cpu-default')['meta']['cpu_count']} cores"),
        # docs/results/cuda/README.md
        ("docs/results/cuda/README.md", f"(×{L['mma_over_tiled']} at the same N, fp16 against"),
        ("docs/results/cuda/README.md", f"Hopper's own tensor-core instruction (×{L['wg_over_mma']})"),
        ("docs/results/cuda/README.md", f"SDPA (C++) {f0(host['sdpa FLASH_ATTENTION (FA2)'])} µs, `flash_attn_cuda` {cuda_host} µs, "
                                        f"Triton {f0(host['flash_attn_triton'])} µs"),
        ("docs/results/cuda/README.md", f"was\n{span([peak['float16'], peak_seed['float16']])} TFLOP/s in the recorded benchmark runs"),
        ("docs/results/cuda/README.md", "(warps, looped tile rows) = " + ", ".join(
            f"({c['warps']}, {c['tile']}) {c['ms_total']:.1f}" + (" ms" if i == 0 else "")
            for i, c in enumerate(sorted(R.json("cuda/cuda_backward.json")["sweep"], key=lambda c: c["ms_total"])))),
        # docs/results/triton/README.md
        ("docs/results/triton/README.md", f"(forward {T['fwd_ratio']},\nbackward {T['bwd_ratio']} FA2)"),
        ("docs/results/triton/README.md", f"(forward {T['fwd_vs_cudnn']}, backward {T['bwd_vs_cudnn']})"),
        ("docs/results/triton/README.md", f"**{tri_log[0]} passed**, {tri_log[1]} skipped"),
        ("docs/results/triton/README.md", f"about {tri_host_bwd} µs of Python per call"),
        ("docs/results/triton/README.md", "brought it to " + span([r["vs_fa2"] for r in R.triton() if r["N"] < 2048
                                                                   and r["mode"] == "fwd"], f2, "×")),
        ("docs/results/triton/README.md", f"worst case over {R.json('triton/gpu_errors.json')[0]['cases']} cases"),
        ("docs/results/triton/README.md", f"{len(aot)} kernel variants compiled for "
                                          f"{' and '.join(f'sm_{a}' for a in sorted({v['arch'] for v in aot}))} "
                                          f"({sum(1 for v in aot if not v['fits'])} failures"),
    ]


# ------------------------------------------------------------------------------------ driver
def _flat(text):
    """Runs of white space (line breaks, indentation) as one space: prose may wrap anywhere."""
    return " ".join(text.split())


def pages(root):
    out = []
    for pattern in PAGE_GLOBS:
        out += sorted(glob.glob(os.path.join(root, pattern)))
    return [p for p in dict.fromkeys(out) if os.path.isfile(p)]


def render(root, path, text, R):
    """``text`` with every generated block rewritten; returns (new text, [problems])."""
    rel = os.path.relpath(path, root).replace(os.sep, "/")
    lang = "zh" if rel.startswith("docs/zh/") else "en"
    problems = []

    def sub(m):
        indent, name = m.group(1), m.group(3)
        fn = TABLES.get(name)
        if fn is None:
            problems.append(f"{rel}: unknown generated block {name!r} (known: {', '.join(TABLES)})")
            return m.group(0)
        try:
            body = fn(R, lang)
        except (OSError, KeyError, ValueError, TypeError, IndexError) as exc:
            problems.append(f"{rel}: block {name!r} cannot be built from docs/results: {type(exc).__name__}: {exc}")
            return m.group(0)
        body = "\n".join(indent + line if line else line for line in body.split("\n"))
        return indent + m.group(2) + body + "\n" + m.group(5)

    new = MARKER.sub(sub, text)
    begins = len(re.findall(r"<!-- BEGIN GENERATED: ", text))
    if begins != len(MARKER.findall(text)):
        problems.append(f"{rel}: a BEGIN GENERATED marker without its matching END marker")
    return new, problems


def run(root=ROOT, check=False, out=sys.stdout):
    """Rewrite (or, with check=True, compare) every generated block and check the prose figures.
    Returns the list of problems (stale blocks, missing prose figures, unreadable files)."""
    R = Results(root)
    problems = []
    for path in pages(root):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new, probs = render(root, path, text, R)
        problems += probs
        if new != text:
            if check:
                diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), f"{rel} (page)",
                                                    f"{rel} (from docs/results)", n=0))
                problems.append(f"{rel}: a generated table is stale (run python tools/docs_tables.py)\n{diff}")
            else:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
                print(f"rewrote {rel}", file=out)
    try:
        quoted = prose(R)
    except (OSError, KeyError, ValueError, TypeError, IndexError) as exc:
        return problems + [f"prose figures cannot be built from docs/results: {type(exc).__name__}: {exc}"]
    texts = {}
    for page, expected in quoted:
        if page not in texts:
            try:
                with open(os.path.join(root, page), encoding="utf-8") as f:
                    texts[page] = f.read()
            except OSError as exc:
                problems.append(f"{page}: cannot read: {exc}")
                texts[page] = None
        if texts[page] is not None and _flat(expected) not in _flat(texts[page]):
            problems.append(f"{page}: the figure quoted in prose does not match its result file; expected the text "
                            f"{expected!r}")
    return problems


def main(argv=None):
    p = argparse.ArgumentParser(prog="python tools/docs_tables.py", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 and list what is stale")
    p.add_argument("--root", default=ROOT, help="repository root (default: this checkout)")
    args = p.parse_args(argv)
    problems = run(args.root, check=args.check)
    for line in problems:
        print(line)
    if problems:
        if not args.check:
            print(f"{len(problems)} problem(s) left after rewriting the tables: fix the prose figures above by hand")
        return 1
    print("docs tables and quoted figures match docs/results" if args.check else "docs tables rewritten; quoted figures match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
