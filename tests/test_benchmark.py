"""The benchmark command (``python -m benchmarks``) on a tiny CPU sweep: files, columns, values, failures.

The sweeps here are tiny (N = 16, 32; B = H = 1; D = 16) so the whole file runs in a few seconds.
"""
import csv
import json
import math
import os
import subprocess
import sys

import pytest

from benchmarks import cli
from benchmarks.report import COLUMNS, PLOTS
from benchmarks.targets import Target
from flash_attention_py.common import attention_flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# these tests are about the CPU sweep: pin the device so they mean the same on a GPU machine
CPU = ["--device", "cpu"]
TINY = ["--n", "16,32", "-b", "1", "--heads", "1", "-d", "16", "--repeats", "2", "--no-progress"]
NUMBERS = ("time_ms", "time_lo_ms", "time_hi_ms", "spread_pct", "gflop", "tflops", "mem_peak_mb", "mem_extra_mb",
           "speedup_vs_naive")


def _read(out):
    with open(os.path.join(out, "results.csv"), newline="") as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames, list(reader)
    with open(os.path.join(out, "results.json")) as f:
        doc = json.load(f)
    return header, rows, doc


def _check_pngs(out):
    import matplotlib.image as mpimg

    for name in PLOTS:
        path = os.path.join(out, name)
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", name
        img = mpimg.imread(path)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, name


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    """One run: two CPU backends + the naive anchor, causal on and off, plus cuda-mma (unsupported on a CPU)."""
    out = str(tmp_path_factory.mktemp("bench"))
    argv = ["--backends", "numpy-v2,torch-split,naive-torch,cuda-mma", "--causal", "both", "--dtype", "float32",
            "--out", out] + TINY
    assert cli.main(CPU + argv) == 0
    return out, CPU + argv


def test_csv_json_png_written(tiny_sweep):
    out, _ = tiny_sweep
    header, rows, doc = _read(out)
    assert header == COLUMNS
    # one row per case: 4 backends x 2 causal x 2 N x 1 dtype x 1 mode
    assert len(rows) == 16 == len(doc["results"])
    keys = {(r["backend"], r["causal"], r["Nq"], r["Nk"], r["dtype"], r["mode"]) for r in rows}
    assert len(keys) == len(rows)
    assert doc["columns"] == COLUMNS
    assert set(doc["results"][0]) == set(COLUMNS)
    _check_pngs(out)
    for name in ("table.txt", "report.md"):
        assert os.path.getsize(os.path.join(out, name)) > 0


def test_values_finite_and_consistent(tiny_sweep):
    out, _ = tiny_sweep
    _, rows, doc = _read(out)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["backend"] for r in ok} == {"numpy-v2", "torch-split", "naive-torch"}
    assert len(ok) == 12
    rss = os.path.exists("/proc/self/clear_refs")  # torch's CPU peak memory is read from Linux's VmHWM
    for r in ok:
        if not rss and not r["backend"].startswith("numpy"):
            continue
        values = {k: float(r[k]) for k in NUMBERS}
        assert all(math.isfinite(v) for v in values.values()), r
        assert values["time_ms"] > 0 and values["tflops"] > 0 and values["mem_extra_mb"] >= 0
        assert values["time_lo_ms"] <= values["time_ms"] <= values["time_hi_ms"]
        B, H, Nq, Nk, D = (int(r[k]) for k in ("B", "H", "Nq", "Nk", "D"))
        flops = attention_flops(B, H, Nq, Nk, D, causal=r["causal"] == "True", mode=r["mode"])
        assert values["gflop"] == pytest.approx(flops / 1e9)
        assert values["tflops"] == pytest.approx(flops / (values["time_ms"] * 1e-3) / 1e12, rel=1e-6)
        assert r["mem_method"] == ("tracemalloc" if r["backend"].startswith("numpy") else "peak RSS delta (VmHWM)")
        if r["backend"] == "naive-torch":
            assert values["speedup_vs_naive"] == 1.0
    for r in doc["results"]:
        if r["status"] == "ok" and (rss or r["backend"].startswith("numpy")):
            assert all(isinstance(r[k], (int, float)) and math.isfinite(r[k]) for k in NUMBERS)


