"""Lab 3 (the tiled CUDA kernel's four device functions) and lab 5 (one tensor-core tile), on a CPU and a GPU.

What the lab grader calls (each function takes ``lang="en"`` or ``"zh"`` for its messages):

* ``lab3_forward(student_path, q, k, v, causal=..., softmax_scale=..., device="cpu"|"cuda")``: the
  repository's own kernel ``tiled_fwd`` (flash_attention_cuda/kernels/tiled.cu) with the bodies of its four
  device functions taken from the student's file; nothing else of the student's file is used.
  On ``"cpu"`` the result is compiled as host C++ by g++ under ``notebooks/labs/emu/cuda_emu.h`` (every CUDA
  thread a fiber; warp shuffles and barriers complete in lock-step, as CUDA defines them); on ``"cuda"``
  NVRTC compiles it and CuPy launches it with the grid of flash_attention_cuda/launcher.py.
* ``lab3_cpu_unavailable_reason()``: why the CPU path cannot run here (no g++), or None.
* ``lab3_hints(...)``: a few sentences about what a wrong (o, lse) most likely means.
* ``lab5_layout_checks(student_py_path, seed=...)``: lab 5's NumPy model of the ``mma.sync.m16n8k16``
  fragment layout, checked against the PTX ISA and numerically (S = Q K^T through the fragments). The
  answer is not in this file: the checks take it from instructor/lab5_layout.py where that is present, and
  otherwise (a student release) from the per-lane digests in lab5_layout_digests.json
  (``lab5_layout_digests``); both give the same pass/fail, only the hints differ.
* ``lab5_mma_tile(student_cu_path, a_tile, b_tile)``: GPU only: the student's kernel computes one tile
  S = A B^T with ``ldmatrix`` and ``mma.sync``; ``lab5_compile_check`` compiles it anywhere nvcc is (never a
  pass: the numbers need a GPU); ``lab5_gpu_unavailable_reason()``.

Errors in the student's code raise ``StudentCodeError`` whose text is a short message for the student
(the first compiler errors with file:line, or what went wrong), never a traceback.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EMU_DIR = os.path.join(HERE, "emu")
KERNEL_DIR = os.path.join(ROOT, "flash_attention_cuda", "kernels")
LAB3_SKELETON = os.path.join(KERNEL_DIR, "tiled.cu")  # the repository's kernel: lab 3's solution
LAB3_FUNCTIONS = ("compute_qk_scores_and_max", "compute_block_softmax_and_weighted_v", "merge_block_stats",
                  "normalize_output")
LAB3_BLOCK_N = 32  # keys per K/V tile in tiled.cu (tiled::Bc)
LAB5_KERNEL = "lab5_mma_tile"

__all__ = ["StudentCodeError", "lab3_forward", "lab3_cpu_unavailable_reason", "lab3_hints", "lab5_layout_checks",
           "lab5_mma_tile", "lab5_compile_check", "lab5_gpu_unavailable_reason", "lab5_layout_digests"]


class StudentCodeError(Exception):
    """The student's code does not compile, is not written yet, or fails at run time; str(e) says how."""


# ------------------------------------------------------------------------------------------ messages
MSG = {
    "todo": {
        "en": "{n} of the 4 device functions are not written yet: {names}.\n"
              "  Each still has its `static_assert(D_PAD < 0, ...)` line: write the body, then delete that line.",
        "zh": "4 个设备函数中还有 {n} 个没有写：{names}。\n"
              "  每个函数里仍有 `static_assert(D_PAD < 0, ...)` 这一行：先写函数体，再删掉这一行。",
    },
    "compile": {"en": "{file} does not compile ({compiler}):\n  {errors}",
                "zh": "{file} 编译失败（{compiler}）：\n  {errors}"},
    "missing_fn": {"en": "{file} has no definition of the device function {name} (keep the given signatures)",
                   "zh": "{file} 里找不到设备函数 {name} 的定义（请保留给定的函数签名）"},
    "directive": {"en": "{file}:{line}: `{text}`: preprocessor directives (#define, #include, #if, ...) are not "
                        "allowed inside the four function bodies; write plain code there",
                  "zh": "{file}:{line}：`{text}`：四个函数体内不允许预处理指令（#define、#include、#if 等），请只写普通代码"},
    "never_meet": {"en": "your device functions deadlock: {detail}",
                   "zh": "你的设备函数会死锁：{detail}（在 GPU 上会卡住或行为未定义。warp shuffle 和 __syncwarp "
                         "必须由掩码中的每个 lane 执行到，__syncthreads 必须由每个线程执行到）"},
    "no_gxx": {"en": "no C++ compiler: g++ is not on PATH (set $CXX to another g++-compatible compiler); "
                     "lab 3's CPU check compiles your device functions as host C++",
               "zh": "没有 C++ 编译器：PATH 上找不到 g++（可用 $CXX 指定其他兼容 g++ 的编译器）；"
                     "lab 3 的 CPU 检查需要把你的设备函数编译成主机 C++"},
    "no_ucontext": {"en": "lab 3's CPU emulation needs POSIX ucontext (Linux or macOS); this is {platform}",
                    "zh": "lab 3 的 CPU 模拟需要 POSIX ucontext（Linux 或 macOS）；当前系统是 {platform}"},
    "crash": {"en": "the kernel failed on the GPU: {err}\n  Usually an index out of bounds: a tile is 32 keys "
                    "(lane = key), D_PAD columns, ROWS rows per warp; write only rows < Nq and columns < D.",
              "zh": "内核在 GPU 上出错：{err}\n  通常是下标越界：一个 tile 有 32 个 key（lane = key）、D_PAD 列，"
                    "每个 warp 有 ROWS 行；只写 row < Nq 且列 < D 的位置。"},
    "oob": {"en": "your code wrote outside {what} (the guard zone {where} it changed): normalize_output may write only "
                  "rows row < Nq and columns d = lane + 32 i < D of this head's O, and lse[row] for row < Nq",
            "zh": "你的代码写到了 {what} 之外（{where} 的保护区被改动）：normalize_output 只能写本 head 的 O 中 "
                  "row < Nq、列 d = lane + 32 i < D 的位置，以及 row < Nq 的 lse[row]"},
    "lab5_todo": {"en": "{name} is not written yet (it still raises NotImplementedError): {what}",
                  "zh": "{name} 还没有写（仍然 raise NotImplementedError）：{what}"},
    "lab5_raised": {"en": "{name}({args}) raised {err}", "zh": "{name}({args}) 抛出异常 {err}"},
    "lab5_type": {"en": "{name}({args}) returned {got!r}; expected a pair of ints {shape_hint}",
                  "zh": "{name}({args}) 返回 {got!r}；应返回一对整数 {shape_hint}"},
    "lab5_range": {"en": "{name}({args}) returned {got}, outside the {shape} tile",
                   "zh": "{name}({args}) 返回 {got}，超出了 {shape} 的 tile"},
    "lab5_dup": {"en": "two registers hold the same element {cell}: {first} and {second}; {missing} of the "
                       "{total} elements are held by no register",
                 "zh": "两个寄存器持有同一个元素 {cell}：{first} 和 {second}；{total} 个元素中有 {missing} 个没有寄存器持有"},
    "lab5_bij_ok": {"en": "each of the {total} elements is in exactly one {slot}",
                    "zh": "{total} 个元素中每一个恰好在一个 {slot} 里"},
    "lab5_ptx_ok": {"en": "matches the PTX ISA's layout for all 32 lanes", "zh": "32 个 lane 全部与 PTX ISA 的布局一致"},
    "lab5_ptx_bad": {"en": "{name}({args}) = {got}, but the PTX ISA puts {want} there ({n_bad} of {total} "
                           "entries differ). {hint}",
                     "zh": "{name}({args}) = {got}，但 PTX ISA 规定这里是 {want}（{total} 项中有 {n_bad} 项不同）。{hint}"},
    "lab5_ptx_bad_lanes": {"en": "{name} differs from the PTX ISA's layout in {n_bad} of the 32 lanes ({lanes}); "
                                 "lane {lane} holds {got} ({order}). {hint}",
                           "zh": "{name} 在 32 个 lane 中有 {n_bad} 个与 PTX ISA 的布局不同（{lanes}）；"
                                 "lane {lane} 持有 {got}（{order}）。{hint}"},
    "lab5_ld_bad_lanes": {"en": "with your addresses, ldmatrix gives lane {lane} the elements {got} of the tile "
                                "(registers 0..{last}, low and high half), which is not the {frag} fragment's lane "
                                "{lane} ({n_bad} of the 32 lanes differ: {lanes}). {hint}",
                          "zh": "按你的地址，ldmatrix 让 lane {lane} 得到 tile 的元素 {got}（寄存器 0..{last}，低半和高半），"
                                "这不是 {frag} 片段的 lane {lane}（32 个 lane 中有 {n_bad} 个不同：{lanes}）。{hint}"},
    "lab5_num_wait": {"en": "not checked yet: the model of the tensor core is the PTX ISA's layout itself, which this "
                            "copy of the repository knows only as per-lane digests; once your {which} map(s) match "
                            "them (see above), your maps are that model and S = Q K^T is computed through them",
                      "zh": "暂未检查：张量核的模型就是 PTX ISA 的布局本身，这份仓库只以逐 lane 摘要的形式知道它；"
                            "等你的 {which} 映射与摘要一致（见上文），你的映射就是这个模型，S = Q K^T 将通过它们计算"},
    "lab5_num_cancel": {"en": "S = Q K^T comes out right here (max-abs error {err:.1e}), but only because the errors "
                              "of your maps cancel: the tensor core reads the registers by the PTX layout, so fix the "
                              "{which} map(s) above",
                        "zh": "这里 S = Q K^T 的结果是对的（最大绝对误差 {err:.1e}），但只是因为你的映射中的错误相互抵消了："
                              "张量核按 PTX 布局读取寄存器，请修正上文的 {which} 映射"},
    "lab5_ld_ok": {"en": "the addresses you give ldmatrix load exactly the {frag} fragment",
                   "zh": "你给 ldmatrix 的地址恰好载入 {frag} 片段"},
    "lab5_ld_bad": {"en": "with your addresses, ldmatrix gives lane {lane} register {reg} the elements {got} of "
                          "the tile, but the {frag} fragment needs {want} there. {hint}",
                    "zh": "按你的地址，ldmatrix 让 lane {lane} 的寄存器 {reg} 得到 tile 的元素 {got}，"
                          "但 {frag} 片段在那里需要 {want}。{hint}"},
    "lab5_num_ok": {"en": "S = Q K^T through your fragments: max-abs error {err:.1e} (fp16 inputs, fp32 sums)",
                    "zh": "通过你的片段计算 S = Q K^T：最大绝对误差 {err:.1e}（fp16 输入，fp32 累加）"},
    "lab5_num_bad": {"en": "S = Q K^T through your fragments is wrong: max-abs error {err:.1e} at S[{i}, {j}] "
                           "(got {got:.4f}, want {want:.4f}). The tensor core reads the registers by the PTX "
                           "layout, so Q and K must be distributed by it, and S collected by the C/D layout.",
                     "zh": "通过你的片段计算的 S = Q K^T 不对：S[{i}, {j}] 处最大绝对误差 {err:.1e}"
                           "（得到 {got:.4f}，应为 {want:.4f}）。张量核按 PTX 布局读取寄存器，所以 Q、K 必须按该布局分发，"
                           "S 必须按 C/D 布局收集。"},
    "lab5_num_skip": {"en": "not checked: {why}", "zh": "未检查：{why}"},
    "lab5_import": {"en": "importing {file} failed: {err}", "zh": "导入 {file} 失败：{err}"},
    "lab5_not_mma": {"en": "{file} compiles, but its PTX has no {instr}: the lab asks for the fragment loads "
                           "with ldmatrix and the product with mma.sync.m16n8k16 (inline PTX or kernels/ptx.cuh)",
                     "zh": "{file} 能编译，但它的 PTX 里没有 {instr}：本实验要求用 ldmatrix 载入片段、"
                           "用 mma.sync.m16n8k16 做乘法（内联 PTX 或 kernels/ptx.cuh）"},
    "lab5_compiled": {"en": "{file} compiles for sm_80 and uses ldmatrix and mma.sync.m16n8k16. The numeric check "
                            "needs a CUDA GPU ({why}): not graded here.",
                      "zh": "{file} 可以为 sm_80 编译，并使用了 ldmatrix 和 mma.sync.m16n8k16。数值检查需要 CUDA GPU"
                            "（{why}）：这里不评分。"},
    "lab5_todo_cu": {"en": "{file}: the kernel is not written yet (its `static_assert(..., \"lab5 TODO ...\")` "
                           "line is still there): write the TODO(lab5) steps, then delete that line",
                     "zh": "{file}：内核还没有写（`static_assert(..., \"lab5 TODO ...\")` 这一行还在）："
                           "完成 TODO(lab5) 的各步，再删掉这一行"},
    "no_nvcc": {"en": "nvcc not found (not on PATH, nor $NVCC, $CUDA_HOME/bin, /usr/local/cuda/bin): "
                      "nothing was compiled",
                "zh": "找不到 nvcc（PATH、$NVCC、$CUDA_HOME/bin、/usr/local/cuda/bin 里都没有）：没有编译"},
}

