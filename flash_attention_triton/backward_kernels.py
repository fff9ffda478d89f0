"""The FlashAttention-2 backward in three Triton kernels.

1. ``attn_bwd_preprocess``: Delta_i = rowsum(dO_i * O_i)        (B, H, Nq) float32
2. ``attn_bwd_dkdv_kernel``: one program per K/V block K_j, V_j; loops over the Q blocks that see it
   and accumulates dK_j and dV_j on chip (no atomics).
3. ``attn_bwd_dq_kernel``: one program per Q block Q_i; loops over the K/V blocks it sees and
   accumulates dQ_i on chip (no atomics).

Both main kernels recompute P_ij = exp(S_ij * scale - lse_i) = exp2(S_ij * scale * log2(e) - lse_i * log2(e))
from the forward's lse, so the (Nq, Nk) matrix P is never stored:

    dV_j += P_ij^T dO_i
    dP_ij = dO_i V_j^T
    dS_ij = P_ij * (dP_ij - Delta_i)
    dQ_i += scale * dS_ij K_j
    dK_j += scale * dS_ij^T Q_i

The same masking rules as the forward: blocks that no query/key pair of the block can see are
skipped, blocks on the causal diagonal and ragged tail blocks are masked, the rest run unmasked.
"""
import triton
import triton.language as tl

from .forward_kernel import load_tile