def test_unsupported_recorded_with_reason(tiny_sweep):
    out, _ = tiny_sweep
    _, rows, doc = _read(out)
    bad = [r for r in rows if r["backend"] == "cuda-mma"]
    assert len(bad) == 4
    assert all(r["status"] == "unsupported" and "cpu" in r["reason"] for r in bad)
    assert all(r["time_ms"] == "" for r in bad)
    names = {b["name"]: b for b in doc["backends"]}
    from flash_attention_py.registry import backend_names

    assert set(backend_names()) <= set(names)  # every registry backend is listed, runnable or not
    assert {"sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"} <= set(names)
    assert names["cuda-mma"]["available"] is False and names["cuda-mma"]["reason"]
    assert names["numpy-v2"]["available"] is True


def test_environment_recorded(tiny_sweep):
    out, argv = tiny_sweep
    _, _, doc = _read(out)
    meta = doc["meta"]
    for key in ("command", "python", "numpy", "torch", "triton", "cupy", "device", "utc", "wall_s"):
        assert key in meta, key
    assert meta["device"] == "cpu" and meta["argv"] == argv
    assert doc["config"]["B"] == 1 and doc["config"]["sizes"] == [[16, 16], [32, 32]]
    assert doc["matmul_peak_tflops"] == {}  # measured on the GPU only


class _Flaky(Target):
    """A stand-in backend: fine at N=16, out of memory at 24, NaN at 32, a crash at 40, NotImplemented at 48."""

    name, rung, description, array, devices = "flaky", "test", "test double", "torch", ("cpu",)

    def dtypes(self, device):
        return ("float32",)

    def unavailable_reason(self, device):
        return None

    def case_reason(self, device, dtype, D, mode):
        return None

    def prepare(self, x, causal, mode):
        import torch

        N = x["q"].shape[-2]

        def fn():
            if N == 24:
                raise MemoryError("pretend the score matrix did not fit")
            if N == 32:
                return torch.full_like(x["q"], float("nan"))
            if N == 40:
                raise RuntimeError("pretend the kernel crashed")
            if N == 48:
                raise NotImplementedError("pretend this shape is not supported")
            return x["q"] * 2

        return fn


def test_failures_recorded_and_sweep_goes_on(tmp_path, monkeypatch):
    real = cli.build_targets
    monkeypatch.setattr(cli, "build_targets", lambda: real() + [_Flaky()])
    out = str(tmp_path)
    assert cli.main(CPU + ["--backends", "flaky,naive-torch", "--n", "16,24,32,40,48", "-b", "1", "--heads", "1", "-d", "16",
                     "--repeats", "1", "--dtype", "float32", "--out", out, "--no-progress", "--no-plots"]) == 0
    _, rows, _ = _read(out)
    got = {int(r["Nk"]): (r["status"], r["reason"]) for r in rows if r["backend"] == "flaky"}
    assert got[16][0] == "ok"
    assert got[24] == ("oom", "MemoryError: pretend the score matrix did not fit")
    assert got[32] == ("error", "the output holds NaN")
    assert got[40] == ("error", "RuntimeError: pretend the kernel crashed")
    assert got[48] == ("unsupported", "NotImplementedError: pretend this shape is not supported")
    assert all(r["status"] == "ok" for r in rows if r["backend"] == "naive-torch")  # the sweep went on


def test_predicted_slow_case_is_skipped(tmp_path):
    out = str(tmp_path)
    assert cli.main(CPU + ["--backends", "numpy-v2", "--n", "16,2048", "-b", "1", "--heads", "1", "-d", "16", "--repeats", "1",
                     "--max-call-s", "1e-6", "--out", out, "--no-progress", "--no-plots"]) == 0
    _, rows, _ = _read(out)
    assert [r["status"] for r in rows] == ["ok", "skipped"]
    assert "--max-call-s" in rows[1]["reason"]


def test_parse_sizes():
    assert cli.parse_sizes("512..4096") == [512, 1024, 2048, 4096]
    assert cli.parse_sizes("1, 17,100") == [1, 17, 100]


