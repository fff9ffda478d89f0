#!/usr/bin/env python
"""The Triton rung's two backwards on a Hopper GPU, beside cuDNN's, in one run: ``backward_kernels.py`` (two kernels,
7 products a tile pair) and ``hopper_backward.py`` (one Gluon kernel, 5 products, dQ summed by the copy engine's
reduce-adds).

    PYTHONPATH=. FA_CUDA_LAUNCH_PLANS=0 python tools/hopper_backward_ab.py --out results/hopper_backward
    PYTHONPATH=. python tools/hopper_backward_ab.py --shapes 2x32x8x4096,1x32x8x16384 --causal both
    PYTHONPATH=. python tools/hopper_backward_ab.py --configs "HEAD_GROUP=0;HEAD_GROUP=4"
    PYTHONPATH=. python tools/hopper_backward_ab.py --shapes 1x32x1x16384 --configs "SPLITS=4;SPLITS=8;SPLITS=16"

Each shape is BxHqxHkxN (D = 128, fp16): first the Gluon kernel's dQ, dK, dV against the two-kernel backward's
(max-abs difference), then the median times (``triton.testing.do_bench``, CUDA events) of the backward alone: cuDNN's
(SDPA with ``enable_gqa``, through autograd), the two-kernel one and the Gluon one, and each as x cuDNN (above 1:
faster than cuDNN). Both Triton backwards get the same forward's O and lse; splits as ``hopper_backward.splits`` picks.
``--configs`` times the Gluon kernel once for each of its ``;``-separated settings of ``hopper_backward.CONFIG`` (each
``KEY=VALUE,...`` over the defaults), a column each; the key ``SPLITS`` sets the split count instead of
``hopper_backward.splits`` (the column "splits" shows the rule's). ``--out DIR`` also writes the table to
DIR/hopper_backward_ab.md.
"""
from __future__ import annotations


def main() -> None:
    from tools.hopper_forward_ab import ab_setup, write_table

    args, default, configs, lines, cases = ab_setup(__doc__, "hopper_backward", [
        "B", "Hq", "Hk", "N", "causal", "splits", "max-abs dQ, dK, dV vs two-kernel", "cuDNN ms", "two-kernel ms",
        "x cuDNN"], extra={"SPLITS": 0})

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from flash_attention_py import masks
    from flash_attention_triton import hopper_backward as hb
    from flash_attention_triton import launch as L

    for B, H, Hk, N, causal, x in cases:
        D = 128
        q, k, v, do = x["q"], x["k"], x["v"], x["do"]
        scale, window = D ** -0.5, masks.window_for(causal)
        o, lse = L._forward(q, k, v, window, scale)
        splits = hb.splits(q, k)
        hopper, L.HOPPER_BACKWARD = L.HOPPER_BACKWARD, False  # the two kernels, whatever the dispatch default
        try:
            two = L._backward(q, k, v, o, lse, do, window, scale)
            t_two = do_bench(lambda: L._backward(q, k, v, o, lse, do, window, scale), warmup=25, rep=200)
        finally:
            L.HOPPER_BACKWARD = hopper
        diffs, t_ones = [], []
        for c in configs:
            c = dict(c)
            s = c.pop("SPLITS", 0) or splits
            if (H // Hk) % s:
                raise SystemExit(f"hopper_backward_ab.py: SPLITS={s} does not divide the group of {H // Hk} query "
                                 "heads")
            hb.CONFIG.update(default, **c)
            try:
                one = hb.backward(q, k, v, o, lse, do, window, scale, s)
                diffs.append(", ".join(f"{(a.float() - b.float()).abs().max().item():.1e}" for a, b in zip(one, two)))
                t_ones.append(do_bench(lambda: hb.backward(q, k, v, o, lse, do, window, scale, s), warmup=25,
                                       rep=200))
            finally:
                hb.CONFIG.update(default)
        diff = "; ".join(dict.fromkeys(diffs))
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=Hk < H)
        t_cudnn = do_bench(lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True), warmup=25, rep=200)
        lines.append(f"| {B} | {H} | {Hk} | {N} | {causal} | {splits} | {diff} | {t_cudnn:.3f} | {t_two:.3f} | "
                     f"{t_cudnn / t_two:.2f} | " + "".join(f"{t:.3f} | {t_cudnn / t:.2f} | " for t in t_ones).strip())
    write_table(lines, args.out, "hopper_backward_ab.md")


if __name__ == "__main__":
    main()
