"""Compile the Triton kernels ahead of time for real GPUs (sm_80 and sm_90) on a machine without one.

The interpreter accepts what a GPU compiler may reject (``tl.dot`` with a dimension < 16, tiles over
the shared-memory limit); ``triton.compile`` with ``GPUTarget("cuda", 80 | 90, 32)`` runs the real
pipeline down to a cubin through ptxas, driver-free. It runs in a subprocess with TRITON_INTERPRET=0,
because this process's kernels were decorated for the interpreter.

CI compiles a representative set per target (``REPRESENTATIVE`` below: the largest tiles the
autotuner may pick at D = 128, the fixed small-problem configs at D = 256 in fp32 (the most shared
memory), D = 16 (the smallest dot), a padded D = 40, and on sm_90 a window bounded on both sides with
grouped-query attention and dropout).
Every variant: ``python tools/triton_aot.py --full --jobs 16`` (see docs/results/triton).
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "triton_aot.py")

SCRIPT = r"""
import json, runpy, sys
aot = runpy.run_path(sys.argv[1])
out = [aot["compile_variant"](*v) for v in aot["representative_variants"]()]
print("RESULT " + json.dumps(out))
"""


def load_tool():
    """tools/triton_aot.py as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("triton_aot", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def compiled():
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, TOOL], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"ahead-of-time compilation failed:\n{proc.stderr[-4000:]}"
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_every_representative_variant_compiles_and_fits(compiled):
    aot = load_tool()

    assert len(compiled) == len(aot.representative_variants())
    archs = {r["arch"] for r in compiled}
    assert archs == {80, 90}
    too_big = [r for r in compiled if r["shared"] > r["limit"]]
    assert not too_big, f"over the shared-memory limit: {too_big}"
    for kernel in ("fwd", "dkdv", "dq"):
        assert any(r["kernel"] == kernel for r in compiled), kernel
    for kernel in ("fwd", "dkdv", "dq"):  # the three-stage loops (a window bounded on both sides) compile too
        assert any(r["kernel"] == kernel and min(r["window"]) >= 0 for r in compiled), kernel
        for extra in ("gqa", "dropout"):  # grouped-query attention and dropout build for sm_90 too
            assert any(r["kernel"] == kernel and r["arch"] == 90 and extra in r["extra"] for r in compiled), (kernel,
                                                                                                          extra)


def test_smem_estimate_bounds_the_compiler(compiled):
    """The pruning estimate must not be below what the compiler allocates by much (else prune lets misfits through)."""
    from flash_attention_triton import configs as C

    for r in compiled:
        BM, BN, _, stages = r["config"]
        block_d = max(16, 1 << (r["head_dim"] - 1).bit_length())
        est = C.smem_estimate(r["kernel"], BM, BN, stages, block_d, 4 if r["dtype"] == "float32" else 2)
        assert r["shared"] <= 1.5 * est + 4096, (r, est)


# the start of a script that compiles Triton kernels for sm_90 in a subprocess (TRITON_INTERPRET=0) and reads their
# SASS with Triton's own nvdisasm: it prints "RESULT null" and stops where there is no disassembler
SASS_SCRIPT_HEAD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import sass_summary, triton_aot
import triton
nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
dis = sass_summary.disassembler(nvdisasm if os.path.exists(nvdisasm) else None)
if dis is None:
    print("RESULT null"); sys.exit(0)
"""


def run_sass_script(body: str, what: str):
    """Run SASS_SCRIPT_HEAD + body (tools/ on its path) and return its RESULT, or skip where there is no
    disassembler; ``what`` names the kernels in the failure message."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SASS_SCRIPT_HEAD + body, os.path.join(ROOT, "tools")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"compiling {what} failed:\n{proc.stderr[-4000:]}"
    result = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
    if result is None:
        pytest.skip("no SASS disassembler (cuobjdump or nvdisasm) on this machine")
    return result


