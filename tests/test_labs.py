"""The graded labs (notebooks/labs/): every solution scores full marks on what can be graded here,
every unfilled template scores 0 with a helpful message and no traceback, the cheats of issue 10 score 0
on the cases they fake and never hang the grader, a typical mistake gets its hint (in English and in
Chinese), results.json has Gradescope's fields, and the code a template gives is the grader's own copy.

The graders run as subprocesses (``python notebooks/labs/grade.py LAB``), exactly as a student runs them,
so that lab 2's TRITON_INTERPRET=1 does not leak into the other tests of this process. On a CUDA GPU the
same tests also grade the GPU parts (lab 2's speed, lab 3's real kernel, lab 5's mma tile).
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABS = os.path.join(ROOT, "notebooks", "labs")
TOOLS = os.path.join(ROOT, "tools")
GRADE = os.path.join(LABS, "grade.py")
FILES = {"lab1": "lab1_online_softmax.py", "lab2": "lab2_triton_inner_loop.py", "lab3": "lab3_cuda_tiled.cu",
         "lab4": "lab4_backward.py", "lab5": "lab5_tensor_cores.py"}
TILED = os.path.join(ROOT, "flash_attention_cuda", "kernels", "tiled.cu")
STUDENT_RELEASE = not os.path.isdir(os.path.join(LABS, "solutions"))
needs_solutions = pytest.mark.skipif(STUDENT_RELEASE, reason="student release: no solutions/ folder")


def _gpu():
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


GPU = _gpu()
try:
    import gradescope_utils  # noqa: F401  (results.json)

    HAVE_GRADESCOPE = True
except ImportError:
    HAVE_GRADESCOPE = False


def _skip_without(lab):
    if lab == "lab2":
        pytest.importorskip("triton", reason="lab 2 needs triton")
    if lab in ("lab3", "lab5") and not os.path.isfile(os.path.join(LABS, "cuda_labs.py")):
        pytest.skip("notebooks/labs/cuda_labs.py is not here")
    if lab == "lab3" and not GPU:
        sys.path.insert(0, LABS)
        try:
            import cuda_labs
        finally:
            sys.path.remove(LABS)
        reason = cuda_labs.lab3_cpu_unavailable_reason()
        if reason:
            pytest.skip(f"lab 3 needs a GPU or its CPU emulation: {reason}")


def grade(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # lab 2: the grader uses the interpreter on a CPU (conftest sets TRITON_INTERPRET=1 there, inherited here)
    # and the real compiler on a CUDA GPU: there the speed is graded too
    if GPU and args and args[0] == "lab2":
        env.pop("TRITON_INTERPRET", None)
    p = subprocess.run([sys.executable, GRADE, *args], capture_output=True, text=True, timeout=timeout, env=env,
                       cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def _score(out):
    line = [ln for ln in out.splitlines() if ln.startswith("Score: ")][-1]
    got, total = line.split()[1].split("/")
    return float(got), float(total)


# ------------------------------------------------------------------------------------------ solutions, templates
def _slow_unless(fast):
    return [lab if lab in fast else pytest.param(lab, marks=pytest.mark.slow) for lab in sorted(FILES)]


@needs_solutions
@pytest.mark.parametrize("lab", _slow_unless({"lab1"}))
def test_solution_scores_full_marks(lab, tmp_path):
    _skip_without(lab)
    res = tmp_path / "results.json"
    json_args = ["--json", str(res)] if HAVE_GRADESCOPE else []
    rc, out, err = grade(lab, "--solution", "--quick", *json_args)
    assert rc == 0, f"the solution of {lab} fails its grader:\n{out}\n{err}"
    assert "Traceback" not in out + err
    assert "All graded cases pass" in out, out
    if HAVE_GRADESCOPE:
        data = json.loads(res.read_text())
        graded = [t for t in data["tests"] if "not graded here" not in t.get("output", "")]
        assert graded and all(t["score"] == t["max_score"] for t in graded), data["tests"]
    if GPU:  # every part is graded on a GPU: lab 2's speed, lab 5's tile
        assert "not graded here" not in out, out
    elif lab == "lab2":
        assert "performance" in out and "not graded here" in out and "not counted as a pass" in out, out


@pytest.mark.parametrize("lab", _slow_unless({"lab1"}))  # tests/test_release.py grades lab 3's template too
def test_template_scores_zero_with_a_helpful_message(lab):
    _skip_without(lab)
    rc, out, err = grade(lab, "--quick")
    assert rc == 1, f"the unfilled template of {lab} should fail (exit 1), got {rc}:\n{out}\n{err}"
    assert "Traceback" not in out + err, f"a traceback instead of a message:\n{out}\n{err}"
    assert "NOT DONE" in out and f"TODO({lab})" in out and "not written yet" in out, out
    assert _score(out)[0] == 0, out


# ------------------------------------------------------------------------------------------ cheats
def _lab1_solution():
    path = os.path.join(LABS, "solutions", FILES["lab1"])
    with open(path) as f:
        return f.read()


FINALIZE_FIRST_LINE = "    seen = l > 0\n"
CHEATS = {  # name: (how to make it from the solution (None: from the template), what the grader must say)
    "library_call_for_the_loop": (None, "NOT DONE"),
    "exit_at_import": (lambda s: s + "\nexit()\n", "exit()"),
    "sys_exit_in_a_todo_function": (lambda s: s.replace(FINALIZE_FIRST_LINE, "    import sys\n    sys.exit(0)\n"),
                                    "sys.exit(0)"),
    "os_exit_in_a_todo_function": (lambda s: s.replace(FINALIZE_FIRST_LINE, "    import os\n    os._exit(0)\n"),
                                   "os._exit()"),
    "os_exit_at_import": (lambda s: s + "\nimport os\nos._exit(0)\n", "exit code 0"),
    "endless_loop_in_a_todo_function": (lambda s: s.replace(FINALIZE_FIRST_LINE, "    while True:\n        pass\n"),
                                        "endless loop"),
}
FAST_CHEATS = {"library_call_for_the_loop", "os_exit_in_a_todo_function"}  # the endless loop waits for its timeout: slow set


@needs_solutions
@pytest.mark.parametrize("cheat", [c if c in FAST_CHEATS else pytest.param(c, marks=pytest.mark.slow) for c in CHEATS])
def test_lab1_cheats_score_zero_and_the_grader_finishes(cheat, tmp_path):
    """Issue 10's cheats: the loop replaced by a library call with the TODOs left open, exit() in its forms
    (at import and inside a TODO function), an endless loop. Each scores 0 with a message, in bounded time."""
    make, expect = CHEATS[cheat]
    if make is None:
        with open(os.path.join(LABS, FILES["lab1"])) as f:
            tpl = f.read()
        a = tpl.index('    fn = "flash_attn_lab1"')
        src = tpl[:a] + ("    from flash_attention_py import flash_attn_numpy\n"
                         "    return flash_attn_numpy(q, k, v, causal=causal, softmax_scale=softmax_scale, "
                         "return_lse=return_lse)\n")
    else:
        src = make(_lab1_solution())
        assert src != _lab1_solution()
    student = tmp_path / "lab1_cheat.py"
    student.write_text(src)
    rc, out, err = grade("lab1", str(student), "--quick", "--timeout", "2", timeout=240)
    assert rc == 1 and "Traceback" not in out + err, out + err
    assert _score(out)[0] == 0, out
    assert expect in out, out
    assert "PASS " not in out, out


@pytest.mark.slow
def test_lab2_file_with_a_library_wrapper_but_no_loop_body_scores_zero(tmp_path):
    """Lab 2: only the loop body is taken from the student's file; replacing the wrapper gains nothing."""
    pytest.importorskip("triton", reason="lab 2 needs triton")
    with open(os.path.join(LABS, FILES["lab2"])) as f:
        tpl = f.read()
    a = tpl.index('    fn = "flash_attn_lab2"')
    student = tmp_path / "lab2_cheat.py"
    student.write_text(tpl[:a] + "    from flash_attention_py import attention_reference\n"
                       "    return attention_reference(q, k, v, causal=causal, return_lse=return_lse)\n")
    rc, out, err = grade("lab2", str(student), "--quick")
    assert rc == 1 and "Traceback" not in out + err and "NOT DONE" in out, out + err
    assert _score(out)[0] == 0, out


