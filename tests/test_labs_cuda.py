"""Lab 3's CPU emulation and lab 5 (notebooks/labs/cuda_labs.py, notebooks/labs/emu/).

* The emulation's primitives (warp shuffles, votes, __syncthreads, divergence) against CUDA's definitions,
  by a small C++ program (notebooks/labs/emu/test_emu.cpp).
* tiled.cu's own four device functions, run through the emulation inside the repository's kernel, against
  the float64 reference on odd shapes; a wrong merge is caught with a numeric hint; the template, a compile
  error, a deadlock and a preprocessor trick give a short student-facing message.
* Lab 5: the solution passes its layout checks, the template and a wrong layout fail with helpful messages;
  the answer (instructor/lab5_layout.py) stays out of a student release, whose checks use per-lane digests
  and score alike; the .cu template and solution compile with nvcc for sm_80.
* On a GPU: lab 3 through the real kernel, and lab 5's tile on a tensor core (skipped here with a reason).
"""
from __future__ import annotations

import importlib.util
import json
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
    given = "    const fa::Mask mask = fa::make_mask(Nq, Nk, window_left, window_right);\n"
    edits.append((given, given + "    if (Nq > 0) { O[0] = 0.0f; return; }  // a sabotaged given kernel\n"))
    path = _variant(tmp_path, "lab3_student.cu", edits, base=TEMPLATE3)
    q, k, v = _inputs(1, 1, 20, 50, 32, seed=5)
    o, lse = CL.lab3_forward(path, q, k, v, causal=True, softmax_scale=0.3, device="cpu")
    _assert_close(o, lse, *_ref(q, k, v, True, 0.3))


