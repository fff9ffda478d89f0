"""The FlashAttention-2 forward kernel in Triton.

One program owns one query block Q_i (Br = BLOCK_M rows of one (batch, head)) and walks over
the key/value blocks K_j, V_j (Bc = BLOCK_N rows each), keeping the running row max m_i, the
running row sum l_i and the unnormalised output acc on chip (the NumPy backend's ``_forward_v2``
loop, one program per outer iteration). BLOCK_M = Br, BLOCK_N = Bc.

The online softmax runs in base 2 with the scale folded in:

    S2_ij = S_ij * scale_log2,   scale_log2 = softmax_scale * log2(e)      exp(S * scale - m) = exp2(S2 - m2)

so each score costs one multiply and one ``exp2``; lse is written in natural log at the end
(lse = (m2 + log2(l)) * ln(2)). The scale is signed: the scores are scaled before the row max is
taken, so a negative (or zero) scale needs nothing else.

The mask is a window (WINDOW_LEFT, WINDOW_RIGHT), bottom-right aligned (``masks.py``; causal =
(-1, 0)). ``masks.kv_blocks`` splits the K/V blocks of a query block into three stages: partial blocks
(elementwise mask and bounds), full blocks (no mask, no ``where``), partial blocks again (the diagonal
of a causal mask and the ragged last block, Nk % Bc != 0). Empty blocks, on either side, are never
visited. The kernel walks the full blocks first and then both partial stages in one loop
(``masks.two_spans``), as the backward kernels do: two software-pipelined loops instead of three.

Grouped-query attention: K and V have Hk = H // group heads; query head h reads K/V head h // group
(the pointer moves, nothing is copied). Dropout (DROPOUT, a constexpr: without it the kernel is the plain
one): after P_ij, keep = tl.rand(dropout_seed, ((b*H + h)*Nq + i)*Nk + j) >= dropout_p (int64 offsets;
``philox.dropout_keep`` draws tl.rand's bits with fewer multiplies, ``flash_attention_py/philox.py`` the same bits); acc sums (P_ij * keep) V_j while l_i sums P_ij
before dropout, so lse is the softmax's own; O = acc / l_i / (1 - dropout_p).
"""
import triton
import triton.language as tl

