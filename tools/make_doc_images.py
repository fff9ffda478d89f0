"""Write the docs' images, drawn by ``notebooks/_pictures.py`` (the notebooks draw the same pictures inline).

    python tools/make_doc_images.py                              # all three, into docs/img/
    python tools/make_doc_images.py --only tile-walk --no-causal --out-dir /tmp

* ``tile_walk.gif`` (notebook 03): ``tile_walk_animation``, the v1 and v2 loop orders over the (Tr, Tc) grid of
  S tiles, causal blocks skipped, and the running m_i, l_i and O of one query row. A fixed seed keeps the
  committed GIF reproducible.
* ``pingpong.png`` (notebook 06, docs/backend_cuda.md rung 3c): ``pingpong_schedule`` and ``draw_pingpong``, one
  warp group alone overlapping its softmax with its own P V only (``wgmma.cu``'s loop), and two taking turns on
  the tensor cores (``wgmma_ws.cu``, the rescale inside the turn as at D = 128), with the illustrative durations
  of ``PINGPONG_CYCLES``: the order of the work, not a measurement.
* ``swizzle_96.png`` (notebook 06, docs/backend_cuda.md rung 3): ``draw_swizzle_96``, a (rows, 96) tile under
  c ^ (r % 8) on every chunk (chunks 8-11 leave the row) and under ``smem_tiles.cuh``'s rule (the 64-byte swizzle on
  a row's last 4 chunks).

Each image is checked to stay under ``--max-bytes``.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "notebooks"))
os.environ.setdefault("MPLBACKEND", "Agg")
IMAGES = ("tile-walk", "pingpong", "swizzle-96")


def tile_walk(out: pathlib.Path, args) -> None:
    from _pictures import tile_walk_animation

    anim = tile_walk_animation(Tr=args.tiles, Tc=args.tiles, causal=not args.no_causal, dpi=args.dpi, seed=args.seed)
    anim.save(str(out), writer="pillow", fps=args.fps, dpi=args.dpi)


def pingpong(out: pathlib.Path, args) -> None:
    import matplotlib.pyplot as plt
    from _pictures import draw_pingpong, pingpong_legend, pingpong_schedule

    steps = args.steps
    fig, axes = plt.subplots(2, 1, figsize=(10, 4.4))
    draw_pingpong(axes[0], pingpong_schedule(1, 2 * steps, rescale_in_turn=False),
                  f"one warp group alone, {2 * steps} tile steps: softmax under its own P V only (wgmma.cu's loop)")
    draw_pingpong(axes[1], pingpong_schedule(2, steps, rescale_in_turn=True),
                  f"two consumer warp groups taking turns, {steps} tile steps each (wgmma_ws.cu, rescale inside the turn)")
    for ax in axes:
        ax.set_xlim(0, max(a.get_xlim()[1] for a in axes))
    pingpong_legend(fig)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def swizzle_96(out: pathlib.Path, args) -> None:
    import matplotlib.pyplot as plt
    from _pictures import draw_swizzle_96

    fig, (ax_x, ax_p) = plt.subplots(1, 2, figsize=(11, 4))
    draw_swizzle_96(ax_x, ax_p)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=pathlib.Path, default=ROOT / "docs" / "img")
    ap.add_argument("--only", choices=IMAGES, action="append", help="write only this image (repeatable)")
    ap.add_argument("--no-causal", action="store_true", help="tile walk: every tile (no causal skipping)")
    ap.add_argument("--tiles", type=int, default=6, help="tile walk: Tr = Tc (default 6)")
    ap.add_argument("--dpi", type=int, default=80, help="tile walk: dots per inch (default 80)")
    ap.add_argument("--fps", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=5, help="ping-pong: tile steps per consumer warp group (default 5)")
    ap.add_argument("--max-bytes", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    if args.tiles < 1 or args.tiles > 16:
        ap.error(f"--tiles: expected 1..16, got {args.tiles}")
    if not 1 <= args.steps <= 12:
        ap.error(f"--steps: expected 1..12, got {args.steps}")

    args.out_dir.mkdir(parents=True, exist_ok=True)
    status = 0
    for name, draw, file in (("tile-walk", tile_walk, "tile_walk.gif"), ("pingpong", pingpong, "pingpong.png"),
                             ("swizzle-96", swizzle_96, "swizzle_96.png")):
        if args.only and name not in args.only:
            continue
        out = args.out_dir / file
        draw(out, args)
        size = out.stat().st_size
        print(f"wrote {out} ({size / 1024:.0f} KiB)")
        if size > args.max_bytes:
            print(f"error: {out} is {size} bytes, more than --max-bytes {args.max_bytes}; lower --dpi, --tiles or "
                  f"--steps", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
