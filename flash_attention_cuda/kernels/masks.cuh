// masks.cuh -- the mask rule, once for every CUDA kernel: which keys a query sees, and which blocks
// hold any. The same rule as flash_attention_py/masks.py and flash_attention_triton/masks.py.
//
// A mask is a window (left, right) aligned to the bottom-right corner. With offset = Nk - Nq, query i
// sees key j iff 0 <= j < Nk, i < Nq and
//     j <= i + offset + right   when right >= 0   (-1: no bound)
//     j >= i + offset - left    when left  >= 0   (-1: no bound)
// Full attention is (-1, -1), causal (-1, 0), causal local attention (w, 0).
//
//     causal (-1, 0)        local (2, 0)          causal, Nq = 5, Nk = 2
//        k0 k1 k2 k3           k0 k1 k2 k3           k0 k1
//     q0  1  0  0  0        q0  1  0  0  0        q0  0  0   <- sees no key: O = 0, lse = -inf
//     q1  1  1  0  0        q1  1  1  0  0        q1  0  0
//     q2  1  1  1  0        q2  1  1  1  0        q2  0  0
//     q3  1  1  1  1        q3  0  1  1  1        q3  1  0
//                                                 q4  1  1
//
// Every kernel builds one fa::Mask from its (Nq, Nk, window_left, window_right) arguments and asks it:
//   mask.visible(i, j)                      elementwise rule (bounds included)
//   mask.kv_begin(q0), mask.kv_end(q1)      keys any query in [q0, q1) sees: the forward's K/V loop range
//   mask.q_begin(k0),  mask.q_end(k1)       queries that see any key in [k0, k1): the backward's Q loop range
//   mask.kv_tile_begin(q0, Bc), mask.kv_tile_end(q0, q1, Bc)   the same K/V range in whole tiles of Bc keys
//   mask.keys_of(i), mask.queries_of(j)     the one run of keys query i sees, of queries key j sees (a Span)
//   mask.full(q0, q1, k0, k1)               every real (query, key) pair of the block is visible: no mask
//   mask.needs_mask(q0, q1, k0, k1)         not full, or past Nk or Nq: the tile applies visible()
//   mask.heavy_last()                       later query blocks see more keys (launch them first)
//   mask.keys_heavy_last()                  later key blocks are seen by more queries (the backward's blocks)
// No #include: compiles under NVRTC and nvcc alike.
#pragma once

namespace fa {

struct Span {  // [first, end): empty when end <= first
    int first, end;
};

struct Mask {
    int Nq, Nk, left, right;  // window: -1 = unbounded on that side

    __device__ __forceinline__ int offset() const { return Nk - Nq; }  // the one bottom-right offset

    __device__ __forceinline__ bool visible(int i, int j) const {
        const int diag = i + offset();
        return i < Nq && j >= 0 && j < Nk && (right < 0 || j <= diag + right) && (left < 0 || j >= diag - left);
    }
    // [kv_begin(q0), kv_end(q1)): the keys any query of [q0, q1) sees (empty when kv_end <= kv_begin)
    __device__ __forceinline__ int kv_begin(int q0) const {
        return left < 0 ? 0 : clamp(q0 + offset() - left, Nk);
    }
    __device__ __forceinline__ int kv_end(int q1) const {
        if (right < 0) return Nk;
        const int last = (q1 < Nq ? q1 : Nq) - 1;
        return clamp(last + offset() + right + 1, Nk);
    }
    // [q_begin(k0), q_end(k1)): the queries that see any key of [k0, k1)
    __device__ __forceinline__ int q_begin(int k0) const {
        return right < 0 ? 0 : clamp(k0 - offset() - right, Nq);
    }
    __device__ __forceinline__ int q_end(int k1) const {
        if (left < 0) return Nq;
        const int last = (k1 < Nk ? k1 : Nk) - 1;
        return clamp(last - offset() + left + 1, Nq);
    }
    // A row of the mask is one run: query i sees exactly the keys [kv_begin(i), kv_end(i + 1)), key j is seen by
    // exactly the queries [q_begin(j), q_end(j + 1)); a query past Nq sees none, a key past Nk is seen by none.
    // A pair's test against its row's run is one compare (the backward's mask pass, bwd::visible_cols).
    __device__ __forceinline__ Span keys_of(int i) const {
        const int lo = kv_begin(i);
        return Span{lo, i < Nq ? kv_end(i + 1) : lo};
    }
    __device__ __forceinline__ Span queries_of(int j) const {
        const int lo = q_begin(j);
        return Span{lo, j < Nk ? q_end(j + 1) : lo};
    }
    // Every real pair of rows [q0, q1) x keys [k0, k1) is visible (rows >= Nq and keys >= Nk do not count:
    // the bounds are checked apart from the mask).
    __device__ __forceinline__ bool full(int q0, int q1, int k0, int k1) const {
        const int last_row = (q1 < Nq ? q1 : Nq) - 1, last_key = (k1 < Nk ? k1 : Nk) - 1;
        return (right < 0 || last_key <= q0 + offset() + right) && (left < 0 || k0 >= last_row + offset() - left);
    }

    // The same range in tiles of Bc keys (tile j holds keys [j Bc, (j + 1) Bc)): a query block [q0, q1) visits
    // tiles kv_tile_begin(q0, Bc) <= j < kv_tile_end(q0, q1, Bc), none when its rows see no key.
    __device__ __forceinline__ int kv_tile_begin(int q0, int Bc) const { return kv_begin(q0) / Bc; }
    __device__ __forceinline__ int kv_tile_end(int q0, int q1, int Bc) const {
        const int end = kv_end(q1);
        return end > kv_begin(q0) ? (end + Bc - 1) / Bc : kv_tile_begin(q0, Bc);
    }
    // The tile [q0, q1) x [k0, k1) of a kernel must apply visible() element by element: some real pair is
    // masked, or the tile runs past the last key (k1 > Nk) or the last query (q1 > Nq). The rows past the ends
    // are zero rows of their tiles, and a zero row times an infinite entry of the other operand is NaN, not 0:
    // unmasked, a score of a row past Nq with an infinite key would put NaN into that key's dK and dV
    // (0 * NaN), where every real query may give 0. Every other tile takes the unmasked fast path.
    __device__ __forceinline__ bool needs_mask(int q0, int q1, int k0, int k1) const {
        return k1 > Nk || q1 > Nq || !full(q0, q1, k0, k1);
    }
    // With a right bound (causal) a later query block sees at least as many keys as an earlier one: the
    // forward kernels launch their query blocks last-first then, so the longest K/V loops start first.
    __device__ __forceinline__ bool heavy_last() const { return right >= 0; }
    // For the blocks of keys of a backward it is the other way round: with a right bound an earlier key block is
    // seen by at least as many queries as a later one; with a left bound alone a later one is.
    __device__ __forceinline__ bool keys_heavy_last() const { return right < 0 && left >= 0; }

    __device__ __forceinline__ static int clamp(int x, int n) { return x < 0 ? 0 : (x > n ? n : x); }
};

// The window of a launch: the launcher passes (left, right); causal is (-1, 0).
__device__ __forceinline__ Mask make_mask(int Nq, int Nk, int window_left, int window_right) {
    return Mask{Nq, Nk, window_left, window_right};
}

}  // namespace fa