@pytest.mark.slow
def test_lab3_empty_bodies_score_zero(tmp_path):
    """Lab 3 with the four static_asserts deleted and the bodies left empty compiles, and scores 0."""
    _skip_without("lab3")
    with open(os.path.join(LABS, FILES["lab3"])) as f:
        src = "".join(ln for ln in f if "static_assert(D_PAD < 0" not in ln)
    student = tmp_path / "lab3_empty.cu"
    student.write_text(src)
    rc, out, err = grade("lab3", str(student), "--quick", timeout=600)
    assert rc == 1 and "Traceback" not in out + err, out + err
    assert _score(out)[0] == 0 and "PASS " not in out, out


# ------------------------------------------------------------------------------------------ hints, json, languages
@needs_solutions
def test_lab1_missing_rescale_gets_its_hint_partial_points_and_results_json(tmp_path):
    """A classic mistake, l_new = l_old + rowsum(P_ij): the single-block cases pass, the hint names the
    rescale, points are partial, and results.json carries Gradescope's fields."""
    pytest.importorskip("gradescope_utils", reason="--json writes results.json through gradescope-utils")
    src = _lab1_solution()
    wrong = "l_new = alpha * l_old + P_ij.sum(axis=-1)"
    assert wrong in src
    student = tmp_path / "lab1_student.py"
    student.write_text(src.replace(wrong, "l_new = l_old + P_ij.sum(axis=-1)"))
    res = tmp_path / "out" / "results.json"
    rc, out, err = grade("lab1", str(student), "--quick", "--json", str(res), "--hidden-seed", "7")
    assert rc == 1 and "Traceback" not in out + err
    assert "FAIL" in out and "PASS" in out  # the single-block cases still pass
    assert "Hint for the first failing case" in out
    assert "did you rescale l" in out and "l was not rescaled" in out, out
    assert "seed from --hidden-seed" in out, out
    got, total = _score(out)
    assert 0 < got < total, out
    data = json.loads(res.read_text())
    assert {"score", "tests"} <= set(data) and abs(data["score"] - got) < 1e-6
    assert len(data["tests"]) == 3
    for t in data["tests"]:
        assert {"name", "score", "max_score", "visibility", "output"} <= set(t), t
        assert t["visibility"] in ("visible", "hidden", "after_due_date", "after_published")
        assert 0 <= t["score"] <= t["max_score"]
    assert [t["visibility"] for t in data["tests"]].count("after_due_date") == 1  # the hidden cases
    assert sum(t["max_score"] for t in data["tests"]) == total