# hints about a wrong (o, lse) of lab 3
HINT = {
    "nan_nokey": {"en": ["NaN in rows {rows}: exactly the rows that see no key at all (causal with Nq = {Nq} > Nk = {Nk}).",
                         "Every score of such a row is -inf, so m_new = -inf and exp2(-inf - (-inf)) = NaN: use "
                         "fa::exp2_minus(x, m), which is 0 when m = -inf,",
                         "and in normalize_output give O = 0 and lse = -inf where l_i == 0 instead of dividing by 0."],
                  "zh": ["第 {rows} 行出现 NaN：正好是完全看不到任何 key 的行（因果掩码且 Nq = {Nq} > Nk = {Nk}）。",
                         "这些行的分数全是 -inf，于是 m_new = -inf，exp2(-inf - (-inf)) = NaN：请用 fa::exp2_minus(x, m)，"
                         "m = -inf 时它返回 0；",
                         "并在 normalize_output 中，当 l_i == 0 时令 O = 0、lse = -inf，而不是除以 0。"]},
    "nan": {"en": ["NaN in rows {rows}: look for exp2(-inf - (-inf)) (use fa::exp2_minus) or 0/0 (l_i == 0 in normalize_output)."],
            "zh": ["第 {rows} 行出现 NaN：检查 exp2(-inf - (-inf))（请用 fa::exp2_minus）或 0/0（normalize_output 中 l_i == 0）。"]},
    "unwritten": {"en": ["rows {rows} of O or lse were never written: normalize_output must write every row < Nq, "
                         "every column d = lane + 32 i < D, and lse[row] once (lane 0)."],
                  "zh": ["O 或 lse 的第 {rows} 行从未被写入：normalize_output 必须写每个 row < Nq、每个列 d = lane + 32 i < D，"
                         "并（由 lane 0）写一次 lse[row]。"]},
    "lse_inf": {"en": ["rows {rows} see no key (causal, Nq > Nk): they must get lse = -inf and O = 0; detect them with l_i == 0."],
                "zh": ["第 {rows} 行看不到任何 key（因果掩码，Nq > Nk）：它们的 lse 必须是 -inf、O 必须是 0；用 l_i == 0 判断。"]},
    "lse_inf_wrong": {"en": ["lse is infinite in rows {rows} that do see keys: is l_i = 0 there, or did exp2 overflow "
                             "(subtract the max first)?"],
                      "zh": ["第 {rows} 行能看到 key，lse 却是无穷大：那里 l_i 是否为 0？还是 exp2 溢出了（先减去最大值）？"]},
    "l_big": {"en": ["the row sums l_i look too large (lse is above the reference, by up to {d:.2g}): in "
                     "merge_block_stats, rescale the old l_i by a = fa::exp2_minus(m_i, m_new) (and the tile's l_ij by "
                     "b = fa::exp2_minus(m_ij, m_new)) before adding. Without it, blocks summed under an old, "
                     "smaller max count too much."],
              "zh": ["行和 l_i 偏大（lse 比参考值大，最多 {d:.2g}）：在 merge_block_stats 中，相加之前先用 "
                     "a = fa::exp2_minus(m_i, m_new) 缩放旧的 l_i（并用 b = fa::exp2_minus(m_ij, m_new) 缩放该块的 l_ij）。"
                     "不缩放的话，在旧的、较小的最大值下求和的块会被算得过多。"]},
    "l_small": {"en": ["the row sums l_i look too small (lse is below the reference, by up to {d:.2g}): is a = "
                       "exp2(m_i - m_new) the right way round (<= 1)? Is the tile's l_ij rescaled by b = "
                       "exp2(m_ij - m_new)? And does lse = (m_i + log2 l_i) * ln 2 use the final m_i?"],
                "zh": ["行和 l_i 偏小（lse 比参考值小，最多 {d:.2g}）：a = exp2(m_i - m_new) 的方向对吗（应 <= 1）？"
                       "该块的 l_ij 是否乘了 b = exp2(m_ij - m_new)？lse = (m_i + log2 l_i) * ln 2 用的是最终的 m_i 吗？"]},
    "l_single": {"en": ["this case has a single K/V tile (Nk = {Nk} <= 32), so no merging is involved: check "
                        "l_ij = warp sum of exp2(s_ij - m_ij) and lse = (m_i + log2 l_i) * ln 2 (natural log)."],
                 "zh": ["这个用例只有一个 K/V tile（Nk = {Nk} <= 32），不涉及合并：检查 l_ij = exp2(s_ij - m_ij) "
                        "的 warp 求和，以及 lse = (m_i + log2 l_i) * ln 2（自然对数）。"]},
    "o_merge": {"en": ["m_i and l_i are right (lse matches the reference) but O is not: acc must be rescaled exactly "
                       "like l_i, acc = a * acc + b * pv for every column the lane owns, and O = acc / l_i once at the end.",
                       "If that is right: in compute_block_softmax_and_weighted_v every lane must have written its p "
                       "to p_warp before any lane reads p_warp back (__syncwarp() in between)."],
                "zh": ["m_i 和 l_i 是对的（lse 与参考值一致），但 O 不对：acc 必须和 l_i 一样缩放，对该 lane 负责的每一列"
                       "acc = a * acc + b * pv，最后一次性 O = acc / l_i。",
                       "如果这没问题：在 compute_block_softmax_and_weighted_v 中，所有 lane 都把自己的 p 写进 p_warp 之后，"
                       "才能有 lane 读回 p_warp（中间要有 __syncwarp()）。"]},
    "o_single": {"en": ["m_i and l_i are right (lse matches the reference) but O is not, with a single K/V tile: check "
                        "pv[r][i] = sum over the 32 keys c of p_c * V[c][lane + 32 i] and O = acc / l_i,",
                        "and that every lane has written its p to p_warp before any lane reads p_warp back "
                        "(__syncwarp() in between)."],
                 "zh": ["m_i 和 l_i 是对的（lse 与参考值一致），但只有一个 K/V tile 时 O 仍不对：检查 "
                        "pv[r][i] = 对 32 个 key c 求和 p_c * V[c][lane + 32 i]，以及 O = acc / l_i，",
                        "并检查所有 lane 都把自己的 p 写进 p_warp 之后，才有 lane 读回 p_warp（中间要有 __syncwarp()）。"]},
    "worst": {"en": ["the largest error of O is in query row {row} (of Nq = {Nq}); compare that row by hand."],
              "zh": ["O 的最大误差在查询行 {row}（共 Nq = {Nq} 行）；请手工核对这一行。"]},
}


