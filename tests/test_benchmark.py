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


def test_autograd_thread_calling_times_the_backward_on_the_calling_thread(tmp_path, monkeypatch):
    """--autograd-thread calling: each torch backend's calls run with autograd's multithreading off (thread-local,
    restored after the case), NumPy backends untouched; the config and report.md say so."""
    import torch

    seen = []
    real = cli.measure.time_call

    def spy(fn, **kw):
        seen.append(torch._C._is_multithreading_enabled())
        return real(fn, **kw)

    monkeypatch.setattr(cli.measure, "time_call", spy)
    out = str(tmp_path)
    assert cli.main(CPU + ["--backends", "naive-torch,numpy-v2", "--n", "16", "-b", "1", "--heads", "1", "-d", "16",
                           "--repeats", "1", "--dtype", "float32", "--mode", "bwd", "--autograd-thread", "calling",
                           "--out", out, "--no-progress", "--no-plots"]) == 0
    assert seen == [False, True]  # naive-torch (torch: off), numpy-v2 (not torch: as it was)
    assert torch._C._is_multithreading_enabled()
    with open(os.path.join(out, "results.json")) as f:
        assert json.load(f)["config"]["autograd_thread"] == "calling"
    with open(os.path.join(out, "report.md")) as f:
        assert "--autograd-thread calling" in f.read()


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


@pytest.mark.slow  # a fresh interpreter / matplotlib drawing: ~8 s on 2 shared cores
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
    # a call under SHORT_CALL_MS: the median of SHORT_CALL_ROUNDS rounds' medians, a slow round outvoted
    rounds = iter([[0.05, 0.04, 0.06], [0.09, 0.08, 0.11], [0.051, 0.045, 0.055]])
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, warmup, rep, quantiles: next(rounds))
    assert measure.SHORT_CALL_ROUNDS == 3
    assert measure.time_gpu(lambda: None, repeats=3) == (0.051, 0.04, 0.11, None,
                                                         "triton.testing.do_bench, median of 3 rounds")
    # one of 3 timings taken in turn (--rounds 3): each do_bench gets a third of its time; a short call keeps its
    # SHORT_CALL_ROUNDS rounds, a long one gets one
    reps = []
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, warmup, rep, quantiles: reps.append((warmup, rep)) or [0.05, 0.04, 0.06])
    assert measure.time_gpu(lambda: None, repeats=3, turns=3) == (0.05, 0.04, 0.06, None,
                                                                  "triton.testing.do_bench, median of 3 rounds")
    assert reps == [(measure.DO_BENCH_WARMUP_MS / 3, measure.DO_BENCH_REP_MS / 3)] * measure.SHORT_CALL_ROUNDS
    reps.clear()
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, warmup, rep, quantiles: reps.append((warmup, rep)) or [5.0, 4.9, 5.2])
    assert measure.time_gpu(lambda: None, repeats=3, turns=3) == (5.0, 4.9, 5.2, None, "triton.testing.do_bench")
    assert len(reps) == 1


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


def test_probe_keeps_its_fastest_call(monkeypatch):
    """A probe call that does one-off work (a launch plan built on the second call) does not decide the prediction:
    the probe times PROBE_CALLS calls after its warm-up and keeps the fastest."""
    from benchmarks import measure
    from benchmarks.targets import RegistryTarget
    from flash_attention_py.registry import get_backend

    times = iter([0.31, 0.0004, 0.0005])
    monkeypatch.setattr(measure, "time_once", lambda fn, device: next(times))
    case = dict(device="cpu", dtype="float32", mode="fwd", causal=False, B=1, H=1, D=16, Nq=4096, Nk=4096,
                backend="numpy-v2")
    flops, sec, label = cli.probe_call(case, RegistryTarget(get_backend("numpy-v2")))
    assert sec == 0.0004 and label == f"{cli.PROBE_N} (probe)" and cli.PROBE_CALLS == 3


def test_small_first_case_needs_no_probe(tmp_path, monkeypatch):
    """The presets' first N (CPU 128, GPU 512, seed 1024) run without a probe call."""
    monkeypatch.setattr(cli, "probe_call", lambda *a: pytest.fail("probed a case that is cheap to run"))
    out = str(tmp_path)
    assert cli.main(CPU + ["--backends", "numpy-v2", "--n", "1024", "-b", "1", "--heads", "1", "-d", "16",
                           "--repeats", "1", "--out", out, "--no-progress", "--no-plots"]) == 0


@pytest.mark.slow  # a fresh interpreter / matplotlib drawing: ~8 s on 2 shared cores
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
                reason="", mem_extra_mb=1.0, speedup_vs_naive=1.0, tflops=0.01, time_ms=1.0)
    sweep = [dict(base, backend=b, Nq=n, Nk=n) for b in ("naive-torch", "sdpa-math") for n in (64, 128)]
    single = [dict(base, backend=b, Nq=64, Nk=64) for b in ("naive-torch", "sdpa-math")]
    cfg = dict(device="cpu", B=1, H=1, D=16)
    report.write_plots(str(tmp_path), sweep, {}, cfg)
    report.write_plots(str(tmp_path), single, {}, cfg)
    assert len(seen) == 6
    assert all(bars == 0 and lines >= 2 and outside for bars, lines, outside in seen[:3]), seen
    assert all(bars == 2 and outside for bars, lines, outside in seen[3:]), seen


