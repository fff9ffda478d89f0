#!/usr/bin/env python
"""Grader for the labs: runs your TODO parts inside the repository's own code and explains what fails.

    python notebooks/labs/grade.py lab1 [FILE]     NumPy online-softmax merge step
    python notebooks/labs/grade.py lab2 [FILE]     Triton inner K/V loop (CPU interpreter; speed on a GPU)
    python notebooks/labs/grade.py lab3 [FILE]     CUDA tiled kernel, four device functions
    python notebooks/labs/grade.py lab4 [FILE]     NumPy backward, the inner step
    python notebooks/labs/grade.py lab5 [FILE...]  one tensor-core tile: layout model (.py) and kernel (.cu)
    python notebooks/labs/grade.py LAB --solution  grade the reference solution instead
    options: --quick, --lang zh, --json results.json, --hidden-seed N, --timeout S

FILE defaults to the lab's template in notebooks/labs/. The grader takes only the functions (lab 2: the
loop body) that the lab asks you to write and runs them inside its own copy of the given code, in a
child process with a timeout per case, on the visible cases of flash_attention_py/testing.py and on hidden
randomized cases. It compares with the float64 reference under the harness's tolerance policy
(max-abs error <= 2 x naive-attention error in the same dtype + a floor), prints one line per case,
points per group, and a hint for the first failing case. Exit code 0 only when every case that can be
graded here passes; 1 otherwise; 2 for a usage error. The grader itself lives in grading/.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "grading"))

from core import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