def _lang(lang: str, fn: str) -> str:
    if lang not in ("en", "zh"):
        raise ValueError(f"{fn}: lang must be 'en' or 'zh', got {lang!r}")
    return lang


def _msg(key: str, lang: str, **kw) -> str:
    return MSG[key][lang].format(**kw)


# ------------------------------------------------------------------------------------------ C/C++ text
def _mask_code(text: str) -> str:
    """``text`` with comments, string and char literals blanked (same length, newlines kept)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            i += 1
            continue
        for p in range(i, j):
            if out[p] != "\n":
                out[p] = " "
        i = j
    return "".join(out)


def _match(masked: str, i: int, open_c: str, close_c: str) -> int:
    """Index of the bracket that closes the one at ``i``."""
    depth = 0
    for p in range(i, len(masked)):
        if masked[p] == open_c:
            depth += 1
        elif masked[p] == close_c:
            depth -= 1
            if depth == 0:
                return p
    return -1


def function_bodies(text: str, names=LAB3_FUNCTIONS) -> dict:
    """{name: (start, end)}: ``text[start:end]`` is the body of the definition ``name(...) {...}`` (between
    its braces), for each name that has a definition; comments and calls (``name<...>(...)``) are skipped."""
    masked = _mask_code(text)
    spans = {}
    for name in names:
        for m in re.finditer(rf"\b{name}\s*\(", masked):
            close = _match(masked, m.end() - 1, "(", ")")
            if close < 0:
                break
            k = close + 1
            while k < len(masked) and masked[k].isspace():
                k += 1
            if k < len(masked) and masked[k] == "{":
                end = _match(masked, k, "{", "}")
                if end > 0:
                    spans[name] = (k + 1, end)
                    break
    return spans


def _line_of(text: str, i: int) -> int:
    return text.count("\n", 0, i) + 1


def _skeleton_text() -> str:
    with open(LAB3_SKELETON) as f:
        return f.read()


def splice_lab3(student_path: str, *, lang: str = "en", skeleton: Optional[str] = None) -> str:
    """tiled.cu with the bodies of its four device functions replaced by those of ``student_path``, with
    ``#line`` directives so that compiler errors in the bodies point into the student's file."""
    fname = os.path.basename(student_path)
    with open(student_path, encoding="utf-8", errors="replace") as f:
        student = f.read()
    skel = _skeleton_text() if skeleton is None else skeleton
    s_spans = function_bodies(student)
    k_spans = function_bodies(skel)
    for name in LAB3_FUNCTIONS:
        if name not in s_spans:
            raise StudentCodeError(_msg("missing_fn", lang, file=fname, name=name))
        if name not in k_spans:  # the repository's kernel changed: a grader bug, not the student's
            raise RuntimeError(f"splice_lab3: {LAB3_SKELETON} has no definition of {name}")
        a, b = s_spans[name]
        for m in re.finditer(r"^[ \t]*#[ \t]*(\w+).*$", student[a:b], flags=re.M):
            if m.group(1) not in ("pragma",):
                raise StudentCodeError(_msg("directive", lang, file=fname, line=_line_of(student, a + m.start()),
                                            text=m.group(0).strip()))
    out, pos = [f'#line 1 "{os.path.basename(LAB3_SKELETON)}"\n'], 0
    for name in sorted(LAB3_FUNCTIONS, key=lambda nm: k_spans[nm][0]):
        ka, kb = k_spans[name]
        sa, sb = s_spans[name]
        out.append(skel[pos:ka])
        out.append(f'\n#line {_line_of(student, sa)} "{fname}"\n')
        out.append(student[sa:sb])
        out.append(f'\n#line {_line_of(skel, kb)} "{os.path.basename(LAB3_SKELETON)}"\n')
        pos = kb
    out.append(skel[pos:])
    return "".join(out)


def _compile_errors(output: str, lang: str, fname: str, compiler: str, paths=()) -> StudentCodeError:
    todo = sorted(set(re.findall(r"lab3 TODO (\d)/4: (\w+) is not written yet", output)))
    if todo:
        return StudentCodeError(_msg("todo", lang, n=len(todo), names=", ".join(nm for _, nm in todo)))
    for p in paths:
        output = output.replace(p + os.sep, "").replace(p, os.path.basename(p))
    errs = []
    for ln in output.splitlines():
        if re.search(r"\berror\b", ln) and ln.strip() not in errs:
            errs.append(ln.strip())
    shown = "\n  ".join(errs[:6]) or output.strip()[-1500:]
    return StudentCodeError(_msg("compile", lang, file=fname, compiler=compiler,
                                 errors=shown + ("\n  ..." if len(errs) > 6 else "")))


# ------------------------------------------------------------------------------------------ lab 3: CPU
_LIBS: dict = {}
_LOCK = threading.Lock()


def _cxx() -> Optional[str]:
    env = os.environ.get("CXX")
    if env and shutil.which(env):
        return shutil.which(env)
    return shutil.which("g++")


def lab3_cpu_unavailable_reason(lang: str = "en") -> Optional[str]:
    """Why lab 3's CPU emulation cannot run on this machine (no g++, no ucontext), or None if it can."""
    lang = _lang(lang, "lab3_cpu_unavailable_reason")
    if os.name != "posix":
        return _msg("no_ucontext", lang, platform=sys.platform)
    if _cxx() is None:
        return _msg("no_gxx", lang)
    return None


def _cache_dir() -> str:
    d = os.environ.get("FA_LABS_CACHE") or os.path.join(tempfile.gettempdir(),
                                                        f"fa_labs_cache_{getattr(os, 'getuid', lambda: 0)()}")
    os.makedirs(d, exist_ok=True)
    return d


def _emu_files() -> list:
    return [os.path.join(EMU_DIR, "cuda_emu.h"), os.path.join(EMU_DIR, "lab3_entry.inc"),
            os.path.join(KERNEL_DIR, "common.cuh"), os.path.join(KERNEL_DIR, "masks.cuh")]


