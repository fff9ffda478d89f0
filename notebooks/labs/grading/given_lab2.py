"""The given code of lab 2, the grader's own copy: the kernel and wrapper of lab2_triton_inner_loop.py
with the loop body still to be filled. The grader copies the student's loop body (the lines between
the two ``-----`` marker lines of the kernel) into this text and runs the result, never the rest of the
student's file. tests/test_labs.py checks that this is the template's code, line for line.
"""
from __future__ import annotations

import triton
import triton.language as tl

from flash_attention_py import masks
from flash_attention_py.validation import check_block_size, check_flag, check_qkv, resolve_softmax_scale

LOG2_E = 1.4426950408889634  # exp(x) = exp2(x * log2(e))


@triton.jit
def _lab2_fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, N_Q, N_K, D, qk_scale, causal_offset,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program: one Q block of BLOCK_M rows of one (batch, head). Grid (cdiv(N_Q, BLOCK_M), B*H)."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // H
    off_h = off_bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows of this block
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    # load Q_i (BLOCK_M, BLOCK_D) once; it stays in registers for the whole loop
    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < N_Q) & d_ok[None, :], other=0.0)
    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running row max (base-2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)  # running row sum of exp2(S - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # unnormalised O_i

    # causal (bottom-right): query i sees key j iff j <= i + causal_offset; later blocks are skipped
    kv_end = N_K
    if CAUSAL:
        kv_end = tl.minimum(N_K, tl.maximum(0, (start_m + 1) * BLOCK_M + causal_offset))
    for start_n in range(0, kv_end, BLOCK_N):
        offs_kv = start_n + offs_n  # key rows of this block
        kv_ok = offs_kv < N_K
        # K_j^T (BLOCK_D, BLOCK_N) and V_j (BLOCK_N, BLOCK_D); rows past N_K read as 0
        kT = tl.load(k_base + offs_kv[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                     mask=kv_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_base + offs_kv[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=kv_ok[:, None] & d_ok[None, :], other=0.0)
        # visible (BLOCK_M, BLOCK_N): True where query row offs_m may see key offs_kv
        visible = kv_ok[None, :] & (offs_m[:, None] >= 0)
        if CAUSAL:
            visible = visible & (offs_kv[None, :] <= offs_m[:, None] + causal_offset)
        # ---------------------------------------------------------------- the loop body (lab 2)
        # TODO(lab2): write the loop body here, using q, kT, v, visible, qk_scale, m_i, l_i, acc.
        # It must update m_i, l_i and acc (see the module docstring). Delete the next line when done.
        tl.static_assert(False, "lab2 TODO: the inner loop body of _lab2_fwd_kernel is not written yet")
        # ---------------------------------------------------------------- end of the loop body

    # O_i = acc / l_i; a row that saw no key (l = 0) gets O = 0 and lse = -inf
    seen = l_i > 0
    l_div = tl.where(seen, l_i, 1.0)
    o = acc / l_div[:, None]
    # lse = log(sum exp(S)) = (m_i + log2(l_i)) * ln(2)   (m_i is in base-2 units)
    lse = tl.where(seen, (m_i + tl.log2(l_div)) * 0.6931471805599453, float("-inf"))  # ln(2)
    o_ptrs = O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o, mask=(offs_m[:, None] < N_Q) & d_ok[None, :])
    tl.store(LSE + off_bh * N_Q + offs_m, lse, mask=offs_m < N_Q)


def flash_attn_lab2(q, k, v, *, causal=False, softmax_scale=None, return_lse=False, block_m=32, block_n=32,
                    num_warps=4, num_stages=2):
    """Forward attention with the lab-2 kernel. GIVEN.

    q (B, H, Nq, D), k and v (B, H, Nk, D): float32, float16 or bfloat16 torch tensors of one dtype on
    one device (the CPU under TRITON_INTERPRET=1, or a CUDA GPU), any strides. causal is bottom-right
    aligned. block_m (BLOCK_M) and block_n (BLOCK_N): powers of two >= 16; num_warps and num_stages are
    passed to the launch (they matter on a GPU only).
    Returns O (B, H, Nq, D) in q's dtype, and lse (B, H, Nq) float32 (natural log) if return_lse.
    """
    import torch

    fn = "flash_attn_lab2"
    B, H, Nq, Nk, D = check_qkv(q, k, v, fn=fn, kinds=("torch",), dtypes=("float32", "float16", "bfloat16"))
    check_flag(causal, "causal", fn=fn)
    scale = resolve_softmax_scale(softmax_scale, D, fn=fn)
    for name, bs in (("block_m", block_m), ("block_n", block_n)):
        check_block_size(bs, name, fn=fn)
        if bs < 16 or bs & (bs - 1):
            raise ValueError(f"{fn}: {name} must be a power of two >= 16 (tl.dot needs it), got {bs}")
    o = torch.empty((B, H, Nq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Nq), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    _lab2_fwd_kernel[grid](
        q, k, v, o, lse,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, Nq, Nk, D, scale * LOG2_E, masks.offset(Nq, Nk),
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(D)),
        num_warps=num_warps, num_stages=num_stages,
    )
    return (o, lse) if return_lse else o
