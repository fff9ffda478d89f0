#!/usr/bin/env python
"""Where a kernel's warps spend their time, region by region of its SASS, from an Nsight Compute source export.

    # on the GPU: profile one call of wgmma_bwd_ws (B4 H16 N4096 D64 fp16) with source-level sampling
    ncu --kernel-name regex:wgmma_bwd_ws --launch-skip 2 --launch-count 1 --section WarpStateStats \\
        --section SourceCounters -o results/ws_bwd python3 tools/ncu_sass_regions.py --run-backward 64
    ncu -i results/ws_bwd.ncu-rep --page source --csv --print-source sass > results/ws_bwd_source.csv
    # anywhere:
    python tools/ncu_sass_regions.py results/ws_bwd_source.csv

    # the instructions executed, opcode by opcode, and the integer arithmetic in front of each kind of
    # memory or tensor instruction (mostly its address), of the export's largest kernel:
    python tools/ncu_sass_regions.py --opcodes results/mma_bwd_source.csv

The SASS is cut at the instructions where a warp waits or meets others (``WARPGROUP.DEPBAR``, ``WARPGROUP.ARRIVE``,
``BAR.SYNC``, mbarrier ``SYNCS``, ``MEMBAR``, ``EXIT``); for each region it prints the share of the stall samples,
the instructions executed per execution of the region's last instruction (for a loop body: per tile and warp),
the most executed opcodes and the main stall reasons. It is how docs/performance.md §7 found the per-pair mask
branches of the backward's elementwise step.
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter

CUT = re.compile(r"WARPGROUP\.DEPBAR|WARPGROUP\.ARRIVE|BAR\.SYNC|SYNCS|MEMBAR|EXIT|USETMAXREG")


def _num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


INTEGER = {"IMAD", "LOP3", "SHF", "LEA", "VIADD", "IADD3", "SEL", "ISETP", "PRMT", "MOV", "VIMNMX", "VIADDMNMX",
           "PLOP3"}  # integer arithmetic, compares and moves
ANCHORS = {"LDSM", "STS", "LDS", "REDG", "LDGSTS", "LDG", "STG", "HMMA", "MUFU", "F2FP", "FFMA", "FMUL", "FADD",
           "FSEL", "FSETP", "BRA", "BSSY", "BSYNC", "BAR"}  # what the integer instructions before them are charged to


def kernel_rows(path: str) -> tuple[str, list[str], list[list[str]]]:
    """The source export's largest kernel: (its name, the header row, its instruction rows). An export holds one
    section per profiled kernel, each opened by a "Kernel Name" row."""
    sections, cur = [], None
    for r in csv.reader(open(path, newline="")):
        if r and r[0] == "Kernel Name":
            cur = [r[1] if len(r) > 1 else "", None, []]
            sections.append(cur)
        elif "Source" in r and "Address" in r:
            if cur is None:
                cur = ["", None, []]
                sections.append(cur)
            cur[1] = r
        elif cur is not None and cur[1] is not None and len(r) == len(cur[1]):
            cur[2].append(r)
    name, hdr, data = max(sections, key=lambda s: len(s[2]))
    return name, hdr, data


def opcodes(path: str, top: int = 30) -> list[str]:
    """Executed instructions by opcode, and the integer instructions executed since the last anchor charged to the
    next one (STS: the stores' addresses; REDG: the atomics'), for the export's largest kernel."""
    name, hdr, data = kernel_rows(path)
    ix = {h: i for i, h in enumerate(hdr)}
    executed, samples = ix["Instructions Executed"], ix["Warp Stall Sampling (All Samples)"]
    ops, stall, charged, anchors, pending = Counter(), Counter(), Counter(), Counter(), 0.0
    for r in data:
        m = re.match(r"(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", r[ix["Source"]].strip())
        if not m:
            continue
        op, n = m.group(2), _num(r[executed])
        ops[op] += n
        stall[op] += _num(r[samples])
        if op in INTEGER:
            pending += n
        elif op in ANCHORS:
            charged[op] += pending
            anchors[op] += n
            pending = 0.0
    total, samples_total = sum(ops.values()) or 1.0, sum(stall.values()) or 1.0
    out = [f"{path}: {name[:100]}", f"instructions executed: {total:,.0f}", "",
           "opcode      executed   share  stall samples"]
    out += [f"{op:9s} {n:12,.0f} {100 * n / total:6.1f}% {100 * stall[op] / samples_total:6.1f}%"
            for op, n in ops.most_common(top)]
    out += ["", "integer instructions executed before each kind of instruction (since the previous one of these kinds)",
            "before      integer      count"]
    out += [f"{op:9s} {charged[op]:12,.0f} {anchors[op]:12,.0f}" for op, _ in charged.most_common() if charged[op]]
    return out


