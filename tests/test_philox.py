"""Dropout's random generator gives the same bits in every language (flash_attention_py/philox.py).

Triton's ``tl.rand`` is the definition; the NumPy and torch versions (philox.py) and the CUDA header
(flash_attention_cuda/kernels/philox.cuh) must match it bit for bit, float32 for float32:
* NumPy and torch against ``tl.rand`` in a small ``@triton.jit`` kernel (the GPU when there is one,
  else the interpreter, TRITON_INTERPRET=1 from tests/conftest.py), offsets >= 2**32 and seeds >= 2**32
  included, and tl.rand's uint32 -> [0, 1) map on the extreme words;
* philox.cuh compiled for the host with g++ (``__device__`` and ``__umulhi`` shimmed) against NumPy;
* philox.cuh compiled for sm_90a with nvcc, and (on a GPU) run through CuPy against NumPy;
* the keep rate of ``keep_mask`` over ~1e6 draws is 1 - p within 5 sigma;
* bad seeds, probabilities and offsets raise errors that name the function and the argument.
"""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from flash_attention_py import philox

KERNEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flash_attention_cuda",
                          "kernels")
GXX = shutil.which("g++")
NVCC = os.environ.get("NVCC") or shutil.which("nvcc")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SEEDS = [0, 1234567, 2**32 + 7, 2**64 - 1]  # the last two use the seed's high key word
WORDS = np.concatenate([np.array([0, 1, 2, 2**24, 2**31 - 2, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 2, 2**32 - 1],
                                 dtype=np.uint64),
                        np.random.default_rng(1).integers(0, 2**32, 1000, dtype=np.uint64)]).astype(np.uint32)


def _offsets():
    """A few thousand int64 offsets: small, random up to 2**62, around 2**32, and the dropout layout's own."""
    rng = np.random.default_rng()
    b, h, i, j = 1, 3, np.arange(9), np.arange(0, 2000, 37)
    block = philox.dropout_offsets(b, h, i, j, 4, 9, 2000).ravel()
    return np.concatenate([np.arange(64), rng.integers(0, 2**62, 2000), 2**32 + np.arange(-32, 32),
                           rng.integers(2**32, 2**40, 500), block]).astype(np.int64)


def _bits(x):
    return (x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)).view(np.uint32)


# ---------------------------------------------------------------------------------------------------- (a)
try:
    import triton
    import triton.language as tl

    @triton.jit
    def _rand_kernel(u_ptr, offsets_ptr, seed, n, BLOCK: tl.constexpr):
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = idx < n
        offset = tl.load(offsets_ptr + idx, mask=inside, other=0)  # int64
        tl.store(u_ptr + idx, tl.rand(seed, offset), mask=inside)

    @triton.jit
    def _uniform_kernel(u_ptr, words_ptr, n, BLOCK: tl.constexpr):
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = idx < n
        word = tl.load(words_ptr + idx, mask=inside, other=0)  # int32 reading of the uint32 word
        tl.store(u_ptr + idx, tl.random.uint_to_uniform_float(word), mask=inside)

    from flash_attention_triton import philox as triton_philox

    @triton.jit
    def _kernels_rand_kernel(u_ptr, offsets_ptr, seed, n, BLOCK: tl.constexpr):
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = idx < n
        offset = tl.load(offsets_ptr + idx, mask=inside, other=0)  # int64
        tl.store(u_ptr + idx, triton_philox.philox_uniform(seed, offset), mask=inside)

    @triton.jit
    def _threshold_kernel(t_ptr, p_ptr):  # one p a program, a scalar, as the kernels call it
        pid = tl.program_id(0)
        tl.store(t_ptr + pid, triton_philox.keep_threshold(tl.load(p_ptr + pid)).to(tl.int64))

    @triton.jit
    def _threshold_block_kernel(t_ptr, p_ptr, n, BLOCK: tl.constexpr):  # a block of p's: the same steps, elementwise
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = idx < n
        p = tl.load(p_ptr + idx, mask=inside, other=0.5)
        tl.store(t_ptr + idx, triton_philox.keep_threshold(p).to(tl.int64), mask=inside)

    @triton.jit
    def _keep_kernel(keep_ptr, offsets_ptr, seed, dropout_p, n, BLOCK: tl.constexpr):
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = idx < n
        offset = tl.load(offsets_ptr + idx, mask=inside, other=0)  # int64
        keep = triton_philox.dropout_keep(seed, offset, triton_philox.keep_threshold(dropout_p))
        tl.store(keep_ptr + idx, keep.to(tl.int8), mask=inside)
