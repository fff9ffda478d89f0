"""The child process of the lab grader: the only place where a student's code runs.

    python notebooks/labs/grading/child.py SPEC.json

SPEC.json (written by the grader) names the lab, the student's file(s), the inputs file (.npz) and an
output folder, and lists the tasks (one per case, plus unit checks and the performance run). This
process loads the inputs and deletes the file, then loads only the student's TODO parts into the
grader's own copy of the given code (grading/given_lab*.py), runs the tasks in order and writes, per
task, ``ID.npz`` (its output arrays) and then ``ID.json`` (its status). It writes ``_loaded.json``
once the student's code is loaded. It never compares anything with a reference: the grader does that
in its own process, so an ``exit()``, a crash or a hang here can only lose the cases it touches.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
LABS_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(LABS_DIR))
for _p in (HERE, LABS_DIR, ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402

from i18n import T, set_lang  # noqa: E402

LAB2_BEGIN = "# ---------------------------------------------------------------- the loop body (lab 2)"
LAB2_END = "# ---------------------------------------------------------------- end of the loop body"


class NotDone(Exception):
    """The student's code cannot be run yet (an open TODO, a syntax error): the message says why."""

    def __init__(self, message, todo=False):
        super().__init__(message)
        self.todo = todo


def explain_exception(exc, student_paths) -> str:
    """'ValueError: ... (at lab1_online_softmax.py:57 in merge_block: `line`)' without a traceback."""
    paths = {os.path.abspath(p) for p in student_paths if p}
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    where = ""
    for e in reversed(chain):  # the innermost exception points closest to the student's line
        frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.abspath(f.filename) in paths]
        if frames:
            f = frames[-1]
            where = T(" (at {file}:{line} in {fn}: `{src}`)", "（位置 {file}:{line}，函数 {fn}：`{src}`）",
                      file=os.path.basename(f.filename), line=f.lineno, fn=f.name, src=(f.line or "").strip())
            break
    root = chain[-1]
    msg = str(root).strip().splitlines()
    return f"{type(root).__name__}: {msg[0] if msg else ''}{where}"


def exit_message(exc: SystemExit, where: str) -> str:
    return T("your code called exit()/sys.exit({code}) {where}: a graded function must return its result, "
             "never end the program",
             "你的代码在{where}调用了 exit()/sys.exit({code})：被评分的函数必须返回结果，不能结束程序",
             code=exc.code if exc.code is not None else "", where=where)


# ------------------------------------------------------------------------------------------ loading
def load_file_as_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise NotDone(T("cannot load {p} as a Python module", "无法把 {p} 作为 Python 模块加载", p=path))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # triton's @jit looks its module up
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as exc:
        raise NotDone(T("{f} has a syntax error at line {n}: {msg}", "{f} 第 {n} 行有语法错误：{msg}",
                        f=os.path.basename(path), n=exc.lineno, msg=exc.msg)
                      + f"\n    {(exc.text or '').strip()}") from None
    except SystemExit as exc:
        raise NotDone(exit_message(exc, T("at import", "导入时"))) from None
    except Exception as exc:
        raise NotDone(T("importing {f} failed: {e}", "导入 {f} 失败：{e}", f=os.path.basename(path),
                        e=explain_exception(exc, [path]))) from None
    return mod


def load_numpy_lab(lab, path):
    """Labs 1 and 4: the grader's copy of the given loop, with the student's two functions put in."""
    names = {"lab1": ("merge_block", "finalize"), "lab4": ("preprocess", "backward_block")}[lab]
    student = load_file_as_module(path, f"{lab}_student")
    given = load_file_as_module(os.path.join(HERE, f"given_{lab}.py"), f"{lab}_given")
    for fn in names:
        f = getattr(student, fn, None)
        if not callable(f):
            raise NotDone(T("{file} has no function {fn}: did you rename or delete it?",
                            "{file} 中没有函数 {fn}：是不是改了名字或删掉了？", file=os.path.basename(path), fn=fn))
        setattr(given, fn, f)
    return given, student


