"""The mask rule (flash_attention_py/masks.py) against brute force, the CUDA header against masks.py, and the
NumPy and split-PyTorch loops with windows other than causal against the float64 reference.

Window rule (masks.py): with offset = Nk - Nq, query i sees key j iff 0 <= j < Nk, i < Nq,
(right < 0 or j <= i + offset + right) and (left < 0 or j >= i + offset - left).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from flash_attention_py import masks, numpy_flash, reference, torch_split

ROOT = Path(__file__).resolve().parent.parent
WINDOWS = [(3, 0), (0, 0), (2, 5), (-1, 4), (2, -1)]  # windows the public API cannot ask for yet


def _rule(i, j, Nq, Nk, window):
    """The contract's rule, one pair at a time (the brute force everything here is checked against)."""
    left, right = window
    diag = i + Nk - Nq
    return 0 <= j < Nk and i < Nq and (right < 0 or j <= diag + right) and (left < 0 or j >= diag - left)


def _draws(rng, n, past_the_end=2):
    """n random (Nq, Nk, window, q0, q1, k0, k1) cases: blocks may overhang the ends, and start up to
    ``past_the_end - 1`` rows past them."""
    for _ in range(n):
        Nq, Nk = (int(x) for x in rng.integers(1, 13, size=2))
        window = tuple(int(x) for x in rng.integers(-1, 6, size=2))
        q0, k0 = int(rng.integers(0, Nq + past_the_end)), int(rng.integers(0, Nk + past_the_end))
        q1, k1 = q0 + int(rng.integers(1, 6)), k0 + int(rng.integers(1, 6))
        yield Nq, Nk, window, q0, q1, k0, k1


def test_masks_against_brute_force():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    for Nq, Nk, window, q0, q1, k0, k1 in _draws(np.random.default_rng(seed), 250):
        case = f"seed={seed} Nq={Nq} Nk={Nk} window={window} rows [{q0}, {q1}) keys [{k0}, {k1})"
        rows, keys = np.arange(q0, q1), np.arange(k0, k1)
        brute = np.array([[_rule(i, j, Nq, Nk, window) for j in keys] for i in rows])
        assert np.array_equal(masks.visible(rows, keys, Nq, Nk, window), brute), case
        assert torch.equal(masks.visible(torch.arange(q0, q1), torch.arange(k0, k1), Nq, Nk, window),
                           torch.from_numpy(brute)), case
        # kv_range: exactly the keys some query of the block sees (they form one run)
        seen_keys = [j for j in range(Nk) if any(_rule(i, j, Nq, Nk, window) for i in rows)]
        lo, hi = masks.kv_range(q0, q1, Nq, Nk, window)
        assert (list(range(lo, hi)) == seen_keys) and 0 <= lo <= hi <= Nk, case
        seen_rows = [i for i in range(Nq) if any(_rule(i, j, Nq, Nk, window) for j in keys)]
        lo, hi = masks.q_range(k0, k1, Nq, Nk, window)
        assert (list(range(lo, hi)) == seen_rows) and 0 <= lo <= hi <= Nq, case
        real = brute[: max(0, min(q1, Nq) - q0), : max(0, min(k1, Nk) - k0)]
        expect = "empty" if not real.any() else ("full" if real.all() else "partial")
        assert masks.block_kind(q0, q1, k0, k1, Nq, Nk, window) == expect, case


def test_window_for_and_blocks():
    assert masks.window_for(False) == masks.FULL and masks.window_for(True) == masks.CAUSAL
    assert masks.window_for(True, (3, 2)) == (3, 0) and masks.window_for(False, (3, 2)) == (3, 2)
    assert list(masks.blocks(5, 17, 4)) == [1, 2, 3, 4] and list(masks.blocks(4, 4, 4)) == []
    assert "{MASK_DIAGRAM}" not in numpy_flash.flash_attn_numpy.__doc__
    for fn in (numpy_flash.flash_attn_numpy, torch_split.flash_attn_torch, reference.attention_reference):
        assert masks.MASK_DIAGRAM.rstrip() in fn.__doc__, fn.__name__  # written once, shown in each


