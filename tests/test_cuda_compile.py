"""Every CUDA source compiles with the machine's nvcc to cubin for sm_80 and sm_90, with no warning.

``-cubin`` runs ptxas, which checks the inline PTX (mma.sync, ldmatrix, cp.async); ``-ptx`` alone
would not. Each .cu ends with explicit instantiations (under ``#ifndef __CUDACC_RTC__``) of the
templates the launcher uses, so nvcc compiles exactly what NVRTC compiles at run time.
No GPU needed; skips (with the reason) only where nvcc is absent.
"""
import os
import re
import shutil
import subprocess

import pytest

from flash_attention_cuda import launcher

NVCC = os.environ.get("NVCC") or shutil.which("nvcc") or ("/usr/local/bin/nvcc" if os.path.exists("/usr/local/bin/nvcc") else None)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source", launcher.SOURCES)
def test_nvcc_cubin_no_errors_no_warnings(source, arch, tmp_path):
    if NVCC is None:
        pytest.skip("nvcc not found (set NVCC or put it on PATH)")
    out = tmp_path / (source + f".{arch}.cubin")
    cmd = [NVCC, "-cubin", f"-arch={arch}", "-std=c++17", "-Werror", "all-warnings", "-Xptxas", "-Werror",
           "-o", str(out), os.path.join(launcher.KERNEL_DIR, source)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    text = (res.stdout + res.stderr).strip()
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{text}"
    assert "warning" not in text.lower(), f"{' '.join(cmd)} warned:\n{text}"
    assert out.stat().st_size > 0


def _instantiations(source):
    """Template instantiations listed in the .cu (``template __global__ void f<...>(``), normalised."""
    text = open(os.path.join(launcher.KERNEL_DIR, source)).read()
    macros = {}
    for m in re.finditer(r"#define (FA_\w+_INST)\(([^)]*)\)(.*?)\n(?=\S)", text, re.S):
        macros[m.group(1)] = ([a.strip() for a in m.group(2).split(",")], m.group(3))
    names = set()
    for name, (params, body) in macros.items():
        for call in re.finditer(rf"^{name}\(([^)]*)\)", text, re.M):
            args = [a.strip() for a in call.group(1).split(",")]
            expanded = body
            for p, a in zip(params, args):
                expanded = re.sub(rf"\b{p}\b", a, expanded)
            for f in re.finditer(r"void (\w+)<([^>]*)>", expanded):
                names.add(f"{f.group(1)}<{', '.join(x.strip() for x in f.group(2).split(','))}>")
    return names


def test_launcher_configs_are_instantiated_for_nvcc():
    """The instantiations the launcher asks NVRTC for are the ones the compile test builds."""
    wanted = {"naive.cu": {f"naive_fwd<{dp}, 32, 64>" for dp in (32, 64, 128)}
              | {f"seed_nomax_fwd<{dp}, 32, 64>" for dp in (32, 64, 128)},
              "tiled.cu": {"tiled_fwd<32, 8>", "tiled_fwd<64, 8>", "tiled_fwd<128, 4>"},
              "mma.cu": {f"mma_fwd<{D}, {bc}, {nw}, {mt}, {bf}>" for D, (bc, nw, mt) in launcher.MMA_CONFIGS.items()
                         for bf in ("false", "true")},
              "backward.cu": {"bwd_dkdv<32, 32>", "bwd_dkdv<64, 32>", "bwd_dkdv<128, 16>",
                              "bwd_dq<32, 32>", "bwd_dq<64, 32>", "bwd_dq<128, 16>"}}
    for source, names in wanted.items():
        have = _instantiations(source)
        assert names <= have, f"{source}: launcher uses {sorted(names - have)} but the .cu does not instantiate them"


def test_sources_include_no_host_headers():
    """NVRTC has no host headers: the only #include is the project's own common.cuh."""
    for source in launcher.SOURCES + ("common.cuh",):
        text = open(os.path.join(launcher.KERNEL_DIR, source)).read()
        includes = re.findall(r'^\s*#\s*include\s*(.+)$', text, re.M)
        assert all(inc.strip() == '"common.cuh"' for inc in includes), f"{source} includes {includes}"