@pytest.mark.slow  # matplotlib drawing: a few seconds on 2 shared cores
def test_speedup_plot_over_the_baseline_the_run_has(tmp_path, monkeypatch):
    """speedup.png divides by naive attention where the run has it, else by FA2 (sdpa-flash): a preset without
    naive-torch (the hopper one) plotted empty panels before. With neither there is no speed-up plot, a stale one
    goes, and report.md does not link it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import report

    titles = []
    real_close = plt.close

    def keep(fig=None):
        if fig is not None and hasattr(fig, "axes"):
            titles.append([ax.get_title() for ax in fig.axes if ax.get_visible() and ax.lines])
        return real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    base = dict(rung="", device="cuda", dtype="float16", mode="fwd", causal=False, B=1, H=1, D=64, status="ok",
                reason="", mem_extra_mb=1.0, speedup_vs_naive=math.nan, tflops=1.0, spread_pct=1.0)
    rows = [dict(base, backend=b, Nq=n, Nk=n, time_ms=t * n) for b, t in (("sdpa-flash", 2.0), ("cuda-mma", 1.0))
            for n in (64, 128)]
    cfg = dict(device="cuda", B=1, H=1, D=64)
    out = tmp_path / "fa2"
    out.mkdir()
    report.write_plots(str(out), rows, {}, cfg)
    assert (out / "speedup.png").exists() and report.speedup_baseline(rows)[0] == "sdpa-flash"
    assert "speed-up over FlashAttention-2" in titles[-1][0]
    sped = report._with_speedup(rows, "sdpa-flash")
    assert [r["speedup"] for r in sped] == [1.0, 1.0, 2.0, 2.0]
    md = report.report_markdown(rows, meta={}, config=dict(cfg, N=[64, 128]), matmul_peak={}, plots=True)
    assert "speedup.png" in md

    others = [dict(r, backend="cuda-wgmma") for r in rows if r["backend"] == "cuda-mma"]
    out2 = tmp_path / "none"
    out2.mkdir()
    (out2 / "speedup.png").write_bytes(b"stale")
    report.write_plots(str(out2), others, {}, cfg)
    assert report.speedup_baseline(others) is None and not (out2 / "speedup.png").exists()
    assert (out2 / "tflops.png").exists() and (out2 / "memory.png").exists()
    md = report.report_markdown(others, meta={}, config=dict(cfg, N=[64, 128]), matmul_peak={}, plots=True)
    assert "speedup.png" not in md and "tflops.png" in md


# ------------------------------------------------------------------------------------ presets
def test_presets_are_listed(capsys):
    from benchmarks import presets

    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in presets.PRESETS:
        assert name in out, out
    assert set(presets.PRESETS) >= {"cuda-ladder", "cuda-backward", "triton-vs-fa2", "launch-overhead"}


@pytest.mark.parametrize("name", ["cuda-ladder", "cuda-backward", "triton-vs-fa2", "launch-overhead"])
def test_preset_dry_run_resolves_without_a_gpu(name, tmp_path, capsys, monkeypatch):
    """--dry-run resolves a GPU preset here and lists every case (with why it cannot run), running none."""
    from benchmarks import presets

    monkeypatch.setattr(cli, "run_case", lambda *a, **k: pytest.fail("a case ran in a dry run"))
    pr = presets.PRESETS[name]
    out = tmp_path / "never"
    assert cli.main(["--preset", name, "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    n = len(cli.parse_sizes(pr.n))
    expected = sum(len(pr.dtypes[b]) for b in pr.backends) * len(pr.shapes) * n * len(pr.combos)
    assert f"{name} on {pr.device}: {expected} cases" in text, text
    assert len([line for line in text.splitlines() if line.startswith("  ")]) == expected
    assert not out.exists()


def _fake_timers(monkeypatch):
    """Replace the three timers of benchmarks.measure by stand-ins that count their calls."""
    from benchmarks import measure

    calls = {"time_gpu": 0, "time_cpu": 0, "time_host": 0}

    def fake(name, ms):
        def timer(fn, **kw):
            calls[name] += 1
            fn()
            return ms, ms, ms, 1, name

        return timer

    monkeypatch.setattr(measure, "time_gpu", fake("time_gpu", 1.0))
    monkeypatch.setattr(measure, "time_cpu", fake("time_cpu", 2.0))
    monkeypatch.setattr(measure, "time_host", fake("time_host", 3.0))
    return calls


@pytest.mark.parametrize("name", ["cuda-ladder", "cuda-backward", "triton-vs-fa2", "launch-overhead"])
def test_presets_time_through_the_one_timer(name, tmp_path, monkeypatch):
    """Each preset, run on the CPU (tiny shape, fp32, the GPU backends recorded as unsupported), times every
    case through benchmarks.measure, compares each backend with the reference's output, and writes the
    sweep's files plus its summary."""
    from benchmarks import presets

    calls = _fake_timers(monkeypatch)
    pr = presets.PRESETS[name]
    backends = [b for b in pr.backends if b != "triton"] + ["naive-torch"]  # triton: slow under the interpreter
    out = str(tmp_path)
    assert cli.main(["--preset", name, "--device", "cpu", "--n", "16", "-b", "1", "--heads", "1", "-d", "16",
                     "--dtype", "float32", "--backends", ",".join(backends), "--out", out, "--no-progress",
                     "--no-plots"]) == 0
    header, rows, doc = _read(out)
    assert header == COLUMNS and doc["config"]["preset"] == name
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["backend"] for r in ok} == {"sdpa-flash", "naive-torch"}
    timer = "time_host" if pr.timer == "host" else "time_cpu"
    assert calls[timer] == len(ok) * pr.rounds and sum(calls.values()) == len(ok) * pr.rounds  # once a round
    assert all(r["timer"].split(";")[0] == timer and float(r["time_ms"]) == {"time_cpu": 2.0, "time_host": 3.0}[timer] for r in ok)
    if pr.reference:
        naive = [r for r in ok if r["backend"] == "naive-torch"]
        assert naive and all(r["ref"] == pr.reference and 0 <= float(r["max_abs_vs_ref"]) < 1e-4 for r in naive), naive
    for fname in pr.summary(doc["results"], dict(meta=doc["meta"], preset=pr)):
        assert os.path.getsize(os.path.join(out, fname)) > 0, fname
    if name == "cuda-ladder":
        with open(os.path.join(out, "cuda_ladder.json")) as f:
            summary = json.load(f)
        assert [r["causal"] for r in summary["rows"]] == [False, True]
        assert all(r["fa2_ms"] == 2.0 and "mma_tflops" not in r for r in summary["rows"])


