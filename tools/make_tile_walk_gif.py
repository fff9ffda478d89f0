"""Write the tile-walk animation (notebook 03) as a GIF for the docs.

    python tools/make_tile_walk_gif.py                      # -> docs/img/tile_walk.gif
    python tools/make_tile_walk_gif.py --out /tmp/walk.gif --no-causal

The drawing is ``tile_walk_animation`` in ``notebooks/_pictures.py``: the v1 and v2 loop orders over the
(Tr, Tc) grid of S tiles, causal blocks skipped, and the running m_i, l_i and O of one query row. A fixed
seed keeps the committed GIF reproducible; the GIF is checked to stay under ``--max-bytes``.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "notebooks"))
os.environ.setdefault("MPLBACKEND", "Agg")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "img" / "tile_walk.gif")
    ap.add_argument("--no-causal", action="store_true", help="walk every tile (no causal skipping)")
    ap.add_argument("--tiles", type=int, default=6, help="Tr = Tc (default 6)")
    ap.add_argument("--dpi", type=int, default=80)
    ap.add_argument("--fps", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-bytes", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    if args.tiles < 1 or args.tiles > 16:
        ap.error(f"--tiles: expected 1..16, got {args.tiles}")

    from _pictures import tile_walk_animation

    anim = tile_walk_animation(Tr=args.tiles, Tc=args.tiles, causal=not args.no_causal, dpi=args.dpi, seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    anim.save(str(args.out), writer="pillow", fps=args.fps, dpi=args.dpi)
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size / 1024:.0f} KiB)")
    if size > args.max_bytes:
        print(f"error: {args.out} is {size} bytes, more than --max-bytes {args.max_bytes}; lower --dpi or --tiles",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