def build_lab3_cpu(student_path: str, *, lang: str = "en") -> str:
    """Compile the spliced kernel as host C++ (g++ -O2, a shared library); returns its path. Cached by content."""
    reason = lab3_cpu_unavailable_reason(lang)
    if reason is not None:
        raise RuntimeError(f"build_lab3_cpu: {reason}")
    cxx = _cxx()
    source = splice_lab3(student_path, lang=lang)
    tu = (f'#include "cuda_emu.h"\n{source}\n#line 1 "lab3_entry.inc"\n#include "lab3_entry.inc"\n')
    flags = ["-std=c++17", "-O2", "-fPIC", "-shared", "-fno-strict-aliasing", "-w", "-I", EMU_DIR, "-I", KERNEL_DIR]
    if os.environ.get("FA_LABS_UCONTEXT"):  # the portable fiber switch instead of x86-64's fast one
        flags.append("-DEMU_USE_UCONTEXT")
    h = hashlib.sha256()
    for part in [tu, cxx, " ".join(flags)] + [open(p).read() for p in _emu_files()]:
        h.update(part.encode())
    key = h.hexdigest()[:24]
    so = os.path.join(_cache_dir(), f"lab3_{key}.so")
    if os.path.isfile(so):
        return so
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "lab3_emu.cpp")
        with open(src, "w") as f:
            f.write(tu)
        out = os.path.join(tmp, "lab3.so")
        try:
            p = subprocess.run([cxx, *flags, "-o", out, src], capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            raise StudentCodeError(_msg("compile", lang, file=os.path.basename(student_path), compiler="g++",
                                        errors="g++ took more than 300 s")) from None
        if p.returncode != 0:
            raise _compile_errors(p.stdout + p.stderr, lang, os.path.basename(student_path), "g++",
                                  paths=(tmp, EMU_DIR, KERNEL_DIR))
        tmp_so = so + f".{os.getpid()}.tmp"
        shutil.copyfile(out, tmp_so)
        os.replace(tmp_so, so)  # atomic: a concurrent grader sees the whole library or none
    return so


def _load_lib(so: str):
    with _LOCK:
        lib = _LIBS.get(so)
        if lib is None:
            lib = ctypes.CDLL(so)
            f = lib.lab3_emu_forward
            fp = ctypes.POINTER(ctypes.c_float)
            f.argtypes = [fp, fp, fp, fp, fp] + [ctypes.c_int] * 4 + [ctypes.c_float] + [ctypes.c_int] * 5 + [
                ctypes.c_char_p, ctypes.c_int]
            f.restype = ctypes.c_int
            _LIBS[so] = lib
    return lib


def lab3_config(D: int) -> tuple:
    """(D_PAD, ROWS) of tiled_fwd for head dim D, as flash_attention_cuda/launcher.py launches it."""
    d_pad = next(p for p in (32, 64, 128) if D <= p)
    return d_pad, 4 if d_pad == 128 else 8


def _check_qkv(q, k, v, fn):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{fn}: {name} must be a NumPy array, got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{fn}: {name} must be 4-D (B, H, N, D), got shape {x.shape}")
        if x.dtype != np.float32:
            raise TypeError(f"{fn}: {name} must be float32, got {x.dtype}")
    B, H, Nq, D = q.shape
    if k.shape[:2] != (B, H) or k.shape[3] != D or v.shape != k.shape:
        raise ValueError(f"{fn}: expected q (B, H, Nq, D) and k, v (B, H, Nk, D) with the same B, H, D; "
                         f"got q {q.shape}, k {k.shape}, v {v.shape}")
    Nk = k.shape[2]
    if min(B, H, Nq, Nk, D) < 1 or D > 128:
        raise ValueError(f"{fn}: need B, H, Nq, Nk >= 1 and 1 <= D <= 128 (the tiled kernel's range); "
                         f"got q {q.shape}, k {k.shape}")
    return B, H, Nq, Nk, D


def lab3_forward(student_path, q, k, v, *, causal, softmax_scale, device, lang="en"):
    """Run lab 3's kernel with the student's four device functions: returns (o, lse).

    q (B, H, Nq, D), k and v (B, H, Nk, D): float32 NumPy arrays, 1 <= D <= 128. causal: the bottom-right
    aligned mask of flash_attention_py/masks.py. softmax_scale: a float, or None for 1/sqrt(D).
    device: "cpu" (g++ and the fiber emulation of notebooks/labs/emu/) or "cuda" (NVRTC + CuPy, the real kernel).
    Returns o float32 (B, H, Nq, D) and lse float32 (B, H, Nq), natural log; entries the kernel never wrote
    are NaN. Raises StudentCodeError (not written yet, compile errors, deadlock, a crash on the GPU) with a
    message in ``lang`` ("en" or "zh"); ValueError/TypeError for bad arguments.
    """
    fn = "lab3_forward"
    lang = _lang(lang, fn)
    B, H, Nq, Nk, D = _check_qkv(q, k, v, fn)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"{fn}: causal must be a bool, got {type(causal).__name__} {causal!r}")
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    if not isinstance(scale, (int, float, np.floating)) or not np.isfinite(scale):
        raise ValueError(f"{fn}: softmax_scale must be a finite float or None, got {softmax_scale!r}")
    if not os.path.isfile(student_path):
        raise ValueError(f"{fn}: student_path {student_path!r} is not a file")
    if device == "cpu":
        return _lab3_cpu(student_path, q, k, v, bool(causal), float(scale), lang)
    if device == "cuda":
        reason = _cuda_unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"{fn}: device 'cuda' needs a CUDA GPU: {reason}")
        return _lab3_cuda(student_path, q, k, v, bool(causal), float(scale), lang)
    raise ValueError(f"{fn}: device must be 'cpu' or 'cuda', got {device!r}")


GUARD = 1024  # floats of NaN-pattern guard zone before and after O and lse: catches writes out of bounds
_GUARD_BITS = np.uint32(0x7FC0DEAD)  # a NaN with a payload no float operation produces


def _guarded(xp, shape):
    """(padded 1-D buffer, the (shape) view inside it): the view is filled with NaN, the guards with the pattern."""
    n = int(np.prod(shape))
    buf = xp.full(n + 2 * GUARD, _GUARD_BITS, dtype=xp.uint32).view(xp.float32)
    view = buf[GUARD:GUARD + n]
    view[...] = np.nan
    return buf, view.reshape(shape)


def _check_guards(buf, what, lang):
    bits = np.asarray(buf).view(np.uint32)
    n = bits.size - 2 * GUARD
    for where, zone in (("before", bits[:GUARD]), ("after", bits[GUARD + n:])):
        if (zone != _GUARD_BITS).any():
            if lang == "zh":
                where = "之前" if where == "before" else "之后"
            raise StudentCodeError(_msg("oob", lang, what=what, where=where))


def _lab3_cpu(student_path, q, k, v, causal, scale, lang):
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    lib = _load_lib(build_lab3_cpu(student_path, lang=lang))
    q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
    o_buf, o = _guarded(np, (B, H, Nq, D))
    lse_buf, lse = _guarded(np, (B, H, Nq))
    vec4 = D % 4 == 0 and all(x.ctypes.data % 16 == 0 for x in (q, k, v))
    d_pad, rows = lab3_config(D)
    err = ctypes.create_string_buffer(2048)
    fp = ctypes.POINTER(ctypes.c_float)
    rc = lib.lab3_emu_forward(*(x.ctypes.data_as(fp) for x in (q, k, v, o, lse)), B * H, Nq, Nk, D,
                              *(x.item() for x in _lab3_scalars(scale, causal)), int(vec4), d_pad, rows, err,
                              len(err))
    if rc == 1:
        raise StudentCodeError(_msg("never_meet", lang, detail=err.value.decode(errors="replace")))
    if rc != 0:
        raise RuntimeError(f"lab3_forward: the emulation failed: {err.value.decode(errors='replace')}")
    _check_guards(o_buf, "O", lang)
    _check_guards(lse_buf, "lse", lang)
    return o.copy(), lse.copy()


# ------------------------------------------------------------------------------------------ lab 3: GPU
_GPU_KERNELS: dict = {}


def _inline_common(source: str) -> str:
    """The spliced tiled.cu with the project headers it includes (common.cuh, masks.cuh) inlined, for NVRTC."""
    lines = source.split("\n")
    for i, ln in enumerate(lines):
        m = re.match(r'\s*#\s*include\s+"(\w+\.cuh)"', ln)
        if m:
            with open(os.path.join(KERNEL_DIR, m.group(1))) as f:
                header = f.read()
            lines[i] = f'#line 1 "{m.group(1)}"\n{header}\n#line {i + 2} "{os.path.basename(LAB3_SKELETON)}"'
    return "\n".join(lines)


def _lab3_scalars(scale: float, causal: bool) -> tuple:
    """tiled_fwd's scalar arguments after D: (scale_log2, window_left, window_right), as the launcher builds them."""
    from flash_attention_cuda.launch_specs import mask_args, scale_args
    from flash_attention_py.masks import window_for

    return (*scale_args(scale), *mask_args(window_for(causal)))


