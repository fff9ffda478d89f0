"""Timing and peak-memory measurement of one zero-argument callable: the benchmark's one timer.

Every timing of ``python -m benchmarks`` (the sweep, every preset, the tile-config sweep, forward and
backward alike) goes through :func:`time_call` (or :func:`time_once` for the single call that predicts a
case's cost), which picks one of the three below.

GPU: ``triton.testing.do_bench`` (warm-up, L2 flush, median with the 20th/80th percentiles) for calls
under 0.2 s; slower calls are timed a few times with ``torch.cuda.synchronize`` + ``time.perf_counter``
(do_bench would run them dozens of times). Peak memory: ``torch.cuda.max_memory_allocated`` after
``torch.cuda.reset_peak_memory_stats``, for one call.

CPU: ``time.perf_counter`` over repeats (median, min and max).

Host time per call (``timer='host'``): what the CPU spends issuing one call (checks, allocation, launch),
timed over back-to-back calls without a synchronisation between them, at a shape so small that the
GPU time does not matter.

Peak memory of one call, above what was
in use before it: ``tracemalloc`` for NumPy backends (NumPy reports its buffers to tracemalloc); for
torch tensors, which tracemalloc cannot see, the process's peak resident set size (Linux: VmHWM, reset
through /proc/self/clear_refs, after ``malloc_trim(0)`` hands freed memory back to the OS), minus the
resident size before the call.
"""
from __future__ import annotations

import ctypes
import math
import os
import statistics
import time
import tracemalloc

# ------------------------------------------------------------------------------------ helpers
_LIBC = None


def _malloc_trim():
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL("libc.so.6")
        _LIBC.malloc_trim(0)
    except Exception:
        pass


def _status_kb(field: str):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def has_nan(result) -> bool:
    """True if any floating array/tensor in ``result`` (nested tuples/lists allowed) holds a NaN."""
    if result is None:
        return False
    if isinstance(result, (tuple, list)):
        return any(has_nan(r) for r in result)
    try:
        import numpy as np

        if isinstance(result, np.ndarray):
            return result.dtype.kind == "f" and bool(np.isnan(result).any())
    except ImportError:
        pass
    try:
        import torch

        if isinstance(result, torch.Tensor):
            return result.is_floating_point() and bool(torch.isnan(result).any())
    except ImportError:
        pass
    return False


# ------------------------------------------------------------------------------------ memory
def peak_memory(fn, *, device: str, array: str):
    """Run ``fn`` once; return (peak_bytes, extra_bytes, method).

    peak_bytes: GPU: max_memory_allocated (all live tensors, inputs included); CPU: the same as
    extra_bytes (the CPU methods see only what is allocated after the start).
    extra_bytes: peak memory above what was in use just before the call.
    """
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        del out
        return peak, peak - before, "torch.cuda.max_memory_allocated"
    if array == "numpy":
        tracemalloc.start()
        try:
            out = fn()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        del out
        return peak, peak, "tracemalloc"
    _malloc_trim()
    if not _reset_hwm():
        return math.nan, math.nan, "unavailable (no /proc/self/clear_refs)"
    before = _status_kb("VmRSS")
    out = fn()
    hwm = _status_kb("VmHWM")
    del out
    if before is None or hwm is None:
        return math.nan, math.nan, "unavailable (no /proc/self/status)"
    extra = max(0, hwm - before) * 1024
    return extra, extra, "peak RSS delta (VmHWM)"


