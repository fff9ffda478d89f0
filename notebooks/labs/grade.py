#!/usr/bin/env python
"""Grader for the labs: runs the shared test cases against your version and explains what fails.

    python notebooks/labs/grade.py lab1 [FILE]     NumPy online-softmax merge step
    python notebooks/labs/grade.py lab2 [FILE]     Triton inner K/V loop (CPU interpreter, float32)
    python notebooks/labs/grade.py lab3 [FILE]     CUDA tiled kernel, four device functions
    python notebooks/labs/grade.py LAB --solution  grade the reference solution instead

FILE defaults to the lab's template in notebooks/labs/. The cases, the input generator, the float64
reference and the tolerance policy (max-abs error <= 2 x naive-attention error in the same dtype +
a floor) are those of the test harness, tests/harness.py. One line per case (PASS/FAIL with max-abs
and relative-norm errors of O and lse), then a hint for the first case that fails. Exit code 0 only
when every case that can run here passes; 1 otherwise; 2 for a usage error.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
import types
from dataclasses import dataclass, field
from typing import Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TESTS = os.path.join(ROOT, "tests")
for _p in (TESTS, ROOT):  # tests/ is not a package: harness.py is imported as a top-level module
    if _p not in sys.path:
        sys.path.insert(0, _p)
import numpy as np  # noqa: E402

LABS = {
    "lab1": dict(template="lab1_online_softmax.py", title="lab 1 - online softmax in NumPy"),
    "lab2": dict(template="lab2_triton_inner_loop.py", title="lab 2 - the inner loop of a Triton kernel"),
    "lab3": dict(template="lab3_cuda_tiled.cu", title="lab 3 - the four device functions of a tiled CUDA kernel"),
}

# words that differ between the labs, for the hints
WORDS = {
    "lab1": dict(exp="np.exp", fix_neginf="m_safe = np.where(np.isneginf(m_new), 0.0, m_new) and subtract m_safe",
                 merge="merge_block", final="finalize", alpha="alpha = np.exp(m_old - m_new)"),
    "lab2": dict(exp="tl.exp2", fix_neginf='m_safe = tl.where(m_new == float("-inf"), 0.0, m_new) and subtract m_safe',
                 merge="the loop body", final="the epilogue", alpha="alpha = tl.exp2(m_i - m_new)"),
    "lab3": dict(exp="exp2f", fix_neginf="use fa::exp2_minus(x, m), which is 0 when m = -inf",
                 merge="merge_block_stats", final="normalize_output",
                 alpha="a = fa::exp2_minus(m, m_new) (and the tile's l_tile by b = fa::exp2_minus(m_tile, m_new))"),
}


class NotDone(Exception):
    """The student's file still has an unfilled TODO (todo=True) or does not compile/load: explain and stop."""

    def __init__(self, message, todo=False):
        super().__init__(message)
        self.todo = todo


# ------------------------------------------------------------------------------------------ cases
@dataclass
class Result:
    case: dict
    causal: bool
    status: str = "PASS"  # PASS, FAIL, ERROR
    o_err: Optional[tuple] = None  # (max-abs, rel-norm)
    lse_err: Optional[tuple] = None
    o_ok: bool = True
    lse_ok: bool = True
    reasons: list = field(default_factory=list)
    error: Optional[str] = None
    out: Optional[tuple] = None  # (o, lse) as float64 NumPy
    ref: Optional[tuple] = None

    @property
    def name(self) -> str:
        return f"{case_id(self.case)} {'causal' if self.causal else 'full'}"


def case_id(c) -> str:
    import harness as H

    return H.case_id(c)


def _f64(x):
    import harness as H

    return H.to_f64_numpy(x)


