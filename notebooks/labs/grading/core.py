"""The lab grader: cases, points, the child process that runs the student's code, the report and
Gradescope's results.json. Entry point: ``python notebooks/labs/grade.py LAB [FILE ...]``.

How a lab is graded
  * Only the student's TODO parts are used, inside the grader's own copy of the given code
    (grading/given_lab*.py; lab 3 and lab 5 through notebooks/labs/cuda_labs.py). A file that replaces
    the given loop with a library call gains nothing.
  * Visible cases are those of flash_attention_py/testing.py; hidden cases are drawn from a seed that a student
    copy of the repository does not contain (notebooks/labs/instructor/hidden_seed.txt, or
    --hidden-seed N): odd sizes, Nq != Nk both ways, causal rows that see no key, several dtypes.
  * The student's code runs in a child process (grading/child.py) with a timeout per case: exit(),
    sys.exit(), os._exit(), a hang, a segfault, a CUDA error or a compile failure cost the cases they
    touch, never the grader. The comparison with the float64 reference happens here, in the parent.
  * Points per group of cases (score = points x passed / cases); --json PATH writes Gradescope's
    results.json through gradescope-utils' JSONTestRunner (one test per group).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
LABS_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(LABS_DIR))
CHILD = os.path.join(HERE, "child.py")
for _p in (HERE, LABS_DIR, ROOT):  # ROOT: the packages (flash_attention_py, ...) when run as a script
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402

from i18n import LANGS, T, set_lang  # noqa: E402

KERNEL_DIR = os.path.join(ROOT, "flash_attention_cuda", "kernels")
LAB3_SOLUTION = os.path.join(KERNEL_DIR, "tiled.cu")
HIDDEN_SEED_FILE = os.path.join(LABS_DIR, "instructor", "hidden_seed.txt")

# Lab 2's performance part: fp16 tl.dot path at a realistic size, on a GPU.
# The target: the solution measured 347 TFLOP/s on an H100 SXM with these launch settings (median of
# triton.testing.do_bench); full points from 200 TFLOP/s, linear below. On another GPU, scale it.
LAB2_PERF = dict(shape=(4, 16, 2048, 64), block_m=128, block_n=64, num_warps=4, num_stages=3,
                 target_tflops=200.0)


LABS = {
    "lab1": dict(template="lab1_online_softmax.py", block_n=16, timeout=30,
                 title=("lab 1 - online softmax in NumPy", "实验 1 - NumPy 中的在线 softmax"),
                 points=dict(visible_full=3, visible_causal=3, hidden=4)),
    "lab2": dict(template="lab2_triton_inner_loop.py", block_n=32, timeout=120,
                 title=("lab 2 - the inner loop of a Triton kernel", "实验 2 - Triton kernel 的内层循环"),
                 points=dict(visible_full=3, visible_causal=3, hidden=4, perf=5)),
    "lab3": dict(template="lab3_cuda_tiled.cu", block_n=32, timeout=180,
                 title=("lab 3 - the four device functions of a tiled CUDA kernel", "实验 3 - 分块 CUDA kernel 的四个 device 函数"),
                 points=dict(visible_full=4, visible_causal=4, hidden=4)),
    "lab4": dict(template="lab4_backward.py", block_n=32, timeout=60,
                 title=("lab 4 - the inner step of the backward in NumPy", "实验 4 - NumPy 中反向传播的内层一步"),
                 points=dict(visible_full=3, visible_causal=3, hidden=4)),
    "lab5": dict(template=None, block_n=None, timeout=180,
                 title=("lab 5 - one tensor-core tile (mma.sync.m16n8k16)", "实验 5 - 一个 tensor core tile（mma.sync.m16n8k16）"),
                 points=dict(layout=6, tile=4)),
}
GROUP_TITLES = {
    "visible_full": ("visible cases, full attention", "公开用例，非 causal"),
    "visible_causal": ("visible cases, causal", "公开用例，causal"),
    "hidden": ("hidden cases (randomized)", "隐藏用例（随机）"),
    "perf": ("performance (GPU, fp16)", "性能（GPU，fp16）"),
    "layout": ("fragment layout model (NumPy)", "fragment 布局模型（NumPy）"),
    "tile": ("one mma tile on the GPU", "GPU 上的一个 mma tile"),
}
VISIBILITY = {"hidden": "after_due_date"}  # Gradescope: the rest is "visible"


def title(lab):
    return T(*LABS[lab]["title"])


def group_title(g):
    return T(*GROUP_TITLES[g])


# ------------------------------------------------------------------------------------------ files
def lab5_templates():
    py = sorted(p for p in glob.glob(os.path.join(LABS_DIR, "lab5_*.py")))
    cu = sorted(p for p in glob.glob(os.path.join(LABS_DIR, "lab5_*.cu")))
    return (py[0] if py else None), (cu[0] if cu else None)


def solution_paths(lab):
    if lab == "lab3":
        return [LAB3_SOLUTION]
    if lab == "lab5":
        return sorted(glob.glob(os.path.join(LABS_DIR, "solutions", "lab5_*.py"))
                      + glob.glob(os.path.join(LABS_DIR, "solutions", "lab5_*.cu")))
    return [os.path.join(LABS_DIR, "solutions", LABS[lab]["template"])]


def resolve_files(lab, files, use_solution):
    """(student, student_cu) absolute paths, or raise SystemExit(2) with a message."""
    if use_solution:
        files = solution_paths(lab)
        if lab == "lab3" and _is_lab3_template(LAB3_SOLUTION):
            print(T("This copy of the repository is a student release: flash_attention_cuda/kernels/tiled.cu is "
                    "lab 3's template, and there is no solution to grade.",
                    "这是发给学生的版本：flash_attention_cuda/kernels/tiled.cu 是实验 3 的模板，没有可评分的参考答案。"))
            raise SystemExit(2)
        if not all(os.path.isfile(f) for f in files) or not files:
            print(T("There is no solution for {lab} in this copy of the repository (a student release has none).",
                    "这份仓库中没有 {lab} 的参考答案（发给学生的版本不含答案）。", lab=lab))
            raise SystemExit(2)
    if lab == "lab5":
        py, cu = lab5_templates()
        for f in files or []:
            if f.endswith(".cu"):
                cu = f
            else:
                py = f
        if py is None:
            print(T("lab 5's files (notebooks/labs/lab5_*.py and lab5_*.cu) are not in this copy of the repository.",
                    "这份仓库中没有实验 5 的文件（notebooks/labs/lab5_*.py 和 lab5_*.cu）。"))
            raise SystemExit(2)
        paths = [os.path.abspath(py), os.path.abspath(cu) if cu else None]
    else:
        if files and len(files) > 1:
            print(T("{lab} takes one FILE, got {n}", "{lab} 只接受一个 FILE，收到 {n} 个", lab=lab, n=len(files)))
            raise SystemExit(2)
        paths = [os.path.abspath(files[0] if files else os.path.join(LABS_DIR, LABS[lab]["template"])), None]
    for p in paths:
        if p is not None and not os.path.isfile(p):
            print(T("no such file: {p}", "文件不存在：{p}", p=p))
            raise SystemExit(2)
    return paths


def _is_lab3_template(path):
    try:
        with open(path) as f:
            return "is not written yet" in f.read()
    except OSError:
        return False


# ------------------------------------------------------------------------------------------ cases
@dataclass
class Task:
    id: str
    group: str
    kind: str  # fwd, bwd, perf, layout, tile, unit
    case: Optional[dict] = None
    causal: bool = False
    dtype: str = "float32"
    device: str = "cpu"
    extra: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)  # name -> NumPy array (sent to the child)

    @property
    def name(self) -> str:
        if self.case is None:
            return self.extra.get("name", self.id)
        import flash_attention_py.testing as H

        dt = "" if self.dtype == "float32" else f" {self.dtype}"
        return f"{H.case_id(self.case)} {'causal' if self.causal else 'full'}{dt}"

    def spec(self) -> dict:
        d = dict(id=self.id, kind=self.kind, causal=self.causal, dtype=self.dtype, device=self.device,
                 layout=(self.case or {}).get("layout", "bhnd"))
        d.update({k: v for k, v in self.extra.items() if k != "name"})
        return d


def read_hidden_seed(arg) -> tuple:
    """(seed, where it came from): --hidden-seed, the instructor file, or a fresh random one."""
    if arg is not None:
        return int(arg), "--hidden-seed"
    if os.path.isfile(HIDDEN_SEED_FILE):
        with open(HIDDEN_SEED_FILE) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    return int(line), "instructor/hidden_seed.txt"
    return int.from_bytes(os.urandom(4), "little"), None


def hidden_cases(lab, seed, *, max_n, dims, dtypes, n_shapes=4):
    """Randomized shapes from ``seed``: odd N; Nq > Nk (causal rows that see no key), Nq < Nk, Nq = Nk.
    Returns a list of (case, causal, dtype)."""
    rng = np.random.default_rng([seed, int(lab[-1])])
    odd = lambda lo, hi: int(rng.integers(lo // 2, hi // 2)) * 2 + 1  # noqa: E731  odd in [lo, hi)
    out = []
    for s in range(n_shapes):
        kind = s % 3
        if kind == 0:  # Nq > Nk: with the causal mask the first Nq - Nk rows see no key
            Nk = odd(3, max_n // 2)
            Nq = odd(Nk + 2, max_n)
        elif kind == 1:  # Nq < Nk
            Nq = odd(1, max_n // 2)
            Nk = odd(Nq + 2, max_n)
        else:
            Nq = Nk = odd(3, max_n)
        case = dict(B=int(rng.integers(1, 3)), H=int(rng.integers(1, 4)), Nq=Nq, Nk=Nk,
                    D=int(rng.choice(dims)), layout="bnhd" if rng.random() < 0.25 else "bhnd", core=False)
        dtype = dtypes[s % len(dtypes)]
        for causal in (False, True):
            out.append((case, causal, dtype))
    return out


def make_case_inputs(case, dtype, *, need_grad_inputs=False):
    """Fresh random q, k, v (and o, lse, do for the backward) as NumPy arrays holding values exactly
    representable in ``dtype`` (bfloat16 values are carried in float32)."""
    from flash_attention_py import make_inputs

    dt = "float32" if dtype in ("float16", "bfloat16") else dtype
    x = make_inputs(case["B"], case["H"], case["Nq"], case["Nk"], case["D"], dtype=dt, kind="numpy",
                    layout=case.get("layout", "bhnd"))
    q, k, v = (np.ascontiguousarray(x[n]) for n in ("q", "k", "v"))
    if dtype in ("float16", "bfloat16"):
        import torch

        tdt = getattr(torch, dtype)
        q, k, v = (torch.from_numpy(a).to(tdt).float().numpy() for a in (q, k, v))
    out = dict(q=q, k=k, v=v)
    if need_grad_inputs:
        rng = np.random.default_rng()
        do = rng.standard_normal(q.shape).astype(q.dtype)
        out["do"] = do
    return out


def build_tasks(lab, *, quick, hidden_seed, device, perf):
    import flash_attention_py.testing as H

    def pick_hidden(*a, n_shapes=4, **kw):  # --quick: half the hidden shapes
        return hidden_cases(*a, n_shapes=max(2, n_shapes // 2) if quick else n_shapes, **kw)

    cfg = LABS[lab]
    tasks = []
    n = [0]

    def add(group, kind, case=None, causal=False, dtype="float32", dev=device, **extra):
        t = Task(id=f"t{n[0]:03d}", group=group, kind=kind, case=case, causal=causal, dtype=dtype, device=dev,
                 extra=extra)
        n[0] += 1
        tasks.append(t)
        return t

    if lab in ("lab1", "lab2", "lab3", "lab4"):
        if lab == "lab1":
            visible = [c for c in H.CASES if c["core"] or not quick]
            hid = pick_hidden(lab, hidden_seed, max_n=200, dims=(8, 16, 24, 40, 64), dtypes=("float32", "float64"))
        elif lab == "lab2":
            big = device != "cpu"
            visible = [c for c in H.CASES if (big or max(c["Nq"], c["Nk"]) <= 128) and (c["core"] or not quick)]
            hid = pick_hidden(lab, hidden_seed, max_n=300 if big else 80, dims=(16, 32, 40, 64),
                               dtypes=("float32", "float16", "bfloat16") if big else ("float32", "float16"),
                               n_shapes=6 if big else 3)
        elif lab == "lab3":
            if device == "cpu":
                visible = [c for c in H.CASES if max(c["Nq"], c["Nk"]) <= 100 and c["D"] <= 128 and (c["core"] or not quick)]
                hid = pick_hidden(lab, hidden_seed, max_n=72, dims=(16, 32, 40, 64), dtypes=("float32",), n_shapes=3)
            else:
                visible = [c for c in H.CASES if c["D"] <= 128 and (c["core"] or not quick)]
                hid = pick_hidden(lab, hidden_seed, max_n=400, dims=(16, 32, 40, 64, 128), dtypes=("float32",))
        else:
            visible = [c for c in H.CASES if c["core"] or not quick]
            hid = pick_hidden(lab, hidden_seed, max_n=160, dims=(8, 16, 24, 40, 64), dtypes=("float32", "float64"))
        kind = "bwd" if lab == "lab4" else "fwd"
        ex = dict(block_n=cfg["block_n"])
        if lab == "lab4":
            ex["block_m"] = 16
        for causal in (False, True):
            for c in visible:
                add("visible_causal" if causal else "visible_full", kind, c, causal, **ex)
        for c, causal, dtype in hid:
            add("hidden", kind, c, causal, dtype, **ex)
        if lab == "lab2" and perf:
            B, Hh, N, D = LAB2_PERF["shape"]
            add("perf", "perf", None, False, "float16", "cuda", name=f"fp16 B{B}H{Hh}-N{N}-d{D} full",
                shape=LAB2_PERF["shape"], seed=int(np.random.default_rng().integers(1 << 30)),
                **{k: LAB2_PERF[k] for k in ("block_m", "block_n", "num_warps", "num_stages")})
        if lab in ("lab1", "lab4"):
            add("unit", "unit", name="unit checks")
    elif lab == "lab5":
        add("layout", "layout", name="layout checks", seed=int(hidden_seed))
        if perf:  # the GPU part
            rng = np.random.default_rng()
            for i in range(3):
                t = add("tile", "tile", name=f"tile {i + 1} (fp16, m16n8k16)", dev="cuda")
                t.inputs = dict(a=rng.standard_normal((16, 16)).astype(np.float16),
                                b=rng.standard_normal((8, 16)).astype(np.float16))
    for t in tasks:
        if t.case is not None:
            t.inputs = make_case_inputs(t.case, t.dtype, need_grad_inputs=(lab == "lab4"))
            if lab == "lab4":
                from flash_attention_py import attention_reference

                o, lse = attention_reference(t.inputs["q"], t.inputs["k"], t.inputs["v"], causal=t.causal, return_lse=True)
                t.inputs["o"] = np.asarray(o).astype(t.inputs["q"].dtype)
                t.inputs["lse"] = np.asarray(lse).astype(t.inputs["q"].dtype)
    return tasks


# ------------------------------------------------------------------------------------------ child runs
def _signal_name(rc):
    try:
        return signal.Signals(-rc).name
    except (ValueError, AttributeError):
        return f"signal {-rc}"


def _log_tail(path, n=6):
    try:
        with open(path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if ln.strip()]
        return lines[-n:]
    except OSError:
        return []


def run_in_child(lab, tasks, paths, *, timeout, lang, load_timeout=180, max_strikes=2):
    """Run the tasks in child processes. Returns (load_status or None, {task id: result dict}).

    A result dict has status 'ok' (with 'arrays'), 'todo', 'error', 'timeout', 'crash' or 'notrun',
    and a 'message'. A hang or a crash costs the task it happened in; the child is restarted for the
    rest, at most ``max_strikes`` times."""
    results, pending, strikes = {}, list(tasks), 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    while pending:
        tmp = tempfile.mkdtemp(prefix="lab_grade_")
        try:
            outdir = os.path.join(tmp, "out")
            os.mkdir(outdir)
            arrays = {f"{t.id}_{k}": v for t in pending for k, v in t.inputs.items()}
            np.savez(os.path.join(tmp, "inputs.npz"), **arrays)
            spec = dict(lab=lab, student=paths[0], student_cu=paths[1], lang=lang, outdir=outdir,
                        inputs=os.path.join(tmp, "inputs.npz"), tasks=[t.spec() for t in pending])
            with open(os.path.join(tmp, "spec.json"), "w") as f:
                json.dump(spec, f)
            log = os.path.join(tmp, "child.log")
            with open(log, "w") as logf:
                p = subprocess.Popen([sys.executable, CHILD, os.path.join(tmp, "spec.json")], stdout=logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
                                     start_new_session=True)
                idx, loaded, started, last, killed = 0, None, False, time.time(), False
                while True:
                    rc = p.poll()
                    if not started and os.path.exists(os.path.join(outdir, "_started.json")):
                        started, last = True, time.time()
                    if loaded is None and os.path.exists(os.path.join(outdir, "_loaded.json")):
                        with open(os.path.join(outdir, "_loaded.json")) as f:
                            loaded = json.load(f)
                        last = time.time()
                    while idx < len(pending) and os.path.exists(os.path.join(outdir, f"{pending[idx].id}.json")):
                        results[pending[idx].id] = _read_result(outdir, pending[idx].id)
                        idx += 1
                        last = time.time()
                    if rc is not None:
                        break
                    limit = timeout if started else load_timeout  # load_timeout: the child's own start
                    if time.time() - last > limit:
                        _kill(p)
                        killed = True
                        break
                    time.sleep(0.02)
            tail = _log_tail(log)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if loaded is None:  # the child never finished loading the student's code
            if killed:
                msg = T("loading your file took more than {s} s (an endless loop at import?)",
                        "加载你的文件超过了 {s} 秒（导入时死循环？）", s=timeout if started else load_timeout)
            elif rc is not None and rc < 0:
                msg = T("the process crashed ({sig}) while loading your file", "加载你的文件时进程崩溃（{sig}）", sig=_signal_name(rc))
            else:
                msg = T("the process ended (exit code {rc}) while loading your file: does it call exit(), "
                        "sys.exit() or os._exit() at import?",
                        "加载你的文件时进程结束了（退出码 {rc}）：你的文件在导入时调用了 exit()、sys.exit() 或 os._exit() 吗？",
                        rc=rc)
            return dict(status="notdone", message=msg + _tail_text(tail)), results
        if loaded.get("status") != "ok":
            return loaded, results
        if any(r["status"] == "todo" for r in results.values()):
            return None, results
        if idx >= len(pending):
            break
        cur = pending[idx]
        if killed:
            results[cur.id] = dict(status="timeout", message=T(
                "no result after {s} s: an endless loop? (the case was stopped)", "{s} 秒内没有结果：死循环？（该用例已被终止）",
                s=timeout))
        elif rc is not None and rc < 0:
            results[cur.id] = dict(status="crash", message=T("the process crashed ({sig}) in this case",
                                                             "该用例中进程崩溃（{sig}）", sig=_signal_name(rc)) + _tail_text(tail))
        else:
            results[cur.id] = dict(status="crash", message=T(
                "the process ended (exit code {rc}) during this case: does your code call os._exit() or exit()?",
                "该用例运行时进程结束了（退出码 {rc}）：你的代码调用了 os._exit() 或 exit() 吗？", rc=rc) + _tail_text(tail))
        strikes += 1
        pending = pending[idx + 1:]
        if strikes >= max_strikes:
            for t in pending:
                results[t.id] = dict(status="notrun", message=T(
                    "not run: your code hung or ended the process {n} times already", "未运行：你的代码已经 {n} 次卡死或结束进程",
                    n=strikes))
            break
    return None, results


def _tail_text(tail):
    tail = [ln for ln in tail if "Traceback" not in ln and not ln.startswith("  File ")]
    return ("\n      " + "\n      ".join(tail[-4:])) if tail else ""


def _kill(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()
    p.wait()


def _read_result(outdir, tid):
    with open(os.path.join(outdir, f"{tid}.json")) as f:
        res = json.load(f)
    npz = os.path.join(outdir, f"{tid}.npz")
    res["arrays"] = {}
    if os.path.exists(npz):
        with np.load(npz, allow_pickle=False) as z:
            res["arrays"] = {k: z[k] for k in z.files}
    return res


# ------------------------------------------------------------------------------------------ checking
@dataclass
class CaseResult:
    task: Task
    status: str = "PASS"  # PASS, FAIL, ERROR, SKIP
    errs: dict = field(default_factory=dict)  # quantity -> (max-abs, rel-norm)
    ok: dict = field(default_factory=dict)
    reasons: list = field(default_factory=list)
    error: Optional[str] = None
    out: Optional[dict] = None
    ref: Optional[dict] = None
    lines: list = field(default_factory=list)  # extra lines (unit checks, layout checks)
    score_fraction: Optional[float] = None  # perf: a fraction of the points

    @property
    def case(self):
        return self.task.case

    @property
    def causal(self):
        return self.task.causal

    @property
    def name(self):
        return self.task.name


def _torch(x, dtype, device):
    import torch

    return torch.from_numpy(np.ascontiguousarray(x)).to(getattr(torch, dtype)).to(device)


def check_forward(lab, t, res, naive_device):
    import flash_attention_py.testing as H
    from flash_attention_py import attention_reference

    r = CaseResult(t)
    q, k, v = (t.inputs[n] for n in ("q", "k", "v"))
    o_ref, lse_ref = attention_reference(q, k, v, causal=t.causal, return_lse=True)
    r.ref = dict(o=H.to_f64_numpy(o_ref), lse=H.to_f64_numpy(lse_ref))
    try:
        o, lse = res["arrays"]["o"], res["arrays"]["lse"]
        r.out = dict(o=np.asarray(o, dtype=np.float64), lse=np.asarray(lse, dtype=np.float64))
    except Exception:
        r.status, r.error = "ERROR", T("no outputs (O, lse) came back", "没有得到输出（O, lse）")
        return r
    shim = types.SimpleNamespace(name=lab, array="torch", tf32_on=())
    naive = H.naive_same_precision(shim, naive_device, *(_torch(x, t.dtype, naive_device) for x in (q, k, v)),
                                   causal=t.causal)
    for qty, out, ref, nv, floor in (("o", r.out["o"], o_ref, naive[0], H.FLOOR[t.dtype]),
                                     ("lse", r.out["lse"], lse_ref, naive[1], H.LSE_FLOOR[t.dtype])):
        r.ok[qty] = _check(r, qty, out, ref, nv, floor, lab, t)
    return r


def check_backward(lab, t, res):
    import flash_attention_py.testing as H
    from flash_attention_py import attention_reference_grads

    r = CaseResult(t)
    q, k, v, do = (t.inputs[n] for n in ("q", "k", "v", "do"))
    refs = attention_reference_grads(q, k, v, do, causal=t.causal)
    r.ref = dict(zip(("dq", "dk", "dv"), (H.to_f64_numpy(g) for g in refs)))
    try:
        r.out = {n: np.asarray(res["arrays"][n], dtype=np.float64) for n in ("dq", "dk", "dv")}
    except Exception:
        r.status, r.error = "ERROR", T("no gradients (dQ, dK, dV) came back", "没有得到梯度（dQ, dK, dV）")
        return r
    shim = types.SimpleNamespace(name=lab, array="torch", tf32_on=())
    naive = H.naive_same_precision(shim, "cpu", *(_torch(x, t.dtype, "cpu") for x in (q, k, v)), causal=t.causal,
                                   do=_torch(do, t.dtype, "cpu"))
    for qty, nv in zip(("dq", "dk", "dv"), naive):
        r.ok[qty] = _check(r, qty, r.out[qty], r.ref[qty], nv, H.FLOOR[t.dtype], lab, t)
    return r


def _check(r, qty, out, ref, naive, floor, lab, t):
    import flash_attention_py.testing as H

    label = {"o": "O", "lse": "lse", "dq": "dQ", "dk": "dK", "dv": "dV"}[qty]
    try:
        r.errs[qty] = max_abs, rel = H.errors(out, ref)
    except AssertionError as exc:
        r.status = "FAIL"
        r.reasons.append(f"{label}: {exc}")
        return False
    # the harness's policy (testing.check_close): max-abs <= 2 x naive error in the same dtype + floor.
    # The naive yardstick itself may give NaN where a row sees no key (some torch versions' backward): there it
    # is measured against the reference's own value, so only the rows it gets right set the scale.
    ref64, nv = H.to_f64_numpy(ref), H.to_f64_numpy(naive)
    nv = np.where(np.isnan(nv), ref64, nv)
    naive_abs, _ = H.errors(nv, ref64)
    bound = 2.0 * naive_abs + floor
    if max_abs <= bound:
        return True
    r.status = "FAIL"
    r.reasons.append(f"{label}: {lab} {qty}: max-abs error {max_abs:.3e} (rel-norm {rel:.3e}) exceeds 2 x naive {t.dtype} "
                     f"error {naive_abs:.3e} + floor {floor:.1e} = {bound:.3e}")
    return False


def check_perf(lab, t, res):
    import flash_attention_py.testing as H
    from flash_attention_py import attention_reference
    from flash_attention_py.common import attention_flops

    r = CaseResult(t)
    a = res["arrays"]
    o_ref, _ = attention_reference(a["q"], a["k"], a["v"], return_lse=True)
    shim = types.SimpleNamespace(name=lab, array="torch", tf32_on=())
    naive = H.naive_same_precision(shim, "cuda", *(_torch(a[n], "float16", "cuda") for n in ("q", "k", "v")), causal=False)
    if not _check(r, "o", a["o"], o_ref, naive[0], H.FLOOR["float16"], lab, t):
        r.score_fraction = 0.0
        r.error = T("the output at this size is wrong, so the speed does not count: {why}",
                    "这个规模下输出不对，速度不计分：{why}", why=r.reasons[-1])
        return r
    B, Hh, N, D = t.extra["shape"]
    ms = float(a["ms"])
    tflops = attention_flops(B, Hh, N, N, D) / (ms * 1e-3) / 1e12
    target = LAB2_PERF["target_tflops"]
    r.score_fraction = min(1.0, tflops / target)
    r.status = "PASS" if tflops >= target else "FAIL"
    r.lines.append(T("{ms:.3f} ms (triton.testing.do_bench, median) = {tf:.1f} TFLOP/s (4·B·H·N²·D / time, "
                     "attention_flops); target {tg:.0f} TFLOP/s: {pct:.0f}% of the points",
                     "{ms:.3f} ms（triton.testing.do_bench，中位数）= {tf:.1f} TFLOP/s（4·B·H·N²·D / 时间，"
                     "attention_flops）；目标 {tg:.0f} TFLOP/s：得 {pct:.0f}% 的分数",
                     ms=ms, tf=tflops, tg=target, pct=100 * r.score_fraction))
    if r.status == "FAIL":
        r.reasons.append(T("below the target: keep P_ij in V's dtype for tl.dot (p.to(v.dtype)), use tl.exp2 on the "
                           "scores already scaled by qk_scale, and no extra loads, stores or divisions in the loop",
                           "低于目标：tl.dot 的 P_ij 用 V 的 dtype（p.to(v.dtype)），对已乘 qk_scale 的分数用 tl.exp2，"
                           "循环里不要有多余的读写或除法"))
    return r


def check_tile(t, res):
    r = CaseResult(t)
    a, b = t.inputs["a"].astype(np.float64), t.inputs["b"].astype(np.float64)
    ref = a @ b.T
    s = np.asarray(res["arrays"].get("s"), dtype=np.float64)
    if s.shape != ref.shape:
        r.status, r.error = "FAIL", T("S has shape {g}, expected {w}", "S 的形状为 {g}，应为 {w}", g=s.shape, w=ref.shape)
        return r
    err = float(np.abs(s - ref).max())
    bound = 1e-2 * float(np.abs(ref).max()) + 1e-2
    r.errs["s"] = (err, float(np.linalg.norm(s - ref) / max(np.linalg.norm(ref), 1e-30)))
    if not err <= bound:
        r.status = "FAIL"
        bad = np.argwhere(np.abs(s - ref) > bound)[:4].tolist()
        r.reasons.append(T("S = A B^T: max-abs error {e:.3e} > {b:.3e}; wrong (row, col) e.g. {bad}: check which lane "
                           "and register hold them in your layout",
                           "S = A B^T：最大绝对误差 {e:.3e} > {b:.3e}；出错的 (行, 列) 例如 {bad}：检查你的布局中由哪个 lane 的哪个寄存器持有它们",
                           e=err, b=bound, bad=bad))
    return r


def evaluate(lab, tasks, results, naive_device):
    out = []
    for t in tasks:
        res = results.get(t.id)
        if res is None:
            continue
        if res["status"] != "ok":
            r = CaseResult(t, status="ERROR", error=res.get("message", res["status"]))
            if t.kind == "perf":
                r.score_fraction = 0.0
            out.append(r)
            continue
        if t.kind == "unit":
            out.append(CaseResult(t, status="INFO", lines=list(res.get("lines", []))))
        elif t.kind == "layout":
            for c in res.get("checks", []):
                rr = CaseResult(Task(id=t.id, group="layout", kind="layout", extra=dict(name=c["name"])),
                                status="PASS" if c["passed"] else "FAIL")
                if not c["passed"]:
                    rr.error = c["message"] or T("wrong", "不对")
                out.append(rr)
        elif t.kind == "tile":
            out.append(check_tile(t, res))
        elif t.kind == "perf":
            out.append(check_perf(lab, t, res))
        elif t.kind == "bwd":
            out.append(check_backward(lab, t, res))
        else:
            out.append(check_forward(lab, t, res, naive_device))
    return out


# ------------------------------------------------------------------------------------------ report
def case_line(r: CaseResult) -> str:
    def fmt(label, err):
        return f"{label} max-abs {err[0]:.1e} rel {err[1]:.1e}" if err else f"{label} {'-':>22}"

    if r.error and not r.errs:
        return f"{r.status:<5} {r.name:<40} {r.error.splitlines()[0]}" + "".join(
            f"\n      {ln}" for ln in r.error.splitlines()[1:])
    labels = {"o": "O", "lse": "lse", "dq": "dQ", "dk": "dK", "dv": "dV", "s": "S"}
    body = " | ".join(fmt(labels[q], e) for q, e in r.errs.items())
    line = f"{r.status:<5} {r.name:<40} {body}"
    for ln in r.lines:
        line += f"\n      {ln}"
    for reason in r.reasons:  # the numbers speak for themselves; say why only when there are none
        q = reason.split(":")[0]
        if q not in [labels[k] for k in r.errs] or r.task.kind == "perf":
            line += f"\n      {reason}"
    return line


@dataclass
class Group:
    key: str
    points: float
    results: list = field(default_factory=list)
    skipped: Optional[str] = None  # why it cannot be graded here
    lines: list = field(default_factory=list)

    @property
    def graded(self):
        return [r for r in self.results if r.status in ("PASS", "FAIL", "ERROR")]

    @property
    def score(self) -> float:
        if self.skipped or not self.graded:
            return 0.0
        fr = [r.score_fraction if r.score_fraction is not None else float(r.status == "PASS") for r in self.graded]
        return round(self.points * sum(fr) / len(fr), 2)

    @property
    def passed(self):
        return not self.skipped and bool(self.graded) and all(r.status == "PASS" for r in self.graded)


def fmt_pts(x):
    return f"{x:g}" if float(x).is_integer() else f"{x:.2f}"


def report(lab, groups, *, header, first_fail_hints, unit_lines, hidden_note):
    print(header)
    for g in groups:
        print(f"\n== {group_title(g.key)} ({T('{p} points', '{p} 分', p=fmt_pts(g.points))}) ==")
        if g.key == "hidden" and hidden_note:
            print(hidden_note)
        if g.skipped:
            print(T("SKIP  not graded here: {why}", "SKIP  此处不评分：{why}", why=g.skipped))
            g.lines.append(T("not graded here: {why}", "此处不评分：{why}", why=g.skipped))
            continue
        for r in g.results:
            line = case_line(r)
            print(line, flush=True)
            g.lines.append(line)
        n_pass = sum(r.status == "PASS" for r in g.graded)
        tail = T("{a}/{b} pass: {s}/{p} points", "{a}/{b} 通过：{s}/{p} 分", a=n_pass, b=len(g.graded),
                 s=fmt_pts(g.score), p=fmt_pts(g.points))
        print(f"   -> {tail}")
        g.lines.append(tail)
    if first_fail_hints:
        print()
        for ln in first_fail_hints:
            print(ln)
    for ln in unit_lines:
        print(f"  {ln}")


# ------------------------------------------------------------------------------------------ results.json
def write_results_json(path, lab, groups, *, summary_text, extra_output=""):
    """Gradescope's results.json through gradescope-utils: one unittest test per group of cases, its
    weight the group's points, its score the group's score, its output the group's case lines."""
    import io
    import unittest

    from gradescope_utils.autograder_utils.json_test_runner import JSONTestRunner

    class LabGroups(unittest.TestCase):
        pass

    for i, g in enumerate(groups):
        def test(self, g=g):
            print("\n".join(g.lines))
            if g.skipped or g.score < g.points:
                self.fail(T("{s}/{p} points", "{s}/{p} 分", s=fmt_pts(g.score), p=fmt_pts(g.points)))

        test.__doc__ = f"{lab}: {group_title(g.key)}"
        test.__weight__ = g.points
        test.__score__ = g.score
        test.__number__ = f"{lab[-1]}.{i + 1}"
        test.__visibility__ = VISIBILITY.get(g.key, "visible")
        setattr(LabGroups, f"test_{i:02d}_{g.key}", test)

    def post(data):
        data["score"] = round(sum(t.get("score", 0.0) for t in data["tests"]), 2)
        data["output"] = summary_text + (("\n\n" + extra_output) if extra_output else "")
        data.pop("leaderboard", None)

    suite = unittest.defaultTestLoader.loadTestsFromTestCase(LabGroups)
    buf = io.StringIO()
    JSONTestRunner(stream=buf, visibility="visible", post_processor=post, failure_prefix="").run(suite)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(buf.getvalue())