@pytest.mark.parametrize("argv, needle", [
    (["--n", "0"], "--n"),
    (["--n", "abc"], "--n"),
    (["--n", "64..32"], "--n"),
    (["--dtype", "float8"], "--dtype"),
    (["--backends", "no-such-backend"], "no-such-backend"),
    (["--nq", "16,32", "--nk", "16,32,64"], "--nq"),
    (["--n", "16", "--nq", "16"], "--n"),
    (["--causal", "maybe"], "--causal"),
    (["--mode", "sideways"], "--mode"),
    (["--repeats", "-1"], "--repeats"),
    (["-b", "0"], "--batch"),
])
def test_bad_options_give_clear_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv + ["--out", os.devnull + "-never-written"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err, err


def test_module_entry_point_rejects_bad_option():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-m", "benchmarks", "--dtype", "float8"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "--dtype" in res.stderr and "float8" in res.stderr


def test_cases_jsonl_and_replot(tiny_sweep, tmp_path):
    """Each case is appended to cases.jsonl as it finishes; replot rebuilds the files from it alone."""
    import shutil

    from benchmarks import replot

    out, _ = tiny_sweep
    with open(os.path.join(out, "cases.jsonl")) as f:
        assert len([line for line in f if line.strip()]) == 16
    cut = str(tmp_path / "cut")
    os.makedirs(cut)
    shutil.copy(os.path.join(out, "cases.jsonl"), cut)  # as if the run had been killed before the end
    assert replot.main([cut]) == 0
    header, rows, doc = _read(cut)
    assert header == COLUMNS and len(rows) == 16 and doc["meta"]["partial"] is True
    naive = [r for r in rows if r["backend"] == "naive-torch"]
    assert all(float(r["speedup_vs_naive"]) == 1.0 for r in naive)
    _check_pngs(cut)


def test_gpu_timer_glue(monkeypatch):
    """The GPU timing path's plumbing, without a GPU: do_bench for fast calls, a few synchronised runs for slow ones."""
    import time

    import torch

    pytest.importorskip("triton", reason="the GPU timer uses triton.testing.do_bench; triton is not installed")
    import triton.testing

    from benchmarks import measure

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    calls = {}

    def fake_do_bench(fn, warmup, rep, quantiles):
        calls["quantiles"] = quantiles
        return [1.0, 0.9, 1.2]

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    assert measure.time_gpu(lambda: None, repeats=3) == (1.0, 0.9, 1.2, None, "triton.testing.do_bench")
    assert calls["quantiles"] == [0.5, 0.2, 0.8]
    med, lo, hi, n, timer = measure.time_gpu(lambda: time.sleep(0.21), repeats=1)
    assert n == 1 and timer == "cuda.synchronize+perf_counter" and lo <= med <= hi and med >= 200


def test_cpu_naive_too_big_is_oom_not_run(tmp_path):
    """On a CPU a naive case whose score matrices cannot fit is recorded as OOM without being run."""
    out = str(tmp_path)
    assert cli.main(CPU + ["--backends", "naive-torch", "--n", "65536", "-b", "64", "--heads", "64", "-d", "16",
                     "--out", out, "--no-progress", "--no-plots"]) == 0
    _, rows, _ = _read(out)
    assert [r["status"] for r in rows] == ["oom"] and "not run" in rows[0]["reason"]


# ------------------------------------------------------------------------------------ --out checked before the sweep
def _bad_out(tmp_path, kind):
    if kind == "existing file":
        path = tmp_path / "a_file"
        path.write_text("x")
        return str(path), "is an existing file"
    if kind == "path inside a file":
        path = tmp_path / "a_file"
        path.write_text("x")
        return str(path / "sub"), "which is a file"
    if kind == "results.csv is a folder":
        (tmp_path / "results.csv").mkdir()
        return str(tmp_path), "results.csv"
    if kind == "cases.jsonl is a folder":
        (tmp_path / "cases.jsonl").mkdir()
        return str(tmp_path), "cases.jsonl"
    if kind == "unwritable folder":
        if os.geteuid() == 0:  # root writes anywhere: a folder that cannot be made at all stands in for it
            if not os.path.isdir("/proc/self"):
                pytest.skip("running as root without /proc: no folder here is unwritable")
            return "/proc/self/bench_out", "cannot create the folder"
        path = tmp_path / "locked"
        path.mkdir()
        path.chmod(0o500)
        return str(path), "not writable"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["existing file", "path inside a file", "results.csv is a folder",
                                  "cases.jsonl is a folder", "unwritable folder"])