from .masks import kv_blocks, span_start, two_spans, visible
from .philox import dropout_keep, keep_threshold
from .tiles import _LN2, head_ptrs, load_rows, load_tile, program_rows, store_rows


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n, offs_d,
               Nq, Nk, scale_log2, lo, hi, lo2, hi2, drop_rows, dropout_p, dropout_seed,
               MASKED: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, DROPOUT: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr):
    """Fold the K/V blocks of [lo, hi) and then of [lo2, hi2) (``masks.two_spans``) into (acc, l_i, m_i): the
    online-softmax step, written once.

    MASKED: the blocks are partial (apply ``masks.visible``, bounds included); else every query of the
    block sees every key of each block and the blocks lie inside [0, Nk). K_ptr/V_ptr point at key row 0.
    """
    n1, n = two_spans(lo, hi, lo2, hi2, BLOCK_N)
    keep_T = tl.zeros([], dtype=tl.uint32)
    if DROPOUT:
        keep_T = keep_threshold(dropout_p)  # keep <=> tl.rand >= p, as an integer test on Philox's word
    for i in range(0, n):
        cols = span_start(i, n1, lo, lo2, BLOCK_N) + offs_n
        # load K_j (Bc, D)
        k = load_tile(K_ptr + cols[:, None] * stride_kn, cols, Nk, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        # S_ij = Q_i K_j^T  (Br, Bc), fp32 accumulate; then in base 2 with the signed scale folded in
        S_ij = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * scale_log2
        if MASKED:  # -inf where key j is past Nk or outside query i's window
            S_ij = tl.where(visible(offs_m[:, None], cols[None, :], Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT),
                            S_ij, float("-inf"))
        # m_new = max(m_i, rowmax(S_ij))
        m_new = tl.maximum(m_i, tl.max(S_ij, 1))
        # a row that has seen no key yet (or only -inf scores) keeps m = -inf: subtract 0 instead,
        # so exp2(-inf) = 0, not exp2(-inf + inf) = NaN
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        # P_ij = exp2(S_ij - m_new)
        P_ij = tl.math.exp2(S_ij - m_sub[:, None])
        # alpha = exp2(m_old - m_new)
        alpha = tl.math.exp2(m_i - m_sub)
        # l_i = alpha * l_i + rowsum(P_ij)
        l_i = l_i * alpha + tl.sum(P_ij, 1)
        # load V_j (Bc, D)
        v = load_tile(V_ptr + cols[:, None] * stride_vn, cols, Nk, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        if DROPOUT:  # Z_ij: keep where tl.rand(seed, ((b*H + h)*Nq + i)*Nk + j) >= p; 1/(1-p) at the end
            keep = dropout_keep(dropout_seed, drop_rows[:, None] * Nk + cols[None, :], keep_T)
            P_ij = tl.where(keep, P_ij, 0.0)
        # acc = alpha * acc + P_ij V_j   (P_ij rounded to V's dtype for the tensor cores, as in FA2)
        acc = acc * alpha[:, None]
        acc = tl.dot(P_ij.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["H", "Nq", "Nk", "dropout_seed"])
def attn_fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, H, group, Nq, Nk, scale_log2, dropout_p, dropout_seed,
    HEAD_DIM: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """O = softmax(Q K^T * scale) V and lse for one (Q block, batch*head) per program.

    Q (B, H, Nq, HEAD_DIM), K and V (B, H // group, Nk, HEAD_DIM): any strides (query head h reads K/V
    head h // group). O (B, H, Nq, HEAD_DIM) contiguous, in Q's dtype; LSE (B, H, Nq) float32 contiguous,
    natural log, of the softmax before dropout. scale_log2 = softmax_scale * log2(e), signed.
    (WINDOW_LEFT, WINDOW_RIGHT): the mask (``masks.py``). DROPOUT: drop P_ij with probability dropout_p
    (float32, in (0, 1)) by tl.rand(dropout_seed, offset); dropout_p and dropout_seed are unused without it.
    DOT_PREC: tl.dot's input_precision for fp32 inputs.
    Grid: (cdiv(Nq, BLOCK_M), B * H). (H, Nq, Nk are not specialised: a value of 1 would become a
    compile-time constant, which made triton 3.6's ptxas crash at Nq = Nk = 1.)
    """
    start_m, pid_bh, off_b, off_h = program_rows(H, BLOCK_M, WINDOW_RIGHT >= 0)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    off_hk = off_h // group  # grouped-query attention: the K/V head of query head off_h
    K_ptr = head_ptrs(K, off_b, off_hk, stride_kb, stride_kh, stride_kd, offs_d)
    V_ptr = head_ptrs(V, off_b, off_hk, stride_vb, stride_vh, stride_vd, offs_d)
    drop_rows = pid_bh.to(tl.int64) * Nq + offs_m  # dropout offsets of row i: ((b*H + h)*Nq + i)*Nk + j

    # load Q_i (Br, D) once; it stays on chip for the whole K/V loop
    q = load_rows(Q, off_b, off_h, stride_qb, stride_qh, stride_qn, stride_qd, offs_m, Nq, offs_d, HEAD_DIM, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running row max (base 2)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running row sum of exp2(S2 - m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # unnormalised O_i

    # the K/V blocks this query block sees: [start, full_start) partial, [full_start, full_end) full,
    # [full_end, end) partial (the first stage is empty unless the window bounds the left side)
    start, full_start, full_end, end = kv_blocks(start_m, Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_M, BLOCK_N)
    # the full blocks, then both partial stages in one loop (the first is empty without a left bound)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n, offs_d,
                               Nq, Nk, scale_log2, full_start, full_end, full_end, full_end, drop_rows, dropout_p,
                               dropout_seed, False, WINDOW_LEFT, WINDOW_RIGHT, DROPOUT, HEAD_DIM, BLOCK_N, BLOCK_D,
                               DOT_PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n, offs_d,
                               Nq, Nk, scale_log2, start, full_start, full_end, end, drop_rows, dropout_p,
                               dropout_seed, True, WINDOW_LEFT, WINDOW_RIGHT, DROPOUT, HEAD_DIM, BLOCK_N, BLOCK_D,
                               DOT_PREC)

    # O_i = acc / l_i ; a row that saw no key (l = 0) gets O = 0 and lse = -inf.
    # l = NaN (a NaN score, or exp2(inf - inf) from a +inf score) stays NaN: O = NaN, and lse = NaN, or +inf
    # where m = +inf, as in the reference (``l > 0`` would be False for NaN and silently give 0 / -inf)
    none = l_i == 0.0
    l_safe = tl.where(none, 1.0, l_i)
    o = tl.where(none[:, None], 0.0, acc / l_safe[:, None])
    if DROPOUT:  # O_i = (P_i * Z_i / (1 - p)) V: the kept weights' scale, once per row
        o = o * (1.0 / (1.0 - dropout_p))
    # lse_i = ln(sum_j exp(S_ij * scale)) = (m2_i + log2(l_i)) * ln(2)
    lse = (m_i + tl.math.log2(l_safe)) * _LN2
    lse = tl.where(m_i == float("inf"), float("inf"), lse)
    lse = tl.where(none, float("-inf"), lse)

    tl.store(LSE + pid_bh.to(tl.int64) * Nq + offs_m, lse, mask=offs_m < Nq)
    store_rows(O, pid_bh, offs_m, Nq, offs_d, o, HEAD_DIM, BLOCK_D)