def test_preset_caps_slow_rungs_and_options_override(tmp_path, monkeypatch):
    """A preset's N cap on a slow rung records the larger cases as skipped; --n/--causal replace the preset's."""
    from benchmarks import presets

    _fake_timers(monkeypatch)
    monkeypatch.setitem(presets.PRESETS, "capped", presets.Preset(
        name="capped", description="test", backends=("naive-torch",), shapes=((1, 1, 16),), n="16,32",
        combos=(("fwd", True),), dtypes={"naive-torch": ("float32",)}, max_n={"naive-torch": 16}, device="cpu"))
    out = str(tmp_path)
    assert cli.main(["--preset", "capped", "--out", out, "--no-progress", "--no-plots"]) == 0
    _, rows, _ = _read(out)
    assert [(r["Nk"], r["causal"], r["status"]) for r in rows] == [("16", "True", "ok"), ("32", "True", "skipped")]
    assert "N <= 16 only" in rows[1]["reason"]


def test_sweep_needs_a_preset_with_configs(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(CPU + ["--sweep", "--out", os.devnull + "-never-written"])
    assert info.value.code == 2 and "--sweep" in capsys.readouterr().err


def test_config_sweep_passes_configs_in_and_writes_no_table(monkeypatch):
    """The tile-config sweep calls the config-taking forward with each candidate and records the best per D;
    the library's config tables stay as they were."""
    import copy
    import types

    from benchmarks import presets

    _fake_timers(monkeypatch)
    seen = []
    specs = types.ModuleType("flash_attention_cuda.launch_specs")  # stand-ins: nothing CUDA runs here
    specs.MMA_CONFIGS = {64: (64, 4, 2), 128: (128, 8, 1)}
    specs.WGMMA_CONFIGS = {64: (64, 2), 128: (128, 2)}
    launcher = types.ModuleType("flash_attention_cuda.launcher")

    def forward_with_config(q, k, v, *, kernel, config, causal=False, softmax_scale=None, return_lse=False):
        seen.append((kernel, q.shape[-1], config, causal))
        return q

    launcher.forward_with_config = forward_with_config
    monkeypatch.setitem(sys.modules, "flash_attention_cuda.launch_specs", specs)
    monkeypatch.setitem(sys.modules, "flash_attention_cuda.launcher", launcher)
    before = copy.deepcopy((specs.MMA_CONFIGS, specs.WGMMA_CONFIGS))
    result = presets.config_sweep(("mma", "wgmma"), ((1, 1, 64), (1, 1, 128)), "cpu", log=lambda text: None)
    assert (specs.MMA_CONFIGS, specs.WGMMA_CONFIGS) == before
    expected = [(kernel, D, c, causal) for kernel in ("mma", "wgmma")
                for D, cands in presets.CONFIG_CANDIDATES[kernel].items() for c in cands for causal in (False, True)]
    assert seen == expected
    assert set(result["best"]) == {"mma", "wgmma"} and set(result["best"]["mma"]) == {"64", "128"}
    assert all(r["ms"] == 4.0 for r in result["results"])  # full + causal, 2.0 ms each from the stand-in timer
    assert result["library"]["mma"] == {"64": [64, 4, 2], "128": [128, 8, 1]}
    # wgmma-ws's candidates go to the same config-taking forward, and its table is recorded, not written
    specs.WGMMA_WS_CONFIGS = {64: (128, 3, 2), 128: (128, 2, 2)}
    seen.clear()
    result = presets.config_sweep(("wgmma-ws",), ((1, 1, 128),), "cpu", log=lambda text: None)
    assert seen == [("wgmma-ws", 128, c, causal) for c in presets.CONFIG_CANDIDATES["wgmma-ws"][128]
                    for causal in (False, True)]
    assert result["library"]["wgmma-ws"] == {"64": [128, 3, 2], "128": [128, 2, 2]}
    assert specs.WGMMA_WS_CONFIGS == {64: (128, 3, 2), 128: (128, 2, 2)}


def _benchmark_sources():
    import ast
    import glob

    for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))):
        with open(path) as f:
            yield os.path.basename(path), ast.parse(f.read())


def test_no_module_writes_into_config_tables():
    """No benchmark module assigns to a *CONFIG* table or attribute (the sweep passes configs in)."""
    import ast

    def config_named(node):
        while isinstance(node, (ast.Subscript, ast.Attribute)):
            if isinstance(node, ast.Attribute) and "CONFIG" in node.attr.upper():
                return True
            node = node.value
        return isinstance(node, ast.Name) and "CONFIG" in node.id.upper() and node.id.isupper()

    for name, tree in _benchmark_sources():
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if isinstance(t, (ast.Subscript, ast.Attribute)):
                    assert not config_named(t), f"benchmarks/{name}:{node.lineno} writes into a config table"
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr":
                assert False, f"benchmarks/{name}:{node.lineno} calls setattr"


def test_one_timer_and_one_sdpa_pin():
    """do_bench is called only in measure.py, and SDPA's kernel is pinned only in targets.py."""
    import ast

    for name, tree in _benchmark_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if fn in ("do_bench", "Event", "elapsed_time"):
                    assert name == "measure.py", f"benchmarks/{name}:{node.lineno} times with {fn}"
                if fn == "sdpa_kernel":
                    assert name == "targets.py", f"benchmarks/{name}:{node.lineno} pins an SDPA kernel"


# ------------------------------------------------------------------------------------ on a GPU
SUMMARIES = {"cuda-ladder": "cuda_ladder.json", "cuda-backward": "cuda_backward.json",
             "triton-vs-fa2": "triton_vs_fa2.json", "launch-overhead": "launch_overhead.txt"}


