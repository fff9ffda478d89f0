"""The FlashAttention-2 backward in two Triton kernels, launched in this order.

1. ``attn_bwd_dq_kernel``: one program per Q block Q_i; first Delta_i = rowsum(dO_i * O_i) for its rows
   ((B, H, Nq) float32, stored for kernel 2), then loops over the K/V blocks it sees and accumulates dQ_i on
   chip (no atomics).
2. ``attn_bwd_dkdv_kernel``: one program per K/V block K_j, V_j; loops over the Q blocks that see it
   and accumulates dK_j and dV_j on chip (no atomics), reading the Delta that kernel 1 stored.

Delta has no kernel of its own (FlashAttention-2 and -3 give it a preprocessing kernel): the dQ program holds
dO_i already and reads O_i once more, and every row of Delta is ready before the dK/dV kernel starts. One launch
fewer, and the first launch is a long one, which matters at small N, where the host's time per call is as long
as the GPU's.

Both main kernels recompute P_ij = exp(S_ij * scale - lse_i) = exp2(S_ij * scale * log2(e) - lse_i * log2(e))
from the forward's lse (in base 2: lse2_i = lse_i * log2(e)), so the (Nq, Nk) matrix P is never stored:

    dV_j += P_ij^T dO_i
    dP_ij = dO_i V_j^T
    dS_ij = P_ij * (dP_ij - Delta_i)
    dQ_i += scale * dS_ij K_j
    dK_j += scale * dS_ij^T Q_i

The same mask as the forward (``masks.py``, a window (WINDOW_LEFT, WINDOW_RIGHT) as constexprs):
``masks.kv_blocks`` (dQ) and ``masks.q_blocks`` (dK/dV) split each loop into partial blocks (masked
elementwise), full blocks (no mask) and partial blocks again; empty blocks are never visited. The kernels run the
full blocks first, then both partial stages as one loop (``masks.two_spans``): two software-pipelined loops a program
instead of three, the partial ones often a block or two long each.
BLOCK_M = Br (query rows), BLOCK_N = Bc (key rows). scale_log2 = softmax_scale * log2(e), signed; the
gradients' factor softmax_scale is scale_log2 * ln(2).

Grouped-query attention (K, V with Hk = H // group heads; query head h reads K/V head h // group): the dQ
kernel reads K/V head h // group; the dK/dV kernel runs per (K/V block, batch, K/V head, split) and loops
over its share of the group's query heads, summing their contributions in registers (no atomics, no copy
of K/V). With one split a program covers the whole group and writes dK, dV; with more (few K/V heads, so
few programs: MQA has B * cdiv(Nk, Bc) of them), each writes a float32 partial sum and the launcher adds
the splits up.

Dropout (DROPOUT constexpr): the keep mask Z is drawn again from the seed, exactly as the forward drew it
(tl.rand(dropout_seed, ((b*H + h)*Nq + i)*Nk + j) >= dropout_p, through ``philox.dropout_keep``), never stored:

    dV_j += (P_ij * Z_ij / (1 - p))^T dO_i
    dP_ij = (dO_i V_j^T) * Z_ij / (1 - p)
    dS_ij = P_ij * (dP_ij - Delta_i)            (Delta_i = rowsum(dO_i * O_i) as before: O is the dropped output)
"""
import triton
import triton.language as tl

from .masks import kv_blocks, q_blocks, span_start, two_spans, visible
from .philox import dropout_keep, keep_threshold
from .tiles import _LN2, _LOG2E, head_ptrs, load_rows, load_tile, program_rows, store_rows


@triton.jit
def lse_base2(lse):
    """lse2_i = lse_i * log2(e), for P_ij = exp2(S2_ij - lse2_i).

    A row that saw no key (lse = -inf) gets 0: it meets only masked entries, or scores of -inf. A row
    with a +inf score (lse = +inf) gets NaN, so its P is NaN everywhere, as in the reference.
    """
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * _LOG2E)
    return tl.where(lse == float("inf"), float("nan"), lse2)


@triton.jit
def keep_scaled(x, keep, dropout_p):
    """x * Z / (1 - p): the kept entries of x scaled by 1 / (1 - dropout_p), the dropped ones 0."""
    return tl.where(keep, x * (1.0 / (1.0 - dropout_p)), 0.0)


