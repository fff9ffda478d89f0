"""Count the instructions that matter in each kernel's SASS (needs nvcc, and cuobjdump or nvdisasm; no GPU).

    python3 tools/sass_summary.py [--arch sm_90] [--source mma.cu] [--nvdisasm PATH]

Builds the .cu with ``nvcc -cubin --resource-usage`` and prints, per kernel, its registers/spills and how many
HGMMA (wgmma), WARPGROUP (wgmma fence/wait), HMMA (tensor-core mma.sync), LDSM (ldmatrix), LDGSTS (cp.async),
UTMALDG (TMA loads), SYNCS (mbarriers), ATOMG (global atomics), MUFU (exp2/log2/rcp), BAR, SHFL, LDL/STL (local
memory: spills) instructions it contains. The Hopper sources (wgmma*.cu) build for sm_90a.

The SASS comes from ``cuobjdump -sass`` (the CUDA toolkit) or, where that is missing, ``nvdisasm -c``: a machine
with nvcc alone gets nvdisasm from PyPI without installing anything,

    pip download --no-deps nvidia-cuda-nvdisasm -d /tmp/nvd && unzip -o -q /tmp/nvd/*.whl -d /tmp/nvd
    python3 tools/sass_summary.py --source wgmma_ws.cu --nvdisasm "$(find /tmp/nvd -name nvdisasm -type f)"

``--dump DIR`` also writes each kernel's SASS to DIR, one file per kernel, to read the instructions in order.

``--philox`` adds, for each kernel that draws dropout's random numbers (philox.cuh), how many Philox4x32-10
evaluations its SASS holds (its integer multiplies by the round multiplier B over 9: every evaluation multiplies by
B in rounds 2 to 10) and the integer multiplies (IMAD in any form) by each of the two round multipliers A and B per
evaluation. Ten rounds with the counter's upper words 0 need 18, a product counted once whether one half or both
are used: A c0 in round 1 (B c2 = 0), both products in rounds 2 to 9, B c2 in round 10 (only c0 is kept); a tile
whose offsets share their high word takes round 2's A c0 once and round 1's as an add (fragments.cuh,
DropoutTile): 16, with the score-by-score 18 beside it in the SASS for the tiles that straddle 2**32.

    python3 tools/sass_summary.py --source wgmma_ws.cu --philox --nvdisasm PATH
    python3 tools/sass_summary.py --source mma.cu --source wgmma.cu ... --philox-table --nvdisasm PATH   # the record's form

``--triton`` counts the same in the Triton kernels with dropout instead (forward, dQ, dK/dV at D = 64 and 128, fp16,
compiled for sm_90 by ``tools/triton_aot.py``'s ``compile_kernel``, no GPU; run with TRITON_INTERPRET unset).

``--overlap`` prints one markdown row per kernel that issues wgmma (HGMMA): how many of its exp2s (MUFU.EX2) run while
products of its own warpgroup are still in flight, read off the SASS along its control flow (``wgmma_overlap``). A
wgmma runs on the tensor cores until a WARPGROUP.DEPBAR waits for it; the FlashAttention-3 schedule computes the
softmax of S_i,j+1 while P_ij V_j runs, and this says whether the compiled kernel does. Default sources wgmma.cu,
wgmma_ws.cu and wgmma_backward.cu (``--match REGEX`` keeps the kernels whose demangled name matches); with
``--triton``, the Triton forward, dQ and dK/dV kernels without dropout in every autotuner candidate at D = 64 and 128:

    python3 tools/sass_summary.py --overlap --match "false, false" --nvdisasm PATH
    TRITON_INTERPRET=0 python3 tools/sass_summary.py --overlap --triton --nvdisasm PATH

``--overlap --philox`` counts the same for dropout's Philox multiplies instead of the exp2s: how many of a kernel's
integer multiplies by a round multiplier run while a product of its warpgroup is in flight.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

KERNEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flash_attention_cuda", "kernels")
OPS = ["HGMMA", "WARPGROUP", "HMMA", "LDSM", "LDGSTS", "UTMALDG", "SYNCS", "ATOMG", "LDS", "STS", "LDG", "STG", "MUFU",
       "FFMA", "FMUL", "FADD", "FMNMX", "F2FP", "SHFL", "BAR", "LDL", "STL"]
# one instruction: its address in a comment, an optional predicate (@P0, @!UP1, @PT), the opcode
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9]*)")
# where a kernel's code starts: cuobjdump's "Function : NAME", nvdisasm's "//----- .text.NAME -----" banner
_FUNCTION = re.compile(r"^\s*Function : (\S+)|^//-+ \.text\.(\S+)\s+-+$", re.M)


def split_functions(sass: str) -> list:
    """cuobjdump or nvdisasm output -> [(kernel name, its SASS text), ...], in the order they appear."""
    marks = list(_FUNCTION.finditer(sass))
    return [(m.group(1) or m.group(2), sass[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(sass)])
            for i, m in enumerate(marks)]


def resource_usage(ptxas: str) -> dict:
    """nvcc --resource-usage output -> {kernel name: "R registers, S bytes spill stores, L bytes spill loads"}."""
    out, name = {}, None
    for line in ptxas.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            out[name] = f"{m.group(1)} bytes spill stores, {m.group(2)} bytes spill loads"
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            out[name] = f"{m.group(1)} registers, " + out.get(name, "")
            name = None
    return out


def count_ops(text: str) -> collections.Counter:
    """Opcode (without modifiers: HGMMA.64x128x16.F32 -> HGMMA) -> how often it occurs in ``text``."""
    return collections.Counter(_INSTRUCTION.findall(text))


# Philox4x32-10's round multipliers as SASS writes them (signed 32-bit immediates: 0xD2511F53 = A, 0xCD9E8D57 = B)
PHILOX_MULTIPLIERS = ("-0x2daee0ad", "-0x326172a9")
_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s+([^;]*);")


def philox_counts(text: str):
    """(Philox evaluations, {"A" or "B": how many IMADs multiply by that round multiplier}) in ``text``.

    Every evaluation multiplies by B in rounds 2 to 10, whichever form it takes: the evaluations are the
    B-products / 9. The A-products per evaluation are 9 (round 1's A * lo and round 2's A * c0 its own, rounds 3
    to 9) or 7 where a block shares round 2's and forms round 1's with an add (philox.cuh, DropoutTile), plus the
    few a block shares."""
    muls = collections.Counter()
    for op, operands in _OPCODE.findall(text):
        if op.startswith("IMAD"):
            args = operands.split(", ")
            for name, m in zip("AB", PHILOX_MULTIPLIERS):
                if m in args:
                    muls[name] += 1
    return muls["B"] / 9, muls


# A warpgroup's products (HGMMA) run on the tensor cores while its threads go on issuing other instructions, until a
# WARPGROUP.DEPBAR waits for them. The last HGMMA of a batch carries "gsb0" (wgmma.commit_group); "WARPGROUP.DEPBAR.LE
# gsb0, 0xN" (wgmma.wait_group N) waits until at most N batches are still running.
_GROUP_END = re.compile(r"\bgsb0\s*$")
# a label, or an instruction: optional guard predicate, opcode (modifiers in any case: HGMMA.64x128x16.F32), operands
_SASS_LINE = re.compile(r"^\s*(\.L_x_\d+):|/\*[0-9a-f]{4,}\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);",
                        re.M)
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_MAX_PENDING = 8


def _blocks(text: str):
    """One kernel's SASS -> (blocks, successors): blocks are lists of (opcode, operands), split at labels and after
    branches and exits; successors[b] the blocks control can pass to from block b."""
    blocks, label_of, ends = [[]], {}, []  # ends[b]: (targets, falls through?)
    for m in _SASS_LINE.finditer(text):
        label, guard, op, operands = m.groups()
        if label:
            if blocks[-1]:
                ends.append(((), True))
                blocks.append([])
            label_of[label] = len(blocks) - 1
            continue
        blocks[-1].append((op, operands))
        if op.startswith("BRA") or op == "EXIT" or op.startswith("RET"):
            targets = tuple(_TARGET.findall(operands)) if op.startswith("BRA") else ()
            unconditional = guard is None and (op == "EXIT" or op.startswith("RET") or
                                               (op == "BRA" and operands.strip().startswith("`")))
            ends.append((targets, not unconditional))
            blocks.append([])
    ends.append(((), False))
    succ = []
    for b, (targets, falls) in enumerate(ends):
        nxt = [label_of[t] for t in targets if t in label_of]
        if falls and b + 1 < len(blocks):
            nxt.append(b + 1)
        succ.append(nxt)
    return blocks, succ


def _wait_n(operands: str) -> int:
    """N of a WARPGROUP.DEPBAR.LE gsb0, N: the batches it lets run on."""
    return int(operands.split(",")[-1].strip(), 0)


def _step(state, op, operands):
    """(fewest, most) batches of products in flight after one instruction."""
    lo, hi = state
    if op.startswith("HGMMA") and _GROUP_END.search(operands):
        return min(lo + 1, _MAX_PENDING), min(hi + 1, _MAX_PENDING)
    if op.startswith("WARPGROUP.DEPBAR"):
        n = _wait_n(operands)
        return min(lo, n), min(hi, n)
    return lo, hi


def wgmma_overlap(text: str) -> dict:
    """How much of a kernel's softmax its SASS runs beside its own warpgroup's tensor-core products.

    Follows the kernel's control flow (its basic blocks and branches, loops to a fixed point) and counts, at every
    instruction, the batches of HGMMA issued and not yet waited for, fewest and most over the paths that reach it.
    An exp2 (MUFU.EX2) reached with at least one batch in flight on every path runs beside a product of its own
    warpgroup. Returns {"hgmma": HGMMA instructions, "waits": {N: WARPGROUP.DEPBAR ... N}, "ex2": MUFU.EX2
    instructions, "ex2_in_flight": those with a batch in flight on every path, "ex2_some_path": on at least one,
    "philox": the integer multiplies by a Philox round multiplier (dropout's keep decisions), "philox_in_flight":
    those with a batch in flight on every path}. Static counts: each instruction once, however often it runs."""
    blocks, succ = _blocks(text)
    entry = [None] * len(blocks)
    entry[0] = (0, 0)
    work = [0]
    while work:  # forward data flow: (fewest, most) in flight at each block's entry
        b = work.pop()
        state = entry[b]
        for op, operands in blocks[b]:
            state = _step(state, op, operands)
        for n in succ[b]:
            old = entry[n]
            new = state if old is None else (min(old[0], state[0]), max(old[1], state[1]))
            if new != old:
                entry[n] = new
                work.append(n)
    out = {"hgmma": 0, "waits": collections.Counter(), "ex2": 0, "ex2_in_flight": 0, "ex2_some_path": 0,
           "philox": 0, "philox_in_flight": 0}
    for b, block in enumerate(blocks):
        state = entry[b]
        for op, operands in block:
            if op.startswith("HGMMA"):
                out["hgmma"] += 1
            elif op.startswith("WARPGROUP.DEPBAR"):
                out["waits"][_wait_n(operands)] += 1
            elif op == "MUFU.EX2":
                out["ex2"] += 1
                if state is not None:  # (a block no path reaches, such as a subroutine, counts as not in flight)
                    out["ex2_in_flight"] += state[0] > 0
                    out["ex2_some_path"] += state[1] > 0
            elif op.startswith("IMAD") and any(m in operands.split(", ") for m in PHILOX_MULTIPLIERS):
                out["philox"] += 1
                out["philox_in_flight"] += state is not None and state[0] > 0
            if state is not None:
                state = _step(state, op, operands)
    out["waits"] = dict(sorted(out["waits"].items()))
    return out


OVERLAP_HEADER = ("| rung | kernel | HGMMA | waits (WARPGROUP.DEPBAR ≤ N: count) | MUFU.EX2 | beside a product on every path "
                  "| on some path |\n|---|---|---:|---|---:|---:|---:|")


PHILOX_OVERLAP_HEADER = ("| rung | kernel | Philox multiplies (IMAD) | beside a product on every path |\n"
                         "|---|---|---:|---:|")


def overlap_row(rung: str, name: str, text: str, philox: bool = False):
    """One markdown row of --overlap for a kernel with tensor-core products (None for one without); philox: the row
    of --overlap --philox instead, for a kernel that draws dropout's keep decisions (None for one that does not)."""
    o = wgmma_overlap(text)
    if not o["hgmma"] or (philox and not o["philox"]):
        return None
    if philox:
        share = o["philox_in_flight"] / o["philox"]
        return f"| {rung} | {name} | {o['philox']} | {o['philox_in_flight']} ({share:.0%}) |"
    waits = ", ".join(f"≤{n}: {c}" for n, c in o["waits"].items())
    every = f"{o['ex2_in_flight']} ({o['ex2_in_flight'] / o['ex2']:.0%})" if o["ex2"] else "–"
    some = f"{o['ex2_some_path']} ({o['ex2_some_path'] / o['ex2']:.0%})" if o["ex2"] else "–"
    return f"| {rung} | {name} | {o['hgmma']} | {waits} | {o['ex2']} | {every} | {some} |"


def demangle(name: str) -> str:
    """A CUDA kernel's mangled name as its template, wgmma_fwd<128, 128, 2, false, false> (c++filt; as is without)."""
    if shutil.which("c++filt") is None:
        return name
    full = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip() or name
    return re.sub(r"^void ", "", full.split("(")[0])


def disassembler(nvdisasm=None):
    """(command, name) that prints a cubin's SASS: cuobjdump -sass, else nvdisasm -c (``nvdisasm`` or $NVDISASM or
    the PATH's); None where neither is there."""
    if shutil.which("cuobjdump") and not nvdisasm:
        return ["cuobjdump", "-sass"], "cuobjdump"
    path = nvdisasm or os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    return ([path, "-c"], "nvdisasm") if path and os.path.exists(path) else None


# the Triton kernels --triton compiles: (kernel, (BLOCK_M, BLOCK_N, warps, stages)), the dQ and dK/dV tiles the
# autotuner picked for the window record (docs/results/triton/window_backward_configs.txt)
TRITON_KERNELS = (("fwd", (128, 64, 4, 3)), ("dq", (128, 64, 8, 3)), ("dkdv", (32, 64, 4, 3)))


def report(name, usage, text, philox, dump=None):
    """Print one kernel's line: registers/spills, the counted opcodes, and (philox) its Philox multiplies."""
    ops = count_ops(text)
    print(f"  {name}: {usage}\n    " + ", ".join(f"{k} {ops[k]}" for k in OPS if ops[k]) + f"; total {sum(ops.values())}")
    evals, muls = philox_counts(text) if philox else (0, {})
    if evals:
        per = {m: n / evals for m, n in sorted(muls.items())}
        print(f"    Philox: {evals:g} evaluations (B-products / 9); per evaluation " +
              ", ".join(f"{m} {v:.3g}" for m, v in per.items()) + f": {sum(per.values()):.3g} multiplies")
    if dump:
        os.makedirs(dump, exist_ok=True)
        with open(os.path.join(dump, f"{name}.sass"), "w") as f:
            f.write(text)


def triton_kernels(dis, philox, dump=None):
    """The Triton kernels with dropout (TRITON_KERNELS, D 64 and 128, fp16), compiled for sm_90 without a GPU."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import triton_aot

    print(f"== Triton (sm_90; SASS by {dis[1]})")
    for D in (64, 128):
        for kernel, config in TRITON_KERNELS:
            compiled = triton_aot.compile_kernel(kernel, "float16", D, False, config, 90, "dropout")
            sass = triton_sass(dis, compiled)
            usage = f"{compiled.metadata.num_warps} warps, {compiled.metadata.shared} bytes of shared memory"
            report(f"triton {kernel} {config} D={D} fp16 dropout", usage, sass, philox, dump)


def triton_sass(dis, compiled) -> str:
    """The SASS of a Triton CompiledKernel (its cubin through the disassembler)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        return subprocess.run(dis[0] + [cubin], capture_output=True, text=True).stdout


def triton_overlap(dis, head_dims=(64, 128)):
    """--overlap for the Triton kernels without dropout: every autotuner candidate that fits an H100's shared memory
    (configs.prune), fp16, compiled for sm_90 without a GPU; one table row each; then the Gluon forward
    (hopper_forward.py) at D = 128, full and causal."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import triton
    import triton_aot
    from flash_attention_triton import configs as C

    print(f"Triton {triton.__version__}, sm_90; SASS by {dis[1]}\n\n{OVERLAP_HEADER}")
    for D in head_dims:
        for kernel in ("fwd", "dq", "dkdv"):
            for config in C.prune(kernel, C.CANDIDATES[kernel], max(16, D), 2):
                compiled = triton_aot.compile_kernel(kernel, "float16", D, False, config, 90, "")
                row = overlap_row("triton", f"{kernel} {tuple(config)} D={D}", triton_sass(dis, compiled))
                if row:
                    print(row, flush=True)
    # the Gluon forward that runs on a Hopper at D = 128 (flash_attention_triton/hopper_forward.py), full and causal
    for window in ((-1, -1), (-1, 0)):
        compiled = triton_aot.compile_hopper_forward("float16", 128, window)
        row = overlap_row("triton (Gluon)", f"hopper_forward window={window} D=128", triton_sass(dis, compiled))
        if row:
            print(row, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90", help="for the sources other than wgmma*.cu (those: sm_90a)")
    ap.add_argument("--source", action="append", help="a .cu in flash_attention_cuda/kernels (repeatable)")
    ap.add_argument("--nvdisasm", help="nvdisasm to use instead of cuobjdump")
    ap.add_argument("--dump", help="write each kernel's SASS into this folder")
    ap.add_argument("--philox", action="store_true",
                    help="count the Philox evaluations (dropout) and their integer multiplies per evaluation")
    ap.add_argument("--philox-table", action="store_true",
                    help="print only one line per kernel with dropout: source | kernel | evaluations | products by A "
                         "and by B per evaluation | total (the form of docs/results/cuda/philox_sass/philox_sass.txt)")
    ap.add_argument("--triton", action="store_true", help="the Triton kernels with dropout instead of --source (with "
                                                          "--overlap: without dropout, every candidate config)")
    ap.add_argument("--overlap", action="store_true",
                    help="one table row per kernel with wgmma: its exp2s that run while its own products do "
                         "(wgmma_overlap); default sources wgmma.cu, wgmma_ws.cu, wgmma_backward.cu")
    ap.add_argument("--match", help="with --overlap: only the kernels whose name (demangled) matches this regex")
    ap.add_argument("--kernel-dir", default=KERNEL_DIR,
                    help="the folder of the .cu sources (default: this checkout's; another checkout's to compare)")
    args = ap.parse_args(argv)
    if args.overlap and args.philox_table:
        ap.error("--overlap prints a table of its own: leave out --philox-table (--philox: its Philox form)")
    if args.overlap and args.philox and args.triton:
        ap.error("--overlap --philox is for the CUDA sources: the Triton kernels of --overlap --triton draw no "
                 "dropout")
    if args.match and not args.overlap:
        ap.error("--match goes with --overlap")
    if args.philox_table and args.triton:
        ap.error("--philox-table is for the CUDA sources (--source); --triton prints its counts with --philox")
    dis = disassembler(args.nvdisasm)
    if dis is None:
        ap.error("neither cuobjdump nor nvdisasm found: pass --nvdisasm PATH (see this tool's docstring)")
    if args.triton:
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            ap.error("--triton compiles for a real GPU: run with TRITON_INTERPRET unset")
        if args.overlap:
            triton_overlap(dis)
        else:
            triton_kernels(dis, args.philox, args.dump)
        return 0
    if shutil.which("nvcc") is None:
        ap.error("nvcc not found")
    if args.philox_table:
        print("# source | kernel | Philox evaluations in its SASS | per evaluation: products by A and by B | total per evaluation")
    if args.overlap:
        print(f"sm_90a; SASS by {dis[1]}\n\n{PHILOX_OVERLAP_HEADER if args.philox else OVERLAP_HEADER}")
    default = ["wgmma.cu", "wgmma_ws.cu", "wgmma_backward.cu"] if args.overlap else ["mma.cu", "tiled.cu"]
    for source in args.source or default:
        with tempfile.TemporaryDirectory() as tmp:
            cubin = os.path.join(tmp, "k.cubin")
            arch = "sm_90a" if source.startswith("wgmma") else args.arch  # Hopper-only instructions
            target = [f"-gencode=arch=compute_{arch[3:]},code={arch}"] if arch.endswith("a") else [f"-arch={arch}"]
            res = subprocess.run(["nvcc", "-cubin", *target, "-std=c++17", "-O3", "--resource-usage", "-o", cubin,
                                  os.path.join(args.kernel_dir, source)], capture_output=True, text=True)
            if not (args.philox_table or args.overlap):
                print(f"== {source} ({arch}; SASS by {dis[1]})")
            if res.returncode != 0:
                print("\n".join("  " + line for line in (res.stdout + res.stderr).splitlines() if "error" in line))
                continue
            usage = resource_usage(res.stdout + res.stderr)
            sass = subprocess.run(dis[0] + [cubin], capture_output=True, text=True).stdout
        for name, text in split_functions(sass):
            if args.overlap:
                nice = demangle(name)
                row = overlap_row(source, nice, text, args.philox) if not args.match or re.search(args.match, nice) \
                    else None
                if row:
                    print(row, flush=True)
            elif args.philox_table:
                evals, muls = philox_counts(text)
                if evals:
                    per = {m: n / evals for m, n in sorted(muls.items())}
                    print(f"{source} | {name} | {evals:g} | " + ", ".join(f"{m} {v:.3g}" for m, v in per.items())
                          + f" | {sum(per.values()):.3g}")
            else:
                report(name, usage.get(name, "?"), text, args.philox, args.dump)
    return 0


if __name__ == "__main__":
    sys.exit(main())