def run_cases(lab, cases, forward, *, kind, dtype, device, naive_device, student_path, backend=None):
    """Run forward(x, causal) -> (o, lse) on every case, causal and not; check it as tests/harness.py does."""
    import harness as H

    # what the harness needs of a backend: its array kind and where its matmuls use tf32 (nowhere here)
    shim = backend or types.SimpleNamespace(name=lab, array=kind, tf32_on=())
    results = []
    for c in cases:
        for causal in (False, True):
            r = Result(case=c, causal=causal)
            results.append(r)
            x = H.inputs_for(shim, device, dtype, c)
            x["case"] = c
            o_ref, lse_ref = H.attention_reference(x["q"], x["k"], x["v"], causal=causal, return_lse=True)
            r.ref = (_f64(o_ref), _f64(lse_ref))
            try:
                o, lse = forward(x, causal)
            except NotDone:
                raise
            except Exception as exc:  # the student's code raised: summarise, no traceback
                r.status, r.o_ok, r.lse_ok = "ERROR", False, False
                r.error = explain_exception(exc, student_path)
                print_line(r)
                continue
            try:
                r.out = (_f64(o), _f64(lse))
            except Exception as exc:
                r.status, r.o_ok, r.lse_ok = "ERROR", False, False
                r.error = f"the outputs are not arrays: {type(exc).__name__}: {exc}"
                print_line(r)
                continue
            o_naive, lse_naive = H.naive_same_precision(shim, naive_device, x["q"], x["k"], x["v"], causal=causal)
            kw = dict(backend=lab, device=device, dtype=dtype)
            for qty, out, ref, naive, floor in (("o", o, o_ref, o_naive, H.FLOOR[dtype]),
                                               ("lse", lse, lse_ref, lse_naive, H.LSE_FLOOR[dtype])):
                try:
                    err = H.errors(out, ref)
                    setattr(r, f"{qty}_err", err)
                    H.check_close(qty, out, ref, naive, floor=floor, **kw)  # the harness's tolerance policy
                except AssertionError as exc:
                    setattr(r, f"{qty}_ok", False)
                    r.status = "FAIL"
                    r.reasons.append(f"{'O' if qty == 'o' else 'lse'}: {exc}")
            print_line(r)
    return results


def print_line(r: Result):
    def fmt(label, err):
        return f"{label} max-abs {err[0]:.1e} rel {err[1]:.1e}" if err else f"{label} {'-':>22}"

    line = f"{r.status:<5} {r.name:<32} {fmt('O', r.o_err)} | {fmt('lse', r.lse_err)}"
    if r.error:
        line = f"{r.status:<5} {r.name:<32} {r.error.splitlines()[0]}"
    print(line, flush=True)
    for reason in r.reasons:  # the numbers speak for themselves; say why only when there are none
        if (reason.startswith("O:") and r.o_err is None) or (reason.startswith("lse:") and r.lse_err is None):
            print(f"      {reason}")


def explain_exception(exc, student_path) -> str:
    """'ValueError: ... (at lab1_online_softmax.py:57 in merge_block: `line`)' without a traceback."""
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    where = ""
    for e in reversed(chain):  # the innermost exception points closest to the student's line
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if os.path.abspath(f.filename) == os.path.abspath(student_path)]
        if frames:
            f = frames[-1]
            where = f" (at {os.path.basename(f.filename)}:{f.lineno} in {f.name}: `{(f.line or '').strip()}`)"
            break
    root = chain[-1]
    msg = str(root).strip().splitlines()
    return f"{type(root).__name__}: {msg[0] if msg else ''}{where}"


def summary(lab, results, *, hint_extra: Optional[Callable] = None, skipped=0) -> int:
    n_pass = sum(r.status == "PASS" for r in results)
    print(f"\n{n_pass}/{len(results)} cases pass" + (f" ({skipped} skipped, see above)" if skipped else "") + ".")
    failing = [r for r in results if r.status != "PASS"]
    if not failing:
        print(f"All cases pass: {LABS[lab]['title']} is done.")
        return 0
    first = failing[0]
    print(f"\nHint for the first failing case ({first.name}):")
    for reason in first.reasons:  # the harness's own verdict, with the tolerance it applied
        print(f"  {reason}")
    for line in diagnose(lab, first, results):
        print(f"  {line}")
    if hint_extra is not None:
        for line in hint_extra() or []:
            print(f"  {line}")
    return 1


# ------------------------------------------------------------------------------------------ hints
def _several_blocks(r: Result, block_n: int) -> bool:
    return r.case["Nk"] > block_n