WRONG_MERGES = {  # name: (edit of merge_block_stats, what the hint must say)
    "no_alpha_on_l": (("l_i[r] = a * l_i[r] + b * l_ij[r];", "l_i[r] = l_i[r] + b * l_ij[r];"),
                      "a = fa::exp2_minus(m_i, m_new)"),
    "no_alpha_on_acc": (("acc[r][i] = fmaf(a, acc[r][i], b * pv[r][i]);", "acc[r][i] = acc[r][i] + b * pv[r][i];"),
                        "acc must be rescaled exactly like l_i"),
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
    path = _variant(tmp_path, "lab3_nan.cu", [("const float a = fa::exp2_minus(m_i[r], m_new);",
                                               "const float a = exp2f(m_i[r] - m_new);")])
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
    path = _variant(tmp_path, "lab3_typo.cu", [("l_i[r] = a * l_i[r] + b * l_ij[r];", "l_i[r] = a * l_i[r] + b * l_ji[r];")])
    line = next(i for i, ln in enumerate(open(path), 1) if "l_ji" in ln)
    q, k, v = _inputs(1, 1, 4, 4, 16, seed=0)
    with pytest.raises(CL.StudentCodeError, match=rf"lab3_typo\.cu:{line}:.*l_ji"):
        CL.lab3_forward(path, q, k, v, causal=False, softmax_scale=None, device="cpu")


@needs_cpu_emu
def test_a_shuffle_some_lanes_skip_is_reported_not_hung(tmp_path):
    path = _variant(tmp_path, "lab3_diverge.cu", [("l_ij[r] = fa::warp_reduce_sum(p);",
                                                   "if (lane != 3) l_ij[r] = fa::warp_reduce_sum(p);")])
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
    path = _variant(tmp_path, "lab3_macro.cu", [("const float m_new = fmaxf(m_i[r], m_ij[r]);",
                                                 "#define tiled_fwd not_the_kernel\n        const float m_new = "
                                                 "fmaxf(m_i[r], m_ij[r]);")])
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
# The answer (the PTX layout) is in instructor/lab5_layout.py, left out of a student release; there the
# checks use the per-lane digests of lab5_layout_digests.json instead. Both must score alike.
INSTRUCTOR5 = os.path.join(LABS, "instructor", "lab5_layout.py")
needs_solutions = pytest.mark.skipif(not os.path.isdir(os.path.join(LABS, "solutions")),
                                     reason="student release: no solutions/ folder")
needs_instructor = pytest.mark.skipif(not os.path.isfile(INSTRUCTOR5),
                                      reason="student release: no instructor/ folder (lab 5's answer)")
# wrong variants of the solution, as wrappers around it (so this file quotes no line of the answer)
LAB5_WRONG = {
    "c1_c2_swapped": "def c_fragment(lane, i):\n    return sol.c_fragment(lane, (0, 2, 1, 3)[i])\n",
    # the halves of every register swapped in A and B alike: S comes out right, the layout is still wrong
    "halves_swapped_in_a_and_b": "def a_fragment(lane, reg, half):\n    return sol.a_fragment(lane, reg, 1 - half)\n"
                                 "def b_fragment(lane, reg, half):\n    return sol.b_fragment(lane, reg, 1 - half)\n",
    # A's registers 1 and 2 swapped, and ldmatrix.x4's matrices 1 and 2 alike: the addresses load no true fragment
    "a_and_ldmatrix_a_wrong": "def a_fragment(lane, reg, half):\n    return sol.a_fragment(lane, (0, 2, 1, 3)[reg], half)\n"
                              "def ldmatrix_a_address(lane):\n"
                              "    return sol.ldmatrix_a_address(8 * (0, 2, 1, 3)[lane // 8] + lane % 8)\n",
    "ldmatrix_b_matrices_swapped": "def ldmatrix_b_address(lane):\n    return sol.ldmatrix_b_address((lane + 8) % 16)\n",
}


def _lab5_answer_pieces() -> set:
    """Telling pieces of lab 5's answer, read from instructor/lab5_layout.py and the solution: the right-hand
    sides of the layout formulas and the clauses of the hints that state the layout."""
    import ast

    pieces = set()
    for path in (INSTRUCTOR5, LAB5_PY_SOL):
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in ("true_layout", "a_fragment", "b_fragment",
                                                                    "c_fragment", "ldmatrix_a_address",
                                                                    "ldmatrix_b_address"):
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Assign, ast.Return)) and sub.value is not None:
                        parts = sub.value.elts if isinstance(sub.value, ast.Tuple) else [sub.value]
                        pieces.update(ast.unparse(e) for e in parts)
                        pieces.add(", ".join(ast.unparse(e) for e in parts))
    for text in (v for hint in CL._lab5_instructor().HINT.values() for v in hint.values()):
        pieces.update(part.strip() for part in re.split(r"[;；]", text))
    # long enough to be telling (not "g", "lane >> 2" or "np.zeros(...)")
    return {p for p in pieces if len(p) >= 12 and "np." not in p and "{" not in p}


def _lab5_variant(tmp_path, name):
    path = tmp_path / f"lab5_{name}.py"
    path.write_text("import importlib.util\n"
                    f"_spec = importlib.util.spec_from_file_location('lab5_sol_for_variant', {LAB5_PY_SOL!r})\n"
                    "sol = importlib.util.module_from_spec(_spec)\n_spec.loader.exec_module(sol)\n"
                    "a_fragment, b_fragment, c_fragment = sol.a_fragment, sol.b_fragment, sol.c_fragment\n"
                    "ldmatrix_a_address, ldmatrix_b_address = sol.ldmatrix_a_address, sol.ldmatrix_b_address\n"
                    + LAB5_WRONG[name])
    return str(path)


@needs_solutions
def test_lab5_solution_passes_every_layout_check():
    for lang in ("en", "zh"):
        checks = CL.lab5_layout_checks(LAB5_PY_SOL, seed=7, lang=lang)
        assert len(checks) == 9 and all(c["passed"] for c in checks), checks


