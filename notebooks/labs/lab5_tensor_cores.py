"""Lab 5, part 1: a NumPy model of the tensor core's fragment layout (mma.sync.m16n8k16, fp16).

One ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`` computes D = A B + C for a whole warp:
A is 16 x 16 (here a Q_i tile: 16 query rows, 16 of the D head dimensions), B is 16 x 8 (here K_j^T:
16 head dimensions, 8 keys), C and D are 16 x 8 fp32 (here S_ij = Q_i K_j^T). No lane holds a whole
row: the 256 halves of A are spread over the 32 lanes, 4 32-bit registers each, 2 halves (fp16) per
register; B over 2 registers per lane; D over 4 fp32 registers per lane. Which lane holds which element
is fixed by the hardware and documented in NVIDIA's PTX ISA, section "Matrix Fragments for
mma.m16n8k16 with floating point type". Write it down here, as functions of

    lane  0..31            groupID = lane >> 2 (0..7), threadID_in_group = lane % 4 (0..3)
    reg   the register     A: 0..3 (a0..a3, each two halves), B: 0..1, C/D: i = 0..3 (c0..c3)
    half  0 or 1           0: the low 16 bits (a0, a2, ... in the PTX ISA's numbering), 1: the high 16 bits

TODO(lab5) 1-3: a_fragment, b_fragment, c_fragment return the (row, col) of their tile.
TODO(lab5) 4-5: ldmatrix. `ldmatrix.sync.aligned.m8n8.x4.shared.b16` loads four 8 x 8 matrices of halves
from shared memory: lane 8 i + r gives the address of row r of matrix i (8 consecutive halves, 16 bytes),
and every lane receives, in register i, the two halves (lane >> 2, 2 (lane % 4)) and
(lane >> 2, 2 (lane % 4) + 1) of matrix i. ldmatrix_a_address(lane) returns the (row, col) of the A tile
(row-major, 16 x 16) where lane's 8 halves start so that the four registers come out as exactly
a_fragment's registers 0..3. ldmatrix_b_address(lane) does the same for `.x2` (two matrices, lanes 0..15)
on the K tile as it lies in shared memory: 8 keys x 16 dims, row-major, so that the two registers are
b_fragment's registers 0 and 1 (B = K^T: B's element (k, n) is the K tile's (n, k)).

Grade it from the repository root (no GPU needed):
    python notebooks/labs/grade.py lab5                 # this file; on a GPU also the .cu part
The grader checks that each map covers its tile exactly once, that it is the PTX ISA's layout, that your
ldmatrix addresses load the fragments, and that S = Q K^T comes out when Q and K are distributed to the
registers by your maps and a model of the tensor core multiplies them. Part 2 is lab5_mma_tile.cu: the
same tile on a real tensor core.
"""
from __future__ import annotations


def a_fragment(lane: int, reg: int, half: int) -> tuple:
    """(row, col) of the A tile (16 x 16, Q_i) held by half `half` of register `reg` (0..3) of `lane`.

    Hint: registers 0 and 2 hold rows groupID, registers 1 and 3 rows groupID + 8; registers 0 and 1 hold
    columns 0..7, registers 2 and 3 columns 8..15; the two halves of a register are neighbouring columns.
    """
    # TODO(lab5) 1: return (row, col); then delete the next line
    raise NotImplementedError("lab5 TODO 1/5: a_fragment")


def b_fragment(lane: int, reg: int, half: int) -> tuple:
    """(k, n) of the B tile (16 x 8, K_j^T) held by half `half` of register `reg` (0..1) of `lane`.

    Hint: a lane holds one column n of B (one key) and four of its rows k.
    """
    # TODO(lab5) 2: return (k, n); then delete the next line
    raise NotImplementedError("lab5 TODO 2/5: b_fragment")


def c_fragment(lane: int, i: int) -> tuple:
    """(row, col) of the C/D tile (16 x 8, fp32, S_ij) held by c[i] (i = 0..3) of `lane`."""
    # TODO(lab5) 3: return (row, col); then delete the next line
    raise NotImplementedError("lab5 TODO 3/5: c_fragment")


def ldmatrix_a_address(lane: int) -> tuple:
    """(row, col) of the A tile where the 8 halves that `lane` points ldmatrix.x4 to start (col: 0 or 8)."""
    # TODO(lab5) 4: return (row, col); then delete the next line
    raise NotImplementedError("lab5 TODO 4/5: ldmatrix_a_address")


def ldmatrix_b_address(lane: int) -> tuple:
    """(key, dim) of the K tile (8 x 16, row-major) where the 8 halves that `lane` (0..15) points ldmatrix.x2
    to start (dim: 0 or 8)."""
    # TODO(lab5) 5: return (key, dim); then delete the next line
    raise NotImplementedError("lab5 TODO 5/5: ldmatrix_b_address")