# ------------------------------------------------------------------------------------ time
def time_cpu(fn, *, repeats: int, budget_s: float, turns: int = 1):
    """Median, min, max (ms) and run count over up to ``repeats`` runs (at least min(3, repeats));
    stops early once ``budget_s`` seconds have been spent. turns > 1 (one of that many timings taken in turn,
    as in :func:`time_gpu`): ceil(repeats / turns) runs and budget_s / turns."""
    repeats, budget_s = -(-repeats // turns), budget_s / turns
    times = []
    start = time.perf_counter()
    for i in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        del out
        if i + 1 >= min(3, repeats) and time.perf_counter() - start > budget_s:
            break
    ms = [t * 1e3 for t in times]
    return statistics.median(ms), min(ms), max(ms), len(ms), "time.perf_counter"


def _sync_time(fn):
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del out
    return dt


# A call shorter than this is timed in SHORT_CALL_ROUNDS rounds of do_bench, and the median of their medians is
# its time. At such lengths a call's host time (Python, launches, autograd's device thread) is close to its GPU
# time, and one round can catch the host in a slow spell: the same backward kernel at N = 1024 read 0.75x and
# 1.42x FlashAttention-2 in two rounds a moment apart (docs/performance.md §7).
SHORT_CALL_MS = 1.0
SHORT_CALL_ROUNDS = 3
DO_BENCH_WARMUP_MS, DO_BENCH_REP_MS = 25, 100  # do_bench's warm-up and repetition times per timing


def time_gpu(fn, *, repeats: int, turns: int = 1):
    """Median, 20th and 80th percentile (ms), run count (None: do_bench's own) and timer name.

    The first call only estimates the time; when it is long it may have compiled or autotuned (Triton tunes a
    new length bucket on its first call), so a second call estimates again before the slow path is chosen.
    A call under SHORT_CALL_MS gets SHORT_CALL_ROUNDS rounds of do_bench: the median of their medians, the
    lowest 20th and the highest 80th percentile.

    turns > 1: this is one of ``turns`` timings of the same call taken in turn with other backends' (the
    benchmark's --rounds), which share one timing's budget: do_bench's warm-up and repetition times are divided
    by ``turns`` (a short call still gets its SHORT_CALL_ROUNDS rounds, each that much shorter: a slow spell of
    the host then has to last through most of them to move the median), a slow one ceil(runs / turns) runs.
    """
    est = _sync_time(fn)
    if est >= 0.2:
        est = _sync_time(fn)
    if est < 0.2:
        try:
            from triton.testing import do_bench
        except Exception:
            do_bench = None
        if do_bench is not None:
            warmup, rep = DO_BENCH_WARMUP_MS / turns, DO_BENCH_REP_MS / turns
            rounds = [do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2, 0.8])]
            if rounds[0][0] < SHORT_CALL_MS:
                rounds += [do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2, 0.8])
                           for _ in range(SHORT_CALL_ROUNDS - 1)]
            timer = "triton.testing.do_bench" + (f", median of {len(rounds)} rounds" if len(rounds) > 1 else "")
            return (float(statistics.median(r[0] for r in rounds)), float(min(r[1] for r in rounds)),
                    float(max(r[2] for r in rounds)), None, timer)
    n = max(1, min(repeats, 5)) if est >= 0.2 else max(3, repeats)
    ms = [_sync_time(fn) * 1e3 for _ in range(-(-n // turns))]
    return statistics.median(ms), min(ms), max(ms), n, "cuda.synchronize+perf_counter"


def _synchronize(device):
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def time_host(fn, *, device: str, calls: int = 2000, batches: int = 5, budget_s: float = 5.0):
    """Host time per call (ms): median, min and max over ``batches`` batches of back-to-back calls, each batch
    timed by ``time.perf_counter`` from the first call issued to the last, with no synchronisation inside it
    (the GPU catches up between batches). A batch holds ``calls`` calls, or fewer where one call is so slow
    (a CPU run) that all batches would take longer than ``budget_s``; up to 20 warm-up calls come first."""
    t0 = time.perf_counter()
    fn()
    _synchronize(device)
    one = time.perf_counter() - t0
    calls = max(1, min(calls, int(budget_s / batches / max(one, 1e-9))))
    for _ in range(min(20, calls)):
        fn()
    _synchronize(device)
    per_call = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e3)
        _synchronize(device)
    return (statistics.median(per_call), min(per_call), max(per_call), calls * batches,
            "host perf_counter per call (no sync)")


TIMERS = ("device", "host")


def time_call(fn, *, device: str, timer: str = "device", repeats: int = 5, budget_s: float = 1.0,
              host_calls: int = 2000, turns: int = 1):
    """Time ``fn`` the one way the benchmark does: returns (median ms, low ms, high ms, runs, timer name).

    timer='device': :func:`time_gpu` on a GPU (do_bench median, 20th/80th percentiles), :func:`time_cpu`
    on a CPU (median, min, max); timer='host': :func:`time_host` (host time per call). turns: this timing is
    one of that many of the same call taken in turn, which share one timing's budget (the device timers; the
    host timer takes its own batches every time).
    """
    if timer == "host":
        return time_host(fn, device=device, calls=host_calls)
    if timer != "device":
        raise ValueError(f"time_call: timer must be one of {TIMERS}, got {timer!r}")
    if device == "cuda":
        return time_gpu(fn, repeats=repeats, turns=turns)
    return time_cpu(fn, repeats=repeats, budget_s=budget_s, turns=turns)


def time_once(fn, *, device: str) -> float:
    """Seconds of one synchronised call of ``fn`` (the probe that predicts a case's cost)."""
    if device == "cuda":
        return _sync_time(fn)
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    del out
    return dt


def available_memory_bytes():
    """MemAvailable from /proc/meminfo (Linux), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def matmul_peak_tflops(dtype: str, *, n: int = 8192, tf32: bool = False):
    """Measured dense matmul throughput (TFLOP/s) on the GPU: an (n x n) @ (n x n) in ``dtype``.

    ``tf32=True`` (float32 only) lets the matmul run on tf32 tensor cores for the measurement; the
    setting is restored afterwards. float32 without it uses whatever torch's setting is (off by default).
    """
    import torch

    a = torch.randn(n, n, device="cuda", dtype=getattr(torch, dtype))
    b = torch.randn(n, n, device="cuda", dtype=getattr(torch, dtype))
    flag = torch.backends.cuda.matmul
    old = flag.allow_tf32 if tf32 else None
    try:
        if tf32:
            flag.allow_tf32 = True
        med, *_ = time_gpu(lambda: torch.matmul(a, b), repeats=10)
    finally:
        if tf32:
            flag.allow_tf32 = old
        del a, b
        torch.cuda.empty_cache()
    return 2.0 * n ** 3 / (med * 1e-3) / 1e12


def cpu_threads():
    try:
        import torch

        return torch.get_num_threads()
    except Exception:
        return os.cpu_count()


# ------------------------------------------------------------------------------------ CPU threads
_BLAS_SET = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
             "openblas_set_num_threads", "MKL_Set_Num_Threads")
_BLAS_GET = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
             "openblas_get_num_threads", "MKL_Get_Max_Threads")


def _numpy_blas():
    """(ctypes library, set function name, get function name) of NumPy's BLAS, or None."""
    import numpy as np

    np.ones((2, 2)) @ np.ones((2, 2))  # make sure the BLAS library is loaded
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "blas" in line.lower() and line.split()[-1].startswith("/")})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for s, g in zip(_BLAS_SET, _BLAS_GET):
            if hasattr(lib, s) and hasattr(lib, g):
                return lib, s, g
    return None


def set_threads(n: int) -> None:
    """Run torch's CPU ops and NumPy's BLAS (OpenBLAS, found through ctypes) on ``n`` threads."""
    try:
        import torch

        torch.set_num_threads(n)
    except Exception:
        pass
    blas = _numpy_blas()
    if blas is not None:
        lib, s, _ = blas
        getattr(lib, s)(ctypes.c_int(n))


def thread_info() -> dict:
    info = {}
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
    except Exception:
        pass
    try:
        blas = _numpy_blas()
        if blas is not None:
            lib, _, g = blas
            info["numpy_blas_threads"] = int(getattr(lib, g)())
    except Exception:
        pass
    return info


def restore_threads(info: dict) -> None:
    """Undo :func:`set_threads` with the counts :func:`thread_info` returned before."""
    try:
        import torch

        if "torch_threads" in info:
            torch.set_num_threads(info["torch_threads"])
    except Exception:
        pass
    blas = _numpy_blas()
    if blas is not None and "numpy_blas_threads" in info:
        lib, s, _ = blas
        getattr(lib, s)(ctypes.c_int(info["numpy_blas_threads"]))