@pytest.mark.parametrize("name", list(SUMMARIES))
def test_preset_runs_on_a_gpu(name, tmp_path):
    """Each preset at a small size on the GPU (with its tile-config sweep where it has one): no case fails,
    the tensor-core and Triton outputs agree with FlashAttention-2's, and the summary holds the timed rows."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    from benchmarks import presets

    out = str(tmp_path)
    argv = ["--preset", name, "--n", "256", "-b", "1", "--heads", "2", "--out", out, "--no-progress", "--no-plots"]
    if presets.PRESETS[name].config_sweep:
        argv.append("--sweep")
    assert cli.main(argv) == 0
    _, rows, doc = _read(out)
    assert not [r for r in rows if r["status"] == "error"], rows
    ok = {r["backend"] for r in rows if r["status"] == "ok"}
    assert "sdpa-flash" in ok and ok & {"cuda-mma", "triton"}, rows
    for r in rows:
        if r["status"] == "ok" and r["ref"]:
            assert float(r["max_abs_vs_ref"]) < 5e-2, r
    path = os.path.join(out, SUMMARIES[name])
    assert os.path.getsize(path) > 0
    if name == "launch-overhead":
        return
    with open(path) as f:
        summary = json.load(f)
    assert summary["rows"] and all(r["fa2_tflops"] > 0 for r in summary["rows"])
    if presets.PRESETS[name].config_sweep:
        sweep = doc["config_sweep"]
        assert sweep["best"] and any(r["ms"] for r in sweep["results"]), sweep


def test_preset_summaries_are_what_docs_tables_reads():
    """The presets' summary files hold the fields tools/docs_tables.py builds the docs' tables from."""
    import importlib.util

    from benchmarks import presets

    spec = importlib.util.spec_from_file_location("docs_tables", os.path.join(ROOT, "tools", "docs_tables.py"))
    dt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dt)

    def long_rows(name, mode_times):
        pr = presets.PRESETS[name]
        rows = []
        for (mode, causal) in pr.combos:
            for B, H, D in pr.shapes:
                for N in (1024, 2048, 16384):
                    for i, backend in enumerate(pr.backends):
                        cap = pr.max_n.get(backend)
                        ok = cap is None or N <= cap
                        rows.append(dict(backend=backend, dtype=pr.dtypes[backend][0], mode=mode, causal=causal, B=B, H=H,
                                         D=D, Nq=N, Nk=N, status="ok" if ok else "skipped", time_ms=mode_times * (i + 1),
                                         tflops=100.0 / (i + 1), gflop=1.0, timer="triton.testing.do_bench",
                                         max_abs_vs_ref=1e-3 if i else None, max_abs_each=[1e-3, 2e-3, 3e-3] if i else None))
        return rows

    ctx = dict(meta={"command": "python -m benchmarks --preset ..."})
    got = {}
    for name, fname in (("cuda-ladder", "cuda_ladder.json"), ("cuda-backward", "cuda_backward.json"),
                        ("triton-vs-fa2", "triton_vs_fa2.json")):
        pr = presets.PRESETS[name]
        got[name] = json.loads(pr.summary(long_rows(name, 1.0), dict(ctx, preset=pr))[fname])

    class Recorded(dt.Results):
        def ladder(self):
            return got["cuda-ladder"]["rows"]

        def backward(self):
            return got["cuda-backward"]["rows"]

        def triton(self):
            return got["triton-vs-fa2"]["rows"]

    R = Recorded(ROOT)
    for fn in (dt.t_cuda_ladder, dt.t_cuda_ladder_summary, dt.t_cuda_backward, dt.t_triton_perf, dt.t_fa2_forward):
        assert fn(R, "en").count("\n") > 2, fn.__name__
    assert dt.ladder_stats(R)["n"] == 12 and dt.backward_stats(R)["ratio"] and dt.triton_stats(R)["fwd_ratio"]
    assert got["cuda-backward"]["rows"][0]["max_abs_vs_fa2"] == {"dq": 1e-3, "dk": 2e-3, "dv": 3e-3}


def test_kernel_breakdown_sums_each_kernel_per_call():
    """tools/kernel_breakdown.py: profiler averages -> (kernel, µs per call, launches per call), longest first,
    host-only rows dropped; the markdown names every backend and its total; no GPU: a clear exit."""
    from types import SimpleNamespace as E

    from tools import kernel_breakdown as kb

    events = [E(key="void wgmma_bwd_ws<128, 64, 2, false, false>(tma::TmaMap, ...)", self_device_time_total=2000.0,
                count=10), E(key="aten::empty", self_device_time_total=0.0, count=30),
              E(key="void mma_bwd_preprocess<128, false>(unsigned short const*)", self_device_time_total=500.0,
                count=10)]
    rows = kb.kernel_rows(events, calls=10)
    assert rows == [(events[0].key, 200.0, 1.0), (events[2].key, 50.0, 1.0)]
    assert kb.short_name(events[0].key) == "wgmma_bwd_ws<128, 64, 2, false, false>"
    text = kb.markdown([dict(title="full, backward", B=4, Hq=16, Hk=16, N=4096, D=128, dtype="float16",
                             backends=[dict(name="cuda-wgmma-ws", kernels=rows, total_us=250.0),
                                       dict(name="flex", error="NotImplementedError: no")])],
                       dict(gpu="H100", git_commit="abc", command="python tools/kernel_breakdown.py --out x"))
    assert "| cuda-wgmma-ws | `wgmma_bwd_ws<128, 64, 2, false, false>` | 1 | 200.0 |" in text
    assert "**250.0**" in text and "| flex | not run: NotImplementedError: no | | |" in text
    assert [c[0] for c in kb.cases()][0] == "window (256, 256), backward"
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="kernel_breakdown: needs a CUDA GPU"):
            kb.main(["--out", "/tmp/unused"])


def test_ncu_sass_regions_opcodes_reads_the_largest_kernel(tmp_path):
    """tools/ncu_sass_regions.py --opcodes: of an Nsight Compute source export holding several kernels' sections,
    the largest kernel's instructions by opcode (predicates and modifiers dropped), and the integer instructions
    in front of each kind of memory or tensor instruction charged to it."""
    from tools import ncu_sass_regions as nsr

    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    small = [["0x0", "LDC R1, c[0x0][0x28]", "1", "8"]]
    big = [["0x0", "IMAD R2, R3, 0x80, R4", "2", "100"], ["0x10", "LOP3.LUT R2, R2, 0x10, RZ, 0x3c, !PT", "1", "100"],
           ["0x20", "STS [R2], R5", "3", "100"], ["0x30", "@!P0 IMAD.MOV.U32 R6, RZ, RZ, R7", "0", "50"],
           ["0x40", "REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU desc[UR4][R8.64], R10", "4", "50"],
           ["0x50", "HMMA.16816.F32 R12, R16, R20, R12", "10", "400"]]
    path = tmp_path / "source.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        for name, rows in (("small_kernel", small), ("big_kernel", big)):
            w.writerow(["Kernel Name", name])
            w.writerow(hdr)
            w.writerows(rows)
    text = "\n".join(nsr.opcodes(str(path)))
    assert "big_kernel" in text and "small_kernel" not in text
    assert "instructions executed: 800" in text
    lines = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln.strip()}
    assert lines["IMAD"][1] == "150" and lines["HMMA"][1] == "400"  # IMAD and IMAD.MOV (predicated) together
    charged = {ln.split()[0]: ln.split()[1:] for ln in text.split("before      integer")[1].splitlines()[1:]}
    assert charged == {"STS": ["200", "100"], "REDG": ["50", "50"]}  # IMAD + LOP3 before STS; the IMAD.MOV before REDG
    assert "6 SASS instructions" in nsr.regions(str(path))[0]  # the region report reads the same kernel


def test_sass_summary_reads_both_disassemblers():
    """tools/sass_summary.py splits cuobjdump's and nvdisasm's listings into kernels alike, counts opcodes without
    their modifiers or predicates, and pairs each kernel with nvcc's registers and spills; an nvdisasm that is not
    there is reported, not replaced."""
    from tools import sass_summary as ss

    body = ("        /*0000*/                   LDC R1, c[0x0][0x28] ;\n"
            "        /*0010*/              @!P0 HGMMA.64x128x16.F32 R24, gdesc[UR16], RZ, !UPT ;\n"
            "        /*0020*/               @PT HGMMA.64x128x16.F32 R24, gdesc[UR16], R24, gsb0 ;\n"
            "        /*0030*/                   ATOMG.E.ADD.STRONG.GPU PT, R2, desc[UR32][R2.64], R5 ;\n")
    cuobjdump = f"\n\tcode for sm_90a\n\t\tFunction : _Z1ai\n{body}\t\tFunction : _Z1bi\n{body[:60]}\n"
    nvdisasm = (f"//--------------------- .text._Z1ai --------------------------\n{body}"
                f"//--------------------- .text._Z1bi --------------------------\n{body[:60]}\n")
    for listing in (cuobjdump, nvdisasm):
        kernels = ss.split_functions(listing)
        assert [name for name, _ in kernels] == ["_Z1ai", "_Z1bi"]
        assert ss.count_ops(kernels[0][1]) == {"LDC": 1, "HGMMA": 2, "ATOMG": 1}
        assert ss.count_ops(kernels[1][1]) == {"LDC": 1}
    ptxas = ("ptxas info    : Compiling entry function '_Z1ai' for 'sm_90a'\n"
             "ptxas info    : Function properties for _Z1ai\n"
             "    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
             "ptxas info    : Used 168 registers, used 16 barriers, 8 bytes cumulative stack size\n")
    assert ss.resource_usage(ptxas) == {"_Z1ai": "168 registers, 12 bytes spill stores, 16 bytes spill loads"}
    assert ss.disassembler("/no/such/nvdisasm") is None  # a path that is not there: none, not a silent fallback


def test_sass_summary_counts_philox_multiplies():
    """tools/sass_summary.py --philox: only the integer multiplies whose immediate is one of Philox's two round
    multipliers (as SASS writes them, signed) count, by multiplier; the evaluations are the B-products / 9."""
    from tools import sass_summary as ss

    one = ("        /*0000*/                   IMAD.WIDE.U32 R2, R4, -0x2daee0ad, RZ ;\n"
           "        /*0010*/                   IMAD.HI.U32 R5, R6, -0x326172a9, RZ ;\n"
           "        /*0020*/               @P0 IMAD R7, R8, -0x326172a9, RZ ;\n"
           "        /*0030*/                   IMAD.WIDE.U32 R10, R11, 0x4, R12 ;\n"          # an address: not counted
           "        /*0040*/                   FMUL R13, R13, 4.6566125955216364218e-10 ;\n")
    evals, muls = ss.philox_counts(one)
    assert evals == 2 / 9 and muls == {"A": 1, "B": 2}
    b_rounds = "        /*0050*/                   IMAD.WIDE.U32 R2, R4, -0x326172a9, RZ ;\n" * 9
    assert ss.philox_counts(b_rounds * 3) == (3, {"B": 27})
    assert [int(m, 16) % 2**32 for m in ss.PHILOX_MULTIPLIERS] == [0xD2511F53, 0xCD9E8D57]


def test_sass_summary_overlap_follows_the_control_flow():
    """tools/sass_summary.py --overlap: a batch of wgmma is in flight from its last HGMMA (gsb0) until a
    WARPGROUP.DEPBAR lets at most N batches run; an exp2 counts as beside a product on every path only if each path
    to it (the loop's back edge included) has one in flight, and on some path if one has."""
    from tools import sass_summary as ss

    sass = ("//--------------------- .text._Z1ki    --------------------------\n"
            "        /*0000*/                   HGMMA.64x128x16.F32 R24, gdesc[UR16], RZ, !UPT, gsb0 ;\n"
            "        /*0010*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
            "        /*0020*/                   MUFU.EX2 R1, R1 ;\n"                  # S_i0's softmax: nothing in flight
            ".L_x_1:\n"
            "        /*0030*/                   HGMMA.64x128x16.F32 R88, gdesc[UR16], RZ, !UPT ;\n"
            "        /*0040*/                   HGMMA.64x128x16.F32 R88, gdesc[UR20], R88, gsb0 ;\n"
            "        /*0050*/                   HGMMA.64x128x16.F32 R24, R152, gdesc[UR8].tnspB, R24, gsb0 ;\n"
            "        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;\n"
            "        /*0070*/                   MUFU.EX2 R2, R2 ;\n"                  # P_ij V_j in flight on every path
            "        /*0074*/                   IMAD.WIDE.U32 R6, R4, -0x326172a9, RZ ;\n"  # a Philox product, too
            "        /*0080*/               @P0 BRA `(.L_x_2) ;\n"
            "        /*0090*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
            ".L_x_2:\n"
            "        /*00a0*/                   MUFU.EX2 R3, R3 ;\n"                  # on the branch's path only
            "        /*00a4*/                   IMAD.WIDE.U32 R8, R4, -0x2daee0ad, RZ ;\n"  # not on every path
            "        /*00b0*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\n"
            "        /*00c0*/               @P1 BRA `(.L_x_1) ;\n"
            "        /*00d0*/                   EXIT ;\n"
            ".L_x_3:\n"
            "        /*00e0*/                   MUFU.EX2 R4, R4 ;\n"                  # no path reaches it
            "        /*00f0*/                   BRA `(.L_x_3);\n")
    (name, text), = ss.split_functions(sass)  # (a short name: nvdisasm pads its banner with spaces)
    assert name == "_Z1ki"
    assert ss.wgmma_overlap(text) == {"hgmma": 4, "waits": {0: 3, 1: 1}, "ex2": 4, "ex2_in_flight": 1,
                                      "ex2_some_path": 2, "philox": 2, "philox_in_flight": 1}
    row = ss.overlap_row("x.cu", "k", text)
    assert row == "| x.cu | k | 4 | ≤0: 3, ≤1: 1 | 4 | 1 (25%) | 2 (50%) |"
    assert ss.overlap_row("x.cu", "k", text, philox=True) == "| x.cu | k | 2 | 1 (50%) |"
    assert ss.overlap_row("x.cu", "k", "        /*0000*/                   MUFU.EX2 R1, R1 ;\n") is None  # no wgmma
    for argv in (["--overlap", "--philox-table"], ["--overlap", "--philox", "--triton"], ["--match", "wgmma"]):
        with pytest.raises(SystemExit):
            ss.main(argv)


def test_ws_block_order_forces_each_order_and_setting():
    """tools/ws_block_order.py forces each order through launch_specs.WGMMA_WS_BACKWARD_ORDER (the kernel's
    tile_major argument) and sweeps the split and order rules' settings (--set); its table; bad options; no GPU:
    a clear exit."""
    from flash_attention_cuda import launch_specs
    from tools import ws_block_order as wbo

    P = launch_specs.Problem
    mqa = P(1, 32, 16384, 16384, 128, "float16", 0.1, (-1, 0), 8)
    try:
        for order, tile_major in (("grid", 0), ("tile-major", 1)):
            launch_specs.WGMMA_WS_BACKWARD_ORDER = order
            launch_specs.clear_caches()
            assert launch_specs.wgmma_bwd_ws(mqa).scalars[-1] == ("tile_major", tile_major)
        launch_specs.WGMMA_WS_BACKWARD_ORDER = "snake"
        launch_specs.clear_caches()
        with pytest.raises(ValueError, match="WGMMA_WS_BACKWARD_ORDER must be None, 'grid' or 'tile-major'"):
            launch_specs.ws_backward_tile_major(mqa)
    finally:
        launch_specs.WGMMA_WS_BACKWARD_ORDER = None
        launch_specs.clear_caches()
    row = dict(B=2, Hq=32, Hk=8, N=4096, D=128, causal=True, picks="tile-major", splits=1,
               ms={"grid": 2.0, "tile-major": 1.6, "grid MORE_BLOCKS=1024": 1.9, "sdpa-cudnn": 1.7})
    table = wbo.markdown([row], dict(gpu="H100", torch="2", git_commit="abc", settings={"WGMMA_WS_BACKWARD_MIN_ROWS": 9},
                                     command="python tools/ws_block_order.py"))
    assert "| grid ms | tile-major ms | grid MORE_BLOCKS=1024 ms | sdpa-cudnn ms | x | kernel picks |" in table
    assert "| 2 | 32 | 8 | 4096 | 128 | yes | 1 | 2.000 | 1.600 | 1.900 | 1.700 | 1.25 | tile-major |" in table
    assert "library's settings (MIN_ROWS=9)" in table
    assert wbo.parse_cases("1,32,8,16384,128,1; 2,16,16,4096,64,0") == [(1, 32, 8, 16384, 128, True),
                                                                       (2, 16, 16, 4096, 64, False)]
    for bad, match in (("1,32,8,16384,128", "must be B,Hq,Hk,N,D,causal"), ("1,32,5,64,64,0", "not a multiple")):
        with pytest.raises(ValueError, match=match):
            wbo.parse_cases(bad)
    assert wbo.parse_settings("WGMMA_WS_BACKWARD_MORE_BLOCKS=1024,WGMMA_WS_BACKWARD_MIN_ROWS=1") == {
        "WGMMA_WS_BACKWARD_MORE_BLOCKS": 1024, "WGMMA_WS_BACKWARD_MIN_ROWS": 1}
    for bad in ("MORE_BLOCKS=1", "WGMMA_WS_BACKWARD_MIN_ROWS=x", ","):
        with pytest.raises(ValueError, match="ws_block_order: --set"):
            wbo.parse_settings(bad)
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="ws_block_order: needs a CUDA GPU"):
            wbo.main(["--out", "/tmp/unused"])