def test_lab5_template_fails_every_check_with_a_helpful_message():
    for source in ("auto", "digests"):
        checks = CL.lab5_layout_checks(LAB5_PY, seed=7, layout_source=source)
        assert len(checks) == 9 and not any(c["passed"] for c in checks)
        assert "a_fragment is not written yet" in checks[0]["message"]
        assert all(c["message"] and "Traceback" not in c["message"] for c in checks)


@needs_instructor
def test_lab5_true_layout_is_the_ptx_isa_table_and_the_digests_match_it():
    inst = CL._lab5_instructor()
    L = inst.true_layout()  # spot checks of the PTX ISA's m16n8k16 figures
    assert tuple(L["A"][5, 1, 0]) == (9, 2) and tuple(L["A"][31, 3, 1]) == (15, 15)
    assert tuple(L["B"][6, 1, 1]) == (13, 1) and tuple(L["C"][30, 3]) == (15, 5)
    with open(CL.LAB5_DIGESTS_FILE, encoding="utf-8") as f:
        stored = json.load(f)
    assert stored == inst.digest_table(stored["salt"]), \
        "lab5_layout_digests.json is stale: run python notebooks/labs/instructor/lab5_layout.py --write"
    assert stored["iterations"] >= 1000 and len(stored["salt"]) >= 32


def test_lab5_digests_reject_bad_arguments():
    L = {"A": np.zeros((32, 4, 2, 2), int), "B": np.zeros((32, 2, 2, 2), int), "C": np.zeros((32, 4, 2), int)}
    with pytest.raises(ValueError, match="lab5_layout_digests: salt must be a non-empty hex string"):
        CL.lab5_layout_digests(L, "not hex")
    with pytest.raises(ValueError, match=r"lab5_layout_digests: layout\['C'\] must have shape \(32, 4, 2\)"):
        CL.lab5_layout_digests(dict(L, C=np.zeros((32, 2))), "ab")
    with pytest.raises(ValueError, match="lab5_layout_checks: layout_source must be 'auto', 'instructor' or "
                                         "'digests', got 'answers'"):
        CL.lab5_layout_checks(LAB5_PY, seed=1, layout_source="answers")


@needs_solutions
@needs_instructor
@pytest.mark.parametrize("variant", [None, *LAB5_WRONG])
def test_lab5_both_answer_sources_score_alike(tmp_path, variant):
    """Per check, the instructor's table and the release's digests pass and fail alike; only the hints differ,
    and the digests' hints never state the layout."""
    path = LAB5_PY_SOL if variant is None else _lab5_variant(tmp_path, variant)
    inst = CL.lab5_layout_checks(path, seed=3, layout_source="instructor")
    dig = CL.lab5_layout_checks(path, seed=3, layout_source="digests")
    assert [c["name"] for c in inst] == [c["name"] for c in dig]
    assert [c["passed"] for c in inst] == [c["passed"] for c in dig]
    assert all(c["passed"] for c in dig) == (variant is None)
    answer = _lab5_answer_pieces()
    for c in dig:
        leaked = [p for p in answer if p in c["message"]]
        assert not leaked and "+ 8" not in c["message"], (leaked, c["message"])


