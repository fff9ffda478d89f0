"""``pip install -r requirements.txt`` on every laptop: environment markers, and a project that imports without
triton or cupy.

* requirements.txt is parsed with ``packaging``; each requirement's marker is evaluated against the marker
  environment of Linux x86_64 and aarch64, macOS arm64 and Windows AMD64 (Python 3.11). triton must resolve
  only on Linux x86_64/aarch64 and cupy-cuda13x only on Linux x86_64/aarch64 and Windows AMD64: where PyPI has
  wheels for them (checked with ``pip download --only-binary=:all: --platform ...``: triton 3.7.1 has
  manylinux x86_64 and aarch64 wheels only; cupy-cuda13x 14.2 has manylinux2014 x86_64/aarch64 and win_amd64
  wheels; neither has macOS wheels). Everything else resolves everywhere.
* In a subprocess where ``import triton`` and ``import cupy`` fail (``sys.modules[name] = None``), the packages
  import, the registry says why the Triton and CUDA rungs cannot run, and the whole test suite still collects.
"""
import os
import subprocess
import sys
import textwrap

import pytest

packaging = pytest.importorskip("packaging")
from packaging.markers import default_environment  # noqa: E402
from packaging.requirements import InvalidRequirement, Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the marker variables of each platform (the rest as on this machine, Python 3.11)
PLATFORMS = {
    "linux-x86_64": dict(sys_platform="linux", platform_system="Linux", platform_machine="x86_64", os_name="posix"),
    "linux-aarch64": dict(sys_platform="linux", platform_system="Linux", platform_machine="aarch64", os_name="posix"),
    "macos-arm64": dict(sys_platform="darwin", platform_system="Darwin", platform_machine="arm64", os_name="posix"),
    "windows-amd64": dict(sys_platform="win32", platform_system="Windows", platform_machine="AMD64", os_name="nt"),
}
# where a package has wheels; a package not named here must install everywhere
ONLY_ON = {
    "triton": {"linux-x86_64", "linux-aarch64"},
    "cupy-cuda13x": {"linux-x86_64", "linux-aarch64", "windows-amd64"},
}
MUST_HAVE = {"torch", "numpy", "pytest", "transformers"}


def environment(platform: str) -> dict:
    env = dict(default_environment())
    env.update(python_version="3.11", python_full_version="3.11.9", implementation_name="cpython",
               platform_python_implementation="CPython", **PLATFORMS[platform])
    return env


def requirements(path=os.path.join(ROOT, "requirements.txt")) -> list:
    """The requirements of a pip requirements file (comments, options and ``-e .`` left out)."""
    reqs = []
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.split(" #")[0].strip()
            if not line or line.startswith(("#", "-")):
                continue
            try:
                reqs.append(Requirement(line))
            except InvalidRequirement as exc:
                pytest.fail(f"requirements.txt line {n}: {line!r} is not a valid requirement: {exc}")
    return reqs


def resolves_on(req) -> set:
    return {p for p in PLATFORMS if req.marker is None or req.marker.evaluate(environment(p))}


def test_requirements_parse_and_pin_what_matters():
    reqs = {canonicalize_name(r.name): r for r in requirements()}
    assert MUST_HAVE <= set(reqs), f"requirements.txt lacks {sorted(MUST_HAVE - set(reqs))}"
    for name in ("torch", "transformers"):
        assert str(reqs[name].specifier).startswith("=="), f"{name} should be pinned, got {reqs[name]}"


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_markers_per_platform(platform):
    got = {canonicalize_name(r.name) for r in requirements() if platform in resolves_on(r)}
    want_absent = {name for name, where in ONLY_ON.items() if platform not in where}
    want_present = {canonicalize_name(r.name) for r in requirements()} - want_absent
    assert not (got & want_absent), (f"{platform}: {sorted(got & want_absent)} would be installed, but PyPI has no "
                                     "wheel for this platform: add an environment marker")
    assert want_present <= got, f"{platform}: {sorted(want_present - got)} would not be installed"


def test_gpu_packages_have_markers():
    for r in requirements():
        name = canonicalize_name(r.name)
        if name in ONLY_ON:
            assert resolves_on(r) == ONLY_ON[name], (f"{r}: resolves on {sorted(resolves_on(r))}, "
                                                     f"expected {sorted(ONLY_ON[name])}")


BLOCK = textwrap.dedent("""
    import sys
    for name in ("triton", "cupy", "cupy_backends", "cupyx"):
        sys.modules[name] = None  # "import triton" now raises ImportError, as where it is not installed
""")


def _env(pythonpath=ROOT):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=pythonpath, HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    return env


def test_imports_without_triton_and_cupy():
    code = BLOCK + textwrap.dedent("""
        import flash_attention_py, flash_attention_py.registry as R, flash_attention_py.hf_attention
        import flash_attention_cuda, benchmarks
        from flash_attention_py import flash_attn_torch, make_inputs
        try:
            import flash_attention_triton
        except ImportError as exc:
            print("flash_attention_triton: ImportError:", exc)
        x = make_inputs(1, 1, 8, 8, 16)
        assert flash_attn_torch(x["q"], x["k"], x["v"]).shape == (1, 1, 8, 16)
        for b in R.BACKENDS:
            for dev in b.devices:
                print(b.name, dev, "|", b.unavailable_reason(dev))
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.rsplit(" | ", 1) for line in r.stdout.splitlines() if " | " in line)
    assert lines["triton cpu"] == "triton is not installed"
    assert lines["triton cuda"] == "triton is not installed"
    assert lines["cuda-mma cuda"] == "cupy is not installed"
    assert lines["numpy-v2 cpu"] == "None" and lines["torch-split cpu"] == "None"


@pytest.mark.slow
def test_suite_collects_without_triton_and_cupy(tmp_path):
    """Every test file imports without triton and cupy (their tests then skip with the reason)."""
    (tmp_path / "block_gpu_packages.py").write_text(BLOCK)
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-p", "block_gpu_packages", "--collect-only", "-q",
                        "-p", "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=_env(f"{tmp_path}{os.pathsep}{ROOT}"))
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "error" not in r.stdout.splitlines()[-1].lower(), r.stdout[-4000:]