@pytest.mark.parametrize("order", ["run", "case"])
def test_rounds_time_the_backends_of_a_case_in_turn(tmp_path, monkeypatch, order):
    """--rounds 3: every backend of a case is timed once a round, in turn, each timing gets a third of the budget,
    and a row keeps the median of its rounds and each round's time. --round-order run (the default) takes round 1
    of every case, then round 2 of every case, ...: A16 B16 A32 B32, three times over; --round-order case takes a
    case's rounds back to back: A16 B16 A16 B16 A16 B16, then N = 32."""
    from benchmarks import measure

    seen = []

    def fake_cpu(fn, *, repeats, budget_s, turns=1):
        seen.append(turns)
        fn()
        ms = float(len(seen))  # the k-th timing reads k ms
        return ms, ms - 0.5, ms + 0.5, 1, "time.perf_counter"

    monkeypatch.setattr(measure, "time_cpu", fake_cpu)
    out = str(tmp_path)
    argv = CPU + ["--backends", "numpy-v2,naive-torch", "--dtype", "float32", "--rounds", "3", "--out", out,
                  "--no-plots", "-b", "1", "--heads", "1", "-d", "16", "--n", "16,32", "--no-progress"]
    assert cli.main(argv + (["--round-order", "case"] if order == "case" else [])) == 0
    assert seen == [3] * 12
    header, rows, doc = _read(out)
    got = {(r["backend"], r["Nq"]): r for r in doc["results"]}
    expected = ({("numpy-v2", 16): [1.0, 5.0, 9.0], ("naive-torch", 16): [2.0, 6.0, 10.0],
                 ("numpy-v2", 32): [3.0, 7.0, 11.0], ("naive-torch", 32): [4.0, 8.0, 12.0]} if order == "run" else
                {("numpy-v2", 16): [1.0, 3.0, 5.0], ("naive-torch", 16): [2.0, 4.0, 6.0],
                 ("numpy-v2", 32): [7.0, 9.0, 11.0], ("naive-torch", 32): [8.0, 10.0, 12.0]})
    assert {k: r["round_ms"] for k, r in got.items()} == expected
    assert all(r["time_ms"] == expected[k][1] for k, r in got.items())
    first, last = expected[("naive-torch", 16)][0], expected[("naive-torch", 16)][-1]
    assert got[("naive-torch", 16)]["time_lo_ms"] == first - 0.5 and got[("naive-torch", 16)]["time_hi_ms"] == last + 0.5
    how = {"run": "one per pass over the whole run", "case": "taken in turn, back to back"}[order]
    assert all(r["timer"] == f"time.perf_counter; the median of 3 rounds, {how}" for r in doc["results"])
    assert doc["meta"]["rounds"] == 3 and doc["config"]["rounds"] == 3 and doc["meta"]["round_order"] == order
    assert {(r["backend"], int(r["Nq"])): r["round_ms"] for r in rows} == {
        k: " ".join(str(x) for x in v) for k, v in expected.items()}
    with open(os.path.join(out, "cases.jsonl")) as f:  # one line per case, in the order of round 1
        lines = [json.loads(line) for line in f]
    assert [(r["backend"], r["Nq"]) for r in lines] == [("numpy-v2", 16), ("naive-torch", 16), ("numpy-v2", 32),
                                                      ("naive-torch", 32)]
    assert [r["round_ms"] for r in lines] == [expected[(r["backend"], r["Nq"])] for r in lines]


