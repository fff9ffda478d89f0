"""Lab 5, part 1: a NumPy model of the tensor core's fragment layout (mma.sync.m16n8k16, fp16).

Solution. See notebooks/labs/lab5_tensor_cores.py for the exercise text.
"""
from __future__ import annotations


def a_fragment(lane: int, reg: int, half: int) -> tuple:
    """(row, col) of the A tile (16 x 16, Q_i) held by half `half` of register `reg` of `lane`."""
    group, tig = lane >> 2, lane % 4
    row = group + 8 * (reg & 1)  # registers 1 and 3: the lower 8 rows
    col = 2 * tig + half + 8 * (reg >> 1)  # registers 2 and 3: the right 8 columns
    return row, col


def b_fragment(lane: int, reg: int, half: int) -> tuple:
    """(k, n) of the B tile (16 x 8, K_j^T) held by half `half` of register `reg` of `lane`."""
    group, tig = lane >> 2, lane % 4
    return 2 * tig + half + 8 * reg, group


def c_fragment(lane: int, i: int) -> tuple:
    """(row, col) of the C/D tile (16 x 8, fp32, S_ij) held by c[i] of `lane`."""
    group, tig = lane >> 2, lane % 4
    return group + 8 * (i >> 1), 2 * tig + (i & 1)


def ldmatrix_a_address(lane: int) -> tuple:
    """(row, col) of the A tile where the 8 halves that `lane` points ldmatrix.x4 to start."""
    matrix, r = lane // 8, lane % 8
    return r + 8 * (matrix & 1), 8 * (matrix >> 1)


def ldmatrix_b_address(lane: int) -> tuple:
    """(key, dim) of the K tile (8 x 16, row-major) where the 8 halves that `lane` (0..15) points ldmatrix.x2 to start."""
    matrix, r = lane // 8, lane % 8
    return r, 8 * matrix
