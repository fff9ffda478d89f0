"""Block sizes, warps and pipeline depths for the kernels.

Three sources of a launch configuration:

* under the interpreter (``TRITON_INTERPRET=1``, CPU tensors): one fixed config per kernel
  (``INTERPRETER``): the autotuner and ``do_bench`` need a GPU driver. Br != Bc on purpose, so
  the CPU tests exercise the mask's block arithmetic with unequal blocks;
* on the GPU, small problems (max(Nq, Nk) < ``AUTOTUNE_MIN_N``): one fixed config per head dim
  (``small_config``): tuning a 100-token problem costs more than it can save;
* on the GPU, larger problems: ``triton.autotune`` over ``FWD_CONFIGS`` / ``DKDV_CONFIGS`` /
  ``DQ_CONFIGS``, keyed on (Nq, Nk, HEAD_DIM, WINDOW_LEFT, WINDOW_RIGHT, DROPOUT, group) and (automatically)
  the tensors' dtypes, after ``prune`` drops the configs whose tiles cannot fit in shared memory.

A config is (BLOCK_M, BLOCK_N, num_warps, num_stages): BLOCK_M = Br (query rows), BLOCK_N = Bc (key rows).
"""
from __future__ import annotations

import triton

# fixed configs under the interpreter: kernel -> (BLOCK_M, BLOCK_N)
INTERPRETER = {"fwd": (64, 32), "dkdv": (32, 64), "dq": (64, 32)}

AUTOTUNE_MIN_N = 1024

# shared memory per block (opt-in maximum), bytes: A100 (sm80) and H100 (sm90)
SMEM_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}

# candidate configs for the GPU autotuner: (BLOCK_M, BLOCK_N, num_warps, num_stages)
FWD_CONFIGS = [
    (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3), (64, 32, 4, 2),
]
DKDV_CONFIGS = [  # BLOCK_N keys per program (dK/dV accumulators), BLOCK_M queries per step
    (64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3), (32, 32, 4, 2),
]
DQ_CONFIGS = [  # BLOCK_M queries per program (dQ accumulator), BLOCK_N keys per step
    (128, 64, 8, 3), (128, 64, 8, 2), (128, 32, 4, 3), (64, 64, 4, 3), (64, 16, 4, 1),
]
CANDIDATES = {"fwd": FWD_CONFIGS, "dkdv": DKDV_CONFIGS, "dq": DQ_CONFIGS}


def smem_estimate(kernel: str, BM: int, BN: int, stages: int, block_d: int, elem: int) -> int:
    """Rough shared-memory bytes of one program: the operand tiles the pipeline keeps in flight.

    At least two buffers of the loop's tiles even at num_stages=1; float32 (3xTF32 dots) keeps the
    split operands too: +25%. Checked against the compiler's figure by tests/test_triton_aot_compile.py.
    """
    stages = max(stages, 2)
    if kernel == "fwd":  # Q_i resident, K_j and V_j per stage, P_ij staged for the second dot
        est = elem * (BM * block_d + stages * 2 * BN * block_d + BM * BN)
    elif kernel == "dkdv":  # K_j, V_j resident, Q_i and dO_i per stage, P^T and dS^T staged
        est = elem * (2 * BN * block_d + stages * 2 * BM * block_d + 2 * BM * BN)
    elif kernel == "dq":  # Q_i, dO_i resident, K_j and V_j per stage, dS staged
        est = elem * (2 * BM * block_d + stages * 2 * BN * block_d + BM * BN)
    else:
        raise ValueError(f"unknown kernel {kernel!r}")
    return est * 5 // 4 if elem == 4 else est


def _regs_ok(kernel: str, BM: int, BN: int, warps: int, block_d: int) -> bool:
    """fp32 accumulators per thread must leave room for the rest (<= 128 of the 255 registers)."""
    threads = 32 * warps
    if kernel == "fwd":
        acc = BM * block_d + BM * BN  # acc and S_ij/P_ij
    elif kernel == "dkdv":
        acc = 2 * BN * block_d + BM * BN  # dK_j, dV_j and one (Bc, Br) score tile
    else:
        acc = BM * block_d + BM * BN  # dQ_i and S_ij/dS_ij
    return acc / threads <= 160


def prune(kernel: str, configs, block_d: int, elem: int, smem_limit: int = SMEM_LIMIT[90]):
    """Keep the configs whose tiles fit in ``smem_limit`` bytes and in the registers.

    ``configs`` are tuples (BM, BN, warps, stages) or ``triton.Config`` objects; returns the same kind.
    If nothing fits, the smallest tile is kept (the compiler then says OutOfResources).
    """
    def unpack(c):
        if isinstance(c, triton.Config):
            return c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages
        return c

    keep = []
    for c in configs:
        BM, BN, warps, stages = unpack(c)
        if smem_estimate(kernel, BM, BN, stages, block_d, elem) <= smem_limit and _regs_ok(kernel, BM, BN, warps, block_d):
            keep.append(c)
    if not keep:
        keep = [min(configs, key=lambda c: unpack(c)[0] * unpack(c)[1] * unpack(c)[3])]
    return keep


def small_config(kernel: str, block_d: int, elem: int):
    """The fixed GPU config for small problems: (BLOCK_M, BLOCK_N, num_warps, num_stages)."""
    if block_d <= 128 and elem <= 2:
        return {"fwd": (64, 64, 4, 2), "dkdv": (32, 64, 4, 2), "dq": (64, 32, 4, 2)}[kernel]
    if block_d <= 64:  # fp32, D <= 64
        return {"fwd": (64, 32, 4, 2), "dkdv": (32, 64, 4, 2), "dq": (64, 32, 4, 2)}[kernel]
    # D in (128, 256], or fp32 with D > 64: small tiles, shallow pipeline
    return {"fwd": (64, 32, 4, 1), "dkdv": (16, 32, 4, 1), "dq": (32, 16, 4, 1)}[kernel]


def triton_configs(kernel: str):
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in CANDIDATES[kernel]]