def test_turn_order_rotate_starts_each_round_one_backend_later(tmp_path, monkeypatch):
    """--turn-order rotate: round 1 in the given order (the reference first), round 2 one backend later, round 3
    two later (with two backends, as round 1): A16 B16 A32 B32, B16 A16 B32 A32, A16 B16 A32 B32. Recorded in
    results.json's meta."""
    from benchmarks import measure

    seen = []

    def fake_cpu(fn, *, repeats, budget_s, turns=1):
        seen.append(turns)
        ms = float(len(seen))  # the k-th timing reads k ms
        return ms, ms, ms, 1, "time.perf_counter"

    monkeypatch.setattr(measure, "time_cpu", fake_cpu)
    out = str(tmp_path)
    assert cli.main(CPU + ["--backends", "numpy-v2,naive-torch", "--dtype", "float32", "--rounds", "3", "--out", out,
                           "--no-plots", "-b", "1", "--heads", "1", "-d", "16", "--n", "16,32", "--no-progress",
                           "--turn-order", "rotate"]) == 0
    _, _, doc = _read(out)
    got = {(r["backend"], r["Nq"]): r["round_ms"] for r in doc["results"]}
    assert got == {("numpy-v2", 16): [1.0, 6.0, 9.0], ("naive-torch", 16): [2.0, 5.0, 10.0],
                   ("numpy-v2", 32): [3.0, 8.0, 11.0], ("naive-torch", 32): [4.0, 7.0, 12.0]}
    assert doc["meta"]["turn_order"] == "rotate"