def zero_groups(lab, message, skipped=None):
    gs = []
    for key, pts in LABS[lab]["points"].items():
        g = Group(key, pts, skipped=(skipped or {}).get(key))
        if not g.skipped:
            g.lines.append(message)
        gs.append(g)
    return gs


# ------------------------------------------------------------------------------------------ main
def _is_todo_text(msg):
    return "not written yet" in msg or "没有写" in msg


def gpu_available():
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="grade.py", description="Grade a lab: runs your TODO parts inside the repository's own code, on visible and "
        "hidden cases, in a child process with a timeout per case.",
        epilog="Example: python notebooks/labs/grade.py lab1    |    instructors: --json results.json --hidden-seed N")
    ap.add_argument("lab", choices=sorted(LABS), help="which lab")
    ap.add_argument("files", nargs="*", metavar="FILE",
                    help="your file (default: the lab's template in notebooks/labs/; lab 5: the .py and/or the .cu)")
    ap.add_argument("--solution", action="store_true", help="grade the reference solution (not in a student release)")
    ap.add_argument("--quick", action="store_true", help="only the harness's 'core' visible cases")
    ap.add_argument("--hidden-seed", type=int, default=None,
                    help="seed of the hidden cases (default: notebooks/labs/instructor/hidden_seed.txt)")
    ap.add_argument("--json", metavar="PATH", help="also write Gradescope's results.json to PATH")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per case before it is stopped")
    ap.add_argument("--lang", choices=LANGS, default=os.environ.get("LAB_LANG", "en"), help="language of the messages")
    ap.add_argument("--debug", action="store_true", help="show the grader's own traceback if it breaks")
    args = ap.parse_args(argv)
    set_lang(args.lang)
    if args.solution and args.files:
        ap.error("give a FILE or --solution, not both")
    if args.json:
        try:
            import gradescope_utils  # noqa: F401
        except ImportError:
            print(T("--json writes results.json through gradescope-utils, which is not installed: "
                    "pip install gradescope-utils", "--json 通过 gradescope-utils 写出 results.json，但它没有安装："
                    "pip install gradescope-utils"))
            return 2
    try:
        paths = resolve_files(args.lab, args.files, args.solution)
    except SystemExit as exc:
        return int(exc.code or 2)
    try:
        return grade(args, paths)
    except KeyboardInterrupt:
        return 1
    except Exception as exc:  # a bug of the grader (or of an environment it did not expect)
        if args.debug:
            raise
        print(T("\nGRADER ERROR: {t}: {e}", "\n评分程序出错：{t}：{e}", t=type(exc).__name__, e=exc))
        print(T("This is the grader failing, not necessarily your code. Run again with --debug for the details.",
                "这是评分程序本身出错，不一定是你的代码的问题。加 --debug 重新运行可看到细节。"))
        return 1