except ImportError:
    triton = None

needs_triton = pytest.mark.skipif(triton is None, reason="triton is not installed")


@needs_triton
def test_numpy_and_torch_match_tl_rand_bit_for_bit():
    offsets = _offsets()
    off_t = torch.from_numpy(offsets).to(DEVICE)
    for seed in SEEDS:
        u_triton = torch.empty(len(offsets), dtype=torch.float32, device=DEVICE)
        _rand_kernel[(triton.cdiv(len(offsets), 1024),)](u_triton, off_t, seed, len(offsets), BLOCK=1024)
        u_numpy = philox.philox_uniform(seed, offsets)
        u_torch = philox.philox_uniform(seed, off_t)
        assert u_numpy.dtype == np.float32 and u_torch.dtype == torch.float32 and u_torch.device == off_t.device
        want = _bits(u_triton)
        assert np.array_equal(_bits(u_numpy), want), f"NumPy differs from tl.rand for seed {seed}"
        assert np.array_equal(_bits(u_torch), want), f"torch differs from tl.rand for seed {seed}"
        assert 0.0 <= u_numpy.min() and u_numpy.max() < 1.0
    # the seed's high half is a key word, as in tl.rand: seed and seed + 2**32 differ
    assert not np.array_equal(philox.philox_uniform(7, offsets), philox.philox_uniform(7 + 2**32, offsets))


@needs_triton
def test_triton_kernels_philox_matches_tl_rand_bit_for_bit():
    """flash_attention_triton/philox.py (one 64-bit product a multiply; on a GPU mul.wide.u32 in PTX) is tl.rand."""
    offsets = _offsets()
    off_t = torch.from_numpy(offsets).to(DEVICE)
    for seed in SEEDS + [2**63 - 1]:
        u_rand = torch.empty(len(offsets), dtype=torch.float32, device=DEVICE)
        u_ours = torch.empty(len(offsets), dtype=torch.float32, device=DEVICE)
        grid = (triton.cdiv(len(offsets), 1024),)
        _rand_kernel[grid](u_rand, off_t, seed, len(offsets), BLOCK=1024)
        _kernels_rand_kernel[grid](u_ours, off_t, seed, len(offsets), BLOCK=1024)
        assert np.array_equal(_bits(u_ours), _bits(u_rand)), f"philox_uniform differs from tl.rand for seed {seed}"