def test_a_run_cut_short_in_a_later_round_keeps_the_rounds_it_took(tmp_path, monkeypatch):
    """--round-order run: cases.jsonl is written again after every case of a later round, each row with the rounds
    it has so far, so a run killed in round 2 leaves every case with round 1 and the first cases with round 2."""
    from benchmarks import measure

    seen = []

    def fake_cpu(fn, *, repeats, budget_s, turns=1):
        seen.append(1)
        if len(seen) == 7:  # round 2 of the second case (N = 32): as if the run were killed there
            raise KeyboardInterrupt
        return float(len(seen)), float(len(seen)), float(len(seen)), 1, "time.perf_counter"

    monkeypatch.setattr(measure, "time_cpu", fake_cpu)
    out = str(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        cli.main(CPU + ["--backends", "numpy-v2,naive-torch", "--dtype", "float32", "--rounds", "3", "--out", out,
                        "--no-plots", "-b", "1", "--heads", "1", "-d", "16", "--n", "16,32", "--no-progress"])
    with open(os.path.join(out, "cases.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert [r["round_ms"] for r in lines] == [[1.0, 5.0], [2.0, 6.0], [3.0], [4.0]]
    assert [r["time_ms"] for r in lines] == [3.0, 4.0, 3.0, 4.0]
    assert lines[0]["timer"] == "time.perf_counter; the median of 2 rounds, one per pass over the whole run"
    assert lines[2]["timer"] == "time.perf_counter"


def test_a_failure_in_a_later_round_makes_the_row_an_error(tmp_path, monkeypatch):
    from benchmarks import measure

    count = []

    def fake_cpu(fn, *, repeats, budget_s, turns=1):
        count.append(1)
        if len(count) == 4:  # naive-torch's second round
            raise RuntimeError("the device went away")
        return 1.0, 1.0, 1.0, 1, "time.perf_counter"

    monkeypatch.setattr(measure, "time_cpu", fake_cpu)
    out = str(tmp_path)
    assert cli.main(CPU + ["--backends", "numpy-v2,naive-torch", "--dtype", "float32", "--rounds", "2", "--out", out,
                           "--no-plots", "-b", "1", "--heads", "1", "-d", "16", "--n", "16", "--no-progress"]) == 0
    got = {r["backend"]: r for r in _read(out)[2]["results"]}
    assert got["numpy-v2"]["status"] == "ok" and got["numpy-v2"]["round_ms"] == [1.0, 1.0]
    assert got["naive-torch"]["status"] == "error" and got["naive-torch"]["time_ms"] is None
    assert got["naive-torch"]["reason"].startswith("round 2: ") and "the device went away" in got["naive-torch"]["reason"]


def test_the_hopper_preset_times_in_three_rounds(capsys):
    assert cli.main(["--preset", "hopper", "--dry-run"]) == 0
    assert "timer device in 3 rounds" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(CPU + ["--rounds", "0", "--dry-run"])


def test_sustained_power_reads_nvidia_smi_samples_per_phase():
    """tools/sustained_power.py: nvidia-smi's CSV lines parse (bad lines skipped), each phase averages the samples
    inside it after its settling time, and the table keeps the median of the rounds with TFLOP/s per GHz."""
    from tools import sustained_power as sp

    text = "\n".join(["2026/11/28 10:00:00.000, 1980, 120.5, 40",
                      "2026/11/28 10:00:01.000, 1600, 660.0, 60",
                      "2026/11/28 10:00:02.000, 1500, 680.0, 62",
                      "[N/A], 1, 2, 3", "2026/11/28 10:00:03.0"])
    samples = sp.parse_samples(text)
    assert [s[1] for s in samples] == [1980.0, 1600.0, 1500.0]
    t0 = samples[0][0]
    st = sp.phase_stats(samples, t0, t0 + 2.5)  # the first sample falls in the settling time
    assert st["samples"] == 2 and st["sm_mhz"] == 1550.0 and st["power_w"] == 670.0 and st["temp_c"] == 62.0
    assert sp.phase_stats(samples, t0 + 10, t0 + 11)["sm_mhz"] is None
    rows = [dict(dtype="float16", B=4, H=16, N=16384, D=128, causal=False, backend="cuda-wgmma-ws", tflops=t,
                 sm_mhz=m, power_w=660.0) for t, m in ((580.0, 1600.0), (600.0, 1500.0), (590.0, 1550.0))]
    md = sp.table(rows, "# x")
    assert "| float16 | 4 | 16 | 16384 | 128 | no | cuda-wgmma-ws | 590 | 1550 | 660 | 381 |" in md


def test_public_key_probe_times_this_checkout_and_a_revision(capsys):
    """tools/public_key_probe.py runs without a GPU: the public call's key and lookup, here and at HEAD."""
    from tools import public_key_probe as pkp

    assert pkp.main(["--against", "HEAD", "--rounds", "1", "--number", "200"]) == 0
    out = capsys.readouterr().out
    assert "this checkout" in out and "at HEAD" in out
    with pytest.raises(SystemExit):
        pkp.main(["--rounds", "0"])


def test_mma_persistent_ab_refuses_without_a_gpu_or_rounds(tmp_path, capsys, monkeypatch):
    """tools/mma_persistent_ab.py: on a machine without a CUDA GPU (here made to look like one, also on a GPU) it says
    so (argparse's error, exit 2), and it refuses --rounds 0; its cases time the persistent configs (D 96 and 128)
    and D = 64 as the control."""
    import torch

    from tools import mma_persistent_ab as ab

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    for argv, msg in ((["--out", str(tmp_path)], "needs a CUDA GPU"), (["--out", str(tmp_path), "--rounds", "0"],
                                                                        "--rounds must be at least 1, got 0")):
        with pytest.raises(SystemExit) as exc:
            ab.main(argv)
        assert exc.value.code == 2 and msg in capsys.readouterr().err
    assert {c[0] for c in ab.CASES} == {64, 96, 128} and ab.NAMES == ("off", "on", "sdpa-flash")


def test_ncu_profiles_are_well_formed():
    """tools/ncu_profile.py: every profile reads through spec() into a known backend, a mode, a dtype, positive sizes
    and a K/V head count that divides H (the GQA pair included), so that a GPU run does not stop on a bad entry."""
    from tools import ncu_profile as ncu

    backends = {"cuda-naive", "cuda-tiled", "cuda-mma", "cuda-wgmma", "cuda-wgmma-ws", "triton", "sdpa-flash",
                "sdpa-cudnn", "flex"}
    for label in ncu.PROFILES:
        sp = ncu.spec(label)
        assert sp["backend"] in backends and sp["mode"] in ("fwd", "bwd"), label
        assert sp["dtype"] in ("float16", "bfloat16", "float32"), label
        assert all(isinstance(sp[k], int) and sp[k] > 0 for k in ("B", "H", "N", "D", "kv_heads")), label
        assert sp["H"] % sp["kv_heads"] == 0 and 0.0 <= sp["dropout_p"] < 1.0, label
        assert sp["window"] is None or len(sp["window"]) == 2, label
    assert ncu.spec("sdpa-cudnn-bwd-d128-gqa-causal")["kv_heads"] == 8
    assert ncu.spec("cuda-mma-fwd-d128")["kv_heads"] == 16 and ncu.spec("cuda-mma-fwd-d128")["window"] is None


def test_cold_warm_refuses_bad_options_and_runs_on_a_gpu(tmp_path, capsys):
    """tools/cold_warm.py: bad --cases, --rounds or --backends get argparse's error (exit 2); without a CUDA GPU it
    says so; on a GPU it times a tiny case both ways and writes its table, cold and warm for every backend named."""
    import torch

    from tools import cold_warm as cw

    for argv, msg in ((["--rounds", "0"], "--rounds must be at least 1, got 0"),
                      (["--cases", "4x16"], "--cases takes BxHxNxD"), (["--cases", "4x16x0x64"], "--cases takes")):
        with pytest.raises(SystemExit) as exc:
            cw.main(["--out", str(tmp_path)] + argv)
        assert exc.value.code == 2 and msg in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exc:
            cw.main(["--out", str(tmp_path)])
        assert exc.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
        return
    with pytest.raises(SystemExit):
        cw.main(["--out", str(tmp_path), "--backends", "cuda-mma,nope"])
    assert "unknown ['nope']" in capsys.readouterr().err
    assert cw.main(["--out", str(tmp_path), "--cases", "1x2x128x64", "--rounds", "1", "--causal", "no"]) == 0
    doc = json.load(open(tmp_path / "cold_warm.json"))
    (row,) = doc["rows"]
    assert set(row["us"]) == {"cuda-mma", "sdpa-flash"} and all(t["cold"] > 0 and t["warm"] > 0
                                                                  for t in row["us"].values())
    assert "| 1 | 2 | 128 | 64 | no | cuda-mma |" in (tmp_path / "cold_warm.md").read_text()