def diagnose(lab, r: Result, results, block_n=None) -> list:
    """A few sentences about what is most likely wrong in the first failing case."""
    w = WORDS[lab]
    block_n = block_n or BLOCK_N.get(lab, 16)
    Nq, Nk = r.case["Nq"], r.case["Nk"]
    if r.error:
        return [f"your code raised {r.error}", "Fix that first (run the lab file's function by hand on small inputs)."]
    o, lse = r.out
    o_ref, lse_ref = r.ref
    if o.shape != o_ref.shape or lse.shape != lse_ref.shape:
        return [f"shapes: O {o.shape} (expected {o_ref.shape}), lse {lse.shape} (expected {lse_ref.shape})."]
    hints = []
    nan_rows = np.isnan(o).any(axis=-1) | np.isnan(lse)
    no_key = np.zeros(Nq, bool)
    if r.causal:
        no_key = np.arange(Nq) + Nk - Nq < 0  # query i sees key j iff j <= i + Nk - Nq
    if nan_rows.any():
        rows = np.unique(np.nonzero(nan_rows)[-1])
        if r.causal and no_key.any() and no_key[rows].all():
            hints += [f"NaN in rows {_rows(rows)}: exactly the rows that see no key at all (causal with Nq = {Nq} > Nk = {Nk}).",
                      "Every score of such a row is -inf, so m_new = -inf and exp(S - m_new) = exp(-inf - (-inf)) = NaN.",
                      f"Fix in {w['merge']}: {w['fix_neginf']};",
                      f"and in {w['final']}: where l == 0 give O = 0 and lse = -inf instead of dividing by 0."]
        elif r.causal:
            hints += [f"NaN in rows {_rows(rows)}, only with the causal mask: some row has every key of a block hidden,",
                      f"so its m is still -inf and exp(-inf - (-inf)) = NaN. Fix: {w['fix_neginf']}."]
        else:
            hints += [f"NaN in rows {_rows(rows)} without any mask: look for 0/0 or inf - inf.",
                      f"Did you subtract the running max before {w['exp']}? (exp of a large score overflows to inf)"]
        return hints
    lse_inf_wrong = ~np.equal(np.isinf(lse), np.isinf(lse_ref)) | (np.isinf(lse_ref) & (lse != lse_ref))
    if lse_inf_wrong.any():
        rows = np.unique(np.nonzero(lse_inf_wrong)[-1])
        if np.isinf(lse_ref[..., rows]).all():
            hints += [f"rows {_rows(rows)} see no key (causal, Nq > Nk): they must get lse = -inf and O = 0.",
                      f"In {w['final']}, detect them with l == 0."]
        else:
            hints += [f"lse is infinite in rows {_rows(rows)} that do see keys: is l = 0 there (the keys were never added)",
                      f"or did {w['exp']} overflow (subtract the max first)?"]
        return hints
    finite = np.isfinite(lse_ref)
    if not r.lse_ok:
        d = (lse - lse_ref)[finite]
        bias = float(d[np.argmax(np.abs(d))]) if d.size else 0.0  # the sign of the worst row's error
        if _several_blocks(r, block_n):
            if bias > 0:
                hints += ["the row sums l look too large (lse is above the reference): did you rescale l by",
                          f"{w['alpha']} before adding rowsum(P_ij)? Without it, blocks summed under an old, smaller max count too much."]
            else:
                hints += ["the row sums l look too small (lse is below the reference): is alpha the right way round,",
                          f"{w['alpha']} (<= 1)? And does P_ij = {w['exp']}(S_ij - m_new) use the NEW max?"]
        else:
            hints += [f"this case has a single K/V block (Nk = {Nk} <= BLOCK_N = {block_n}), so no merging is involved:",
                      f"check l = rowsum({w['exp']}(S_ij - m_new)) (sum over the keys, the last axis) and lse = m + log(l)."]
            if lab == "lab2":
                hints += ["Base 2: qk_scale already contains log2(e); use tl.exp2 on the scaled scores, not tl.exp."]
    elif not r.o_ok:
        if _several_blocks(r, block_n):
            acc_rule = {"lab1": "acc = alpha[..., None] * acc + P_ij @ V_j",
                        "lab2": "acc = acc * alpha[:, None] + tl.dot(p, v)",
                        "lab3": "acc = a * acc + b * pv, for every column the lane owns"}[lab]
            hints += ["m and l are right (lse matches the reference) but O is not. acc must be rescaled exactly like l:",
                      f"{acc_rule}, and O = acc / l once at the end ({w['final']})."]
        else:
            hints += ["m and l are right (lse matches the reference) but O is not, with a single K/V block:",
                      "check acc += P_ij @ V_j (probabilities times values) and O = acc / l."]
    one = [x for x in results if x.status != "PASS" and not _several_blocks(x, block_n)]
    several_pass = [x for x in results if x.status == "PASS" and _several_blocks(x, block_n)]
    single_pass = [x for x in results if x.status == "PASS" and not _several_blocks(x, block_n)]
    if single_pass and not one and not several_pass:
        hints.append("Pattern: every case with one K/V block passes, every case with several fails: the merge across blocks is the problem.")
    if r.causal and all(x.status == "PASS" for x in results if not x.causal):
        hints.append("Pattern: every non-causal case passes: look at how you treat masked (-inf) scores.")
    if not hints:
        err = np.abs(o - o_ref).max(axis=-1)
        idx = np.unravel_index(int(np.argmax(err)), err.shape)
        hints.append(f"the largest error of O is in query row {idx[-1]} (of Nq = {Nq}); compare that row by hand.")
    return hints


