"""The FlashAttention-2 forward kernel in Triton.

One program owns one query block Q_i (Br = BLOCK_M rows of one (batch, head)) and walks over
the key/value blocks K_j, V_j (Bc = BLOCK_N rows each), keeping the running row max m_i, the
running row sum l_i and the unnormalised output acc on chip (the NumPy backend's ``_forward_v2``
loop, one program per outer iteration).

The online softmax runs in base 2 with the scale folded in:

    S_ij * scale * log2(e)  =  S2_ij          exp(S * scale - m) = exp2(S2 - m2)

so each score costs one multiply-add and one ``exp2``; lse is written in natural log at the end
(lse = (m2 + log2(l)) * ln(2)).

The K/V loop has two stages:

* the unmasked stage: blocks every row of Q_i sees entirely (for causal, the blocks left of the
  diagonal; always inside [0, Nk)); no mask, no ``where``;
* the masked stage: the diagonal blocks of a causal mask and the ragged last block (Nk % Bc != 0).
  Blocks right of the diagonal are never visited.

Causal masking is bottom-right aligned: query i sees key j iff j <= i + (Nk - Nq).
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e)
LN2 = 0.6931471805599453  # ln(2)


@triton.jit
def load_tile(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              MASK_ROWS: tl.constexpr):
    """Load a (rows, BLOCK_D) tile; rows >= n_rows and columns >= HEAD_DIM read as 0."""
    if MASK_ROWS:
        if HEAD_DIM == BLOCK_D:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    else:
        if HEAD_DIM == BLOCK_D:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return x


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n, offs_d,
               Nk, causal_off, qk_scale, lo, hi,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, NEG_SCALE: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr):
    """Fold the K/V blocks [lo, hi) into (acc, l_i, m_i). K_ptr/V_ptr point at key row 0, column offs_d."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        # load K_j (Bc, D)
        k = load_tile(K_ptr + cols[:, None] * stride_kn, cols, Nk, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        # S_ij = Q_i K_j^T  (Br, Bc), fp32 accumulate
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        if MASKED:
            # S2_ij = S_ij * scale * log2(e), -inf where key j is past Nk or hidden by the causal rule
            qk = qk * qk_scale
            visible = cols[None, :] < Nk
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + causal_off)
            qk = tl.where(visible, qk, float("-inf"))
            # m_new = max(m_old, rowmax(S2_ij))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # a row that has seen no key yet keeps m = -inf: subtract 0 instead so exp2(-inf) = 0
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            # P_ij = exp2(S2_ij - m_new)
            p = tl.math.exp2(qk - m_sub[:, None])
            # alpha = exp2(m_old - m_new)
            alpha = tl.math.exp2(m_i - m_sub)
        else:
            # m_new = max(m_old, rowmax(S_ij) * scale * log2(e))   (rowmin for a negative scale)
            if NEG_SCALE:
                m_new = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)
            else:
                m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            # every score so far -inf (an inf in q or k): subtract 0 so exp2(-inf) = 0, not exp2(-inf + inf) = NaN
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            # P_ij = exp2(S_ij * scale * log2(e) - m_new)    (one fused multiply-add per score)
            p = tl.math.exp2(qk * qk_scale - m_sub[:, None])
            # alpha = exp2(m_old - m_new)
            alpha = tl.math.exp2(m_i - m_sub)
        # l_new = alpha * l_old + rowsum(P_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        # load V_j (Bc, D)
        v = load_tile(V_ptr + cols[:, None] * stride_vn, cols, Nk, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        # acc = alpha * acc + P_ij V_j   (P_ij rounded to V's dtype for the tensor cores, as in FA2)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["H", "Nq", "Nk"])
def attn_fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    H, Nq, Nk, qk_scale,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, NEG_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """O = softmax(Q K^T * scale) V and lse for one (Q block, batch*head) per program.

    Q (B, H, Nq, HEAD_DIM), K and V (B, H, Nk, HEAD_DIM): any strides. O (B, H, Nq, HEAD_DIM)
    contiguous, in Q's dtype; LSE (B, H, Nq) float32 contiguous, natural log.
    qk_scale = scale * log2(e). DOT_PREC: tl.dot's input_precision for fp32 inputs.
    Offsets: (batch, head) in int64, rows and columns in int32: the launcher guarantees that each (batch,
    head) slice spans fewer than 2**31 elements (``attention._fit_int32``).
    Grid: (cdiv(Nq, BLOCK_M), B * H). (H, Nq, Nk are not specialised: a value of 1 would become a
    compile-time constant, which made triton 3.6's ptxas crash at Nq = Nk = 1.)
    """
    pid_m = tl.program_id(0)
    if CAUSAL:
        # the last Q blocks see the most keys: start them first so the grid's tail is short
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    Q_ptr = Q + off_b * stride_qb + off_h * stride_qh + offs_d[None, :] * stride_qd
    K_ptr = K + off_b * stride_kb + off_h * stride_kh + offs_d[None, :] * stride_kd
    V_ptr = V + off_b * stride_vb + off_h * stride_vh + offs_d[None, :] * stride_vd

    # load Q_i (Br, D) once; it stays on chip for the whole K/V loop
    q = load_tile(Q_ptr + offs_m[:, None] * stride_qn, offs_m, Nq, offs_d, HEAD_DIM, BLOCK_D, True)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running row max (base 2)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running row sum of exp2(S2 - m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # unnormalised O_i

    # which K/V blocks to visit: [0, full) unmasked, [full, hi) masked
    causal_off = Nk - Nq  # query i sees key j iff j <= i + causal_off
    n_even = (Nk // BLOCK_N) * BLOCK_N  # keys in whole blocks
    if CAUSAL:
        # keys [0, hi) are seen by some row of this block; blocks past hi are skipped
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + causal_off, 0), Nk)
        # keys [0, full) are seen by every row of this block (its first row sees j <= start_m + causal_off)
        full = tl.minimum((tl.maximum(start_m + causal_off + 1, 0) // BLOCK_N) * BLOCK_N, n_even)
    else:
        hi = Nk
        full = n_even
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n, offs_d,
                               Nk, causal_off, qk_scale, 0, full,
                               False, CAUSAL, NEG_SCALE, HEAD_DIM, BLOCK_N, BLOCK_D, DOT_PREC)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n, offs_d,
                               Nk, causal_off, qk_scale, full, hi,
                               True, CAUSAL, NEG_SCALE, HEAD_DIM, BLOCK_N, BLOCK_D, DOT_PREC)

    # O_i = acc / l_i ; a row that saw no key (l = 0) gets O = 0 and lse = -inf.
    # l = NaN (a NaN score, or exp2(inf - inf) from a +inf score) stays NaN: O = NaN, and lse = NaN, or +inf
    # where m = +inf, as in the reference (``l > 0`` would be False for NaN and silently give 0 / -inf)
    none = l_i == 0.0
    l_safe = tl.where(none, 1.0, l_i)
    o = tl.where(none[:, None], 0.0, acc / l_safe[:, None])
    # lse_i = ln(sum_j exp(S_ij * scale)) = (m2_i + log2(l_i)) * ln(2)
    lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453
    lse = tl.where(m_i == float("inf"), float("inf"), lse)
    lse = tl.where(none, float("-inf"), lse)

    row_ok = offs_m < Nq
    tl.store(LSE + pid_bh.to(tl.int64) * Nq + offs_m, lse, mask=row_ok)
    O_ptr = O + pid_bh.to(tl.int64) * Nq * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    if HEAD_DIM == BLOCK_D:
        tl.store(O_ptr, o.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(O_ptr, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