def _lab3_cuda(student_path, q, k, v, causal, scale, lang):
    import cupy

    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    d_pad, rows = lab3_config(D)
    name = f"tiled_fwd<{d_pad}, {rows}>"
    code = _inline_common(splice_lab3(student_path, lang=lang))
    key = (hashlib.sha256(code.encode()).hexdigest(), name, cupy.cuda.Device().id)
    kern = _GPU_KERNELS.get(key)
    if kern is None:
        try:
            module = cupy.RawModule(code=code, options=("--std=c++17",), name_expressions=[name])
            kern = module.get_function(name)
        except Exception as exc:  # cupy.cuda.compiler.CompileException: NVRTC's log
            if "compile" in type(exc).__name__.lower() or "nvrtc" in str(exc).lower():
                raise _compile_errors(str(exc), lang, os.path.basename(student_path), "NVRTC") from None
            raise
        _GPU_KERNELS[key] = kern
    qd, kd, vd = (cupy.asarray(np.ascontiguousarray(x)) for x in (q, k, v))
    o_buf, o = _guarded(cupy, (B, H, Nq, D))
    lse_buf, lse = _guarded(cupy, (B, H, Nq))
    br = 4 * rows
    vec4 = D % 4 == 0  # CuPy allocations are 256-byte aligned
    try:
        kern(((Nq + br - 1) // br, B * H), (128,),
             (qd, kd, vd, o, lse, np.int32(Nq), np.int32(Nk), np.int32(D), *_lab3_scalars(scale, causal),
              np.int32(vec4)))
        cupy.cuda.runtime.deviceSynchronize()  # a crash inside the kernel surfaces here
        o_buf, lse_buf = cupy.asnumpy(o_buf), cupy.asnumpy(lse_buf)
    except Exception as exc:
        text = f"{type(exc).__module__} {type(exc).__name__} {exc}"
        if "cuda" in text.lower():
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StudentCodeError(_msg("crash", lang, err=f"{type(exc).__name__}: {first}")) from None
        raise
    _check_guards(o_buf, "O", lang)
    _check_guards(lse_buf, "lse", lang)
    n = B * H * Nq
    return (o_buf[GUARD:GUARD + n * D].reshape(B, H, Nq, D).copy(), lse_buf[GUARD:GUARD + n].reshape(B, H, Nq).copy())


# ------------------------------------------------------------------------------------------ lab 3: hints
def _rows(rows, n=6) -> str:
    rows = [int(i) for i in rows]
    return ", ".join(map(str, rows[:n])) + (", ..." if len(rows) > n else "")


def lab3_hints(o, lse, o_ref, lse_ref, *, causal, Nk, lang="en", atol=1e-4) -> list:
    """A few sentences on what most likely makes lab 3's (o, lse) differ from the float64 reference.

    o, o_ref (..., Nq, D); lse, lse_ref (..., Nq); Nk the number of keys (one K/V tile of 32 keys or
    several decides between "the merge" and "the tile's own softmax"). ``atol``: the error above which a
    value counts as wrong (the grader's tolerance). Returns [] when nothing stands out.
    """
    lang = _lang(lang, "lab3_hints")
    o, lse, o_ref, lse_ref = (np.asarray(x, np.float64) for x in (o, lse, o_ref, lse_ref))
    Nq = o_ref.shape[-2]
    no_key = np.isneginf(lse_ref).reshape(-1, Nq).all(axis=0)
    several = Nk > LAB3_BLOCK_N

    def h(key, **kw):
        return [s.format(**kw) for s in HINT[key][lang]]

    o_nan = np.isnan(o).any(axis=-1).reshape(-1, Nq).any(axis=0)
    lse_nan = np.isnan(lse).reshape(-1, Nq).any(axis=0)
    if (o_nan | lse_nan).any():
        rows = np.nonzero(o_nan | lse_nan)[0]
        if causal and no_key.any() and no_key[rows].all():
            return h("nan_nokey", rows=_rows(rows), Nq=Nq, Nk=Nk)
        if np.isnan(o).all(axis=-1).reshape(-1, Nq)[:, rows].all() or np.isnan(lse).reshape(-1, Nq)[:, rows].all():
            return h("unwritten", rows=_rows(rows))
        return h("nan", rows=_rows(rows))
    inf_wrong = (np.isinf(lse) != np.isinf(lse_ref)) | (np.isinf(lse_ref) & (lse != lse_ref))
    if inf_wrong.any():
        rows = np.unique(np.nonzero(inf_wrong)[-1])
        return h("lse_inf", rows=_rows(rows)) if no_key[rows].all() else h("lse_inf_wrong", rows=_rows(rows))
    fin = np.isfinite(lse_ref)
    d = (lse - lse_ref)[fin]
    if d.size and np.abs(d).max() > atol:
        worst = float(d[np.argmax(np.abs(d))])
        if not several:
            return h("l_single", Nk=Nk)
        return h("l_big" if worst > 0 else "l_small", d=abs(worst))
    err = np.abs(o - o_ref).max(axis=-1)
    if err.max() > atol:
        if several:
            return h("o_merge")
        row = int(np.unravel_index(int(np.argmax(err)), err.shape)[-1])
        return h("o_single") + h("worst", row=row, Nq=Nq)
    return []


# ------------------------------------------------------------------------------------------ lab 5: layout
# The answer (the PTX ISA's fragment layout) is not in this file: it lives in instructor/lab5_layout.py, which a
# student release leaves out. There the checks compare entry by entry and quote the layout in their hints;
# without it they compare each lane's registers with salted, iterated SHA-256 digests (PBKDF2-HMAC-SHA256)
# of the true layout, stored in lab5_layout_digests.json. A digest covers all the registers of one lane of
# one fragment (8 (row, col) pairs for A, 4 for B and C), so it tells which lanes are wrong without giving
# away a register's answer, and the pass/fail of every check is the same either way.
LAB5_INSTRUCTOR_FILE = os.path.join(HERE, "instructor", "lab5_layout.py")
LAB5_DIGESTS_FILE = os.path.join(HERE, "lab5_layout_digests.json")
LAB5_DIGEST_ITERATIONS = 4000
# fragment key -> (function, registers per lane, tile shape, layout array shape)
_LAB5_FRAG = {"A": ("a_fragment", 4, (16, 16), (32, 4, 2, 2)),
              "B": ("b_fragment", 2, (16, 8), (32, 2, 2, 2)),
              "C": ("c_fragment", 4, (16, 8), (32, 4, 2))}


def _lane_payload(key: str, lane: int, cells) -> bytes:
    """The text a lane's digest is taken of: the fragment, the lane and its (row, col) pairs in register order."""
    return (f"lab5|{key}|{lane}|" + ";".join(f"{int(r)},{int(c)}" for r, c in cells)).encode()


def _lane_cells(arr, lane: int) -> list:
    """The (row, col) pairs of one lane of a layout array, in register order (reg, then half)."""
    return [tuple(int(x) for x in cell) for cell in np.asarray(arr[lane]).reshape(-1, 2)]


def lab5_layout_digests(layout, salt, iterations=LAB5_DIGEST_ITERATIONS) -> dict:
    """Per-lane digests of a fragment layout: {"A": [32 hex strings], "B": [...], "C": [...]}.

    layout: {"A": (32, 4, 2, 2), "B": (32, 2, 2, 2), "C": (32, 4, 2)} integer arrays of (row, col) indexed
    [lane, reg, half] (C: [lane, i]); salt: a non-empty hex string; iterations: PBKDF2 rounds (>= 1). Lane
    ``lane`` of fragment ``key`` gets PBKDF2-HMAC-SHA256 of ``lab5|key|lane|r0,c0;r1,c1;...`` (all of the
    lane's registers, in order) with the salt. notebooks/labs/instructor/lab5_layout.py writes the digests of
    the true layout to lab5_layout_digests.json with this function.
    """
    fn = "lab5_layout_digests"
    if not isinstance(salt, str) or not salt or len(salt) % 2 or any(ch not in "0123456789abcdefABCDEF" for ch in salt):
        raise ValueError(f"{fn}: salt must be a non-empty hex string of even length, got {salt!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) or iterations < 1:
        raise ValueError(f"{fn}: iterations must be an int >= 1, got {iterations!r}")
    if not isinstance(layout, dict) or set(layout) != set(_LAB5_FRAG):
        raise TypeError(f"{fn}: layout must be a dict with keys 'A', 'B', 'C', got "
                        f"{sorted(layout) if isinstance(layout, dict) else type(layout).__name__}")
    out = {}
    for key, (_, _, _, shape) in _LAB5_FRAG.items():
        arr = np.asarray(layout[key])
        if arr.shape != shape:
            raise ValueError(f"{fn}: layout[{key!r}] must have shape {shape}, got {arr.shape}")
        out[key] = [hashlib.pbkdf2_hmac("sha256", _lane_payload(key, ln, _lane_cells(arr, ln)), bytes.fromhex(salt),
                                        int(iterations)).hex() for ln in range(32)]
    return out


def _lab5_instructor():
    """instructor/lab5_layout.py as a module, or None where it is not (a student release)."""
    if not os.path.isfile(LAB5_INSTRUCTOR_FILE):
        return None
    spec = importlib.util.spec_from_file_location("lab5_instructor_layout", LAB5_INSTRUCTOR_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Lab5Answer:
    """What the checks compare with: the true layout (instructor) or the stored per-lane digests (digests)."""

    def __init__(self, source: str, fn: str):
        if source not in ("auto", "instructor", "digests"):
            raise ValueError(f"{fn}: layout_source must be 'auto', 'instructor' or 'digests', got {source!r}")
        inst = _lab5_instructor() if source in ("auto", "instructor") else None
        if source == "instructor" and inst is None:
            raise ValueError(f"{fn}: layout_source='instructor' needs {LAB5_INSTRUCTOR_FILE}, which is not here")
        self.true, self.hint = (inst.true_layout(), inst.HINT) if inst is not None else (None, None)
        self.mode = "instructor" if inst is not None else "digests"
        if self.mode == "digests":
            try:
                with open(LAB5_DIGESTS_FILE, encoding="utf-8") as f:
                    table = json.load(f)
                self.salt, self.iterations = bytes.fromhex(table["salt"]), int(table["iterations"])
                self.digests = {k: list(table["digests"][k]) for k in _LAB5_FRAG}
                if any(len(v) != 32 for v in self.digests.values()):
                    raise ValueError("32 digests per fragment expected")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise RuntimeError(f"{fn}: lab 5's layout digests ({LAB5_DIGESTS_FILE}) cannot be read "
                                   f"({type(exc).__name__}: {exc}); the layout checks need them") from None
        self._cache = {}

    def bad_lanes(self, key: str, arr) -> list:
        """The lanes whose registers (arr[lane], a layout array of fragment key) differ from the PTX layout."""
        if self.mode == "instructor":
            return [ln for ln in range(32) if _lane_cells(arr, ln) != _lane_cells(self.true[key], ln)]
        bad = []
        for ln in range(32):
            payload = _lane_payload(key, ln, _lane_cells(arr, ln))
            if payload not in self._cache:
                self._cache[payload] = hashlib.pbkdf2_hmac("sha256", payload, self.salt, self.iterations).hex()
            if self._cache[payload] != self.digests[key][ln]:
                bad.append(ln)
        return bad


def _ldmatrix(tile, addr, nmat):
    """ldmatrix.sync.aligned.m8n8.x{nmat}.b16 as the PTX ISA defines it: lane 8 i + r gives the start
    (row, col) of row r of matrix i (8 consecutive 16-bit elements); lane gets, in register i, the elements
    (lane >> 2, 2 (lane % 4)) and (lane >> 2, 2 (lane % 4) + 1) of matrix i. Returns (32, nmat, 2) values."""
    out = np.zeros((32, nmat, 2), tile.dtype)
    for lane in range(32):
        for i in range(nmat):
            r0, c0 = addr[8 * i + (lane >> 2)]
            for half in range(2):
                out[lane, i, half] = tile[r0, c0 + 2 * (lane & 3) + half]
    return out


def _mma_model(a_regs, b_regs, layout):
    """What the tensor core computes, given its register layout (arrays as in lab5_layout_digests): it reads A
    (16x16) and B (16x8) from the registers by the layout and returns D = A B (fp32 sums) in the registers of
    the C/D layout, (32, 4)."""
    A = np.zeros((16, 16), np.float32)
    B = np.zeros((16, 8), np.float32)
    LA, LB, LC = layout["A"], layout["B"], layout["C"]
    for lane in range(32):
        for reg in range(4):
            for half in range(2):
                A[tuple(LA[lane, reg, half])] = a_regs[lane, reg, half]
        for reg in range(2):
            for half in range(2):
                B[tuple(LB[lane, reg, half])] = b_regs[lane, reg, half]
    Dm = A @ B
    return np.array([[Dm[tuple(LC[lane, i])] for i in range(4)] for lane in range(32)], np.float32)


_LAB5_WHAT = {
    "a_fragment": {"en": "A (16 x 16): the (row, col) held by (lane, reg, half)",
                   "zh": "A（16 x 16）：(lane, reg, half) 持有的 (row, col)"},
    "b_fragment": {"en": "B (16 x 8, = K_j^T): the (k, n) held by (lane, reg, half)",
                   "zh": "B（16 x 8，= K_j^T）：(lane, reg, half) 持有的 (k, n)"},
    "c_fragment": {"en": "C/D (16 x 8, fp32): the (row, col) held by (lane, i)",
                   "zh": "C/D（16 x 8，fp32）：(lane, i) 持有的 (row, col)"},
    "ldmatrix_a_address": {"en": "the (row, col) of the A tile that lane points ldmatrix.x4 to",
                           "zh": "lane 交给 ldmatrix.x4 的地址在 A tile 中的 (row, col)"},
    "ldmatrix_b_address": {"en": "the (key, dim) of the K tile that lane points ldmatrix.x2 to",
                           "zh": "lane 交给 ldmatrix.x2 的地址在 K tile 中的 (key, dim)"},
}
# Hints that help without stating the layout (instructor/lab5_layout.py has the ones that state it).
_LAB5_HINT = {
    "A": {"en": "A: see the PTX ISA's figure of the A fragment of mma.m16n8k16 (.f16): with groupID = lane >> 2 and "
                "threadID_in_group = lane % 4, which rows and which columns do a lane's four registers cover?",
          "zh": "A：参见 PTX ISA 中 mma.m16n8k16（.f16）A 片段的图：令 groupID = lane >> 2、threadID_in_group = lane % 4，"
                "一个 lane 的四个寄存器覆盖哪些行、哪些列？"},
    "B": {"en": "B: a lane holds one column n of B (one key) and four of its rows k; see the PTX ISA's figure of the "
                "B fragment of mma.m16n8k16.",
          "zh": "B：一个 lane 持有 B 的一列 n（一个 key）中的四行 k；参见 PTX ISA 中 mma.m16n8k16 B 片段的图。"},
    "C": {"en": "C/D: a lane's four floats c0..c3 lie in two rows of the tile, two neighbouring columns in each; see "
                "the PTX ISA's figure of the C/D fragment of mma.m16n8k16.",
          "zh": "C/D：一个 lane 的四个浮点数 c0..c3 位于 tile 的两行中，每行两个相邻的列；参见 PTX ISA 中 "
                "mma.m16n8k16 C/D 片段的图。"},
    "LA": {"en": "ldmatrix.x4: matrix i takes its 8 row addresses from lanes 8 i .. 8 i + 7 and lands in register i "
                 "of every lane: point matrix i at the 8x8 block of A that a_fragment puts in register i.",
           "zh": "ldmatrix.x4：矩阵 i 的 8 个行地址来自 lane 8i .. 8i+7，它进入每个 lane 的寄存器 i："
                 "让矩阵 i 指向 a_fragment 放进寄存器 i 的那个 A 的 8x8 块。"},
    "LB": {"en": "ldmatrix.x2 on the K tile (8 keys x 16 dims, row-major): lanes 0-7 give the rows of matrix 0, "
                 "lanes 8-15 those of matrix 1, and matrix i lands in register i; B = K^T, so a K row is a B column: "
                 "point matrix i at the 8x8 block of K whose transpose b_fragment puts in register i.",
           "zh": "在 K tile（8 个 key x 16 维，行主序）上用 ldmatrix.x2：lane 0-7 给出矩阵 0 的行，lane 8-15 给出矩阵 1 "
                 "的行，矩阵 i 进入寄存器 i；B = K^T，所以 K 的一行是 B 的一列：让矩阵 i 指向 K 中那个 8x8 块，"
                 "它的转置就是 b_fragment 放进寄存器 i 的内容。"},
    "digest": {"en": "(This copy of the repository checks each lane against a salted digest of the PTX ISA's layout "
                     "(section \"Matrix Fragments for mma.m16n8k16 with floating point type\"): it names the lanes "
                     "that differ, not the registers.)",
               "zh": "（这份仓库用 PTX ISA 布局（\"Matrix Fragments for mma.m16n8k16 with floating point type\" 一节）"
                     "的加盐摘要逐个 lane 检查：它指出哪些 lane 不对，而不是哪个寄存器。）"},
}
_LAB5_ORDER = {"A": "reg 0..3 x half 0..1", "B": "reg 0..1 x half 0..1", "C": "i = 0..3"}


def _lanes_text(lanes) -> str:
    return ", ".join(map(str, lanes[:8])) + (", ..." if len(lanes) > 8 else "")


def _lab5_load(path, lang):
    name = f"lab5_student_{abs(hash(os.path.abspath(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise StudentCodeError(_msg("lab5_import", lang, file=os.path.basename(path), err="not a Python file"))
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as exc:
        raise StudentCodeError(_msg("lab5_import", lang, file=os.path.basename(path),
                                    err=f"syntax error at line {exc.lineno}: {exc.msg}")) from None
    except Exception as exc:
        raise StudentCodeError(_msg("lab5_import", lang, file=os.path.basename(path),
                                    err=f"{type(exc).__name__}: {exc}")) from None
    return mod


def _collect(mod, fname, arg_grid, shape, lang):
    """Call mod.fname(*args) for every args of arg_grid; returns ({args: (r, c)}, None) or (None, message)."""
    f = getattr(mod, fname, None)
    what = _LAB5_WHAT[fname][lang]
    if not callable(f):
        return None, _msg("lab5_todo", lang, name=fname, what=what)
    out = {}
    for args in arg_grid:
        a = ", ".join(map(str, args))
        try:
            got = f(*args)
        except NotImplementedError:
            return None, _msg("lab5_todo", lang, name=fname, what=what)
        except Exception as exc:
            return None, _msg("lab5_raised", lang, name=fname, args=a, err=f"{type(exc).__name__}: {exc}")
        try:
            r, c = got
            if isinstance(r, (bool, np.bool_)) or isinstance(c, (bool, np.bool_)) or r != int(r) or c != int(c):
                raise TypeError
            r, c = int(r), int(c)
        except Exception:
            return None, _msg("lab5_type", lang, name=fname, args=a, got=got, shape_hint=f"(row, col) in {shape}")
        if not (0 <= r < shape[0] and 0 <= c < shape[1]):
            return None, _msg("lab5_range", lang, name=fname, args=a, got=(r, c), shape=f"{shape[0]} x {shape[1]}")
        out[args] = (r, c)
    return out, None


def lab5_layout_checks(student_py_path, *, seed, lang="en", layout_source="auto") -> list:
    """Grade lab 5's NumPy model of the m16n8k16 fragments: a list of dict(name, passed, message).

    The student's module defines a_fragment(lane, reg, half), b_fragment(lane, reg, half), c_fragment(lane, i),
    ldmatrix_a_address(lane) and ldmatrix_b_address(lane) (see notebooks/labs/lab5_tensor_cores.py). Checks
    (9): each fragment map is a bijection onto its tile, and equals the PTX ISA's layout; the ldmatrix
    addresses load exactly the A and B fragments; and S = Q K^T for a random fp16 Q tile (16 x 16) and K tile
    (8 x 16) drawn from ``seed``, distributed to registers by the student's maps, multiplied by a model of the
    tensor core (which reads registers by the PTX layout) and collected by the student's C map. That last
    check passes only when all three maps are the PTX layout (errors that cancel in S do not count).

    layout_source: "instructor" compares with notebooks/labs/instructor/lab5_layout.py (the answer; its hints
    quote the layout), "digests" with the per-lane digests of lab5_layout_digests.json (a student release:
    the hints name the wrong lanes, and the tensor-core model is the student's own maps once they match),
    "auto" (default) the first of the two that is here. Every check passes or fails alike in both modes.
    Raises StudentCodeError if the file does not import.
    """
    fn = "lab5_layout_checks"
    lang = _lang(lang, fn)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{fn}: seed must be an int, got {type(seed).__name__} {seed!r}")
    ans = _Lab5Answer(layout_source, fn)
    hints = ans.hint if ans.mode == "instructor" else {
        k: {lg: f"{v[lg]} {_LAB5_HINT['digest'][lg]}" for lg in v} for k, v in _LAB5_HINT.items()}
    mod = _lab5_load(student_py_path, lang)
    checks = []
    maps, layouts, ptx_ok = {}, {}, set()
    specs = (("A", [(ln, r, h) for ln in range(32) for r in range(4) for h in range(2)]),
             ("B", [(ln, r, h) for ln in range(32) for r in range(2) for h in range(2)]),
             ("C", [(ln, i) for ln in range(32) for i in range(4)]))
    for key, grid in specs:
        fname, _, shape, arr_shape = _LAB5_FRAG[key]
        got, err = _collect(mod, fname, grid, shape, lang)
        total = shape[0] * shape[1]
        title = {"A": "A fragment (16x16)", "B": "B fragment (16x8 = K^T)", "C": "C/D fragment (16x8, fp32)"}[key]
        if err is not None:
            checks += [dict(name=f"{title}: a bijection", passed=False, message=err),
                       dict(name=f"{title}: the PTX ISA layout", passed=False, message=err)]
            continue
        maps[key] = got
        arr = np.zeros(arr_shape, np.int64)
        for args, cell in got.items():
            arr[args] = cell
        layouts[key] = arr
        seen, dup = {}, None
        for args, cell in got.items():
            if cell in seen and dup is None:
                dup = (cell, seen[cell], args)
            seen.setdefault(cell, args)
        if dup is None:
            checks.append(dict(name=f"{title}: a bijection", passed=True, message=_msg("lab5_bij_ok", lang, total=total,
                                                      slot="(lane, i)" if key == "C" else "(lane, reg, half)")))
        else:
            checks.append(dict(name=f"{title}: a bijection", passed=False,
                               message=_msg("lab5_dup", lang, cell=dup[0], first=f"{fname}{dup[1]}",
                                            second=f"{fname}{dup[2]}", missing=total - len(seen), total=total)))
        bad_lanes = ans.bad_lanes(key, arr)
        name = f"{title}: the PTX ISA layout"
        if not bad_lanes:
            ptx_ok.add(key)
            checks.append(dict(name=name, passed=True, message=_msg("lab5_ptx_ok", lang)))
        elif ans.mode == "instructor":
            true = ans.true[key]
            bad = [(args, cell, tuple(int(x) for x in true[args])) for args, cell in got.items()
                   if tuple(int(x) for x in true[args]) != cell]
            args, cell, want = bad[0]
            checks.append(dict(name=name, passed=False, message=_msg(
                "lab5_ptx_bad", lang, name=fname, args=", ".join(map(str, args)), got=cell, want=want,
                n_bad=len(bad), total=total, hint=hints[key][lang])))
        else:
            ln = bad_lanes[0]
            checks.append(dict(name=name, passed=False, message=_msg(
                "lab5_ptx_bad_lanes", lang, name=fname, n_bad=len(bad_lanes), lanes=_lanes_text(bad_lanes), lane=ln,
                order=_LAB5_ORDER[key], got=_lane_cells(arr, ln), hint=hints[key][lang])))
    # ldmatrix: the addresses must load exactly the true fragments
    for key, fname, nmat, lanes, shape, frag in (("LA", "ldmatrix_a_address", 4, 32, (16, 16), "A"),
                                                 ("LB", "ldmatrix_b_address", 2, 16, (8, 16), "B")):
        name = f"ldmatrix.x{nmat} addresses load the {frag} fragment"
        got, err = _collect(mod, fname, [(ln,) for ln in range(lanes)], shape, lang)
        if err is None:
            addr = [got[(ln,)] for ln in range(lanes)]
            if any(c % 8 for _, c in addr):
                ln = next(i for i, (_, c) in enumerate(addr) if c % 8)
                err = _msg("lab5_range", lang, name=fname, args=ln, got=addr[ln],
                           shape="row-start (col a multiple of 8) of the " + f"{shape[0]} x {shape[1]}")
        if err is not None:
            checks.append(dict(name=name, passed=False, message=err))
            continue
        cells = np.empty(shape, object)
        for r in range(shape[0]):
            for c in range(shape[1]):
                cells[r, c] = (r, c)
        loaded = _ldmatrix(cells, addr, nmat)  # which tile cell lands in (lane, reg, half)
        # in the fragment's coordinates: B = K^T, so B's (k, n) is the K tile's (n, k)
        as_frag = np.array([[[loaded[ln, reg, h] if frag == "A" else loaded[ln, reg, h][::-1] for h in range(2)]
                             for reg in range(nmat)] for ln in range(32)], np.int64)
        bad_lanes = ans.bad_lanes(frag, as_frag)
        if not bad_lanes:
            checks.append(dict(name=name, passed=True, message=_msg("lab5_ld_ok", lang, frag=frag)))
            continue
        # the fragment to compare with, register by register: the true one, or the student's own once it matches
        ref = ans.true[frag] if ans.mode == "instructor" else (layouts[frag] if frag in ptx_ok else None)
        if ref is not None:
            want = lambda ln, reg, h: tuple(int(x) for x in (ref[ln, reg, h] if frag == "A"  # noqa: E731
                                                             else ref[ln, reg, h][::-1]))
            ln, reg = next((ln, reg) for ln in range(32) for reg in range(nmat)
                           if any(loaded[ln, reg, h] != want(ln, reg, h) for h in range(2)))
            checks.append(dict(name=name, passed=False, message=_msg(
                "lab5_ld_bad", lang, lane=ln, reg=reg, frag=frag, got=[loaded[ln, reg, h] for h in range(2)],
                want=[want(ln, reg, h) for h in range(2)], hint=hints[key][lang])))
        else:
            ln = bad_lanes[0]
            checks.append(dict(name=name, passed=False, message=_msg(
                "lab5_ld_bad_lanes", lang, lane=ln, frag=frag, last=nmat - 1, n_bad=len(bad_lanes),
                lanes=_lanes_text(bad_lanes), got=[tuple(x) for x in loaded[ln].reshape(-1)], hint=hints[key][lang])))
    # numeric: S = Q K^T through the student's maps and the tensor core's true layout
    name = f"S = Q K^T through the fragments (seed {int(seed)})"
    missing = [k for k in ("A", "B", "C") if k not in maps]
    if missing:
        checks.append(dict(name=name, passed=False,
                           message=_msg("lab5_num_skip", lang, why=", ".join(missing) + (
                               " map(s) missing (see above)" if lang == "en" else " 的映射缺失（见上文）"))))
        return checks
    not_ptx = [k for k in ("A", "B", "C") if k not in ptx_ok]
    if not_ptx and ans.mode == "digests":  # the model of the tensor core is the layout these maps do not match
        checks.append(dict(name=name, passed=False, message=_msg("lab5_num_wait", lang, which=", ".join(not_ptx))))
        return checks
    rng = np.random.default_rng(int(seed))
    Qt = rng.standard_normal((16, 16)).astype(np.float16)
    Kt = rng.standard_normal((8, 16)).astype(np.float16)
    a_regs = np.zeros((32, 4, 2), np.float32)
    b_regs = np.zeros((32, 2, 2), np.float32)
    for (ln, reg, h), (r, c) in maps["A"].items():
        a_regs[ln, reg, h] = Qt[r, c]
    for (ln, reg, h), (kk, n) in maps["B"].items():
        b_regs[ln, reg, h] = Kt[n, kk]  # B = K^T
    # the tensor core: the PTX layout, i.e. the instructor's table, or the student's maps once they match it
    d_regs = _mma_model(a_regs, b_regs, ans.true if ans.mode == "instructor" else layouts)
    S = np.full((16, 8), np.nan, np.float32)
    for (ln, i), (r, c) in maps["C"].items():
        S[r, c] = d_regs[ln, i]
    S_ref = Qt.astype(np.float64) @ Kt.astype(np.float64).T
    err = np.abs(np.nan_to_num(S, nan=np.inf) - S_ref)
    i, j = np.unravel_index(int(np.argmax(err)), err.shape)
    ok = bool(err.max() <= 1e-3 * (1 + np.abs(S_ref).max()))
    if ok and not_ptx:  # right numbers from wrong maps: their errors cancel (e.g. A's columns and B's rows alike)
        checks.append(dict(name=name, passed=False, message=_msg("lab5_num_cancel", lang, err=float(err.max()),
                                                                 which=", ".join(not_ptx))))
        return checks
    checks.append(dict(name=name, passed=ok, message=_msg("lab5_num_ok" if ok else "lab5_num_bad", lang,
                                                           err=float(err.max()), i=i, j=j, got=float(S[i, j]),
                                                           want=float(S_ref[i, j]))))
    return checks


# ------------------------------------------------------------------------------------------ lab 5: the tile
def find_nvcc() -> Optional[str]:
    cands = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(os.path.join(os.environ[env], "bin", "nvcc"))
    cands += ["/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"]
    return next((c for c in cands if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def _lab5_check_ptx(ptx: str, path: str, lang: str):
    for instr in ("ldmatrix.sync.aligned", "mma.sync.aligned.m16n8k16"):
        if instr not in ptx:
            raise StudentCodeError(_msg("lab5_not_mma", lang, file=os.path.basename(path), instr=instr))


def _lab5_compile_error(output, path, lang, compiler, paths=()):
    if "lab5 TODO" in output:
        return StudentCodeError(_msg("lab5_todo_cu", lang, file=os.path.basename(path)))
    return _compile_errors(output, lang, os.path.basename(path), compiler, paths=paths)


def lab5_compile_check(student_cu_path, *, arch="sm_80", lang="en") -> dict:
    """Compile lab 5's kernel with nvcc to PTX (anywhere, no GPU needed) and check that it uses ldmatrix and
    mma.sync.m16n8k16. Returns dict(compiled=True, message=...) whose message says the numbers still need a
    GPU (this is never a pass); raises StudentCodeError if it does not compile or lacks those instructions,
    RuntimeError if there is no nvcc."""
    fn = "lab5_compile_check"
    lang = _lang(lang, fn)
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError(f"{fn}: {_msg('no_nvcc', lang)}")
    path = os.path.abspath(student_cu_path)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lab5.ptx")
        try:
            p = subprocess.run([nvcc, "-ptx", f"-arch={arch}", "-std=c++17", "-I", KERNEL_DIR, "-o", out, path],
                               capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            raise StudentCodeError(_msg("compile", lang, file=os.path.basename(path), compiler="nvcc",
                                        errors="nvcc took more than 300 s")) from None
        if p.returncode != 0:
            raise _lab5_compile_error(p.stdout + p.stderr, path, lang, "nvcc", paths=(os.path.dirname(path),))
        with open(out) as f:
            _lab5_check_ptx(f.read(), path, lang)
    why = lab5_gpu_unavailable_reason() or "run lab5_mma_tile for the numbers"
    return dict(compiled=True, message=_msg("lab5_compiled", lang, file=os.path.basename(path), why=why))


def lab5_gpu_unavailable_reason() -> Optional[str]:
    """Why lab 5's kernel cannot run here (no CuPy, no GPU, compute capability < 8.0), or None."""
    return _cuda_unavailable_reason(min_cc=80)


def _cuda_unavailable_reason(min_cc=None) -> Optional[str]:
    try:
        import cupy
    except Exception as exc:
        return f"CuPy does not import ({type(exc).__name__})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA GPU"
        cc = int(cupy.cuda.Device().compute_capability)
    except Exception as exc:
        return f"no usable CUDA GPU ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    if min_cc is not None and cc < min_cc:
        return f"mma.sync.m16n8k16 with fp16 needs compute capability 8.0 or newer; this GPU has {cc}"
    return None


_LAB5_KERNELS: dict = {}


def lab5_mma_tile(student_cu_path, a_tile, b_tile, *, lang="en") -> np.ndarray:
    """GPU only: run the student's kernel ``lab5_mma_tile`` (one warp) on one tile: returns S = A B^T.

    a_tile (16, 16) float16 (a Q_i tile), b_tile (8, 16) float16 (8 rows of K_j): S (16, 8) float32, fp32 sums.
    NVRTC compiles the file to PTX for this GPU (kernels/ptx.cuh on the include path); the PTX must contain
    ldmatrix and mma.sync.m16n8k16 (else StudentCodeError). RuntimeError when no GPU can run it
    (lab5_gpu_unavailable_reason); StudentCodeError for compile errors or a crash.
    """
    fn = "lab5_mma_tile"
    lang = _lang(lang, fn)
    for name, x, shape in (("a_tile", a_tile, (16, 16)), ("b_tile", b_tile, (8, 16))):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{fn}: {name} must be a NumPy array, got {type(x).__name__}")
        if x.shape != shape or x.dtype != np.float16:
            raise ValueError(f"{fn}: {name} must be float16 of shape {shape}, got {x.dtype} {x.shape}")
    reason = lab5_gpu_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"{fn}: needs a CUDA GPU: {reason}")
    import cupy
    from cupy_backends.cuda.libs import nvrtc

    path = os.path.abspath(student_cu_path)
    with open(path) as f:
        code = f.read()
    cc = cupy.cuda.Device().compute_capability
    key = (hashlib.sha256(code.encode()).hexdigest(), cc, cupy.cuda.Device().id)
    kern = _LAB5_KERNELS.get(key)
    if kern is None:
        prog = nvrtc.createProgram(code, os.path.basename(path), (), ())
        try:
            try:
                nvrtc.compileProgram(prog, ("--std=c++17", f"-arch=compute_{cc}", f"--include-path={KERNEL_DIR}"))
            except nvrtc.NVRTCError:
                raise _lab5_compile_error(nvrtc.getProgramLog(prog), path, lang, "NVRTC") from None
            ptx = nvrtc.getPTX(prog)
        finally:
            nvrtc.destroyProgram(prog)
        ptx_text = ptx.decode() if isinstance(ptx, bytes) else ptx
        _lab5_check_ptx(ptx_text, path, lang)
        with tempfile.TemporaryDirectory() as tmp:
            p = os.path.join(tmp, "lab5.ptx")
            with open(p, "w") as f:
                f.write(ptx_text.rstrip("\x00"))
            kern = cupy.RawModule(path=p).get_function(LAB5_KERNEL)
        _LAB5_KERNELS[key] = kern
    A = cupy.asarray(np.ascontiguousarray(a_tile).view(np.uint16))
    B = cupy.asarray(np.ascontiguousarray(b_tile).view(np.uint16))
    S = cupy.full((16, 8), np.nan, cupy.float32)
    try:
        kern((1,), (32,), (A, B, S))
        cupy.cuda.runtime.deviceSynchronize()
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise StudentCodeError(_msg("crash", lang, err=f"{type(exc).__name__}: {first}").split("\n")[0]) from None
    return cupy.asnumpy(S)