@needs_solutions
def test_hints_in_chinese(tmp_path):
    src = _lab1_solution().replace("l_new = alpha * l_old + P_ij.sum(axis=-1)", "l_new = l_old + P_ij.sum(axis=-1)")
    student = tmp_path / "lab1_student.py"
    student.write_text(src)
    rc, out, err = grade("lab1", str(student), "--quick", "--lang", "zh")
    assert rc == 1 and "Traceback" not in out + err
    assert "第一个失败用例" in out and "重新缩放" in out and "得分" in out, out


@pytest.mark.slow
@needs_solutions
def test_lab1_exception_is_explained_without_traceback(tmp_path):
    src = _lab1_solution()
    student = tmp_path / "lab1_student.py"
    student.write_text(src.replace("P_ij = np.exp(S_ij - m_safe[..., None])", "P_ij = np.exp(S_ij - m_safe)"))
    rc, out, err = grade("lab1", str(student), "--quick")
    assert rc == 1 and "Traceback" not in out + err
    assert "ERROR" in out and "ValueError" in out and "in merge_block" in out, out


@pytest.mark.slow
@needs_solutions
def test_lab4_wrong_dv_gets_its_hint(tmp_path):
    with open(os.path.join(LABS, "solutions", FILES["lab4"])) as f:
        src = f.read()
    right = "dV_j = dV_j + np.swapaxes(P_ij, -1, -2) @ dO_i"
    assert right in src
    student = tmp_path / "lab4_student.py"
    student.write_text(src.replace(right, "dV_j = dV_j + np.swapaxes(P_ij, -1, -2) @ dO_i * scale"))
    rc, out, err = grade("lab4", str(student), "--quick")
    assert rc == 1 and "Traceback" not in out + err
    assert "dV is wrong" in out and "FAIL" in out, out