@triton.jit
def _dkdv_inner(dk, dv, k, v, Q_ptr, DO_ptr, LSE_ptr, DELTA_ptr, stride_qn, stride_don,
                offs_n, offs_m0, offs_d, Nq, Nk, scale_log2, lo, hi, lo2, hi2, drop_row0, dropout_p, dropout_seed,
                MASKED: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, DROPOUT: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr):
    """Fold the Q blocks of [lo, hi) and then of [lo2, hi2) (``two_spans``) into (dk, dv) of one K/V block (its key
    rows offs_n).

    MASKED: partial blocks (``masks.visible``, bounds included); else whole Q blocks inside [0, Nq) whose
    every query sees every key of this block. DROPOUT: drop_row0 = (b*H + h)*Nq (int64), the dropout
    offsets' row base of this query head.
    """
    n1, n = two_spans(lo, hi, lo2, hi2, BLOCK_M)
    keep_T = tl.zeros([], dtype=tl.uint32)
    if DROPOUT:
        keep_T = keep_threshold(dropout_p)  # keep <=> tl.rand >= p, as an integer test on Philox's word
    for i in range(0, n):
        rows = span_start(i, n1, lo, lo2, BLOCK_M) + offs_m0
        # load Q_i (Br, D), dO_i (Br, D), lse_i and Delta_i (Br)
        q = load_tile(Q_ptr + rows[:, None] * stride_qn, rows, Nq, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        do = load_tile(DO_ptr + rows[:, None] * stride_don, rows, Nq, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        if MASKED:
            lse = tl.load(LSE_ptr + rows, mask=rows < Nq, other=0.0)
            delta = tl.load(DELTA_ptr + rows, mask=rows < Nq, other=0.0)
        else:
            lse = tl.load(LSE_ptr + rows)
            delta = tl.load(DELTA_ptr + rows)
        # S_ij^T = K_j Q_i^T  (Bc, Br), in base 2 with the signed scale folded in
        S_ijT = tl.dot(k, tl.trans(q), input_precision=DOT_PREC) * scale_log2
        # P_ij^T = exp2(S_ij^T - lse2_i)   (the forward's probabilities, recomputed)
        P_ijT = tl.math.exp2(S_ijT - lse_base2(lse)[None, :])
        if MASKED:
            seen = visible(rows[None, :], offs_n[:, None], Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT)
            P_ijT = tl.where(seen, P_ijT, 0.0)
        # dP_ij^T = V_j dO_i^T
        dP_ijT = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        if DROPOUT:  # Z_ij^T, drawn again: the forward's offsets ((b*H + h)*Nq + i)*Nk + j, transposed
            keep = dropout_keep(dropout_seed, (drop_row0 + rows[None, :]) * Nk + offs_n[:, None], keep_T)
            # dV_j += (P_ij * Z_ij / (1 - p))^T dO_i
            dv = tl.dot(keep_scaled(P_ijT, keep, dropout_p).to(do.dtype), do, dv, input_precision=DOT_PREC)
            # dP_ij^T (of the dropped weights) = (V_j dO_i^T) * Z_ij^T / (1 - p)
            dP_ijT = keep_scaled(dP_ijT, keep, dropout_p)
        else:
            # dV_j += P_ij^T dO_i
            dv = tl.dot(P_ijT.to(do.dtype), do, dv, input_precision=DOT_PREC)
        # dS_ij^T = P_ij^T * (dP_ij^T - Delta_i)
        dS_ijT = P_ijT * (dP_ijT - delta[None, :])
        if MASKED:
            dS_ijT = tl.where(seen, dS_ijT, 0.0)  # 0 * NaN is NaN: a hidden pair gets no gradient from a NaN row
        # dK_j += dS_ij^T Q_i   (times softmax_scale once, at the end)
        dk = tl.dot(dS_ijT.to(q.dtype), q, dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit(do_not_specialize=["H", "Nq", "Nk", "dropout_seed"])
def attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_dob, stride_doh, stride_don, stride_dod,
    H, group, splits, Nq, Nk, scale_log2, dropout_p, dropout_seed,
    HEAD_DIM: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """dK_j, dV_j for one K/V block (Bc = BLOCK_N keys) of one (batch, K/V head, split) per program.

    Q, DO (B, H, Nq, HEAD_DIM); K, V (B, Hk, Nk, HEAD_DIM) with Hk = H // group. The group's query heads
    hk * group ... hk * group + group - 1 are cut into ``splits`` equal shares (group % splits == 0); the
    program sums the contributions of its share in registers. LSE and DELTA are (B, H, Nq) float32
    contiguous; DK and DV (B, Hk * splits, Nk, HEAD_DIM) contiguous: split s of K/V head hk at head
    hk * splits + s (with splits = 1, dK and dV themselves). Grid: (cdiv(Nk, BLOCK_N), B * Hk * splits).
    """
    Hk = H // group
    start_n, pid_out, off_b, off_hs = program_rows(Hk * splits, BLOCK_N, False)
    off_hk = off_hs // splits
    share = group // splits
    first_h = off_hk * group + (off_hs % splits) * share  # this program's first query head
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    # load K_j, V_j (Bc, D) once
    k = load_rows(K, off_b, off_hk, stride_kb, stride_kh, stride_kn, stride_kd, offs_n, Nk, offs_d, HEAD_DIM, BLOCK_D)
    v = load_rows(V, off_b, off_hk, stride_vb, stride_vh, stride_vn, stride_vd, offs_n, Nk, offs_d, HEAD_DIM, BLOCK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    # the Q blocks that see this K/V block: [start, full_start) partial, [full_start, full_end) full,
    # [full_end, end) partial (the first stage is empty unless the window bounds the right side)
    start, full_start, full_end, end = q_blocks(start_n, Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_M, BLOCK_N)
    for g in range(0, share):  # this program's query heads that read this K/V head (one without GQA)
        off_h = first_h + g
        pid_bh = off_b * H + off_h  # int64
        Q_ptr = head_ptrs(Q, off_b, off_h, stride_qb, stride_qh, stride_qd, offs_d)
        DO_ptr = head_ptrs(DO, off_b, off_h, stride_dob, stride_doh, stride_dod, offs_d)
        LSE_ptr = LSE + pid_bh * Nq
        DELTA_ptr = DELTA + pid_bh * Nq
        drop_row0 = pid_bh * Nq  # dropout offsets: ((b*H + h)*Nq + i)*Nk + j
        # the full Q blocks, then both partial stages in one loop (the first is empty without a right bound)
        dk, dv = _dkdv_inner(dk, dv, k, v, Q_ptr, DO_ptr, LSE_ptr, DELTA_ptr, stride_qn, stride_don,
                             offs_n, offs_m0, offs_d, Nq, Nk, scale_log2, full_start, full_end, full_end, full_end,
                             drop_row0, dropout_p, dropout_seed,
                             False, WINDOW_LEFT, WINDOW_RIGHT, DROPOUT, HEAD_DIM, BLOCK_M, BLOCK_D, DOT_PREC)
        dk, dv = _dkdv_inner(dk, dv, k, v, Q_ptr, DO_ptr, LSE_ptr, DELTA_ptr, stride_qn, stride_don,
                             offs_n, offs_m0, offs_d, Nq, Nk, scale_log2, start, full_start, full_end, end,
                             drop_row0, dropout_p, dropout_seed,
                             True, WINDOW_LEFT, WINDOW_RIGHT, DROPOUT, HEAD_DIM, BLOCK_M, BLOCK_D, DOT_PREC)
    # dK_j = softmax_scale * sum_h sum_i dS_ij^T Q_i  (summed over the group's query heads)
    dk = dk * (scale_log2 * _LN2)

    store_rows(DK, pid_out, offs_n, Nk, offs_d, dk, HEAD_DIM, BLOCK_D)
    store_rows(DV, pid_out, offs_n, Nk, offs_d, dv, HEAD_DIM, BLOCK_D)


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n0, offs_d,
              Nq, Nk, scale_log2, lo, hi, lo2, hi2, drop_rows, dropout_p, dropout_seed,
              MASKED: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, DROPOUT: tl.constexpr,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr):
    """Fold the K/V blocks of [lo, hi) and then of [lo2, hi2) (``two_spans``) into dq of one Q block (its query rows
    offs_m); MASKED as in the forward."""
    n1, n = two_spans(lo, hi, lo2, hi2, BLOCK_N)
    keep_T = tl.zeros([], dtype=tl.uint32)
    if DROPOUT:
        keep_T = keep_threshold(dropout_p)  # keep <=> tl.rand >= p, as an integer test on Philox's word
    for i in range(0, n):
        cols = span_start(i, n1, lo, lo2, BLOCK_N) + offs_n0
        # load K_j, V_j (Bc, D)
        k = load_tile(K_ptr + cols[:, None] * stride_kn, cols, Nk, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        v = load_tile(V_ptr + cols[:, None] * stride_vn, cols, Nk, offs_d, HEAD_DIM, BLOCK_D, MASKED)
        # S_ij = Q_i K_j^T in base 2 with the scale folded in;  P_ij = exp2(S_ij - lse2_i)
        S_ij = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * scale_log2
        P_ij = tl.math.exp2(S_ij - lse2[:, None])
        if MASKED:
            seen = visible(offs_m[:, None], cols[None, :], Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT)
            P_ij = tl.where(seen, P_ij, 0.0)
        # dP_ij = dO_i V_j^T
        dP_ij = tl.dot(do, tl.trans(v), input_precision=DOT_PREC)
        if DROPOUT:  # of the dropped weights: dP_ij * Z_ij / (1 - p), Z_ij drawn again from the seed
            keep = dropout_keep(dropout_seed, drop_rows[:, None] * Nk + cols[None, :], keep_T)
            dP_ij = keep_scaled(dP_ij, keep, dropout_p)
        # dS_ij = P_ij * (dP_ij - Delta_i)
        dS_ij = P_ij * (dP_ij - delta[:, None])
        if MASKED:
            dS_ij = tl.where(seen, dS_ij, 0.0)  # 0 * NaN is NaN: a hidden pair gets no gradient from a NaN row
        # dQ_i += dS_ij K_j   (times softmax_scale once, at the end)
        dq = tl.dot(dS_ij.to(k.dtype), k, dq, input_precision=DOT_PREC)
    return dq


@triton.jit(do_not_specialize=["H", "Nq", "Nk", "dropout_seed"])
def attn_bwd_dq_kernel(
    Q, K, V, O, DO, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_dob, stride_doh, stride_don, stride_dod,
    H, group, Nq, Nk, scale_log2, dropout_p, dropout_seed,
    HEAD_DIM: tl.constexpr, WINDOW_LEFT: tl.constexpr, WINDOW_RIGHT: tl.constexpr, DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """Delta_i and dQ_i for one Q block (Br = BLOCK_M queries) of one (batch, head) per program.

    K, V (B, H // group, Nk, HEAD_DIM): query head h reads K/V head h // group. O, DQ (B, H, Nq, HEAD_DIM)
    contiguous; DELTA (B, H, Nq) float32 contiguous, written here. Grid: (cdiv(Nq, BLOCK_M), B * H).
    """
    start_m, pid_bh, off_b, off_h = program_rows(H, BLOCK_M, WINDOW_RIGHT >= 0)  # the heaviest Q blocks first
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    # load Q_i, dO_i (Br, D), lse_i (Br) once
    q = load_rows(Q, off_b, off_h, stride_qb, stride_qh, stride_qn, stride_qd, offs_m, Nq, offs_d, HEAD_DIM, BLOCK_D)
    do = load_rows(DO, off_b, off_h, stride_dob, stride_doh, stride_don, stride_dod, offs_m, Nq, offs_d,
                   HEAD_DIM, BLOCK_D)
    lse2 = lse_base2(tl.load(LSE + pid_bh.to(tl.int64) * Nq + offs_m, mask=offs_m < Nq, other=0.0))
    # Delta_i = rowsum(dO_i * O_i), stored for the dK/dV kernel (launched after this one)
    o = load_tile(O + pid_bh.to(tl.int64) * Nq * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                  offs_m, Nq, offs_d, HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * Nq + offs_m, delta, mask=offs_m < Nq)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    off_hk = off_h // group  # grouped-query attention: the K/V head of query head off_h
    K_ptr = head_ptrs(K, off_b, off_hk, stride_kb, stride_kh, stride_kd, offs_d)
    V_ptr = head_ptrs(V, off_b, off_hk, stride_vb, stride_vh, stride_vd, offs_d)
    drop_rows = pid_bh.to(tl.int64) * Nq + offs_m  # dropout offsets of row i: ((b*H + h)*Nq + i)*Nk + j

    # the forward's K/V stages: [start, full_start) partial, [full_start, full_end) full, [full_end, end) partial
    start, full_start, full_end, end = kv_blocks(start_m, Nq, Nk, WINDOW_LEFT, WINDOW_RIGHT, BLOCK_M, BLOCK_N)
    # the full K/V blocks, then both partial stages in one loop (the first is empty without a left bound)
    dq = _dq_inner(dq, q, do, lse2, delta, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n0, offs_d,
                   Nq, Nk, scale_log2, full_start, full_end, full_end, full_end, drop_rows, dropout_p, dropout_seed,
                   False, WINDOW_LEFT, WINDOW_RIGHT, DROPOUT, HEAD_DIM, BLOCK_N, BLOCK_D, DOT_PREC)
    dq = _dq_inner(dq, q, do, lse2, delta, K_ptr, V_ptr, stride_kn, stride_vn, offs_m, offs_n0, offs_d,
                   Nq, Nk, scale_log2, start, full_start, full_end, end, drop_rows, dropout_p, dropout_seed,
                   True, WINDOW_LEFT, WINDOW_RIGHT, DROPOUT, HEAD_DIM, BLOCK_N, BLOCK_D, DOT_PREC)
    # dQ_i = softmax_scale * sum_j dS_ij K_j
    dq = dq * (scale_log2 * _LN2)

    store_rows(DQ, pid_bh, offs_m, Nq, offs_d, dq, HEAD_DIM, BLOCK_D)