@needs_solutions
@needs_instructor
def test_lab5_wrong_layout_is_caught(tmp_path):
    path = _lab5_variant(tmp_path, "c1_c2_swapped")
    checks = {c["name"]: c for c in CL.lab5_layout_checks(path, seed=1)}  # the instructor's table: detailed
    ptx = checks["C/D fragment (16x8, fp32): the PTX ISA layout"]
    assert not ptx["passed"] and "c_fragment(0, 1) = (8, 0), but the PTX ISA puts (0, 1) there" in ptx["message"]
    assert checks["C/D fragment (16x8, fp32): a bijection"]["passed"]
    num = checks["S = Q K^T through the fragments (seed 1)"]
    assert not num["passed"] and "S = Q K^T through your fragments is wrong" in num["message"]
    checks = {c["name"]: c for c in CL.lab5_layout_checks(path, seed=1, layout_source="digests")}
    ptx = checks["C/D fragment (16x8, fp32): the PTX ISA layout"]
    assert not ptx["passed"] and "c_fragment differs from the PTX ISA's layout in 32 of the 32 lanes" in ptx["message"]
    assert "lane 0 holds [(0, 0), (8, 0), (0, 1), (8, 1)]" in ptx["message"]
    assert "not checked yet" in checks["S = Q K^T through the fragments (seed 1)"]["message"]
    # errors that cancel in S still fail, in both modes
    path = _lab5_variant(tmp_path, "halves_swapped_in_a_and_b")
    num = CL.lab5_layout_checks(path, seed=1)[-1]
    assert not num["passed"] and "only because the errors of your maps cancel" in num["message"]
    # ldmatrix with a wrong A map: the release names the lane, not the register
    path = _lab5_variant(tmp_path, "a_and_ldmatrix_a_wrong")
    ld = {c["name"]: c for c in CL.lab5_layout_checks(path, seed=1, layout_source="digests")}[
        "ldmatrix.x4 addresses load the A fragment"]
    assert not ld["passed"] and "which is not the A fragment's lane 0" in ld["message"]


@pytest.fixture(scope="module")
def lab5_release(tmp_path_factory):
    """A student release (release.py) and its own cuda_labs module."""
    sys.path.insert(0, LABS)
    try:
        import release
    finally:
        sys.path.remove(LABS)
    out = tmp_path_factory.mktemp("release5") / "course"
    release.make_release(str(out), quiet=True)
    spec = importlib.util.spec_from_file_location("release_cuda_labs", str(out / "notebooks" / "labs" / "cuda_labs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return out, mod


@needs_solutions
@needs_instructor
def test_lab5_release_holds_no_answer(lab5_release):
    out, RCL = lab5_release
    labs = out / "notebooks" / "labs"
    assert not (labs / "instructor").exists() and not (labs / "solutions").exists()
    assert (labs / "lab5_layout_digests.json").is_file()
    assert not hasattr(RCL, "lab5_true_layout") and RCL._lab5_instructor() is None
    answer = _lab5_answer_pieces()
    assert len(answer) >= 15, answer
    for path in labs.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".cu", ".cuh", ".h", ".md", ".json", ".ipynb", ".txt"):
            text = path.read_text(encoding="utf-8")
            leaked = [p for p in answer if p in text]
            assert not leaked, f"{path.relative_to(out)} holds lab 5's answer: {leaked[:3]}"
            assert "lab5_true_layout" not in text and "def true_layout" not in text, path
    # the release's checks: digests, full marks for the solution, the same verdicts as the instructor's table
    assert all(c["passed"] for c in RCL.lab5_layout_checks(LAB5_PY_SOL, seed=5))
    assert RCL._Lab5Answer("auto", "test").mode == "digests"


@needs_solutions
@needs_instructor
@pytest.mark.slow
def test_lab5_release_grader_scores_solution_full_and_template_zero(lab5_release, tmp_path):
    out, _ = lab5_release
    env = dict(os.environ, PYTHONPATH=str(out), CUDA_VISIBLE_DEVICES="")

    def grade(*args):
        p = subprocess.run([sys.executable, "notebooks/labs/grade.py", "lab5", *args], cwd=str(out), env=env,
                           capture_output=True, text=True, timeout=300)
        assert "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr
        return p.returncode, p.stdout + p.stderr

    rc, text = grade(LAB5_PY_SOL)
    assert rc == 0 and "9/9 pass: 6/6 points" in text, text
    rc, text = grade(_lab5_variant(tmp_path, "c1_c2_swapped"))
    assert rc == 1 and "7/9 pass" in text and "c_fragment differs from the PTX ISA's layout" in text, text
    rc, text = grade()  # the template
    assert rc == 1 and "Score: 0/10" in text and "a_fragment is not written yet" in text and "TODO(lab5)" in text, text


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