@triton.jit(do_not_specialize=["H", "Nq"])
def attn_bwd_preprocess(
    O, DO, DELTA,
    stride_dob, stride_doh, stride_don, stride_dod,
    H, Nq,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Delta (B, H, Nq) float32 contiguous = rowsum(dO * O); O contiguous. Grid: (cdiv(Nq, BLOCK_M), B * H)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = load_tile(O + pid_bh.to(tl.int64) * Nq * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                  offs_m, Nq, offs_d, HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_don
                   + offs_d[None, :] * stride_dod, offs_m, Nq, offs_d, HEAD_DIM, BLOCK_D, True)
    # Delta_i = rowsum(dO_i * O_i)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * Nq + offs_m, delta, mask=offs_m < Nq)


@triton.jit
def _dkdv_inner(dk, dv, k, v, Q_ptr, DO_ptr, LSE_ptr, DELTA_ptr, stride_qn, stride_don,
                offs_n, offs_m0, offs_d, Nq, causal_off, qk_scale, lo, hi,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr):
    """Fold the Q blocks [lo, hi) into (dk, dv) of one K/V block (its key rows offs_n)."""
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m0
        # load Q_i (Br, D), dO_i (Br, D), lse_i and Delta_i (Br)
        q = load_tile(Q_ptr + rows[:, None] * stride_qn, rows, Nq, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        do = load_tile(DO_ptr + rows[:, None] * stride_don, rows, Nq, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        if MASKED:
            lse = tl.load(LSE_ptr + rows, mask=rows < Nq, other=0.0)
            delta = tl.load(DELTA_ptr + rows, mask=rows < Nq, other=0.0)
        else:
            lse = tl.load(LSE_ptr + rows)
            delta = tl.load(DELTA_ptr + rows)
        # lse in base 2; a row that saw no key (lse = -inf) only meets masked entries below;
        # a row with a +inf score (lse = +inf) has P = NaN everywhere, as in the reference
        lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
        lse2 = tl.where(lse == float("inf"), float("nan"), lse2)
        # S_ij^T = K_j Q_i^T  (Bc, Br)
        qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PREC)
        # P_ij^T = exp2(S_ij^T * scale * log2(e) - lse2_i)   (the forward's probabilities, recomputed)
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])
        if MASKED:
            visible = rows[None, :] < Nq
            if CAUSAL:
                visible = visible & (offs_n[:, None] <= rows[None, :] + causal_off)
            pT = tl.where(visible, pT, 0.0)
        # dV_j += P_ij^T dO_i
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PREC)
        # dP_ij^T = V_j dO_i^T
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        # dS_ij^T = P_ij^T * (dP_ij^T - Delta_i)
        dsT = pT * (dpT - delta[None, :])
        if MASKED:
            dsT = tl.where(visible, dsT, 0.0)  # 0 * NaN is NaN: a hidden pair gets no gradient from a NaN row
        # dK_j += dS_ij^T Q_i   (times scale once, at the end)
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit(do_not_specialize=["H", "Nq", "Nk"])
def attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    H, Nq, Nk, softmax_scale, qk_scale,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """dK_j, dV_j for one K/V block (Bc = BLOCK_N keys) of one (batch, head) per program.

    LSE and DELTA are (B, H, Nq) float32 contiguous; DK and DV (B, H, Nk, HEAD_DIM) contiguous.
    Grid: (cdiv(Nk, BLOCK_N), B * H).
    """
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    # load K_j, V_j (Bc, D) once
    k = load_tile(K + off_b * stride_kb + off_h * stride_kh + offs_n[:, None] * stride_kn
                  + offs_d[None, :] * stride_kd, offs_n, Nk, offs_d, HEAD_DIM, BLOCK_D, True)
    v = load_tile(V + off_b * stride_vb + off_h * stride_vh + offs_n[:, None] * stride_vn
                  + offs_d[None, :] * stride_vd, offs_n, Nk, offs_d, HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    Q_ptr = Q + off_b * stride_qb + off_h * stride_qh + offs_d[None, :] * stride_qd
    DO_ptr = DO + off_b * stride_dob + off_h * stride_doh + offs_d[None, :] * stride_dod
    LSE_ptr = LSE + pid_bh.to(tl.int64) * Nq
    DELTA_ptr = DELTA + pid_bh.to(tl.int64) * Nq

    causal_off = Nk - Nq  # query i sees key j iff j <= i + causal_off
    n_even = (Nq // BLOCK_M) * BLOCK_M  # queries in whole blocks
    n_round = tl.cdiv(Nq, BLOCK_M) * BLOCK_M
    if CAUSAL:
        # queries before start_n - causal_off see no key of this block: start at that query's block
        lo = (tl.maximum(start_n - causal_off, 0) // BLOCK_M) * BLOCK_M
        # queries from start_n + BLOCK_N - 1 - causal_off on see every key of this block
        mid = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - causal_off, 0), BLOCK_M) * BLOCK_M
    else:
        lo = 0
        mid = 0
    # masked stage: the blocks on the causal diagonal
    dk, dv = _dkdv_inner(dk, dv, k, v, Q_ptr, DO_ptr, LSE_ptr, DELTA_ptr, stride_qn, stride_don,
                         offs_n, offs_m0, offs_d, Nq, causal_off, qk_scale, lo, tl.minimum(mid, n_round),
                         True, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_D, DOT_PREC)
    # unmasked stage: whole Q blocks that see every key of this block
    dk, dv = _dkdv_inner(dk, dv, k, v, Q_ptr, DO_ptr, LSE_ptr, DELTA_ptr, stride_qn, stride_don,
                         offs_n, offs_m0, offs_d, Nq, causal_off, qk_scale, mid, n_even,
                         False, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_D, DOT_PREC)
    # masked stage: the ragged last Q block (Nq % Br != 0)
    dk, dv = _dkdv_inner(dk, dv, k, v, Q_ptr, DO_ptr, LSE_ptr, DELTA_ptr, stride_qn, stride_don,
                         offs_n, offs_m0, offs_d, Nq, causal_off, qk_scale, tl.maximum(mid, n_even), Nq,
                         True, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_D, DOT_PREC)
    # dK_j = scale * sum_i dS_ij^T Q_i
    dk = dk * softmax_scale

    row_ok = offs_n[:, None] < Nk
    if HEAD_DIM != BLOCK_D:
        row_ok = row_ok & (offs_d[None, :] < HEAD_DIM)
    out_off = pid_bh.to(tl.int64) * Nk * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out_off, dk.to(DK.dtype.element_ty), mask=row_ok)
    tl.store(DV + out_off, dv.to(DV.dtype.element_ty), mask=row_ok)


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n0, offs_d,
              Nk, causal_off, qk_scale, lo, hi,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr):
    """Fold the K/V blocks [lo, hi) into dq of one Q block (its query rows offs_m)."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n0
        # load K_j, V_j (Bc, D)
        k = load_tile(K_ptr + cols[:, None] * stride_kn, cols, Nk, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        v = load_tile(V_ptr + cols[:, None] * stride_vn, cols, Nk, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        # S_ij = Q_i K_j^T ;  P_ij = exp2(S_ij * scale * log2(e) - lse2_i)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            visible = cols[None, :] < Nk
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + causal_off)
            p = tl.where(visible, p, 0.0)
        # dP_ij = dO_i V_j^T
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        # dS_ij = P_ij * (dP_ij - Delta_i)
        ds = p * (dp - delta[:, None])
        if MASKED:
            ds = tl.where(visible, ds, 0.0)  # 0 * NaN is NaN: a hidden pair gets no gradient from a NaN row
        # dQ_i += dS_ij K_j   (times scale once, at the end)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


@triton.jit(do_not_specialize=["H", "Nq", "Nk"])
def attn_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    H, Nq, Nk, softmax_scale, qk_scale,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """dQ_i for one Q block (Br = BLOCK_M queries) of one (batch, head) per program.

    DQ (B, H, Nq, HEAD_DIM) contiguous. Grid: (cdiv(Nq, BLOCK_M), B * H).
    """
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m  # the heaviest Q blocks first
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    # load Q_i, dO_i (Br, D), lse_i, Delta_i (Br) once
    q = load_tile(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qn
                  + offs_d[None, :] * stride_qd, offs_m, Nq, offs_d, HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_don
                   + offs_d[None, :] * stride_dod, offs_m, Nq, offs_d, HEAD_DIM, BLOCK_D, True)
    lse = tl.load(LSE + pid_bh.to(tl.int64) * Nq + offs_m, mask=offs_m < Nq, other=0.0)
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * Nq + offs_m, mask=offs_m < Nq, other=0.0)
    # lse in base 2; a row that saw no key (lse = -inf) only meets masked entries;
    # a row with a +inf score (lse = +inf) has P = NaN everywhere, as in the reference
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
    lse2 = tl.where(lse == float("inf"), float("nan"), lse2)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    K_ptr = K + off_b * stride_kb + off_h * stride_kh + offs_d[None, :] * stride_kd
    V_ptr = V + off_b * stride_vb + off_h * stride_vh + offs_d[None, :] * stride_vd

    # the forward's block ranges: [0, full) unmasked, [full, hi) masked
    causal_off = Nk - Nq
    n_even = (Nk // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + causal_off, 0), Nk)
        full = tl.minimum((tl.maximum(start_m + causal_off + 1, 0) // BLOCK_N) * BLOCK_N, n_even)
    else:
        hi = Nk
        full = n_even
    dq = _dq_inner(dq, q, do, lse2, delta, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n0, offs_d,
                   Nk, causal_off, qk_scale, 0, full, False, CAUSAL, HEAD_DIM, BLOCK_N, BLOCK_D, DOT_PREC)
    dq = _dq_inner(dq, q, do, lse2, delta, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n0, offs_d,
                   Nk, causal_off, qk_scale, full, hi, True, CAUSAL, HEAD_DIM, BLOCK_N, BLOCK_D, DOT_PREC)
    # dQ_i = scale * sum_j dS_ij K_j
    dq = dq * softmax_scale

    ok = offs_m[:, None] < Nq
    if HEAD_DIM != BLOCK_D:
        ok = ok & (offs_d[None, :] < HEAD_DIM)
    tl.store(DQ + pid_bh.to(tl.int64) * Nq * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=ok)
