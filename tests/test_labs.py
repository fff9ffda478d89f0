"""The graded labs (notebooks/labs/): each solution passes its grader, each unfilled template fails it
with a helpful message and no traceback, a typical mistake gets the matching hint, and the parts of a
template the student does not write are the same as in its solution (lab 3's solution is the
repository's own flash_attention_cuda/kernels/tiled.cu; on a CPU its grader only compiles it).

The graders run as subprocesses (``python notebooks/labs/grade.py LAB``), exactly as a student runs
them, so that lab 2's TRITON_INTERPRET=1 does not leak into the other tests of this process.
"""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABS = os.path.join(ROOT, "notebooks", "labs")
GRADE = os.path.join(LABS, "grade.py")
FILES = {"lab1": "lab1_online_softmax.py", "lab2": "lab2_triton_inner_loop.py", "lab3": "lab3_cuda_tiled.cu"}


def _nvcc():
    cands = [shutil.which("nvcc")] + [os.path.join(os.environ[e], "bin", "nvcc") for e in ("CUDA_HOME", "CUDA_PATH")
                                      if os.environ.get(e)] + ["/usr/local/cuda/bin/nvcc"]
    return next((c for c in cands if c and os.path.isfile(c)), None)


def _skip_without(lab):
    if lab == "lab2":
        pytest.importorskip("triton", reason="lab 2 needs triton")
    if lab == "lab3" and _nvcc() is None:
        pytest.skip("lab 3's grader compiles with nvcc, and there is no nvcc here")


def grade(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # lab 2: the grader uses the interpreter on a CPU (conftest sets TRITON_INTERPRET=1 there, inherited here)
    # and the real compiler on a CUDA GPU
    p = subprocess.run([sys.executable, GRADE, *args], capture_output=True, text=True, timeout=timeout, env=env,
                       cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("lab", sorted(FILES))
def test_solution_passes(lab):
    _skip_without(lab)
    args = [lab, "--solution"] + (["--quick"] if lab == "lab3" else [])
    rc, out, err = grade(*args)
    assert rc == 0, f"the solution of {lab} fails its grader:\n{out}\n{err}"
    assert "Traceback" not in out + err
    assert "FAIL" not in out and "ERROR" not in out
    if lab == "lab3":
        assert "COMPILE OK" in out
        assert "All cases pass" in out or "numerical check needs a CUDA GPU" in out, out
    else:
        assert "All cases pass" in out, out
        n_pass = out.count("\nPASS ")
        assert n_pass >= 12, f"only {n_pass} cases ran:\n{out}"


@pytest.mark.parametrize("lab", sorted(FILES))
def test_template_fails_with_a_helpful_message(lab):
    _skip_without(lab)
    rc, out, err = grade(lab)
    assert rc == 1, f"the unfilled template of {lab} should fail (exit 1), got {rc}:\n{out}\n{err}"
    assert "Traceback" not in out + err, f"a traceback instead of a message:\n{out}\n{err}"
    assert "NOT DONE" in out and f"TODO({lab})" in out, out
    assert "not written yet" in out, out


def test_lab1_hint_for_a_missing_rescale(tmp_path):
    """A classic mistake, l_new = l_old + rowsum(P_ij), gets the hint about rescaling l."""
    src = open(os.path.join(LABS, "solutions", FILES["lab1"])).read()
    wrong = "l_new = alpha * l_old + P_ij.sum(axis=-1)"
    assert wrong in src
    student = tmp_path / "lab1_student.py"
    student.write_text(src.replace(wrong, "l_new = l_old + P_ij.sum(axis=-1)"))
    rc, out, err = grade("lab1", str(student), "--quick")
    assert rc == 1 and "Traceback" not in out + err
    assert "FAIL" in out and "PASS" in out  # the single-block cases still pass
    assert "Hint for the first failing case" in out
    assert "did you rescale l" in out and "l was not rescaled" in out, out


def test_lab1_exception_is_explained_without_traceback(tmp_path):
    src = open(os.path.join(LABS, "solutions", FILES["lab1"])).read()
    wrong = "P_ij = np.exp(S_ij - m_safe[..., None])"
    student = tmp_path / "lab1_student.py"
    student.write_text(src.replace(wrong, "P_ij = np.exp(S_ij - m_safe)"))
    rc, out, err = grade("lab1", str(student), "--quick")
    assert rc == 1 and "Traceback" not in out + err
    assert "ERROR" in out and "ValueError" in out and "in merge_block" in out, out


def _between(text, start, end=None):
    a = text.index(start)
    return text[a:] if end is None else text[a:text.index(end, a)]


@pytest.mark.parametrize("lab", ["lab1", "lab2"])
def test_given_code_is_the_same_in_template_and_solution(lab):
    """Only the TODO parts differ: the loop/kernel/wrapper the student is given is the solution's."""
    tpl = open(os.path.join(LABS, FILES[lab])).read()
    sol = open(os.path.join(LABS, "solutions", FILES[lab])).read()
    if lab == "lab1":
        parts = [("def flash_attn_lab1", None)]
    else:
        parts = [("@triton.jit", "        # ---------------------------------------------------------------- the loop body"),
                 ("        # ---------------------------------------------------------------- end of the loop body", None)]
    for start, end in parts:
        assert _between(tpl, start, end) == _between(sol, start, end), f"{lab}: template and solution differ after {start!r}"


def test_lab3_template_is_generated_from_the_repository_kernel():
    """Lab 3's solution is flash_attention_cuda/kernels/tiled.cu; its template must be that file minus the
    four bodies. After changing tiled.cu, run: python notebooks/labs/make_lab3.py"""
    sys.path.insert(0, LABS)
    try:
        import make_lab3
    finally:
        sys.path.remove(LABS)
    with open(make_lab3.SOLUTION) as f:
        expected = make_lab3.make_template(f.read())
    with open(os.path.join(LABS, FILES["lab3"])) as f:
        assert f.read() == expected, "notebooks/labs/lab3_cuda_tiled.cu is stale: run python notebooks/labs/make_lab3.py"
    for name in make_lab3.FUNCTIONS:
        assert f"{name} is not written yet" in expected