def load_lab2(path, tmpdir):
    """Lab 2: the student's loop body (between the two marker lines) spliced into the grader's kernel."""
    with open(path) as f:
        text = f.read()
    if LAB2_BEGIN not in text or LAB2_END not in text:
        raise NotDone(T("the two marker lines around the loop body ('# ----... the loop body (lab 2)' and "
                        "'# ----... end of the loop body') are missing from {f}: put them back, the grader "
                        "takes your code from between them",
                        "{f} 中循环体前后的两行标记（'# ----... the loop body (lab 2)' 和 "
                        "'# ----... end of the loop body'）不见了：请恢复它们，评分程序只取两行之间的代码",
                        f=os.path.basename(path)))
    a = text.index(LAB2_BEGIN) + len(LAB2_BEGIN)
    body = text[a:text.index(LAB2_END, a)]
    body_line0 = text[:a].count("\n")  # line of the begin marker in the student's file
    with open(os.path.join(HERE, "given_lab2.py")) as f:
        given = f.read()
    g0 = given.index(LAB2_BEGIN) + len(LAB2_BEGIN)
    g1 = given.index(LAB2_END, g0)
    # pad with blank lines so that the body keeps the student's line numbers in error messages
    shift = body_line0 - given[:g0].count("\n")
    pre = given[:g0]
    if shift > 0:
        pre = pre.replace('from __future__ import annotations\n', 'from __future__ import annotations\n' + "\n" * shift, 1)
    graded = pre + body + given[g1:]
    out = os.path.join(tmpdir, os.path.basename(path))
    with open(out, "w") as f:
        f.write(graded)
    return load_file_as_module(out, "lab2_graded"), out


# ------------------------------------------------------------------------------------------ tasks
def _restride(x, layout):
    """The harness's 'bnhd' layout: a (B, H, N, D) view of a (B, N, H, D) array (non-contiguous)."""
    if layout == "bnhd":
        return np.ascontiguousarray(np.swapaxes(x, 1, 2)).swapaxes(1, 2)
    return x


def run_task(lab, task, data, ctx):
    kind = task["kind"]
    x = {k: _restride(data[f"{task['id']}_{k}"], task.get("layout")) for k in ("q", "k", "v", "o", "lse", "do")
         if f"{task['id']}_{k}" in data}
    if kind == "fwd" and lab == "lab1":
        o, lse = ctx["given"].flash_attn_lab1(x["q"], x["k"], x["v"], causal=task["causal"], return_lse=True,
                                               block_n=task["block_n"])
        return dict(o=o, lse=lse)
    if kind == "bwd" and lab == "lab4":
        dq, dk, dv = ctx["given"].flash_attn_bwd_lab4(x["q"], x["k"], x["v"], x["o"], x["lse"], x["do"],
                                                       causal=task["causal"], block_m=task["block_m"],
                                                       block_n=task["block_n"])
        return dict(dq=dq, dk=dk, dv=dv)
    if kind == "fwd" and lab == "lab2":
        import torch

        dev = task["device"]
        q, k, v = (torch.from_numpy(x[n]).to(dev).to(getattr(torch, task["dtype"])) for n in ("q", "k", "v"))
        o, lse = lab2_call(ctx, q, k, v, causal=task["causal"], block_m=32, block_n=task["block_n"])
        return dict(o=o.float().cpu().numpy(), lse=lse.float().cpu().numpy())
    if kind == "perf" and lab == "lab2":
        return lab2_perf(ctx, task)
    if kind == "fwd" and lab == "lab3":
        D = x["q"].shape[-1]
        o, lse = ctx["cuda_labs"].lab3_forward(ctx["path"], x["q"], x["k"], x["v"], causal=task["causal"],
                                               softmax_scale=1.0 / math.sqrt(D), device=task["device"],
                                               lang=ctx["lang"])
        return dict(o=np.asarray(o), lse=np.asarray(lse))
    if kind == "layout" and lab == "lab5":
        checks = ctx["cuda_labs"].lab5_layout_checks(ctx["path"], seed=task["seed"], lang=ctx["lang"])
        return dict(_checks=[dict(name=str(c["name"]), passed=bool(c["passed"]), message=str(c.get("message", "")))
                             for c in checks])
    if kind == "tile" and lab == "lab5":
        s = ctx["cuda_labs"].lab5_mma_tile(ctx["path_cu"], data[f"{task['id']}_a"], data[f"{task['id']}_b"],
                                           lang=ctx["lang"])
        return dict(s=np.asarray(s))
    if kind == "unit" and lab == "lab1":
        import hints

        return dict(_lines=hints.lab1_unit_checks(ctx["student"]))
    if kind == "unit" and lab == "lab4":
        import hints

        return dict(_lines=hints.lab4_unit_checks(ctx["student"]))
    raise ValueError(f"child: unknown task kind {kind!r} for {lab}")


def lab2_call(ctx, q, k, v, **kw):
    try:
        return ctx["given"].flash_attn_lab2(q, k, v, return_lse=True, **kw)
    except Exception as exc:
        text = " ".join(str(e) for e in _exc_chain(exc))
        if "lab2 TODO" in text:
            raise NotDone(T("the inner loop body of _lab2_fwd_kernel is not written yet "
                            "(the tl.static_assert(False, ...) line of the TODO(lab2) is still there)",
                            "_lab2_fwd_kernel 的内层循环体还没有写（TODO(lab2) 里的 tl.static_assert(False, ...) "
                            "那一行还在），not written yet"), todo=True) from None
        if type(exc).__name__ in ("CompilationError", "InterpreterError"):
            lines = [ln for ln in str(exc).splitlines() if ln.strip()][:10]
            msg = explain_exception(exc, [ctx["graded_path"]]).replace(ctx["graded_path"], ctx["path"])
            raise RuntimeError(T("the kernel does not compile/run: {m}", "kernel 无法编译/运行：{m}", m=msg)
                               + ("\n    " + "\n    ".join(lines) if type(exc).__name__ == "CompilationError" else "")) from None
        raise