@needs_triton
def test_triton_dropout_keep_matches_tl_rand():
    """The kernels' dropout_keep (the integer test on Philox's word) = tl.rand >= p, p at the test's edges too."""
    offsets = _offsets()
    off_t = torch.from_numpy(offsets).to(DEVICE)
    seed = 2**33 + 99
    u = philox.philox_uniform(seed, offsets)
    for p in [0.0, 0.17, 0.5, 0.999, float(np.sort(u)[len(u) // 3]), float(np.nextafter(np.sort(u)[len(u) // 2], 1))]:
        keep = torch.empty(len(offsets), dtype=torch.int8, device=DEVICE)
        _keep_kernel[(triton.cdiv(len(offsets), 1024),)](keep, off_t, seed, p, len(offsets), BLOCK=1024)
        assert np.array_equal(keep.cpu().numpy().astype(bool), u >= np.float32(p)), p


@needs_triton
def test_triton_keep_threshold_is_the_first_kept_fold():
    """keep_threshold(p) in the Triton kernels: the smallest fold whose uniform is >= p (as fa::keep_test). Every
    p in blocks of 1024 (one program a block: the interpreter runs a program's 31 steps in about 40 ms), and a
    sample of them one a program, with p a scalar as the kernels call it."""
    p = _probabilities()
    T = torch.empty(len(p), dtype=torch.int64, device=DEVICE)
    _threshold_block_kernel[(triton.cdiv(len(p), 1024),)](T, torch.from_numpy(p).to(DEVICE), len(p), BLOCK=1024)
    T = T.cpu().numpy()
    some = np.arange(0, len(p), 97)
    T_scalar = torch.empty(len(some), dtype=torch.int64, device=DEVICE)
    _threshold_kernel[(len(some),)](T_scalar, torch.from_numpy(p[some].copy()).to(DEVICE))
    assert np.array_equal(T_scalar.cpu().numpy(), T[some])
    assert ((T >= 0) & (T < 2**31)).all()
    assert (philox.uint32_to_uniform(T.astype(np.uint32)) >= p).all()
    below = T > 0
    assert (philox.uint32_to_uniform((T[below] - 1).astype(np.uint32)) < p[below]).all()


@needs_triton
def test_uniform_map_matches_triton_on_extreme_words():
    words_t = torch.from_numpy(WORDS.view(np.int32).copy()).to(DEVICE)
    u_triton = torch.empty(len(WORDS), dtype=torch.float32, device=DEVICE)
    _uniform_kernel[(triton.cdiv(len(WORDS), 1024),)](u_triton, words_t, len(WORDS), BLOCK=1024)
    want = _bits(u_triton)
    assert np.array_equal(_bits(philox.uint32_to_uniform(WORDS)), want)
    assert np.array_equal(_bits(philox.uint32_to_uniform(words_t)), want)  # int32 reading, on DEVICE
    u = philox.uint32_to_uniform(WORDS)
    assert u[0] == 0.0 and u.max() == np.nextafter(np.float32(1), np.float32(0))  # [0, 1): 1 - 2**-24 at most


def test_keep_mask_is_the_block_of_the_offset_rule():
    """keep_mask of a block = philox_uniform at ((b*Hq + h)*Nq + i)*Nk + j >= float32(p), NumPy and torch alike."""
    seed, p, b, h, Hq, Nq, Nk = 2**40 + 3, 0.3, 2, 1, 3, 50, 70
    i, j = np.arange(16, 32), np.arange(64, 80)  # a last block overhanging Nk: offsets still defined
    offsets = ((b * Hq + h) * Nq + i[:, None]) * Nk + j[None, :]
    want = philox.philox_uniform(seed, offsets) >= np.float32(p)
    got = philox.keep_mask(seed, p, b, h, i, j, Hq, Nq, Nk)
    got_t = philox.keep_mask(seed, p, b, h, torch.from_numpy(i).to(DEVICE), torch.from_numpy(j).to(DEVICE), Hq, Nq, Nk)
    assert got.shape == (16, 16) and got.dtype == bool and np.array_equal(got, want)
    assert got_t.dtype == torch.bool and np.array_equal(got_t.cpu().numpy(), want)
    assert philox.keep_mask(seed, 0.0, b, h, i, j, Hq, Nq, Nk).all()  # p = 0 keeps everything


# ---------------------------------------------------------------------------------------------------- (b)
HOST_DRIVER = r"""
// Host build of philox.cuh: the CUDA-only names shimmed. Reads binary input on stdin, writes binary output.
//   r SEED               int64 offsets  -> float32 fa::philox_uniform
//   u                    uint32 words   -> float32 fa::uint32_to_uniform
//   k SEED P B H HQ NQ NK               -> uint8 fa::dropout_keep for i < NQ, j < NK (row major)
//   t                    float32 p's    -> uint32 fa::keep_test(p).T
//   x SEED P             int64 offsets  -> uint8 fa::keep_test(P).keeps(fa::philox_word(...)) (the kernels' test)
#define __device__
#define __forceinline__ inline
static inline unsigned __umulhi(unsigned a, unsigned b) {
    return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
#include "philox.cuh"
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    const char mode = argv[1][0];
    if (mode == 'r' && argc == 3) {
        const unsigned long long seed = std::strtoull(argv[2], nullptr, 10);
        long long offset;
        while (std::fread(&offset, sizeof offset, 1, stdin) == 1) {
            const float u = fa::philox_uniform(static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32), offset);
            std::fwrite(&u, sizeof u, 1, stdout);
        }
    } else if (mode == 'u' && argc == 2) {
        unsigned word;
        while (std::fread(&word, sizeof word, 1, stdin) == 1) {
            const float u = fa::uint32_to_uniform(word);
            std::fwrite(&u, sizeof u, 1, stdout);
        }
    } else if (mode == 't' && argc == 2) {
        float p;
        while (std::fread(&p, sizeof p, 1, stdin) == 1) {
            const unsigned T = fa::keep_test(p).T;
            std::fwrite(&T, sizeof T, 1, stdout);
        }
    } else if (mode == 'x' && argc == 4) {
        const unsigned long long seed = std::strtoull(argv[2], nullptr, 10);
        const fa::KeepTest keep = fa::keep_test(std::strtof(argv[3], nullptr));
        long long offset;
        while (std::fread(&offset, sizeof offset, 1, stdin) == 1)
            std::fputc(keep.keeps(fa::philox_word(static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32),
                                                  offset)) ? 1 : 0, stdout);
    } else if (mode == 'k' && argc == 9) {
        const unsigned long long seed = std::strtoull(argv[2], nullptr, 10);
        const float p = std::strtof(argv[3], nullptr);
        const int b = std::atoi(argv[4]), h = std::atoi(argv[5]), Hq = std::atoi(argv[6]);
        const int Nq = std::atoi(argv[7]), Nk = std::atoi(argv[8]);
        const unsigned seed_lo = static_cast<unsigned>(seed), seed_hi = static_cast<unsigned>(seed >> 32);
        for (int i = 0; i < Nq; ++i)
            for (int j = 0; j < Nk; ++j) {
                const long long offset = fa::dropout_offset(b, h, i, j, Hq, Nq, Nk);
                std::fputc(fa::dropout_keep(seed_lo, seed_hi, offset, p) ? 1 : 0, stdout);
            }
    } else {
        return 2;
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def host_philox(tmp_path_factory):
    if GXX is None:
        pytest.skip("g++ not found: the host build of philox.cuh is not checked")
    d = tmp_path_factory.mktemp("philox_host")
    (d / "driver.cpp").write_text(HOST_DRIVER)
    exe = d / "philox_host"
    cmd = [GXX, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror",
           "-Wno-unknown-pragmas",  # '#pragma unroll' is for nvcc
           "-I", KERNEL_DIR, "-o", str(exe), str(d / "driver.cpp")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout}{res.stderr}"

    def run(*args, data=b""):
        out = subprocess.run([str(exe), *map(str, args)], input=data, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        return out.stdout

    return run


def test_cuda_header_on_host_matches_numpy(host_philox):
    offsets = _offsets()
    for seed in SEEDS:
        got = np.frombuffer(host_philox("r", seed, data=offsets.tobytes()), dtype=np.uint32)
        assert np.array_equal(got, _bits(philox.philox_uniform(seed, offsets))), f"philox.cuh differs for seed {seed}"
    got = np.frombuffer(host_philox("u", data=WORDS.tobytes()), dtype=np.uint32)
    assert np.array_equal(got, _bits(philox.uint32_to_uniform(WORDS)))
    seed, p, b, h, Hq, Nq, Nk = 2**33 + 11, 0.17, 1, 2, 3, 37, 45
    got = np.frombuffer(host_philox("k", seed, repr(float(np.float32(p))), b, h, Hq, Nq, Nk), dtype=np.uint8)
    assert np.array_equal(got.reshape(Nq, Nk).astype(bool), philox.keep_mask(seed, p, b, h, np.arange(Nq),
                                                                              np.arange(Nk), Hq, Nq, Nk))


def _probabilities():
    """float32 p's for the keep test: the ends, every uniform value's edges (a word's own uniform and the float32
    next to it on each side), and random ones."""
    rng = np.random.default_rng()
    words = np.concatenate([WORDS, rng.integers(0, 2**32, 300, dtype=np.uint64).astype(np.uint32)])
    u = philox.uint32_to_uniform(words)
    edges = np.concatenate([u, np.nextafter(u, np.float32(0)), np.nextafter(u, np.float32(1))])
    ends = np.array([0.0, 1e-45, 1e-10, 2.0**-32, 0.17, 0.5, 0.999, 1 - 2.0**-24], dtype=np.float32)
    p = np.concatenate([ends, edges.astype(np.float32), rng.random(200).astype(np.float32)])
    return p[(p >= 0) & (p < 1)]


def test_keep_test_threshold_is_the_first_kept_fold(host_philox):
    """fa::keep_test(p).T is the smallest fold with uniform >= p: the kernels' integer keep test
    (T <= word <= ~T) is uniform(word) >= p for every word."""
    p = _probabilities()
    T = np.frombuffer(host_philox("t", data=p.tobytes()), dtype=np.uint32).astype(np.int64)
    assert (T < 2**31).all()
    assert (philox.uint32_to_uniform(T.astype(np.uint32)) >= p).all()
    below = T > 0
    assert (philox.uint32_to_uniform((T[below] - 1).astype(np.uint32)) < p[below]).all()
    for t, pp in zip(T[::25], p[::25]):  # the word form, on every test word
        t = np.uint32(t)
        keeps = (WORDS - t) <= (~t - t)  # uint32, mod 2**32
        assert np.array_equal(keeps, philox.uint32_to_uniform(WORDS) >= pp), f"p = {pp!r}"


@pytest.mark.parametrize("p", [0.0, 0.17, 0.5, 0.999])
def test_kernels_keep_test_on_host_matches_numpy(host_philox, p):
    """KeepTest on philox_word (what every CUDA kernel runs) = philox_uniform >= p, offsets around 2**32."""
    offsets = _offsets()
    for seed in SEEDS[1:3]:
        got = np.frombuffer(host_philox("x", seed, repr(float(np.float32(p))), data=offsets.tobytes()), dtype=np.uint8)
        assert np.array_equal(got.astype(bool), philox.philox_uniform(seed, offsets) >= np.float32(p))


# ---------------------------------------------------------------------------------------------------- (c)
DEVICE_KERNELS = r"""
#include "philox.cuh"
// u[t] = tl.rand(seed, offsets[t]); keep[t] = (u[t] >= p)
extern "C" __global__ void philox_fill(float* u, unsigned char* keep, const long long* offsets, int n,
                                       unsigned long long seed, float p) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const unsigned seed_lo = static_cast<unsigned>(seed), seed_hi = static_cast<unsigned>(seed >> 32);
    u[t] = fa::philox_uniform(seed_lo, seed_hi, offsets[t]);
    keep[t] = fa::dropout_keep(seed_lo, seed_hi, offsets[t], p);
}
// keep[i * Nk + j] for the scores (b, h, i, j): one thread per score
extern "C" __global__ void dropout_block(unsigned char* keep, unsigned long long seed, float p, int b, int h,
                                         int Hq, int Nq, int Nk) {
    const int i = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= Nq || j >= Nk) return;
    keep[i * Nk + j] = fa::dropout_keep(static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32),
                                        fa::dropout_offset(b, h, i, j, Hq, Nq, Nk), p);
}
"""


def test_nvcc_compiles_header_for_sm90a(tmp_path):
    if NVCC is None:
        pytest.skip("nvcc not found (set NVCC or put it on PATH)")
    src = tmp_path / "philox_test.cu"
    src.write_text(DEVICE_KERNELS)
    out = tmp_path / "philox_test.cubin"
    cmd = [NVCC, "-cubin", "-arch=sm_90a", "-std=c++17", "-Werror", "all-warnings", "-I", KERNEL_DIR,
           "-o", str(out), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    text = (res.stdout + res.stderr).strip()
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{text}"
    assert "warning" not in text.lower(), f"{' '.join(cmd)} warned:\n{text}"
    assert out.stat().st_size > 0


@pytest.mark.gpu
def test_cuda_header_on_gpu_matches_numpy():
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available():
        pytest.skip("no CUDA GPU: cupy.cuda.is_available() is False")
    # the header inlined: CuPy's compile cache keys on the source text, not on the files it includes
    with open(os.path.join(KERNEL_DIR, "philox.cuh")) as f:
        header = f.read().replace("#pragma once", "")
    module = cupy.RawModule(code=DEVICE_KERNELS.replace('#include "philox.cuh"', header), options=("--std=c++17",))
    offsets = _offsets()
    n, p = len(offsets), 0.5
    off_d = cupy.asarray(offsets)
    for seed in SEEDS:
        u, keep = cupy.empty(n, dtype=cupy.float32), cupy.empty(n, dtype=cupy.uint8)
        module.get_function("philox_fill")(((n + 255) // 256,), (256,), (u, keep, off_d, np.int32(n), np.uint64(seed),
                                                                        np.float32(p)))
        want = philox.philox_uniform(seed, offsets)
        assert np.array_equal(cupy.asnumpy(u).view(np.uint32), want.view(np.uint32)), f"GPU differs for seed {seed}"
        assert np.array_equal(cupy.asnumpy(keep).astype(bool), want >= np.float32(p))
    seed, b, h, Hq, Nq, Nk = 2**35 + 5, 1, 2, 4, 33, 300
    keep = cupy.zeros((Nq, Nk), dtype=cupy.uint8)
    module.get_function("dropout_block")(((Nk + 127) // 128, Nq), (128,), (keep, np.uint64(seed), np.float32(0.17),
                                                                          *map(np.int32, (b, h, Hq, Nq, Nk))))
    assert np.array_equal(cupy.asnumpy(keep).astype(bool),
                          philox.keep_mask(seed, 0.17, b, h, np.arange(Nq), np.arange(Nk), Hq, Nq, Nk))


# One warp's DropoutTile (fragments.cuh): the Philox work its scores share, against Dropout::scale score by score,
# and dropout_rows (the forwards') on a tile of ones, both layouts; the tile is NT = 4 accumulator tiles wide, or 16
# (the Hopper forwards' 128 keys: dropout_rows draws it in four groups).
TILE_PROBE = r"""
template <bool KEY_ROWS, int NT>
__global__ void dropout_tile_probe(float* z_tile, float* z_each, float* rows, int* shared, long long bh, int Nq,
                                   int Nk, int row0, int col0, unsigned long long seed, float p) {
    const int lane = threadIdx.x;
    const frag::Dropout dp = frag::make_dropout(p, static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32), bh,
                                                Nq, Nk);
    const frag::DropoutTile<KEY_ROWS, NT> tile(dp, row0, col0);
    float P[NT][4];
    for (int n = 0; n < NT; ++n)
        for (int e = 0; e < 4; ++e) {
            const int r = row0 + frag::acc_row(e), c = col0 + frag::acc_col(n, e), at = (lane * NT + n) * 4 + e;
            z_tile[at] = tile.shared ? dp.scale(tile.high, tile.a_lo(n, e)) : -1.0f;
            z_each[at] = KEY_ROWS ? dp.scale(c, r) : dp.scale(r, c);
            P[n][e] = 1.0f;
        }
    if (!KEY_ROWS) {
        frag::dropout_rows(P, dp, row0, col0);
        for (int n = 0; n < NT; ++n)
            for (int e = 0; e < 4; ++e) rows[(lane * NT + n) * 4 + e] = P[n][e];
    }
    shared[lane] = tile.shared;
}
"""
TILE_NAMES = {(False, 4): "dropout_tile_probe<false, 4>", (True, 4): "dropout_tile_probe<true, 4>",
              (False, 16): "dropout_tile_probe<false, 16>"}


def _tile_probe_source():
    from flash_attention_cuda.runtime import read_source
    return read_source("fragments.cuh") + TILE_PROBE


def test_nvcc_compiles_dropout_tile_probe(tmp_path):
    if NVCC is None:
        pytest.skip("nvcc not found (set NVCC or put it on PATH)")
    src = tmp_path / "tile_probe.cu"
    src.write_text(_tile_probe_source() + "".join(
        f"template __global__ void {n[:n.index('<')]}<{n[n.index('<') + 1:-1]}>(float*, float*, float*, int*, "
        "long long, int, int, int, int, unsigned long long, float);\n" for n in TILE_NAMES.values()))
    cmd = [NVCC, "-cubin", "-arch=sm_90", "-std=c++17", "-o", str(tmp_path / "tile_probe.cubin"), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout}{res.stderr}"


@pytest.mark.gpu
@pytest.mark.parametrize("key_rows,NT", list(TILE_NAMES))
def test_dropout_tile_shares_philox_exactly(key_rows, NT):
    """Tiles around offset 2**32 (some threads' offsets straddle it: they take the score-by-score path), far past
    it and near 0: every kept or dropped score is philox_uniform's, the shared form's included."""
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available():
        pytest.skip("no CUDA GPU: cupy.cuda.is_available() is False")
    module = cupy.RawModule(code=_tile_probe_source(), options=("--std=c++17",),
                            name_expressions=list(TILE_NAMES.values()))
    kernel = module.get_function(TILE_NAMES[(key_rows, NT)])
    Nq, Nk, seed = 1000, 1000, 2**33 + 99
    lane, n, e = np.meshgrid(np.arange(32), np.arange(NT), np.arange(4), indexing="ij")
    straddled = 0
    # bh = 4294: offset 2**32 is (i, j) = (967, 296); tiles across it, one far past 2**32, one near 0
    for bh, row0, col0, p in [(4294, 964, 288, 0.17), (4294, 960, 280, 0.5), (4294, 288, 964, 0.5),
                              (4294, 966, 290, 0.999), (123456, 16, 40, 0.17), (3, 0, 0, 0.5)]:
        r0, c0 = (col0, row0) if key_rows else (row0, col0)  # the call's rows/cols
        out = [cupy.full(32 * NT * 4, np.nan, dtype=cupy.float32) for _ in range(3)]
        shared = cupy.zeros(32, dtype=cupy.int32)
        kernel((1,), (32,), (*out, shared, np.int64(bh), np.int32(Nq), np.int32(Nk), np.int32(r0), np.int32(c0),
                             np.uint64(seed), np.float32(p)))
        z_tile, z_each, rows = (cupy.asnumpy(x).reshape(32, NT, 4) for x in out)
        shared = cupy.asnumpy(shared).astype(bool)
        r = r0 + lane // 4 + 8 * (e >> 1)
        c = c0 + 8 * n + 2 * (lane % 4) + (e & 1)
        i, j = (c, r) if key_rows else (r, c)
        offsets = ((bh * Nq + i) * Nk + j).astype(np.int64)
        inv = np.float32(1) / (np.float32(1) - np.float32(p))
        want = np.where(philox.philox_uniform(seed, offsets) >= np.float32(p), inv, np.float32(0))
        assert np.array_equal(z_each, want), (bh, row0, col0)
        first, last = offsets[:, 0, 0], offsets[:, NT - 1, 3]  # each thread's smallest and largest offset
        assert np.array_equal(shared, (first >> 32) == (last >> 32))
        assert np.array_equal(z_tile[shared], want[shared]), (bh, row0, col0)
        assert (z_tile[~shared] == -1).all()
        if not key_rows:
            assert np.array_equal(rows, want), (bh, row0, col0)
        straddled += (~shared).sum()
    assert straddled > 0  # the score-by-score path ran


# tools/philox_floor.py: the keep decisions alone, dropout's floor. Its kernels of the rule must keep exactly the
# scores NumPy keeps (every form, tile width and register budget), and its FA2-rate kernel about 1 - p of them.
def _philox_floor():
    import importlib.util
    path = os.path.join(os.path.dirname(KERNEL_DIR), os.pardir, "tools", "philox_floor.py")
    spec = importlib.util.spec_from_file_location("philox_floor", os.path.normpath(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_nvcc_compiles_philox_floor(tmp_path):
    if NVCC is None:
        pytest.skip("nvcc not found (set NVCC or put it on PATH)")
    src = tmp_path / "philox_floor.cu"
    src.write_text(_philox_floor().nvcc_source())
    cmd = [NVCC, "-cubin", "-arch=sm_90", "-std=c++17", "-o", str(tmp_path / "philox_floor.cubin"), str(src)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout}{res.stderr}"


@pytest.mark.parametrize("argv,match", [(["--out", "x", "--shapes", "4x32x4096"], "expected BxHxNxD"),
                                        (["--out", "x", "--shapes", "1x1x100x64"], "N a multiple of 128"),
                                        (["--out", "x", "--p", "1.0"], r"--p: expected a dropout probability"),
                                        (["--out", "x", "--rounds", "0"], "--rounds: expected at least 1"),
                                        ([], "--out is required"),
                                        (["--replot", "/nonexistent"], "--replot: .* does not exist")])
def test_philox_floor_refuses_bad_arguments(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        _philox_floor().main(argv)
    assert exc.value.code == 2
    assert re.search(match, capsys.readouterr().err)


def test_philox_floor_replot_rebuilds_the_record(tmp_path):
    """--replot runs nothing: it rebuilds the table and the plot from a record's philox_floor.json, on any machine."""
    record = os.path.join(os.path.dirname(KERNEL_DIR), os.pardir, "docs", "results", "cuda", "philox_floor")
    shutil.copy(os.path.join(record, "philox_floor.json"), tmp_path)
    assert _philox_floor().main(["--replot", str(tmp_path)]) == 0
    with open(os.path.join(record, "philox_floor.md")) as f:
        assert (tmp_path / "philox_floor.md").read_text() == f.read()
    assert (tmp_path / "philox_floor.png").stat().st_size > 10_000


@pytest.mark.gpu
def test_philox_floor_kernels_keep_what_numpy_keeps():
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available():
        pytest.skip("no CUDA GPU: cupy.cuda.is_available() is False")
    pf = _philox_floor()
    floor = pf.Floor()
    BH, N, p, seed = 3, 256, 0.17, 2**33 + 7
    want = sum(int(philox.keep_mask(seed, p, 0, h, np.arange(N), np.arange(N), BH, N, N).sum()) for h in range(BH))
    counts = {key: floor.count(key, BH, N, p, seed) for key in pf.NAMES}
    for key, kept in counts.items():
        if key[0] != "fa2-rate":
            assert kept == want, f"{pf.NAMES[key]} kept {kept}, NumPy {want}"
    assert pf.check_counts(counts, BH * N * N, p) == []


# ---------------------------------------------------------------------------------------------------- (d)
@pytest.mark.parametrize("p", [0.17, 0.5])
def test_keep_rate_is_one_minus_p(p):
    Nq = Nk = 1024  # 2**20 draws
    keep = philox.keep_mask(20240 + int(p * 100), p, 0, 1, np.arange(Nq), np.arange(Nk), 2, Nq, Nk)
    n = keep.size
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(keep.mean() - (1 - p)) < 5 * sigma, f"keep rate {keep.mean():.5f}, want {1 - p} +- {5 * sigma:.5f}"


# ---------------------------------------------------------------------------------------------------- (e)
@pytest.mark.parametrize("seed,exc", [(-1, ValueError), (2**64, ValueError), (1.0, TypeError), (True, TypeError),
                                      ("7", TypeError), (None, TypeError)])
def test_bad_seed(seed, exc):
    with pytest.raises(exc, match=r"philox_uniform: seed must be"):
        philox.philox_uniform(seed, np.arange(4))
    with pytest.raises(exc, match=r"keep_mask: seed must be"):
        philox.keep_mask(seed, 0.1, 0, 0, np.arange(2), np.arange(2), 1, 2, 2)


@pytest.mark.parametrize("p,exc", [(-0.1, ValueError), (1.0, ValueError), (1.5, ValueError), (float("nan"), ValueError),
                                   (1 - 1e-9, ValueError), ("0.1", TypeError), (None, TypeError), (True, TypeError)])
def test_bad_dropout_p(p, exc):
    with pytest.raises(exc, match=r"keep_mask: dropout_p must be"):
        philox.keep_mask(1, p, 0, 0, np.arange(2), np.arange(2), 1, 2, 2)


def test_bad_offsets_and_indices():
    with pytest.raises(TypeError, match=r"philox_uniform: offsets must be an integer array .*float64"):
        philox.philox_uniform(1, np.zeros(3))
    with pytest.raises(TypeError, match=r"philox_uniform: offsets must be an integer tensor .*torch.float32"):
        philox.philox_uniform(1, torch.zeros(3))
    with pytest.raises(ValueError, match=r"keep_mask: h must be in \[0, 2\), got 2"):
        philox.keep_mask(1, 0.1, 0, 2, np.arange(2), np.arange(2), 2, 2, 2)
    with pytest.raises(ValueError, match=r"keep_mask: i_idx and j_idx must be 1-D"):
        philox.keep_mask(1, 0.1, 0, 0, np.zeros((2, 2), dtype=np.int64), np.arange(2), 1, 2, 2)