def regions(path: str, min_share: float = 0.3) -> list[str]:
    """The report's lines for the source export at path (regions under min_share % of the samples folded in), for
    its largest kernel (kernel_rows)."""
    _, hdr, data = kernel_rows(path)
    ix = {h: i for i, h in enumerate(hdr)}
    samples, executed = ix["Warp Stall Sampling (All Samples)"], ix["Instructions Executed"]
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(_num(r[samples]) for r in data) or 1.0
    out = [f"{path}: {len(data)} SASS instructions, {total:.0f} stall samples",
           "stall reasons, whole kernel: " + ", ".join(
               f"{s[6:]} {100 * v / total:.1f}%" for s, v in sorted(
                   ((s, sum(_num(r[ix[s]]) for r in data)) for s in stalls), key=lambda x: -x[1])[:8]),
           "", "  first-last  share  instr/exec  region ends with / top opcodes per exec / top stalls"]
    first = 0
    for i, r in enumerate(data):
        src = r[ix["Source"]].strip()
        if not (CUT.search(src) or i == len(data) - 1):
            continue
        seg = data[first:i + 1]
        share = 100 * sum(_num(x[samples]) for x in seg) / total
        if share >= min_share:
            per = _num(r[executed]) or 1.0
            ops = Counter()
            for x in seg:
                m = re.match(r"(@!?U?P\w+\s+)?(\S+)", x[ix["Source"]].strip())
                if m:
                    ops[m.group(2).split(".")[0]] += _num(x[executed]) / per
            st = Counter({s[6:]: sum(_num(x[ix[s]]) for x in seg) for s in stalls})
            seg_total = sum(st.values()) or 1.0
            out.append(f"{first:5d}-{i:5d} {share:5.1f}% {sum(ops.values()):9.0f}  {src[:60]}")
            out.append("             " + ", ".join(f"{k} {v:.0f}" for k, v in ops.most_common(8)))
            out.append("             stalls: " + ", ".join(f"{k} {100 * v / seg_total:.0f}%"
                                                          for k, v in st.most_common(4)))
        first = i + 1
    return out


def run_backward(D: int) -> None:
    """Three calls of the wgmma-ws backward kernels (B4 H16 N4096, fp16, not causal) for ncu to pick from."""
    import torch

    from flash_attention_cuda import flash_attn_cuda, launch_specs
    from flash_attention_py.inputs import make_inputs
    from flash_attention_py.masks import window_for

    x = make_inputs(4, 16, 4096, 4096, D, dtype="float16", device="cuda")
    o, lse = flash_attn_cuda(x["q"], x["k"], x["v"], kernel="mma", return_lse=True)
    for _ in range(3):
        launch_specs.run_backward(x["q"], x["k"], x["v"], o, lse, x["do"], window_for(False), D ** -0.5, "wgmma-ws")
    torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--min-share", type=float, default=0.3, help="print regions with at least this %% of samples")
    ap.add_argument("--run-backward", type=int, metavar="D", help="run the wgmma-ws backward at head dim D (for ncu)")
    ap.add_argument("--opcodes", action="store_true",
                    help="instructions by opcode and the integer arithmetic before each kind, largest kernel")
    args = ap.parse_args(argv)
    if args.run_backward:
        run_backward(args.run_backward)
        return 0
    if not args.csv:
        ap.error("give the source export, or --run-backward D under ncu")
    print("\n".join(opcodes(args.csv) if args.opcodes else regions(args.csv, args.min_share)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