# ------------------------------------------------------------------------------------------ given code
def _between(text, start, end=None):
    a = text.index(start)
    return text[a:] if end is None else text[a:text.index(end, a)]


GIVEN_PARTS = {
    "lab1": [("def flash_attn_lab1", None)],
    "lab2": [("@triton.jit", None)],
    "lab4": [("def flash_attn_bwd_lab4", None)],
}


@pytest.mark.parametrize("lab", sorted(GIVEN_PARTS))
def test_the_graders_given_code_is_the_templates(lab):
    """The grader runs its own copy of the given code (grading/given_labN.py): it must be the template's."""
    with open(os.path.join(LABS, FILES[lab])) as f:
        tpl = f.read()
    with open(os.path.join(LABS, "grading", f"given_{lab}.py")) as f:
        given = f.read()
    for start, end in GIVEN_PARTS[lab]:
        assert _between(tpl, start, end) == _between(given, start, end), f"{lab}: grading/given_{lab}.py differs"


@needs_solutions
@pytest.mark.parametrize("lab", sorted(GIVEN_PARTS))
def test_given_code_is_the_same_in_template_and_solution(lab):
    """Only the TODO parts differ: the loop/kernel/wrapper the student is given is the solution's."""
    with open(os.path.join(LABS, FILES[lab])) as f:
        tpl = f.read()
    with open(os.path.join(LABS, "solutions", FILES[lab])) as f:
        sol = f.read()
    if lab == "lab2":
        marker = "        # ---------------------------------------------------------------- "
        parts = [("@triton.jit", marker + "the loop body"), (marker + "end of the loop body", None)]
    else:
        parts = GIVEN_PARTS[lab]
    for start, end in parts:
        assert _between(tpl, start, end) == _between(sol, start, end), f"{lab}: template and solution differ after {start!r}"


@pytest.mark.skipif(not os.path.isfile(os.path.join(TOOLS, "make_lab3.py")), reason="tools/make_lab3.py is not here")
def test_lab3_template_is_generated_from_the_repository_kernel():
    """Lab 3's solution is flash_attention_cuda/kernels/tiled.cu; its template must be that file minus the
    four bodies. After changing tiled.cu, run: python tools/make_lab3.py"""
    with open(TILED) as f:
        if "is not written yet" in f.read():
            pytest.skip("student release: tiled.cu is lab 3's template")
    sys.path.insert(0, TOOLS)
    try:
        import make_lab3
    finally:
        sys.path.remove(TOOLS)
    with open(make_lab3.SOLUTION) as f:
        expected = make_lab3.make_template(f.read())
    with open(os.path.join(LABS, FILES["lab3"])) as f:
        assert f.read() == expected, "notebooks/labs/lab3_cuda_tiled.cu is stale: run python tools/make_lab3.py"
    for name in make_lab3.FUNCTIONS:
        assert f"{name} is not written yet" in expected


def test_usage_errors_exit_2():
    rc, out, err = grade("lab1", "/nonexistent/lab1.py")
    assert rc == 2 and "no such file" in out and "Traceback" not in out + err