def _rows(rows, n=6) -> str:
    rows = [int(i) for i in rows]
    return ", ".join(map(str, rows[:n])) + (", ..." if len(rows) > n else "")


BLOCK_N = {"lab1": 16, "lab2": 32, "lab3": 32}  # the K/V block sizes the graders run with


# ------------------------------------------------------------------------------------------ loading
def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise NotDone(f"cannot load {path} as a Python module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # triton's @jit looks its module up
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as exc:
        raise NotDone(f"{os.path.basename(path)} has a syntax error at line {exc.lineno}: {exc.msg}\n"
                      f"    {(exc.text or '').strip()}") from None
    except Exception as exc:
        raise NotDone(f"importing {os.path.basename(path)} failed: {explain_exception(exc, path)}") from None
    return mod


def not_done_message(lab, path, exc: NotDone) -> None:
    print(f"NOT DONE: {exc}")
    if exc.todo:
        print(f"Open {os.path.relpath(path, ROOT)}, write the parts marked TODO({lab}), and run this grader again.")
    else:
        print(f"Fix {os.path.relpath(path, ROOT)} and run this grader again.")


# ------------------------------------------------------------------------------------------ lab 1
def grade_lab1(path, quick=False) -> int:
    import harness as H

    mod = load_module(path, "lab1_student")
    for fn in ("merge_block", "finalize", "flash_attn_lab1"):
        if not hasattr(mod, fn):
            raise NotDone(f"{os.path.basename(path)} has no function {fn}: did you rename or delete it?")
    cases = [c for c in H.CASES if c["core"]] if quick else list(H.CASES)
    print(f"{LABS['lab1']['title']}: {os.path.relpath(path, ROOT)}")
    print(f"float32 NumPy, Br = 32, Bc = {BLOCK_N['lab1']}; {len(cases) * 2} cases from tests/harness.py; "
          "tolerance: 2 x naive float32 error + floor\n")

    def forward(x, causal):
        try:
            return mod.flash_attn_lab1(x["q"], x["k"], x["v"], causal=causal, return_lse=True,
                                       block_n=BLOCK_N["lab1"])
        except NotImplementedError as exc:
            raise NotDone(str(exc) or "a function still raises NotImplementedError", todo=True) from None

    results = run_cases("lab1", cases, forward, kind="numpy", dtype="float32", device="cpu",
                        naive_device="cpu", student_path=path)
    return summary("lab1", results, hint_extra=lambda: lab1_unit_checks(mod))


def lab1_unit_checks(mod) -> list:
    """Call merge_block and finalize on a 1-row example and say which of m, l, acc, O, lse is off."""
    e = math.e
    out = ["Unit check on a one-row example (two blocks; the second has the larger max):"]
    m0, l0, a0 = np.array([-np.inf]), np.array([0.0]), np.zeros((1, 2))
    S1, V1 = np.array([[1.0, 2.0]]), np.array([[1.0, 0.0], [0.0, 1.0]])
    S2, V2 = np.array([[4.0, 0.0]]), np.array([[2.0, 0.0], [0.0, 3.0]])
    m1, l1, a1 = 2.0, e ** -1 + 1.0, np.array([e ** -1, 1.0])
    m2 = 4.0
    alpha = e ** (m1 - m2)
    l2 = alpha * l1 + 1.0 + e ** -4
    a2 = alpha * a1 + np.array([2.0, 3.0 * e ** -4])
    try:
        got1 = mod.merge_block(m0, l0, a0, S1, V1)
        got2 = mod.merge_block(*(np.asarray(g, dtype=np.float64) for g in got1), S2, V2)
        gm, gl, ga = (np.asarray(g, dtype=np.float64) for g in got2)
        gm1, gl1, ga1 = (np.asarray(g, dtype=np.float64) for g in got1)
    except NotImplementedError:
        return out + ["  merge_block still raises NotImplementedError."]
    except Exception as exc:
        return out + [f"  merge_block raised {type(exc).__name__}: {exc}"]
    ok = True
    if not np.allclose(gm1, [m1]) or not np.allclose(gm, [m2]):
        ok = False
        out.append(f"  m: got {gm1.ravel()} then {gm.ravel()}, expected [{m1}] then [{m2}]: m_new = max(m_old, rowmax(S_ij)).")
    if np.isnan(gl1).any():
        ok = False
        out.append("  l after block 1 is NaN. On the first block m_old = -inf, so alpha = exp(m_old - m_new) = 0 and "
                   "alpha * l_old = 0;\n    NaN means inf * 0 or -inf - (-inf): is alpha upside down (exp(m_new - m_old) = inf)?")
    elif not np.allclose(gl1, [l1]):
        ok = False
        out.append(f"  l after block 1: got {gl1.ravel()}, expected [{l1:.6f}] = exp(1-2) + exp(2-2): "
                   "P_ij = exp(S_ij - m_new), l = rowsum(P_ij).")
    elif not np.allclose(gl, [l2]):
        ok = False
        guess = {l1 + 1.0 + e ** -4: "l was not rescaled: l_new = alpha * l_old + rowsum(P_ij), alpha = exp(m_old - m_new)",
                 e ** (m2 - m1) * l1 + 1.0 + e ** -4: "alpha is upside down: alpha = exp(m_old - m_new), not exp(m_new - m_old)",
                 alpha * l1 + e ** 4 + 1.0: "P_ij must subtract the new max: P_ij = exp(S_ij - m_new)"}
        why = next((v for k, v in guess.items() if np.isclose(gl[0], k)), "compare with l_new = alpha * l_old + rowsum(P_ij)")
        out.append(f"  l after block 2: got {gl.ravel()}, expected [{l2:.6f}]: {why}.")
    if ok and not np.allclose(ga1, a1[None]):
        ok = False
        out.append(f"  acc after block 1: got {ga1.ravel()}, expected {a1}: acc_new = alpha * acc_old + P_ij @ V_j.")
    elif ok and not np.allclose(ga, a2[None]):
        ok = False
        why = ("acc was not rescaled by alpha" if np.allclose(ga, a1 + np.array([2.0, 3.0 * e ** -4]))
               else "acc_new = alpha[..., None] * acc_old + P_ij @ V_j")
        out.append(f"  acc after block 2: got {ga.ravel()}, expected {a2}: {why}.")
    with np.errstate(all="ignore"):
        try:
            hm, hl, ha = (np.asarray(g, dtype=np.float64) for g in
                          mod.merge_block(m0, l0, a0, np.array([[-np.inf, -np.inf]]), V1))
            if np.isnan(hm).any() or np.isnan(hl).any() or np.isnan(ha).any():
                ok = False
                out.append("  a row whose keys are all hidden (S_ij = -inf, m_old = -inf) gives NaN: "
                           "exp(-inf - (-inf)) is NaN; subtract 0 where m_new is -inf.")
        except Exception as exc:
            out.append(f"  merge_block raised {type(exc).__name__} on a fully masked row: {exc}")
        try:
            O, lse = (np.asarray(g, dtype=np.float64) for g in
                      mod.finalize(np.array([1.0, -np.inf]), np.array([2.0, 0.0]), np.array([[2.0, 4.0], [0.0, 0.0]])))
            want_o, want_lse = np.array([[1.0, 2.0], [0.0, 0.0]]), np.array([1.0 + math.log(2.0), -np.inf])
            if not (np.array_equal(np.isnan(O), np.zeros_like(O, bool)) and np.allclose(O, want_o)):
                ok = False
                out.append(f"  finalize: O = {O.tolist()}, expected {want_o.tolist()} (O = acc / l; 0 where l == 0).")
            if not (np.array_equal(np.isinf(lse), [False, True]) and np.isclose(lse[0], want_lse[0]) and lse[1] == -np.inf):
                ok = False
                out.append(f"  finalize: lse = {lse.tolist()}, expected {want_lse.tolist()} (lse = m + log(l); -inf where l == 0).")
        except NotImplementedError:
            ok = False
            out.append("  finalize still raises NotImplementedError.")
        except Exception as exc:
            ok = False
            out.append(f"  finalize raised {type(exc).__name__}: {exc}")
    if ok:
        out.append("  merge_block and finalize are right on it: look at broadcasting over the (B, H) axes and the Br, Bc axes.")
    return out


# ------------------------------------------------------------------------------------------ lab 2
LAB2_MAX_N = 128  # the interpreter is slow: small cases only


def grade_lab2(path, quick=False) -> int:
    import harness as H

    # Triton runs on a CPU only under its interpreter, chosen when a kernel is decorated: set it before
    # loading the lab. With a CUDA GPU the lab runs natively there; TRITON_INTERPRET=1 forces the interpreter.
    if "TRITON_INTERPRET" not in os.environ:
        import torch

        os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interp else "cuda"
    if not interp:
        import torch

        if not torch.cuda.is_available():
            raise NotDone("TRITON_INTERPRET is not 1 and there is no CUDA GPU: unset it (or set it to 1) to use the CPU interpreter")
    try:
        import triton  # noqa: F401
    except ImportError:
        raise NotDone("triton is not installed (pip install triton): lab 2 needs it, even on a CPU") from None
    mod = load_module(path, "lab2_student")
    if not hasattr(mod, "flash_attn_lab2"):
        raise NotDone(f"{os.path.basename(path)} has no function flash_attn_lab2: did you rename or delete it?")
    cases = [c for c in H.CASES if max(c["Nq"], c["Nk"]) <= LAB2_MAX_N and (c["core"] or not quick)]
    print(f"{LABS['lab2']['title']}: {os.path.relpath(path, ROOT)}")
    print(f"float32 on {'the CPU (TRITON_INTERPRET=1)' if interp else 'the GPU'}, BLOCK_M = 32, BLOCK_N = "
          f"{BLOCK_N['lab2']}; {len(cases) * 2} cases of tests/harness.py with N <= {LAB2_MAX_N}; "
          "tolerance: 2 x naive float32 error + floor\n")

    def forward(x, causal):
        try:
            return mod.flash_attn_lab2(x["q"], x["k"], x["v"], causal=causal, return_lse=True,
                                       block_m=32, block_n=BLOCK_N["lab2"])
        except Exception as exc:
            text = " ".join(str(e) for e in _exc_chain(exc))
            if "lab2 TODO" in text:
                raise NotDone("the inner loop body of _lab2_fwd_kernel is not written yet "
                              "(the tl.static_assert(False, ...) line of the TODO is still there)", todo=True) from None
            if type(exc).__name__ in ("CompilationError", "InterpreterError"):
                raise NotDone(f"the kernel does not compile/run: {_triton_error_text(exc, path)}") from None
            raise

    results = run_cases("lab2", cases, forward, kind="torch", dtype="float32", device=device,
                        naive_device=device, student_path=path)
    return summary("lab2", results)


def _exc_chain(exc):
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


def _triton_error_text(exc, path) -> str:
    text = explain_exception(exc, path)
    if type(exc).__name__ == "CompilationError":  # on a GPU: the message quotes the kernel line with a ^
        lines = [ln for ln in str(exc).splitlines() if ln.strip()][:10]
        text += "\n    " + "\n    ".join(lines)
    return text


# ------------------------------------------------------------------------------------------ lab 3
# The solution of lab 3 is the repository's own kernel; the template is generated from it (make_lab3.py).
KERNEL_DIR = os.path.join(ROOT, "flash_attention_cuda", "kernels")
LAB3_SOLUTION = os.path.join(KERNEL_DIR, "tiled.cu")
LAB3_KERNEL = "tiled_fwd"


def find_nvcc() -> Optional[str]:
    cands = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(os.path.join(os.environ[env], "bin", "nvcc"))
    cands += ["/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"]
    return next((c for c in cands if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def nvcc_compile(nvcc, src_path, out_path, arch="sm_90"):
    """nvcc -cubin (with common.cuh on the include path); returns (ok, compiler output)."""
    cmd = [nvcc, "-cubin", f"-arch={arch}", "-std=c++17", "-I", KERNEL_DIR, "-Xptxas", "-v", "-o", out_path, src_path]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return False, "nvcc took more than 600 s"
    return p.returncode == 0, (p.stdout + p.stderr)


def explain_compile_errors(output, path) -> str:
    todo = sorted(set(re.findall(r'lab3 TODO (\d)/4: (\w+) is not written yet', output)))
    if todo:
        return (f"{len(todo)} of the 4 device functions are not written yet: "
                + ", ".join(name for _, name in todo)
                + ".\n  Each still has its `static_assert(D_PAD < 0, ...)` line: write the body, then delete that line.")
    base = os.path.basename(path)
    errs = []
    for ln in output.splitlines():
        if "error" in ln.lower() and ln.strip() not in errs:
            errs.append(ln.strip())
    shown = "\n  ".join(ln.replace(path, base) for ln in errs[:8]) or output.strip()[-1500:]
    return f"{base} does not compile (nvcc):\n  {shown}" + ("\n  ..." if len(errs) > 8 else "")


def _is_cuda_error(exc) -> bool:
    text = f"{type(exc).__module__} {type(exc).__name__} {exc}"
    return any(w in text for w in ("cupy", "CUDA error", "cudaError", "CUDADriverError", "CUDARuntimeError"))


def grade_lab3(path, quick=False) -> int:
    print(f"{LABS['lab3']['title']}: {os.path.relpath(path, ROOT)}")
    src = open(path).read()
    if not re.search(rf"\b{LAB3_KERNEL}\b", src) or "merge_block_stats" not in src:
        raise NotDone(f"{os.path.basename(path)} must keep the given kernel {LAB3_KERNEL} and the four device functions")
    m_bc = re.search(r"constexpr\s+int\s+BC\s*=\s*(\d+)", src)
    BLOCK_N["lab3"] = int(m_bc.group(1)) if m_bc else 32

    # 1. compile check, anywhere: nvcc -cubin -arch=sm_90 (the file's explicit instantiations are compiled)
    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc not found (not on PATH, nor $NVCC, $CUDA_HOME/bin, /usr/local/cuda/bin): install the CUDA")
        print("toolkit to compile the lab, or grade it on a machine that has one. Nothing was checked.")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        ok, output = nvcc_compile(nvcc, path, os.path.join(tmp, "lab3.cubin"))
    if not ok:
        raise NotDone(explain_compile_errors(output, path), todo="lab3 TODO" in output)
    regs = re.findall(r"Used (\d+) registers", output)
    smem = re.findall(r"(\d+) bytes smem", output)
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", output)]
    print(f"COMPILE OK  nvcc -cubin -arch=sm_90 -std=c++17: {len(regs)} kernel instantiations, registers "
          f"{'/'.join(regs)}, shared memory {'/'.join(smem)} bytes"
          + (f", {max(spills)} bytes spilled" if spills and max(spills) else ""))

    # 2. numerical check: needs a GPU
    from flash_attention_py.registry import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is not None:
        print(f"\nThe numerical check needs a CUDA GPU, and there is none here ({reason}).")
        print("Only the compile check ran. Run this command again on a machine with a GPU to grade the numbers.")
        return 0
    return _lab3_gpu(path, src, quick)


def _lab3_gpu(path, src, quick, device="cuda") -> int:
    """Launch the student's kernel through the repository's own launcher (flash_attention_cuda)."""
    import harness as H
    import torch
    from flash_attention_py.registry import get_backend

    try:
        from flash_attention_cuda import launcher
    except Exception as exc:
        raise NotDone(f"cannot import flash_attention_cuda.launcher to launch the kernel: {type(exc).__name__}: {exc}")
    if not (hasattr(launcher, "read_source") and hasattr(launcher, "_KERNEL_CACHE")):
        raise NotDone("flash_attention_cuda.launcher has no read_source/_KERNEL_CACHE any more: "
                      "the lab-3 grader needs them to swap in your tiled.cu (please report this)")
    with open(os.path.join(KERNEL_DIR, "common.cuh")) as f:
        common = f.read()
    student_text = src.replace('#include "common.cuh"', common)
    original_read = launcher.read_source
    backend = get_backend("cuda-tiled")

    def read_source(source):  # tiled.cu -> the student's file; everything else unchanged
        return student_text if source == "tiled.cu" else original_read(source)

    cases = [c for c in H.CASES if c["core"] or not quick]
    run = [c for c in cases if backend.supports_head_dim(c["D"])]
    skipped = [c for c in cases if not backend.supports_head_dim(c["D"])]
    gpu = torch.cuda.get_device_name() if device == "cuda" else device
    print(f"\nfloat32 on the GPU ({gpu}), through flash_attention_cuda's launcher, "
          f"BC = {BLOCK_N['lab3']}; {len(run) * 2} cases of tests/harness.py; "
          "tolerance: 2 x naive float32 error + floor\n")
    for c in skipped:
        print(f"SKIP  {case_id(c):<32} D = {c['D']}: the tiled kernel takes D <= {backend.max_head_dim}")

    def forward(x, causal):
        try:
            o, lse = backend.forward(x["q"], x["k"], x["v"], causal=causal, return_lse=True)
            if device == "cuda":
                torch.cuda.synchronize()  # a crash inside the kernel surfaces here, not later
            return o, lse
        except Exception as exc:
            if _is_cuda_error(exc):
                if "compile" in type(exc).__name__.lower() or "nvrtc" in str(exc).lower():
                    raise NotDone(f"NVRTC could not compile your file: {exc}") from None
                # a crashed kernel leaves the CUDA context unusable: stop here
                raise NotDone(f"the kernel crashed on case {case_id(x['case'])}: {type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}\n"
                              "  Usually an index out of bounds: a tile is 32 keys (lane = key), D_PAD columns, "
                              "ROWS rows per warp; write only rows < Nq and columns < D.") from None
            raise

    launcher.read_source = read_source
    launcher._KERNEL_CACHE.clear()
    try:
        results = run_cases("lab3", run, forward, kind="torch", dtype="float32", device=device,
                            naive_device=device, student_path=path, backend=backend)
    finally:
        launcher.read_source = original_read
        launcher._KERNEL_CACHE.clear()
    return summary("lab3", results, skipped=len(skipped))


# ------------------------------------------------------------------------------------------ main
GRADERS = {"lab1": grade_lab1, "lab2": grade_lab2, "lab3": grade_lab3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Example: python notebooks/labs/grade.py lab1")
    ap.add_argument("lab", choices=sorted(LABS), help="which lab")
    ap.add_argument("file", nargs="?", help="your file (default: the lab's template in notebooks/labs/)")
    ap.add_argument("--solution", action="store_true", help="grade the reference solution in notebooks/labs/solutions/")
    ap.add_argument("--quick", action="store_true", help="only the harness's 'core' cases")
    ap.add_argument("--debug", action="store_true", help="show the grader's own traceback if it breaks")
    args = ap.parse_args(argv)
    name = LABS[args.lab]["template"]
    if args.solution and args.file:
        ap.error("give a FILE or --solution, not both")
    solution = LAB3_SOLUTION if args.lab == "lab3" else os.path.join(HERE, "solutions", name)
    path = solution if args.solution else (args.file or os.path.join(HERE, name))
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        print(f"no such file: {path}")
        return 2
    try:
        return GRADERS[args.lab](path, quick=args.quick)
    except NotDone as exc:
        not_done_message(args.lab, path, exc)
        return 1
    except KeyboardInterrupt:
        return 1
    except Exception as exc:  # a bug of the grader (or of an environment it did not expect)
        if args.debug:
            raise
        print(f"\nGRADER ERROR: {type(exc).__name__}: {exc}")
        print("This is the grader failing, not necessarily your code. Run again with --debug for the details.")
        return 1


if __name__ == "__main__":
    sys.exit(main())