# ------------------------------------------------------------------ the CUDA header, compiled for the host
_HOST_MAIN = r"""
#define __device__
#define __forceinline__ inline
#include "masks.cuh"
#include <cstdio>
int main() {
    int Nq, Nk, left, right, q0, q1, k0, k1, Bc;
    while (std::scanf("%d %d %d %d %d %d %d %d %d", &Nq, &Nk, &left, &right, &q0, &q1, &k0, &k1, &Bc) == 9) {
        const fa::Mask m = fa::make_mask(Nq, Nk, left, right);
        std::printf("%d %d %d %d %d %d %d %d ", m.kv_begin(q0), m.kv_end(q1), m.q_begin(k0), m.q_end(k1),
                    (int)m.full(q0, q1, k0, k1), (int)m.needs_mask(q0, q1, k0, k1), m.kv_tile_begin(q0, Bc),
                    m.kv_tile_end(q0, q1, Bc));
        for (int i = q0; i < q1; ++i)
            for (int j = k0; j < k1; ++j) std::printf("%d", (int)m.visible(i, j));
        std::printf(" |");  // each row's run, two rows past the block (and past Nq or Nk) included
        for (int i = q0; i < q1 + 2; ++i) std::printf(" %d %d", m.keys_of(i).first, m.keys_of(i).end);
        std::printf(" |");
        for (int j = k0; j < k1 + 2; ++j) std::printf(" %d %d", m.queries_of(j).first, m.queries_of(j).end);
        std::printf("\n");
    }
    return 0;
}
"""


def test_cuda_mask_header_matches_masks_py(tmp_path):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed: the CUDA mask header is compiled for the host with g++")
    (tmp_path / "main.cpp").write_text(_HOST_MAIN)
    exe = tmp_path / "masks_host"
    subprocess.run([gxx, "-std=c++17", "-O1", "-I", str(ROOT / "flash_attention_cuda" / "kernels"),
                    str(tmp_path / "main.cpp"), "-o", str(exe)], check=True, capture_output=True, text=True)
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    cases = [(*c, int(rng.integers(1, 5))) for c in _draws(rng, 400, past_the_end=0)]  # blocks of a real grid
    lines = [f"{Nq} {Nk} {w[0]} {w[1]} {q0} {q1} {k0} {k1} {Bc}" for Nq, Nk, w, q0, q1, k0, k1, Bc in cases]
    out = subprocess.run([str(exe)], input="\n".join(lines), check=True, capture_output=True,
                         text=True).stdout.splitlines()
    assert len(out) == len(cases)
    for (Nq, Nk, window, q0, q1, k0, k1, Bc), line in zip(cases, out):
        case = f"seed={seed} Nq={Nq} Nk={Nk} window={window} rows [{q0}, {q1}) keys [{k0}, {k1}) Bc={Bc}: {line}"
        head, keys_of, queries_of = line.split(" |")
        *ints, bits = head.split()
        kv_begin, kv_end, q_begin, q_end, full, needs_mask, tile_begin, tile_end = map(int, ints)
        # Mask::keys_of(i), Mask::queries_of(j): a row's run is exactly the keys (queries) visible() lets it see
        runs = np.array(keys_of.split(), dtype=int).reshape(-1, 2)
        for i, (first, end) in zip(range(q0, q1 + 2), runs):
            seen = np.flatnonzero(masks.visible(np.array([i]), np.arange(Nk), Nq, Nk, window)[0])
            assert list(seen) == list(range(first, max(first, end))), f"{case}: keys_of({i}) = [{first}, {end})"
        runs = np.array(queries_of.split(), dtype=int).reshape(-1, 2)
        for j, (first, end) in zip(range(k0, k1 + 2), runs):
            seen = np.flatnonzero(masks.visible(np.arange(Nq), np.array([j]), Nq, Nk, window)[:, 0])
            assert list(seen) == list(range(first, max(first, end))), f"{case}: queries_of({j}) = [{first}, {end})"
        kv, qr = masks.kv_range(q0, q1, Nq, Nk, window), masks.q_range(k0, k1, Nq, Nk, window)
        assert (kv_begin, max(kv_begin, kv_end)) == kv or (kv[0] == kv[1] and kv_end <= kv_begin), case
        assert (q_begin, max(q_begin, q_end)) == qr or (qr[0] == qr[1] and q_end <= q_begin), case
        assert list(range(tile_begin, tile_end)) == list(masks.blocks(*kv, Bc)), case
        kind = masks.block_kind(q0, q1, k0, k1, Nq, Nk, window)
        assert bool(full) == (kind == "full"), case
        assert bool(needs_mask) == (k1 > Nk or q1 > Nq or kind != "full"), case
        visible = masks.visible(np.arange(q0, q1), np.arange(k0, k1), Nq, Nk, window)
        assert bits == "".join(str(int(b)) for b in visible.ravel()), case