def test_bad_out_is_one_line_error_before_the_sweep(kind, tmp_path, monkeypatch, capsys):
    out, needle = _bad_out(tmp_path, kind)

    def never(*a, **k):
        raise AssertionError("a case ran although --out is unusable")

    monkeypatch.setattr(cli, "run_case", never)
    with pytest.raises(SystemExit) as info:
        cli.main(CPU + ["--backends", "numpy-v2", "--out", out] + TINY)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("python -m benchmarks: error: --out: ") and needle in err, err


# ------------------------------------------------------------------------------------ predicted time, before the first N
def test_huge_first_case_is_predicted_by_a_probe_and_skipped(tmp_path):
    """--n 200000 on a CPU: one small timed call predicts hours, so the case is skipped at once, with the reason."""
    import time

    out = str(tmp_path)
    t0 = time.perf_counter()
    assert cli.main(CPU + ["--backends", "numpy-v2", "--n", "200000", "-b", "1", "--heads", "1", "-d", "16",
                           "--out", out, "--no-progress", "--no-plots"]) == 0
    assert time.perf_counter() - t0 < 30
    _, rows, _ = _read(out)
    assert [r["status"] for r in rows] == ["skipped"]
    reason = rows[0]["reason"]
    assert f"N={cli.PROBE_N} (probe)" in reason and "--max-call-s 2" in reason and "not run" in reason
    with open(os.path.join(out, "table.txt")) as f:
        assert reason in f.read()


def test_probe_lets_a_case_under_the_limit_run(tmp_path, monkeypatch):
    probes = []
    real = cli.probe_call
    monkeypatch.setattr(cli, "probe_call", lambda case, target: probes.append(case["Nk"]) or real(case, target))
    out = str(tmp_path)
    assert cli.main(CPU + ["--backends", "numpy-v2", "--n", "2048", "-b", "1", "--heads", "1", "-d", "16",
                           "--repeats", "1", "--out", out, "--no-progress", "--no-plots"]) == 0
    _, rows, _ = _read(out)
    assert probes == [2048] and [r["status"] for r in rows] == ["ok"]


def test_small_first_case_needs_no_probe(tmp_path, monkeypatch):
    """The presets' first N (CPU 128, GPU 512, seed 1024) run without a probe call."""
    monkeypatch.setattr(cli, "probe_call", lambda *a: pytest.fail("probed a case that is cheap to run"))
    out = str(tmp_path)
    assert cli.main(CPU + ["--backends", "numpy-v2", "--n", "1024", "-b", "1", "--heads", "1", "-d", "16",
                           "--repeats", "1", "--out", out, "--no-progress", "--no-plots"]) == 0


def test_plots_lines_for_a_sweep_bars_for_one_n_legend_outside(tmp_path, monkeypatch):
    """Several N: lines; a single N: bars (not a column of dots); the legend lies outside every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import report

    seen = []
    real_close = plt.close

    def keep(fig=None):
        if fig is not None and hasattr(fig, "axes"):
            fig.canvas.draw()
            axes = [ax for ax in fig.axes if ax.get_visible()]
            legend_box = fig.legends[0].get_window_extent()
            right = max(ax.get_window_extent().x1 for ax in axes)
            seen.append((sum(len(ax.patches) for ax in axes), sum(len(ax.lines) for ax in axes), legend_box.x0 >= right))
        return real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    base = dict(rung="anchor", device="cpu", dtype="float32", mode="fwd", causal=False, B=1, H=1, D=16, status="ok",
                reason="", mem_extra_mb=1.0, speedup_vs_naive=1.0, tflops=0.01)
    sweep = [dict(base, backend=b, Nq=n, Nk=n) for b in ("naive-torch", "sdpa-math") for n in (64, 128)]
    single = [dict(base, backend=b, Nq=64, Nk=64) for b in ("naive-torch", "sdpa-math")]
    cfg = dict(device="cpu", B=1, H=1, D=16)
    report.write_plots(str(tmp_path), sweep, {}, cfg)
    report.write_plots(str(tmp_path), single, {}, cfg)
    assert len(seen) == 6
    assert all(bars == 0 and lines >= 2 and outside for bars, lines, outside in seen[:3]), seen
    assert all(bars == 2 and outside for bars, lines, outside in seen[3:]), seen
