"""Tile loads and stores shared by the forward and backward kernels, and the base-2 constants.

Every kernel owns one (batch, head) slice per program column and addresses rows of a (B, H, N, D)
tensor: the slice's base pointer is offset in int64, rows and columns within it in int32 (the launcher
guarantees a slice spans fewer than 2**31 elements: ``attention._fit_int32``). A head dim that is not
a power of two >= 16 is padded to BLOCK_D and the pad columns are masked off.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = 0.6931471805599453  # ln(2): ln(x) = log2(x) * LN2
_LOG2E = tl.constexpr(LOG2E)  # the same numbers, readable inside @triton.jit functions
_LN2 = tl.constexpr(LN2)


@triton.jit
def program_rows(H, BLOCK: tl.constexpr, HEAVY_LAST: tl.constexpr):
    """(first row, pid_bh, off_b, off_h) of this program in a grid (cdiv(N, BLOCK), B * H): its rows start at
    that row of (batch, head) = (off_b, off_h) (int64), pid_bh = off_b * H + off_h.

    HEAVY_LAST: the last blocks do the most work (a window bounded on the right: the last query blocks see
    the most keys), so the programs take them first and the grid's tail is short.
    """
    pid = tl.program_id(0)
    if HEAVY_LAST:
        pid = tl.num_programs(0) - 1 - pid
    pid_bh = tl.program_id(1)
    return pid * BLOCK, pid_bh, (pid_bh // H).to(tl.int64), (pid_bh % H).to(tl.int64)


@triton.jit
def head_ptrs(X, off_b, off_h, stride_b, stride_h, stride_d, offs_d):
    """Pointers (1, BLOCK_D) to row 0 of the (off_b, off_h) slice of a strided (B, H, N, D) tensor;
    add ``rows[:, None] * stride_n`` for a tile of rows."""
    return X + off_b * stride_b + off_h * stride_h + offs_d[None, :] * stride_d


@triton.jit
def load_tile(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              MASK_ROWS: tl.constexpr):
    """Load a (rows, BLOCK_D) tile; rows >= n_rows (when MASK_ROWS) and columns >= HEAD_DIM read as 0."""
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
def load_rows(X, off_b, off_h, stride_b, stride_h, stride_n, stride_d, rows, n_rows, offs_d,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The (rows, BLOCK_D) tile of the (off_b, off_h) slice of a strided (B, H, n_rows, HEAD_DIM) tensor X;
    rows >= n_rows and columns >= HEAD_DIM read as 0."""
    ptrs = head_ptrs(X, off_b, off_h, stride_b, stride_h, stride_d, offs_d) + rows[:, None] * stride_n
    return load_tile(ptrs, rows, n_rows, offs_d, HEAD_DIM, BLOCK_D, True)


@triton.jit
def store_rows(X, pid_bh, rows, n_rows, offs_d, x, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store x (rows, BLOCK_D) into a contiguous (B * H, n_rows, HEAD_DIM) tensor X, in X's dtype:
    rows < n_rows and columns < HEAD_DIM only."""
    ok = rows[:, None] < n_rows
    if HEAD_DIM != BLOCK_D:
        ok = ok & (offs_d[None, :] < HEAD_DIM)
    ptrs = X + pid_bh.to(tl.int64) * n_rows * HEAD_DIM + rows[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(ptrs, x.to(X.dtype.element_ty), mask=ok)
