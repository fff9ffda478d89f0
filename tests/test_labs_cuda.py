"""Lab 3's CPU emulation and lab 5 (notebooks/labs/cuda_labs.py, notebooks/labs/emu/).

* The emulation's primitives (warp shuffles, votes, __syncthreads, divergence) against CUDA's definitions,
  by a small C++ program (notebooks/labs/emu/test_emu.cpp).
* tiled.cu's own four device functions, run through the emulation inside the repository's kernel, against
  the float64 reference on odd shapes; a wrong merge is caught with a numeric hint; the template, a compile
  error, a deadlock and a preprocessor trick give a short student-facing message.
* Lab 5: the solution passes its layout checks, the template and a wrong layout fail with helpful messages;
  the .cu template and solution compile with nvcc for sm_80.
* On a GPU: lab 3 through the real kernel, and lab 5's tile on a tensor core (skipped here with a reason).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABS = os.path.join(ROOT, "notebooks", "labs")
sys.path.insert(0, LABS)
import cuda_labs as CL  # noqa: E402

from flash_attention_py import attention_reference  # noqa: E402

TILED = os.path.join(ROOT, "flash_attention_cuda", "kernels", "tiled.cu")
TEMPLATE3 = os.path.join(LABS, "lab3_cuda_tiled.cu")
LAB5_PY, LAB5_PY_SOL = os.path.join(LABS, "lab5_tensor_cores.py"), os.path.join(LABS, "solutions", "lab5_tensor_cores.py")
LAB5_CU, LAB5_CU_SOL = os.path.join(LABS, "lab5_mma_tile.cu"), os.path.join(LABS, "solutions", "lab5_mma_tile.cu")

CPU_REASON = CL.lab3_cpu_unavailable_reason()
needs_cpu_emu = pytest.mark.skipif(CPU_REASON is not None, reason=f"lab 3's CPU emulation: {CPU_REASON}")


def _gpu_reason():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA GPU"
        return None
    except Exception as exc:
        return f"no usable CUDA GPU ({type(exc).__name__})"


GPU_REASON = _gpu_reason()


def _inputs(B, H, Nq, Nk, D, seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(np.float32) for s in ((B, H, Nq, D), (B, H, Nk, D), (B, H, Nk, D)))


def _ref(q, k, v, causal, scale=None):
    o, lse = attention_reference(*(x.astype(np.float64) for x in (q, k, v)), causal=causal, softmax_scale=scale,
                                 return_lse=True)
    return np.asarray(o), np.asarray(lse)


def _assert_close(o, lse, o_ref, lse_ref, tol=2e-5):
    assert o.dtype == np.float32 and lse.dtype == np.float32
    assert o.shape == o_ref.shape and lse.shape == lse_ref.shape
    no_key = np.isneginf(lse_ref)
    assert np.array_equal(np.isneginf(lse), no_key), "rows that see no key must get lse = -inf, the others finite"
    assert np.all(o[no_key] == 0), "rows that see no key must get O = 0"
    assert np.abs(o - o_ref).max() <= tol
    assert np.abs(lse[~no_key] - lse_ref[~no_key]).max(initial=0.0) <= tol


def _variant(tmp_path, name, edits, base=TILED):
    """A student file: `base` with each (old, new) replaced once (old must be there)."""
    with open(base) as f:
        text = f.read()
    for old, new in edits:
        assert old in text, f"{old!r} is no longer in {os.path.basename(base)}: update this test"
        text = text.replace(old, new, 1)
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------------------------ the emulation itself
@needs_cpu_emu
@pytest.mark.parametrize("switch", ["default", "ucontext"])
def test_emulation_primitives_match_cuda_semantics(tmp_path, switch):
    exe = tmp_path / "test_emu"
    flags = ["-DEMU_USE_UCONTEXT"] if switch == "ucontext" else []  # default: the fast x86-64 switch where it exists
    build = subprocess.run([CL._cxx(), "-std=c++17", "-O1", *flags, "-I", CL.EMU_DIR, "-I", CL.KERNEL_DIR,
                            os.path.join(CL.EMU_DIR, "test_emu.cpp"), "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "ALL OK" in run.stdout, run.stdout + run.stderr
    assert "FAIL" not in run.stdout


def test_function_bodies_skip_comments_and_calls():
    text = ('// merge_block_stats(m, l) in a comment { not a body }\n'
            'template <int D_PAD, int ROWS>\n__device__ void merge_block_stats(float (&m)[ROWS]) {\n'
            '    const char* s = "}";  // a brace in a string\n    if (m[0]) { m[0] = 1; }\n}\n'
            'void k() { merge_block_stats<32, 8>(m); }\n')
    (a, b), = CL.function_bodies(text, ("merge_block_stats",)).values()
    assert text[a:b].strip().startswith('const char* s = "}";') and text[a:b].rstrip().endswith("m[0] = 1; }")


# ------------------------------------------------------------------------------------ lab 3 on the CPU
SHAPES = [  # (B, H, Nq, Nk, D, causal)
    (1, 1, 1, 1, 16, False),
    (1, 1, 1, 1, 16, True),
    (1, 2, 17, 17, 32, True),
    (1, 1, 17, 100, 40, False),   # Nq < Nk, 4 K/V tiles, D not a multiple of 32
    (2, 1, 100, 17, 64, True),    # Nq > Nk causal: rows 0..82 see no key
    (1, 1, 100, 100, 128, True),  # D_PAD 128, ROWS 4
    (1, 1, 33, 70, 3, False),     # D = 3: the scalar (non-float4) loads
    (1, 1, 40, 9, 96, True),
]


@needs_cpu_emu
@pytest.mark.parametrize("B,H,Nq,Nk,D,causal", SHAPES, ids=lambda x: str(x))
def test_solution_through_the_emulation_matches_float64(B, H, Nq, Nk, D, causal):
    q, k, v = _inputs(B, H, Nq, Nk, D, seed=Nq * 1000 + Nk + D)
    o, lse = CL.lab3_forward(TILED, q, k, v, causal=causal, softmax_scale=None, device="cpu")
    _assert_close(o, lse, *_ref(q, k, v, causal))


@needs_cpu_emu
def test_only_the_four_bodies_are_taken_from_the_student_file(tmp_path):
    # the template with the solution's bodies, and a given kernel sabotaged: the grader must not run it
    with open(TILED) as f:
        solved = f.read()
    spans = CL.function_bodies(solved)
    edits = []
    with open(TEMPLATE3) as f:
        tmpl = f.read()
    for name, (a, b) in CL.function_bodies(tmpl).items():
        edits.append((tmpl[a:b], solved[spans[name][0]:spans[name][1]]))
    edits.append(("    const float scale2 = scale * FA_LOG2E;\n", "    const float scale2 = scale * FA_LOG2E;\n"
                  "    if (Nq > 0) { O[0] = 0.0f; return; }  // a sabotaged given kernel\n"))
    path = _variant(tmp_path, "lab3_student.cu", edits, base=TEMPLATE3)
    q, k, v = _inputs(1, 1, 20, 50, 32, seed=5)
    o, lse = CL.lab3_forward(path, q, k, v, causal=True, softmax_scale=0.3, device="cpu")
    _assert_close(o, lse, *_ref(q, k, v, True, 0.3))


WRONG_MERGES = {  # name: (edit of merge_block_stats, what the hint must say)
    "no_alpha_on_l": (("l[r] = a * l[r] + b * l_tile[r];", "l[r] = l[r] + b * l_tile[r];"), "a = fa::exp2_minus(m, m_new)"),
    "no_alpha_on_acc": (("acc[r][i] = fmaf(a, acc[r][i], b * pv[r][i]);", "acc[r][i] = acc[r][i] + b * pv[r][i];"),
                        "acc must be rescaled exactly like l"),
    # not a merge, but the same symptom: lanes read p_warp before the others wrote it (a race, caught here)
    "no_syncwarp": (("    __syncwarp();  // the warp's P_ij rows are in shared memory\n", ""), "__syncwarp() in between"),
}


@needs_cpu_emu
@pytest.mark.parametrize("kind", sorted(WRONG_MERGES))
def test_a_wrong_merge_is_caught_with_a_numeric_hint(tmp_path, kind):
    edit, expect = WRONG_MERGES[kind]
    path = _variant(tmp_path, f"lab3_{kind}.cu", [edit])
    q, k, v = _inputs(1, 1, 40, 100, 64, seed=11)
    q *= 2.0  # larger scores: the running max moves between tiles
    o, lse = CL.lab3_forward(path, q, k, v, causal=False, softmax_scale=None, device="cpu")
    o_ref, lse_ref = _ref(q, k, v, False)
    assert max(np.abs(o - o_ref).max(), np.abs(lse - lse_ref).max()) > 1e-2  # far outside any tolerance
    hints = CL.lab3_hints(o, lse, o_ref, lse_ref, causal=False, Nk=100)
    assert any(expect in h for h in hints), hints
    zh = CL.lab3_hints(o, lse, o_ref, lse_ref, causal=False, Nk=100, lang="zh")
    assert zh and all(re.search(r"[\u4e00-\u9fff]", h) for h in zh)


@needs_cpu_emu
def test_nan_for_rows_without_keys_gets_its_hint(tmp_path):
    path = _variant(tmp_path, "lab3_nan.cu", [("const float a = fa::exp2_minus(m[r], m_new);",
                                               "const float a = exp2f(m[r] - m_new);")])
    q, k, v = _inputs(1, 1, 40, 9, 32, seed=3)
    o, lse = CL.lab3_forward(path, q, k, v, causal=True, softmax_scale=None, device="cpu")
    hints = CL.lab3_hints(o, lse, *_ref(q, k, v, True), causal=True, Nk=9)
    assert "see no key" in hints[0] and "fa::exp2_minus" in hints[1]


@needs_cpu_emu
def test_template_says_which_functions_are_not_written():
    q, k, v = _inputs(1, 1, 4, 4, 16, seed=0)
    with pytest.raises(CL.StudentCodeError, match="4 of the 4 device functions are not written yet") as e:
        CL.lab3_forward(TEMPLATE3, q, k, v, causal=False, softmax_scale=None, device="cpu")
    assert "merge_block_stats" in str(e.value) and "Traceback" not in str(e.value)


@needs_cpu_emu
def test_compile_error_points_to_the_students_line(tmp_path):
    path = _variant(tmp_path, "lab3_typo.cu", [("l[r] = a * l[r] + b * l_tile[r];", "l[r] = a * l[r] + b * l_tle[r];")])
    line = next(i for i, ln in enumerate(open(path), 1) if "l_tle" in ln)
    q, k, v = _inputs(1, 1, 4, 4, 16, seed=0)
    with pytest.raises(CL.StudentCodeError, match=rf"lab3_typo\.cu:{line}:.*l_tle"):
        CL.lab3_forward(path, q, k, v, causal=False, softmax_scale=None, device="cpu")


@needs_cpu_emu
def test_a_shuffle_some_lanes_skip_is_reported_not_hung(tmp_path):
    path = _variant(tmp_path, "lab3_diverge.cu", [("l_tile[r] = fa::warp_reduce_sum(p);",
                                                   "if (lane != 3) l_tile[r] = fa::warp_reduce_sum(p);")])
    q, k, v = _inputs(1, 1, 4, 4, 16, seed=0)
    with pytest.raises(CL.StudentCodeError, match=r"deadlock.*lane 3 at __syncwarp"):
        CL.lab3_forward(path, q, k, v, causal=False, softmax_scale=None, device="cpu")


@needs_cpu_emu
def test_writes_out_of_bounds_are_reported(tmp_path):
    path = _variant(tmp_path, "lab3_oob.cu", [("        if (row >= Nq) continue;\n", "")])  # rows past Nq written
    q, k, v = _inputs(1, 1, 20, 20, 32, seed=0)
    with pytest.raises(CL.StudentCodeError, match=r"your code wrote outside O \(the guard zone after it changed\)"):
        CL.lab3_forward(path, q, k, v, causal=False, softmax_scale=None, device="cpu")


def test_preprocessor_directives_in_a_body_are_refused(tmp_path):
    path = _variant(tmp_path, "lab3_macro.cu", [("const float m_new = fmaxf(m[r], m_tile[r]);",
                                                 "#define tiled_fwd not_the_kernel\n        const float m_new = "
                                                 "fmaxf(m[r], m_tile[r]);")])
    with pytest.raises(CL.StudentCodeError, match=r"lab3_macro\.cu:\d+: `#define tiled_fwd"):
        CL.splice_lab3(path)


def test_bad_arguments_name_the_function():
    q, k, v = _inputs(1, 1, 4, 4, 16, seed=0)
    with pytest.raises(TypeError, match="lab3_forward: q must be float32, got float64"):
        CL.lab3_forward(TILED, q.astype(np.float64), k, v, causal=False, softmax_scale=None, device="cpu")
    with pytest.raises(ValueError, match="lab3_forward: device must be 'cpu' or 'cuda', got 'tpu'"):
        CL.lab3_forward(TILED, q, k, v, causal=False, softmax_scale=None, device="tpu")
    with pytest.raises(ValueError, match=r"lab3_forward: need .* D <= 128"):
        CL.lab3_forward(TILED, *_inputs(1, 1, 4, 4, 130, seed=0), causal=False, softmax_scale=None, device="cpu")
    with pytest.raises(ValueError, match="lab3_forward: lang must be 'en' or 'zh', got 'fr'"):
        CL.lab3_forward(TILED, q, k, v, causal=False, softmax_scale=None, device="cpu", lang="fr")


def test_no_compiler_gives_a_reason(monkeypatch):
    monkeypatch.setattr(CL, "_cxx", lambda: None)
    assert "g++" in CL.lab3_cpu_unavailable_reason()
    assert "g++" in CL.lab3_cpu_unavailable_reason(lang="zh")


# ------------------------------------------------------------------------------------ lab 5 (CPU part)
def test_lab5_solution_passes_every_layout_check():
    for lang in ("en", "zh"):
        checks = CL.lab5_layout_checks(LAB5_PY_SOL, seed=7, lang=lang)
        assert len(checks) == 9 and all(c["passed"] for c in checks), checks


def test_lab5_template_fails_every_check_with_a_helpful_message():
    checks = CL.lab5_layout_checks(LAB5_PY, seed=7)
    assert checks and not any(c["passed"] for c in checks)
    assert "a_fragment is not written yet" in checks[0]["message"]
    assert all(c["message"] and "Traceback" not in c["message"] for c in checks)


def test_lab5_true_layout_is_the_ptx_isa_table():
    L = CL.lab5_true_layout()  # spot checks of the PTX ISA's m16n8k16 figures
    assert tuple(L["A"][5, 1, 0]) == (9, 2) and tuple(L["A"][31, 3, 1]) == (15, 15)
    assert tuple(L["B"][6, 1, 1]) == (13, 1) and tuple(L["C"][30, 3]) == (15, 5)


def test_lab5_wrong_layout_is_caught(tmp_path):
    with open(LAB5_PY_SOL) as f:
        text = f.read()
    old = "return group + 8 * (i >> 1), 2 * tig + (i & 1)"
    assert old in text
    path = tmp_path / "lab5_wrong.py"
    path.write_text(text.replace(old, "return group + 8 * (i & 1), 2 * tig + (i >> 1)"))  # c1 and c2 swapped
    checks = {c["name"]: c for c in CL.lab5_layout_checks(str(path), seed=1)}
    ptx = checks["C/D fragment (16x8, fp32): the PTX ISA layout"]
    assert not ptx["passed"] and "c_fragment(0, 1) = (8, 0), but the PTX ISA puts (0, 1) there" in ptx["message"]
    assert checks["C/D fragment (16x8, fp32): a bijection"]["passed"]
    assert not checks["S = Q K^T through the fragments (seed 1)"]["passed"]


# ------------------------------------------------------------------------------------ lab 5 (.cu, compile)
NVCC = CL.find_nvcc()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_lab5_cu_solution_compiles_for_sm80_and_template_says_todo():
    res = CL.lab5_compile_check(LAB5_CU_SOL, arch="sm_80")
    assert res["compiled"] and "ldmatrix and mma.sync.m16n8k16" in res["message"]
    with pytest.raises(CL.StudentCodeError, match="the kernel is not written yet"):
        CL.lab5_compile_check(LAB5_CU, arch="sm_80")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_lab5_cu_without_mma_is_refused(tmp_path):
    with open(LAB5_CU) as f:
        text = f.read()
    path = tmp_path / "lab5_plain.cu"  # the template with the stopper gone and a plain loop: no tensor core
    path.write_text(re.sub(r"    static_assert\(sizeof\(a\).*\n",
                           "    for (int e = lane; e < 128; e += 32) { float s = 0.0f;\n"
                           "        for (int d = 0; d < 16; ++d) s += __half2float(*(const __half*)&a_s[e / 8][d]) * "
                           "__half2float(*(const __half*)&b_s[e % 8][d]);\n        S[e] = s; }\n", text)
                 .replace('#include "ptx.cuh"', '#include "ptx.cuh"\n#include <cuda_fp16.h>'))
    with pytest.raises(CL.StudentCodeError, match="PTX has no ldmatrix"):
        CL.lab5_compile_check(str(path), arch="sm_80")


# ------------------------------------------------------------------------------------ GPU
@pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")
@pytest.mark.parametrize("B,H,Nq,Nk,D,causal", SHAPES, ids=lambda x: str(x))
def test_lab3_gpu_solution_matches_float64(B, H, Nq, Nk, D, causal):
    q, k, v = _inputs(B, H, Nq, Nk, D, seed=Nq * 1000 + Nk + D)
    o, lse = CL.lab3_forward(TILED, q, k, v, causal=causal, softmax_scale=None, device="cuda")
    _assert_close(o, lse, *_ref(q, k, v, causal))


@pytest.mark.skipif(GPU_REASON is not None, reason=f"needs a CUDA GPU: {GPU_REASON}")
def test_lab3_gpu_wrong_merge_and_template(tmp_path):
    edit, expect = WRONG_MERGES["no_alpha_on_l"]
    path = _variant(tmp_path, "lab3_no_alpha.cu", [edit])
    q, k, v = _inputs(1, 1, 40, 100, 64, seed=11)
    q *= 2.0
    o, lse = CL.lab3_forward(path, q, k, v, causal=False, softmax_scale=None, device="cuda")
    o_ref, lse_ref = _ref(q, k, v, False)
    assert np.abs(lse - lse_ref).max() > 1e-2
    assert any(expect in h for h in CL.lab3_hints(o, lse, o_ref, lse_ref, causal=False, Nk=100))
    with pytest.raises(CL.StudentCodeError, match="4 of the 4 device functions are not written yet"):
        CL.lab3_forward(TEMPLATE3, q, k, v, causal=False, softmax_scale=None, device="cuda")


LAB5_GPU_REASON = CL.lab5_gpu_unavailable_reason()


@pytest.mark.skipif(LAB5_GPU_REASON is not None, reason=f"lab 5's tile: {LAB5_GPU_REASON}")
def test_lab5_tile_on_a_tensor_core():
    rng = np.random.default_rng(0)
    for _ in range(3):
        a = rng.standard_normal((16, 16)).astype(np.float16)
        b = rng.standard_normal((8, 16)).astype(np.float16)
        S = CL.lab5_mma_tile(LAB5_CU_SOL, a, b)
        ref = a.astype(np.float64) @ b.astype(np.float64).T
        assert S.shape == (16, 8) and S.dtype == np.float32
        assert np.abs(S - ref).max() <= 1e-3 * (1 + np.abs(ref).max())
    with pytest.raises(CL.StudentCodeError, match="the kernel is not written yet"):
        CL.lab5_mma_tile(LAB5_CU, a, b)


@pytest.mark.skipif(LAB5_GPU_REASON is None, reason="a GPU is here: the tile runs")
def test_lab5_tile_and_lab3_cuda_without_a_gpu_say_so():
    q, k, v = _inputs(1, 1, 4, 4, 16, seed=0)
    with pytest.raises(RuntimeError, match="lab3_forward: device 'cuda' needs a CUDA GPU"):
        CL.lab3_forward(TILED, q, k, v, causal=False, softmax_scale=None, device="cuda")
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((16, 16)).astype(np.float16), rng.standard_normal((8, 16)).astype(np.float16)
    with pytest.raises(RuntimeError, match="lab5_mma_tile: needs a CUDA GPU"):
        CL.lab5_mma_tile(LAB5_CU_SOL, a, b)
