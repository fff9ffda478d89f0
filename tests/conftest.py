"""Test set-up shared by every test file.

* Without a CUDA GPU, Triton kernels run under its interpreter: TRITON_INTERPRET=1 must be set
  before any module with an ``@triton.jit`` kernel is imported, so it is set here, first
  (``flash_attention_triton.capabilities.use_interpreter_without_gpu``).
* Every accuracy check records its errors (``flash_attention_py.testing``); the summary at the end prints,
  per backend, device, dtype and quantity, the worst max-abs and relative-norm error against the float64
  reference.
* Every test starts on the CUDA rung's Python path (``fresh_launch_plans``): a C++ launch plan registered by an
  earlier test with the same key would otherwise answer a call before the test's patched settings or spies.
"""
import os
import sys

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

from flash_attention_triton.capabilities import use_interpreter_without_gpu  # noqa: E402

use_interpreter_without_gpu()

from flash_attention_py import testing  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_launch_plans():
    """Forget the CUDA rung's launch-plan keys before each test (flash_attention_cuda/launch_plans.py)."""
    plans = sys.modules.get("flash_attention_cuda.launch_plans")
    if plans is not None:
        plans.clear()
    yield


@pytest.fixture
def recorded_launches(monkeypatch):
    """The CUDA runtime without a GPU: kernels are recorded (kernel, grid, block, args, smem), not run; outputs
    stay empty (tests/test_cuda_kernels.py, tests/test_cuda_variants.py)."""
    from flash_attention_cuda import runtime

    calls = []

    class Kernel:
        max_dynamic_shared_size_bytes = 48 * 1024

        def __init__(self, source, name, device_id):
            self.source, self.name = source, name

    class Stream:
        device_id = 0
        handle = None  # no driver launch: every launch goes through run()

        def __init__(self, x):
            pass

        def run(self, kern, grid, block, args, shared_mem=0):
            calls.append((kern, grid, block, args, shared_mem))

    kernels = {}  # cached per instantiation, as the real runtime does (its shared-memory opt-in keys on the object)
    monkeypatch.setattr(runtime, "Stream", Stream)
    monkeypatch.setattr(runtime, "get_kernel",
                        lambda source, name, device_id: kernels.setdefault((source, name), Kernel(source, name, device_id)))
    monkeypatch.setattr(runtime, "as_cupy", runtime.ptr)  # CPU tensors: addresses instead of CuPy views
    monkeypatch.setattr(runtime, "device_cc", lambda x: (9, 0))
    monkeypatch.setattr(runtime, "device_sms", lambda x: 132)  # an H100's SMs: wgmma_ws_fwd's persistent grid
    monkeypatch.setattr(runtime, "_SMEM_SET", {})
    # tensor maps (wgmma_ws.cu) without a driver: (address, dims, byte strides, box), uncached
    monkeypatch.setattr(runtime, "encode_tensor_map", lambda address, dims, strides, box: (address, dims, strides, box))
    monkeypatch.setattr(runtime, "_MAPS", {})
    return calls


def pytest_sessionfinish(session):
    """A pytest-xdist worker hands its accuracy rows to the controller, which prints the one table."""
    if hasattr(session.config, "workeroutput"):
        import json

        session.config.workeroutput["fa_error_rows"] = json.dumps(testing.error_table())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):  # pytest-xdist's hook: a worker finished
    import json

    testing.merge_errors(json.loads(getattr(node, "workeroutput", {}).get("fa_error_rows", "[]")))


def pytest_terminal_summary(terminalreporter):
    rows = testing.error_table()
    if not rows:
        return
    terminalreporter.write_sep("=", "accuracy against the float64 reference (worst case per row)")
    head = f"{'backend':<12} {'device':<6} {'dtype':<9} {'quantity':<5} {'max-abs':>10} {'rel-norm':>10} {'naive max-abs':>13} {'cases':>6}"
    terminalreporter.write_line(head)
    for r in rows:
        terminalreporter.write_line(
            f"{r['backend']:<12} {r['device']:<6} {r['dtype']:<9} {r['quantity']:<5} {r['max_abs']:>10.2e} "
            f"{r['rel_norm']:>10.2e} {r['naive_max_abs']:>13.2e} {r['cases']:>6}"
        )
    path = os.environ.get("FA_ERROR_REPORT")
    if path:
        import json

        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