# ------------------------------------------------------------------ the loops take the window (not public yet)
def _reference(q, k, v, do, scale, window):
    """float64 O, lse and (dq, dk, dv) through the reference's standard attention with the window's mask."""
    q, k, v = (torch.from_numpy(x).requires_grad_(True) for x in (q, k, v))
    with torch.enable_grad():
        o, lse = reference._naive_torch(q, k, v, scale, window=window)
        o.backward(torch.from_numpy(do))
    return o.detach().numpy(), lse.detach().numpy(), (q.grad.numpy(), k.grad.numpy(), v.grad.numpy())


def _close(name, got, ref, case):
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-10, err_msg=f"{name} {case}")


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("Nq,Nk", [(9, 9), (6, 13), (13, 6)])
def test_loops_with_a_window_match_the_reference(window, Nq, Nk):
    rng = np.random.default_rng()
    q, do = rng.standard_normal((2, 1, 2, Nq, 8))
    k, v = rng.standard_normal((2, 1, 2, Nk, 8))
    scale = 0.4
    o_ref, lse_ref, grads_ref = _reference(q, k, v, do, scale, window)
    assert not np.isneginf(lse_ref).all()  # some row sees a key
    for loop in (numpy_flash._forward_v1, numpy_flash._forward_v2):
        with np.errstate(invalid="ignore"):
            o, lse = loop(q, k, v, window, scale, 3, 4, None)
        _close("O", o, o_ref, loop.__name__)
        _close("lse", lse, lse_ref, loop.__name__)
    for name, g, g_ref in zip("dq dk dv".split(), numpy_flash._backward(q, k, v, o, lse, do, window, scale, 3, 4),
                              grads_ref):
        _close(name, g, g_ref, "numpy backward")
    qt, kt, vt, dot = (torch.from_numpy(x) for x in (q, k, v, do))
    o, lse = torch_split._forward(qt, kt, vt, window, scale, 4)
    _close("O", o.numpy(), o_ref, "torch-split")
    _close("lse", lse.numpy(), lse_ref, "torch-split")
    for name, g, g_ref in zip("dq dk dv".split(), torch_split._backward(qt, kt, vt, o, lse, dot, window, scale, 4),
                              grads_ref):
        _close(name, g.numpy(), g_ref, "torch-split backward")


def test_loops_skip_the_blocks_a_window_hides():
    """A diagonal band (0, 0) with Br = Bc: each Q block reads one K/V block (v2) and vice versa (v1)."""
    N, D, B_ = 64, 4, 8
    q, k, v = np.random.default_rng().standard_normal((3, 1, 1, N, D))
    for loop, key in ((numpy_flash._forward_v2, "read_k"), (numpy_flash._forward_v1, "read_q")):
        stats = {}
        loop(q, k, v, (0, 0), 1.0, B_, B_, stats)
        assert stats[key] == N * D, (loop.__name__, stats)


def test_triton_sanitizer_cases_reach_the_merged_partial_loop():
    """tools/run_sanitizer.py --backend triton claims a query block whose K/V blocks are partial on both sides of
    full ones (the merged partial loop, masks.two_spans) on its fixed and forced tiles, GQA, dropout, Nq > Nk and a
    row that sees no key. Checked here with the mask module's block kinds, so a change to the case list cannot
    quietly drop what the sanitizer run covers."""
    from flash_attention_triton import configs as C
    from tools import run_sanitizer as R

    def stages(Nq, Nk, window, BM, BN):  # per query block: the kinds of its visited K/V blocks, in order
        return [[kind for k0 in range(0, Nk, BN)
                 if (kind := masks.block_kind(q0, q0 + BM, k0, k0 + BN, Nq, Nk, window)) != "empty"]
                for q0 in range(0, Nq, BM)]

    def both_sides(kinds):  # partial, then full, then partial again
        return "full" in kinds and kinds[0] == "partial" and kinds[-1] == "partial"

    both, gqa, dropout, no_key = set(), False, False, False
    for B, Hq, Hk, Nq, Nk, D, dtypes, kinds in R.TRITON_CASES:
        assert Hq % Hk == 0 and set(dtypes) <= {"float16", "bfloat16", "float32"}
        gqa |= Hk < Hq
        for causal, window_size, p in kinds:
            window = masks.window_for(causal, window_size)
            dropout |= p > 0
            no_key |= any(masks.kv_range(i, i + 1, Nq, Nk, window)[1] <= masks.kv_range(i, i + 1, Nq, Nk, window)[0]
                          for i in range(Nq))
            tiles = [C.small_config("fwd", 64, 2)] + ([R.TRITON_FORCED[0]["fwd"]] if D <= 128 else [])
            for BM, BN, *_ in tiles:
                if any(both_sides(k) for k in stages(Nq, Nk, window, BM, BN)):
                    both.add((BM, BN))
    assert both == {(64, 64), (128, 64)}, both
    assert gqa and dropout and no_key