def grade(args, paths) -> int:
    lab = args.lab
    cfg = LABS[lab]
    rel = ", ".join(os.path.relpath(p, ROOT) for p in paths if p)
    gpu = gpu_available()
    skipped = {}
    device = "cpu"
    if lab == "lab2":
        from flash_attention_triton.capabilities import interpreter_on, use_interpreter_without_gpu

        use_interpreter_without_gpu()  # TRITON_INTERPRET=1 without a GPU (the child inherits it)
        device = "cpu" if interpreter_on() else "cuda"
        if device == "cuda" and not gpu:
            print(T("TRITON_INTERPRET is not 1 and there is no CUDA GPU: unset it (or set it to 1) to use the CPU interpreter",
                    "TRITON_INTERPRET 不是 1，而这里没有 CUDA GPU：取消它（或设为 1）以使用 CPU 解释器"))
            return 2
        if not gpu or device == "cpu":
            skipped["perf"] = T("the performance part needs a CUDA GPU (and TRITON_INTERPRET unset); it is not counted "
                                "as a pass", "性能部分需要 CUDA GPU（且不设 TRITON_INTERPRET）；不算作通过")
    if lab in ("lab3", "lab5"):
        try:
            import cuda_labs
        except Exception as exc:
            why = T("lab {n}'s grading module notebooks/labs/cuda_labs.py is not available here ({t}: {e})",
                    "实验 {n} 的评分模块 notebooks/labs/cuda_labs.py 在这里不可用（{t}：{e}）", n=lab[-1],
                    t=type(exc).__name__, e=exc)
            print(f"{title(lab)}: {rel}\n\n{T('NOT GRADED', '未评分')}: {why}")
            groups = zero_groups(lab, why, skipped={k: why for k in cfg["points"]})
            if args.json:
                write_results_json(args.json, lab, groups, summary_text=why)
            return 1
        if lab == "lab3":
            if gpu:
                device = "cuda"
            else:
                reason = cuda_labs.lab3_cpu_unavailable_reason()
                if reason:
                    why = T("no CUDA GPU, and the CPU path is not available: {r}", "没有 CUDA GPU，CPU 路径也不可用：{r}", r=reason)
                    skipped.update({k: why for k in cfg["points"]})
        if lab == "lab5":
            reason = cuda_labs.lab5_gpu_unavailable_reason() if gpu else T("no CUDA GPU", "没有 CUDA GPU")
            if reason:
                skipped["tile"] = T("the mma tile runs on a CUDA GPU only ({r}); it is not counted as a pass",
                                    "mma tile 只能在 CUDA GPU 上运行（{r}）；不算作通过", r=reason)
            elif paths[1] is None:
                skipped["tile"] = T("no .cu file given", "没有给出 .cu 文件")
    seed, seed_from = read_hidden_seed(args.hidden_seed)
    hidden_note = (T("(seed from {w})", "（种子来自 {w}）", w=seed_from) if seed_from else
                   T("(a fresh random seed {s}: the instructor's hidden seed is not in this copy; your grade uses it)",
                     "（新的随机种子 {s}：本副本中没有教师的隐藏种子；正式评分时使用教师的种子）", s=seed))
    tasks = build_tasks(lab, quick=args.quick, hidden_seed=seed, device=device,
                        perf=("perf" not in skipped and "tile" not in skipped and gpu))
    tasks = [t for t in tasks if t.group not in skipped]
    header = f"{title(lab)}: {rel}\n" + {
        "lab1": T("float32/float64 NumPy, Br = 32, Bc = {bn}; tolerance: 2 x naive error in the same dtype + floor",
                  "float32/float64 NumPy，Br = 32，Bc = {bn}；容差：同 dtype 朴素实现误差的 2 倍 + 下限", bn=cfg["block_n"]),
        "lab2": T("Triton on {d}, BLOCK_M = 32, BLOCK_N = {bn}; tolerance: 2 x naive error in the same dtype + floor",
                  "Triton，运行于 {d}，BLOCK_M = 32，BLOCK_N = {bn}；容差：同 dtype 朴素实现误差的 2 倍 + 下限",
                  d=T("the CPU (TRITON_INTERPRET=1)", "CPU（TRITON_INTERPRET=1）") if device == "cpu" else "the GPU",
                  bn=cfg["block_n"]),
        "lab3": T("float32, your four device functions {how}; tolerance: 2 x naive float32 error + floor",
                  "float32，你的四个 device 函数{how}；容差：float32 朴素实现误差的 2 倍 + 下限",
                  how=T("in the real kernel on the GPU", "在 GPU 上的真实 kernel 中") if device == "cuda"
                  else T("compiled as host code under the CPU emulation", "作为主机代码在 CPU 模拟下编译")),
        "lab4": T("float32/float64 NumPy, Br = 16, Bc = {bn}; dQ, dK, dV against attention_reference_grads; "
                  "tolerance: 2 x naive error in the same dtype + floor",
                  "float32/float64 NumPy，Br = 16，Bc = {bn}；dQ、dK、dV 与 attention_reference_grads 比较；"
                  "容差：同 dtype 朴素实现误差的 2 倍 + 下限", bn=cfg["block_n"]),
        "lab5": T("the fragment layout model on the CPU; the mma tile on a GPU",
                  "CPU 上检查 fragment 布局模型；GPU 上检查 mma tile"),
    }[lab]
    timeout = args.timeout or cfg["timeout"]
    load, results = run_in_child(lab, tasks, paths, timeout=timeout, lang=args.lang, load_timeout=120)
    todo = next((r for r in results.values() if r["status"] == "todo"), None)
    lay = [r for t in tasks if t.kind == "layout" and t.id in results and results[t.id]["status"] == "ok"
           for r in results[t.id].get("checks", [])]
    if lay and not any(c["passed"] for c in lay) and any(_is_todo_text(c["message"]) for c in lay):
        todo = dict(status="todo", message="\n  ".join(sorted({c["message"] for c in lay if _is_todo_text(c["message"])})))
    if load is not None or todo is not None:
        msg = (load or todo)["message"]
        todo_flag = todo is not None or (load or {}).get("status") == "todo"
        print(header)
        print(f"\nNOT DONE: {msg}")
        tpl = os.path.relpath(paths[0], ROOT)
        if todo_flag or "not written yet" in msg:
            print(T("Open {f}, write the parts marked TODO({lab}), and run this grader again.",
                    "打开 {f}，完成标有 TODO({lab}) 的部分，然后重新运行评分程序。", f=tpl, lab=lab))
        else:
            print(T("Fix {f} and run this grader again.", "修正 {f} 后重新运行评分程序。", f=tpl))
        groups = zero_groups(lab, f"NOT DONE: {msg}", skipped)
        total = sum(g.points for g in groups)
        summary_text = T("Score: 0/{t}", "得分：0/{t}", t=fmt_pts(total))
        print("\n" + summary_text)
        if args.json:
            write_results_json(args.json, lab, groups, summary_text=summary_text + f"\nNOT DONE: {msg}")
        return 1
    naive_device = "cuda" if device == "cuda" else "cpu"
    checked = evaluate(lab, tasks, results, naive_device)
    groups = []
    for key, pts in cfg["points"].items():
        g = Group(key, pts, skipped=skipped.get(key))
        g.results = [r for r in checked if r.task.group == key]
        groups.append(g)
    unit = [ln for r in checked if r.task.kind == "unit" for ln in r.lines]
    failing = [r for g in groups for r in g.graded if r.status != "PASS"]
    hints = []
    if failing:
        first = failing[0]
        hints.append(T("Hint for the first failing case ({n}):", "第一个失败用例（{n}）的提示：", n=first.name))
        for reason in first.reasons:
            hints.append(f"  {reason}")
        lab3_lines = []
        if lab == "lab3" and first.task.kind == "fwd" and not first.error:
            import cuda_labs

            lab3_lines = cuda_labs.lab3_hints(first.out["o"], first.out["lse"], first.ref["o"], first.ref["lse"],
                                              causal=first.causal, Nk=first.case["Nk"], lang=args.lang)
        if lab3_lines:
            hints += [f"  {ln}" for ln in lab3_lines]
        elif first.task.kind == "fwd":
            import hints as HI

            hints += [f"  {ln}" for ln in HI.diagnose(lab, first, [r for r in checked if r.task.kind == "fwd"], cfg["block_n"])]
        elif first.task.kind == "bwd":
            import hints as HI

            hints += [f"  {ln}" for ln in HI.diagnose_lab4(first, [r for r in checked if r.task.kind == "bwd"])]
        elif first.error:
            hints.append(f"  {first.error}")
    else:
        unit = []
    report(lab, groups, header=header, first_fail_hints=hints, unit_lines=unit, hidden_note=hidden_note)
    total = sum(g.points for g in groups)
    gradable = sum(g.points for g in groups if not g.skipped)
    score = round(sum(g.score for g in groups), 2)
    vis = sum(g.score for g in groups if g.key.startswith("visible"))
    vis_max = sum(g.points for g in groups if g.key.startswith("visible"))
    hid = sum(g.score for g in groups if g.key == "hidden")
    hid_max = sum(g.points for g in groups if g.key == "hidden")
    parts = []
    if vis_max:
        parts.append(T("visible {a}/{b}", "公开 {a}/{b}", a=fmt_pts(vis), b=fmt_pts(vis_max)))
    if hid_max:
        parts.append(T("hidden {a}/{b}", "隐藏 {a}/{b}", a=fmt_pts(hid), b=fmt_pts(hid_max)))
    for g in groups:
        if not g.key.startswith("visible") and g.key != "hidden":
            parts.append(f"{group_title(g.key)} " + (T("not graded here", "此处不评分") if g.skipped
                                                      else f"{fmt_pts(g.score)}/{fmt_pts(g.points)}"))
    summary_text = T("Score: {s}/{t} ({parts})", "得分：{s}/{t}（{parts}）", s=fmt_pts(score), t=fmt_pts(total),
                     parts=", ".join(parts))
    if gradable < total:
        summary_text += T("; {g} of the {t} points can be graded here", "；此处可评 {t} 分中的 {g} 分",
                          g=fmt_pts(gradable), t=fmt_pts(total))
    print("\n" + summary_text)
    all_pass = all(g.passed for g in groups if not g.skipped) and any(not g.skipped for g in groups)
    if all_pass:
        print(T("All graded cases pass: {t} is done.", "所有评分用例都通过：{t} 完成。", t=title(lab))
              + (T(" (Parts not graded here are listed above.)", "（此处未评分的部分见上文。）") if gradable < total else ""))
    if args.json:
        write_results_json(args.json, lab, groups, summary_text=summary_text, extra_output="\n".join(hints))
    return 0 if all_pass else 1
