#!/usr/bin/env python
"""Lab 5's answer: the m16n8k16 fp16 fragment layout of the PTX ISA, and the hints that quote it.

Not part of a student release (``release.py`` leaves notebooks/labs/instructor/ out). With this file present,
``cuda_labs.lab5_layout_checks`` compares a student's maps with ``true_layout()`` entry by entry and prints
``HINT``; without it (a student copy) the checks compare each lane's registers with the salted digests of
notebooks/labs/lab5_layout_digests.json, which this file writes:

    python notebooks/labs/instructor/lab5_layout.py --check    # the digests match true_layout() (exit 0)
    python notebooks/labs/instructor/lab5_layout.py --write    # new salt, new digests (after a change here)

Source: NVIDIA, PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", with
groupID = lane >> 2 and threadID_in_group = lane % 4.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LABS = os.path.dirname(HERE)


def true_layout() -> dict:
    """The PTX ISA's m16n8k16 fp16 fragment layout, as int64 arrays of (row, col):

    * "A" (32, 4, 2, 2): [lane, reg, half] -> (row, col) of A (16 x 16, row-major); half 0 is the low 16 bits
      (the even a_i of the PTX ISA), 1 the high. row = groupID (+ 8 for registers 1 and 3),
      col = 2 * threadID_in_group + half (+ 8 for registers 2 and 3).
    * "B" (32, 2, 2, 2): [lane, reg, half] -> (k, n) of B (16 x 8, K x N): k = 2 * threadID_in_group + half
      (+ 8 for register 1), n = groupID.
    * "C" (32, 4, 2): [lane, i] -> (row, col) of C/D (16 x 8, fp32): row = groupID (+ 8 for c2, c3),
      col = 2 * threadID_in_group + (i & 1).
    """
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3
    A = np.zeros((32, 4, 2, 2), np.int64)
    for reg in range(4):
        for half in range(2):
            A[:, reg, half, 0] = g + 8 * (reg & 1)
            A[:, reg, half, 1] = 2 * t + half + 8 * (reg >> 1)
    B = np.zeros((32, 2, 2, 2), np.int64)
    for reg in range(2):
        for half in range(2):
            B[:, reg, half, 0] = 2 * t + half + 8 * reg
            B[:, reg, half, 1] = g
    C = np.zeros((32, 4, 2), np.int64)
    for i in range(4):
        C[:, i, 0] = g + 8 * (i >> 1)
        C[:, i, 1] = 2 * t + (i & 1)
    return {"A": A, "B": B, "C": C}


# Hints that state the answer; shown only where this file is present.
HINT = {
    "A": {"en": "A: groupID = lane >> 2, threadID_in_group = lane % 4; row = groupID, + 8 for registers 1 and 3; "
                "col = 2 * threadID_in_group + half, + 8 for registers 2 and 3.",
          "zh": "A：groupID = lane >> 2，threadID_in_group = lane % 4；row = groupID，寄存器 1 和 3 再 + 8；"
                "col = 2 * threadID_in_group + half，寄存器 2 和 3 再 + 8。"},
    "B": {"en": "B: k = 2 * threadID_in_group + half, + 8 for register 1; n = groupID.",
          "zh": "B：k = 2 * threadID_in_group + half，寄存器 1 再 + 8；n = groupID。"},
    "C": {"en": "C/D: row = groupID, + 8 for c2 and c3; col = 2 * threadID_in_group + (i & 1).",
          "zh": "C/D：row = groupID，c2 和 c3 再 + 8；col = 2 * threadID_in_group + (i & 1)。"},
    "LA": {"en": "ldmatrix.x4: lanes 8 i .. 8 i + 7 give the 8 row addresses of matrix i, and matrix i lands in "
                 "register i; registers 0..3 of A are the 8x8 blocks (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), "
                 "(rows 0-7, cols 8-15), (rows 8-15, cols 8-15).",
           "zh": "ldmatrix.x4：lane 8i .. 8i+7 提供矩阵 i 的 8 个行地址，矩阵 i 进入寄存器 i；A 的寄存器 0..3 是 8x8 块"
                 "（0-7 行, 0-7 列）、（8-15 行, 0-7 列）、（0-7 行, 8-15 列）、（8-15 行, 8-15 列）。"},
    "LB": {"en": "ldmatrix.x2 on the K tile (8 keys x 16 dims, row-major): register 0 of B is K[0:8, 0:8], "
                 "register 1 is K[0:8, 8:16]; lanes 0-7 and 8-15 give their rows (B = K^T, so a K row is a B column).",
           "zh": "在 K tile（8 个 key x 16 维，行主序）上用 ldmatrix.x2：B 的寄存器 0 是 K[0:8, 0:8]，寄存器 1 是 "
                 "K[0:8, 8:16]；lane 0-7 和 8-15 给出各自的行（B = K^T，所以 K 的一行是 B 的一列）。"},
}


def _cuda_labs():
    """notebooks/labs/cuda_labs.py (the digest function lives there, since a student copy needs it)."""
    mod = sys.modules.get("cuda_labs")
    if mod is None:
        spec = importlib.util.spec_from_file_location("cuda_labs", os.path.join(LABS, "cuda_labs.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["cuda_labs"] = mod
        spec.loader.exec_module(mod)
    return mod


def digest_table(salt: str) -> dict:
    """The digest file's content for ``salt`` (a hex string): see cuda_labs.lab5_layout_digests."""
    CL = _cuda_labs()
    return dict(salt=salt, iterations=CL.LAB5_DIGEST_ITERATIONS, digests=CL.lab5_layout_digests(true_layout(), salt))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="check or rewrite lab 5's layout digests")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="exit 0 when the digest file matches true_layout()")
    g.add_argument("--write", action="store_true", help="write the digest file with a new random salt")
    args = ap.parse_args(argv)
    path = _cuda_labs().LAB5_DIGESTS_FILE
    if args.write:
        table = digest_table(secrets.token_hex(16))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
        print(f"wrote {path} (salt {table['salt']})")
        return 0
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    ok = stored == digest_table(stored["salt"])
    print(f"{path}: {'matches' if ok else 'does NOT match'} true_layout()")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