def lab2_perf(ctx, task):
    """fp16 at a realistic size on the GPU: the output of batch 0 (two heads) for the check, and the time."""
    import torch
    import triton.testing

    B, H, N, D = task["shape"]
    gen = torch.Generator(device="cuda").manual_seed(int(task["seed"]))
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    kw = dict(causal=False, block_m=task["block_m"], block_n=task["block_n"], num_warps=task["num_warps"],
              num_stages=task["num_stages"])
    o, _ = lab2_call(ctx, q, k, v, **kw)
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(lambda: lab2_call(ctx, q, k, v, **kw), return_mode="median")
    return dict(o=o[:1, :2].float().cpu().numpy(), q=q[:1, :2].float().cpu().numpy(), k=k[:1, :2].float().cpu().numpy(),
                v=v[:1, :2].float().cpu().numpy(), ms=np.array(ms, dtype=np.float64))


def _exc_chain(exc):
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    return chain


# ------------------------------------------------------------------------------------------ main
def _write(outdir, name, payload, arrays=None):
    if arrays:
        tmp = os.path.join(outdir, f"{name}.tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, os.path.join(outdir, f"{name}.npz"))
    tmp = os.path.join(outdir, f"{name}.tmp.json")
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, os.path.join(outdir, f"{name}.json"))


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    os.remove(spec_path)
    lab, outdir = spec["lab"], spec["outdir"]
    set_lang(spec.get("lang", "en"))
    with np.load(spec["inputs"], allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    os.remove(spec["inputs"])  # the inputs live in this process's memory only
    ctx = dict(path=spec["student"], path_cu=spec.get("student_cu"), lang=spec.get("lang", "en"))
    paths = [spec["student"], spec.get("student_cu")]
    tmpdir = tempfile.mkdtemp(prefix="lab_graded_")
    _write(outdir, "_started", dict(status="ok"))  # from here on, the student's file is being loaded
    try:
        if lab in ("lab1", "lab4"):
            ctx["given"], ctx["student"] = load_numpy_lab(lab, spec["student"])
        elif lab == "lab2":
            ctx["given"], ctx["graded_path"] = load_lab2(spec["student"], tmpdir)
            paths.append(ctx["graded_path"])
        else:
            import cuda_labs

            ctx["cuda_labs"] = cuda_labs
        _write(outdir, "_loaded", dict(status="ok"))
    except NotDone as exc:
        _write(outdir, "_loaded", dict(status="todo" if exc.todo else "notdone", message=str(exc)))
        return 0
    except SystemExit as exc:
        _write(outdir, "_loaded", dict(status="notdone", message=exit_message(exc, T("at import", "导入时"))))
        return 0
    except Exception as exc:
        _write(outdir, "_loaded", dict(status="notdone", message=explain_exception(exc, paths)))
        return 0
    student_error = ctx.get("cuda_labs") and getattr(ctx["cuda_labs"], "StudentCodeError", None)
    for task in spec["tasks"]:
        arrays, payload = {}, dict(status="ok")
        try:
            with np.errstate(all="ignore"):
                res = run_task(lab, task, data, ctx)
            for key, val in res.items():
                if key.startswith("_"):
                    payload[key[1:]] = val
                else:
                    arrays[key] = np.asarray(val)
        except NotImplementedError as exc:
            payload = dict(status="todo", message=str(exc) or T("a function still raises NotImplementedError",
                                                                "某个函数仍然抛出 NotImplementedError"))
        except NotDone as exc:
            payload = dict(status="todo" if exc.todo else "error", message=str(exc))
        except SystemExit as exc:
            payload = dict(status="error", message=exit_message(exc, T("while running", "运行时")))
        except Exception as exc:
            if student_error and isinstance(exc, student_error):
                todo = "not written yet" in str(exc) or "没有写" in str(exc)
                payload = dict(status="todo" if todo else "error", message=str(exc))
            else:
                payload = dict(status="error", message=explain_exception(exc, paths))
        if lab == "lab2" and "graded_path" in ctx and payload.get("message"):
            payload["message"] = payload["message"].replace(os.path.basename(ctx["graded_path"]),
                                                            os.path.basename(spec["student"]))
        _write(outdir, task["id"], payload, arrays)
        if payload["status"] == "todo":
            break
    return 0


if __name__ == "__main__":
    rc = main(sys.argv[1])
    sys.stdout.flush()
    os._exit(rc)  # no atexit hooks of student code
