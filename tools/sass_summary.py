"""Count the instructions that matter in each kernel's SASS (needs nvcc and cuobjdump).

    python3 tools/sass_summary.py [--arch sm_90] [--source mma.cu]

Builds the .cu with ``nvcc -cubin --resource-usage`` and prints, per kernel, its registers/spills and
how many HGMMA (wgmma), WARPGROUP (wgmma fence/wait), HMMA (tensor-core mma.sync), LDSM (ldmatrix), LDGSTS (cp.async), MUFU (exp2/log2/rcp), BAR,
SHFL, LDL/STL (local memory: spills) instructions it contains.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

KERNEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flash_attention_cuda", "kernels")
OPS = ["HGMMA", "WARPGROUP", "HMMA", "LDSM", "LDGSTS", "LDS", "STS", "LDG", "STG", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "F2FP",
       "SHFL", "BAR", "LDL", "STL"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--source", action="append")
    args = ap.parse_args()
    for source in args.source or ["mma.cu", "tiled.cu"]:
        with tempfile.TemporaryDirectory() as tmp:
            cubin = os.path.join(tmp, "k.cubin")
            arch = "sm_90a" if source == "wgmma.cu" else args.arch  # Hopper-only instructions
            target = [f"-gencode=arch=compute_{arch[3:]},code={arch}"] if arch.endswith("a") else [f"-arch={arch}"]
            res = subprocess.run(["nvcc", "-cubin", *target, "-std=c++17", "--resource-usage", "-o", cubin,
                                  os.path.join(KERNEL_DIR, source)], capture_output=True, text=True)
            print(f"== {source} ({arch})")
            for line in (res.stdout + res.stderr).splitlines():
                if "registers" in line or "spill" in line or "error" in line:
                    print("  " + line.strip())
            sass = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True).stdout
        for chunk in re.split(r"\n\s+Function : ", sass)[1:]:
            name = chunk.split("\n")[0].strip()
            ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9]*)", chunk))
            print(f"  {name}: " + ", ".join(f"{k} {ops[k]}" for k in OPS if ops[k]) + f"; total {sum(ops.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