PHILOX_SCRIPT = r"""
out = {}
for kernel, config in sass_summary.TRITON_KERNELS:
    compiled = triton_aot.compile_kernel(kernel, "float16", 64, False, config, 90, "dropout")
    evals, muls = sass_summary.philox_counts(sass_summary.triton_sass(dis, compiled))
    out[kernel] = [evals, muls["A"] + muls["B"]]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_triton_dropout_kernels_issue_18_philox_multiplies_per_evaluation():
    """flash_attention_triton/philox.py writes each Philox product as one mul.wide.u32: compiled for sm_90, the
    forward, dQ and dK/dV kernels with dropout issue 18 integer multiplies by the round multipliers per evaluation
    (tl.rand's umulhi + mul form issues 32), the fewest ten rounds allow (docs/results/triton/philox_sass/)."""
    result = run_sass_script(PHILOX_SCRIPT, "the dropout kernels")
    for kernel, (evals, muls) in result.items():
        assert evals > 0, f"{kernel}: no Philox evaluation found in its SASS"
        assert muls == 18 * evals, f"{kernel}: {muls / evals:g} multiplies per Philox evaluation, expected 18"


OVERLAP_SCRIPT = r"""
out = {}
for D, config in ((64, (128, 64, 4, 3)), (128, (128, 64, 8, 3))):
    compiled = triton_aot.compile_kernel("fwd", "float16", D, False, config, 90, "")
    out[f"fwd {config} D={D}"] = sass_summary.wgmma_overlap(sass_summary.triton_sass(dis, compiled))
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_triton_forward_waits_for_each_product_before_its_softmax():
    """docs/performance.md §8: compiled for sm_90, the Triton forward waits for every product (WARPGROUP.DEPBAR 0)
    before the next exp2, so none of its exp2s runs beside a product of its own warpgroup
    (tools/sass_summary.py --overlap --triton)."""
    result = run_sass_script(OVERLAP_SCRIPT, "the forward")
    for name, o in result.items():
        assert o["hgmma"] > 0 and o["ex2"] > 0, (name, o)
        assert set(o["waits"]) == {"0"}, f"{name}: waits {o['waits']}, expected only WARPGROUP.DEPBAR 0"
        assert o["ex2_some_path"] == 0, f"{name}: {o['ex2_some_path']} exp2s beside a product"


HOPPER_SCRIPT = r"""
out = {}
for dtype, D, window in (("fp16", 128, (-1, 0)), ("bf16", 64, (256, 256))):
    compiled = triton_aot.compile_hopper_forward(dtype, D, window)
    o = sass_summary.wgmma_overlap(sass_summary.triton_sass(dis, compiled))
    ptx = compiled.asm["ptx"]
    out[f"{dtype} D={D} window={window}"] = dict(o, shared=compiled.metadata.shared, setmaxnreg="setmaxnreg" in ptx,
                                                 item_bars={op: ptx.count(op) for op in (
                                                     "barrier.sync 14, 288", "barrier.arrive 14, 288",
                                                     "barrier.sync 15, 288", "barrier.arrive 15, 288")})
print("RESULT " + json.dumps(out))
"""


def test_hopper_forward_compiles_for_sm90_and_waits_for_s_alone():
    """flash_attention_triton/hopper_forward.py (Gluon) compiled for sm_90: its tiles fit one block's shared memory,
    the copy warp hands its registers to the consumers (setmaxnreg), and besides the waits for every product
    (WARPGROUP.DEPBAR 0) the consumers' loop waits for S_ij alone with P V still in flight (DEPBAR 1), its exp2s
    run beside P_ij V_j, and the work items pass between named barriers (docs/performance.md §9, *The Triton forward
    on a Hopper*)."""
    result = run_sass_script(HOPPER_SCRIPT, "the Gluon forward")
    for name, o in result.items():
        assert o["shared"] <= 232448, f"{name}: {o['shared']} bytes of shared memory"
        assert o["setmaxnreg"], f"{name}: no register hand-over (setmaxnreg) in its PTX"
        assert o["hgmma"] > 0 and o["ex2"] > 0 and "1" in o["waits"], (name, o)
        # the loop's exp2s (half of them; the first tile's run alone) with P_ij V_j still in flight on every path
        assert 2 * o["ex2_in_flight"] == o["ex2"], f"{name}: {o['ex2_in_flight']} of {o['ex2']} exp2s beside P V"
        # the persistent programs' work items handed over between named barriers: the copy warp arrives on
        # ITEM_FULL (14) and waits on ITEM_EMPTY (15); each consumer waits on 14 and arrives on 15
        bars = o["item_bars"]
        assert all(bars.values()) and bars["barrier.sync 14, 288"] == bars["barrier.arrive 15, 288"], (name, bars)


HOPPER_BACKWARD_SCRIPT = r"""
from flash_attention_triton import hopper_backward as hb
out = {}
for fragments, dtype, window in ((1, "fp16", (-1, 0)), (1, "bf16", (256, 256)), (0, "fp16", (-1, -1))):
    hb.CONFIG["DQ_FRAGMENTS"] = fragments
    compiled = triton_aot.compile_hopper_backward(dtype, 128, window)
    ptx = compiled.asm["ptx"]
    out[f"{dtype} window={window} DQ_FRAGMENTS={fragments}"] = dict(
        shared=compiled.metadata.shared, setmaxnreg="setmaxnreg" in ptx, wgmma=ptx.count("wgmma.mma_async"),
        adds=ptx.count(".add.f32"), boxes=64 // hb.dq_box(),
        reduces=ptx.count("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add"))
print("RESULT " + json.dumps(out))
"""


def test_hopper_backward_compiles_for_sm90():
    """flash_attention_triton/hopper_backward.py (Gluon) compiled for sm_90: its tiles fit one block's shared
    memory, the copy warp hands its registers to the consumers (setmaxnreg), and each consumer hands its 64 x 64
    sums of dQ_i to the copy engine with no atomic add from a thread: one reduce-add of the whole block in register
    order (DQ_FRAGMENTS, the default), or two of 64 x 32 (a 128-byte swizzle's box) in dQ's own order."""
    result = run_sass_script(HOPPER_BACKWARD_SCRIPT, "the Gluon backward")
    for name, o in result.items():
        assert o["shared"] <= 232448, f"{name}: {o['shared']} bytes of shared memory"
        assert o["setmaxnreg"], f"{name}: no register hand-over (setmaxnreg) in its PTX"
        assert o["wgmma"] > 0, (name, o)
        assert o["reduces"] == 2 * o["boxes"], f"{name}: {o['reduces']} reduce-adds in its PTX (2 consumers x boxes)"
        assert o["adds"] == 0, f"{name}: {o['adds']} float32 atomic adds in its PTX"
