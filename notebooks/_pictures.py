"""Drawings used by the notebooks (and by ``tools/make_doc_images.py``); plain NumPy + matplotlib.

* ``tile_walk_animation(...)``: the v1 and v2 loop orders walking the (Tr, Tc) grid of S tiles, with
  causal block skipping, and the running m_i, l_i and O of one query row as its tiles arrive.
* ``animation_html(anim)``: ``anim.to_jshtml()`` made self-contained (the player's buttons as text
  symbols instead of an icon font fetched from a CDN), for notebooks read offline or on the built site.
* ``draw_mma_fragments(ax_a, ax_c)``: which lane of a warp holds which element of the A (16 x 16) and
  C (16 x 8) tiles of ``mma.sync.m16n8k16`` (PTX ISA, "Matrix Fragments for mma.m16n8k16").
* ``draw_swizzle(ax_logical, ax_physical)``: the XOR swizzle of ``mma.cu`` / ``smem_tiles.cuh``:
  16-byte chunk c of shared-memory row r is stored at chunk c ^ (r % 8).
* ``pingpong_schedule(...)``, ``draw_pingpong(ax, schedule)``, ``pingpong_legend(fig)``, ``longest_hidden_softmax``: a small model of the loop of one or two consumer
  warp groups (``wgmma.cu``; ``wgmma_ws.cu``'s ping-pong) and the tensor cores' timeline it gives.
* ``dq_store_banks(lane)``, ``draw_dq_store_banks(axes)``: the banks a half warp's 8-byte stores of the backward's
  dQ sums hit, with ``wgmma_backward.cu``'s old and new chunk swizzle (``dq_chunk``).
"""
from __future__ import annotations

import numpy as np

from flash_attention_py import masks


def visited_tiles(Tr: int, Tc: int, Br: int, Bc: int, causal: bool, order: str) -> list[tuple[int, int]]:
    """The (i, j) tiles of S that a loop order computes, in the order it computes them.

    Nq = Tr * Br queries, Nk = Tc * Bc keys; with ``causal`` (bottom-right aligned, as everywhere in
    this repository: ``flash_attention_py.masks``) a tile that ``masks.block_kind`` calls 'empty' (no
    query of it sees any of its keys) is skipped. ``order`` is ``"v1"`` (outer j over K/V blocks, inner i over Q blocks) or
    ``"v2"`` (outer i, inner j).
    """
    if order not in ("v1", "v2"):
        raise ValueError(f"visited_tiles: order must be 'v1' or 'v2', got {order!r}")
    Nq, Nk, window = Tr * Br, Tc * Bc, masks.window_for(causal)

    def needed(i, j):
        return masks.block_kind(i * Br, (i + 1) * Br, j * Bc, (j + 1) * Bc, Nq, Nk, window) != "empty"

    if order == "v2":
        return [(i, j) for i in range(Tr) for j in range(Tc) if needed(i, j)]
    return [(i, j) for j in range(Tc) for i in range(Tr) if needed(i, j)]


def _row_history(S_row, V, Bc, tiles, i_row):
    """Running (m, l, O = acc / l) of one query row after each of ``tiles`` (None where the row is untouched)."""
    m, l, acc = -np.inf, 0.0, np.zeros(V.shape[1])
    hist = []
    for (i, j) in tiles:
        if i == i_row:
            s = S_row[j * Bc:(j + 1) * Bc]
            m_new = max(m, s.max())
            if np.isfinite(m_new):
                alpha = np.exp(m - m_new)
                p = np.exp(s - m_new)
                l = alpha * l + p.sum()
                acc = alpha * acc + p @ V[j * Bc:(j + 1) * Bc]
                m = m_new
        hist.append((m, l, acc / l if l > 0 else np.zeros_like(acc)))
    return hist


def tile_walk_animation(Tr: int = 6, Tc: int = 6, Br: int = 4, Bc: int = 4, D: int = 6, causal: bool = True,
                        dpi: int = 72, interval: int = 700, seed: int | None = None):
    """A ``matplotlib.animation.FuncAnimation`` of both loop orders side by side (one frame per tile).

    Row 1 is v1, row 2 is v2. Left: the (Tr, Tc) grid of S tiles (grey crosses: skipped by the causal
    mask; orange: the tile being computed; blue: done; the outline marks what stays in SRAM through
    the inner loop: K_j, V_j in v1, Q_i and acc_i in v2). Middle: the running max m and sum l of one
    query row (the middle row of the last Q block). Right: that row's running O = acc / l, one bar per
    column of the head, against the float64 reference (black ticks). Fresh random inputs each call
    unless ``seed`` is given. Use ``.to_jshtml()`` in a notebook, ``.save(path, writer="pillow")`` for a GIF.
    """
    import matplotlib.pyplot as plt
    from matplotlib import animation
    from matplotlib.patches import Rectangle

    rng = np.random.default_rng(seed)
    Nq, Nk = Tr * Br, Tc * Bc
    q, k, v = (rng.standard_normal((n, D)) for n in (Nq, Nk, Nk))
    S = q @ k.T / np.sqrt(D)
    if causal:
        S = np.where(masks.visible(np.arange(Nq), np.arange(Nk), Nq, Nk, masks.CAUSAL), S, -np.inf)
    i_row, r = Tr - 1, (Tr - 1) * Br + Br // 2
    P = np.exp(S[r] - S[r].max())
    O_ref = (P / P.sum()) @ v

    walks = {o: visited_tiles(Tr, Tc, Br, Bc, causal, o) for o in ("v1", "v2")}
    hists = {o: _row_history(S[r], v, Bc, walks[o], i_row) for o in walks}
    n_frames = len(walks["v1"]) + 1
    m_all = [h[0] for o in hists for h in hists[o] if np.isfinite(h[0])]
    l_all = [h[1] for o in hists for h in hists[o]]
    o_lim = 1.15 * max(np.abs(O_ref).max(), max(np.abs(h[2]).max() for o in hists for h in hists[o]))

    fig, axes = plt.subplots(2, 3, figsize=(10, 5.6), gridspec_kw={"width_ratios": [1.1, 1.2, 1.2]}, dpi=dpi)
    title = fig.suptitle("", fontsize=9)
    art = {}   # artists made once and updated per frame (rebuilding axes per frame is several times slower)
    for row, order in enumerate(("v1", "v2")):
        ax_grid, ax_ml, ax_o = axes[row]
        walk = walks[order]
        cells = {}
        for i in range(Tr):
            for j in range(Tc):
                if (i, j) in walk:
                    cells[i, j] = ax_grid.add_patch(Rectangle((j, i), 1, 1, facecolor="white", edgecolor="0.4"))
                else:
                    ax_grid.add_patch(Rectangle((j, i), 1, 1, facecolor="0.88", edgecolor="0.6", hatch="xx"))
        sram = ax_grid.add_patch(Rectangle((0, 0), 1, 1, fill=False, edgecolor="C3", lw=2.5, visible=False))
        ax_grid.add_patch(Rectangle((0, i_row + 0.5 - 0.04), Tc, 0.08, color="k"))
        ax_grid.set_xlim(0, Tc); ax_grid.set_ylim(Tr, 0); ax_grid.set_aspect("equal")
        ax_grid.set_xticks(np.arange(Tc) + 0.5, [str(j) for j in range(Tc)], fontsize=7)
        ax_grid.set_yticks(np.arange(Tr) + 0.5, [str(i) for i in range(Tr)], fontsize=7)
        ax_grid.set_xlabel("K/V block j", fontsize=8); ax_grid.set_ylabel("Q block i", fontsize=8)
        inner = "inner i (K_j, V_j stay)" if order == "v1" else "inner j (Q_i, acc_i stay)"
        ax_grid.set_title(f"{order}: {'outer j' if order == 'v1' else 'outer i'}, {inner}", fontsize=8)

        ax_l = ax_ml.twinx()
        (m_line,) = ax_ml.plot([], [], "o-", color="C0", ms=3)
        (l_line,) = ax_l.plot([], [], "s-", color="C2", ms=3)
        ax_ml.set_xlim(0, n_frames); ax_ml.set_ylim(min(m_all) - 0.3, max(m_all) + 0.3)
        ax_l.set_ylim(0, 1.1 * max(l_all)); ax_l.tick_params(labelsize=7); ax_ml.tick_params(labelsize=7)
        ax_ml.set_xlabel("tiles computed", fontsize=8)
        ax_ml.set_ylabel("m_i", fontsize=8, color="C0"); ax_l.set_ylabel("l_i", fontsize=8, color="C2")
        ax_ml.set_title(f"row {r} (black bar): running m_i (blue), l_i (green)", fontsize=8)

        bars = ax_o.bar(np.arange(D), np.zeros(D), color="C4", alpha=0.8, label="acc / l now")
        ax_o.plot(np.arange(D), O_ref, "k_", ms=14, mew=2, label="reference O")
        ax_o.set_ylim(-o_lim, o_lim); ax_o.axhline(0, color="0.5", lw=0.5)
        ax_o.set_xticks(range(D)); ax_o.tick_params(labelsize=7)
        ax_o.set_xlabel("column of O (head dim)", fontsize=8)
        ax_o.set_title(f"row {r} of O = acc / l", fontsize=8)
        if row == 0:
            ax_o.legend(fontsize=6, loc="lower right")
        art[order] = (cells, sram, m_line, l_line, bars)

    def draw(frame):
        for order in ("v1", "v2"):
            cells, sram, m_line, l_line, bars = art[order]
            walk, hist = walks[order], hists[order]
            cur = walk[frame - 1] if frame > 0 else None
            for n, tile in enumerate(walk):
                cells[tile].set_facecolor("C1" if tile == cur else ("#9ecae1" if n < frame else "white"))
            if cur is None:
                sram.set_visible(False)
            elif order == "v1":   # what the inner loop keeps on chip: K_j, V_j (a column of tiles) ...
                sram.set_bounds(cur[1], 0, 1, Tr); sram.set_visible(True)
            else:                 # ... or Q_i, acc_i, m_i, l_i (a row of tiles)
                sram.set_bounds(0, cur[0], Tc, 1); sram.set_visible(True)
            steps = np.arange(1, frame + 1)
            m_line.set_data(steps, [hist[s - 1][0] if np.isfinite(hist[s - 1][0]) else np.nan for s in steps])
            l_line.set_data(steps, [hist[s - 1][1] for s in steps])
            O_now = hist[frame - 1][2] if frame > 0 else np.zeros(D)
            for bar, h in zip(bars, O_now):
                bar.set_height(h)
        title.set_text(f"tile walk, Tr = {Tr}, Tc = {Tc}, Br = {Br}, Bc = {Bc}, causal = {causal}: "
                       f"tile {frame} of {n_frames - 1}")
        return []

    fig.tight_layout(rect=(0, 0, 1, 0.95))
    anim = animation.FuncAnimation(fig, draw, frames=n_frames, interval=interval, blit=False)
    plt.close(fig)
    return anim


_BUTTONS = {"fast-backward": "|&lt;&lt;", "step-backward": "&lt;", "play": "&#9654;", "play fa-flip-horizontal": "&#9664;", "pause": "||",
            "step-forward": "&gt;", "fast-forward": "&gt;&gt;|", "minus": "&minus;", "plus": "+"}


def animation_html(anim) -> str:
    """HTML/JS player of a matplotlib animation (``to_jshtml``) that loads nothing from the network."""
    import re

    html = anim.to_jshtml()
    html = re.sub(r"<link[^>]*font-awesome[^>]*>", "", html)
    return re.sub(r'<i class="fa fa-([a-z -]+)"></i>', lambda m: _BUTTONS.get(m.group(1), m.group(1)), html)


def mma_fragment_owner(matrix: str, row: int, col: int) -> tuple[int, int]:
    """(lane, register index) holding element (row, col) of an mma.sync.m16n8k16 fragment (16-bit A, fp32 C).

    A is 16 x 16 (8 halves per lane, a0..a7), C is 16 x 8 (4 floats per lane, c0..c3). groupID = lane // 4,
    threadID_in_group = lane % 4: row groupID (+8 for the second half of the registers), columns
    2 * threadID_in_group + {0, 1} (+8 for a4..a7), as in the PTX ISA's fragment figures.
    """
    if matrix == "C":
        if not (0 <= row < 16 and 0 <= col < 8):
            raise ValueError(f"mma_fragment_owner: C is 16 x 8, got (row, col) = ({row}, {col})")
        lane = (row % 8) * 4 + col // 2
        return lane, (col % 2) + 2 * (row // 8)
    if matrix == "A":
        if not (0 <= row < 16 and 0 <= col < 16):
            raise ValueError(f"mma_fragment_owner: A is 16 x 16, got (row, col) = ({row}, {col})")
        lane = (row % 8) * 4 + (col % 8) // 2
        return lane, (col % 2) + 2 * (row // 8) + 4 * (col // 8)
    raise ValueError(f"mma_fragment_owner: matrix must be 'A' or 'C', got {matrix!r}")


def draw_mma_fragments(ax_a, ax_c) -> None:
    """Colour each element of the A (16 x 16) and C (16 x 8) tiles by the lane that holds it, labelled lane/register."""
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab20", 32)
    for ax, name, cols in ((ax_a, "A", 16), (ax_c, "C", 8)):
        lanes = np.zeros((16, cols))
        for r in range(16):
            for c in range(cols):
                lane, reg = mma_fragment_owner(name, r, c)
                lanes[r, c] = lane
                ax.text(c, r, f"{lane}\n{name.lower()}{reg}", ha="center", va="center", fontsize=5)
        ax.imshow(lanes % 20, cmap=cmap, vmin=0, vmax=31, aspect="equal")
        ax.set_xticks(range(cols)); ax.set_yticks(range(16)); ax.tick_params(labelsize=6)
        ax.set_xlabel("column"); ax.set_ylabel("row")
    ax_a.set_title("A (16 x 16, fp16): lane / register", fontsize=8)
    ax_c.set_title("C (16 x 8, fp32): lane / register", fontsize=8)


def draw_swizzle(ax_logical, ax_physical, rows: int = 8, chunks: int = 8) -> None:
    """Shared-memory tile of ``rows`` rows of ``chunks`` 16-byte chunks (64 halves = 128 bytes a row).

    Left: where each chunk belongs (logical column c). Right: where it is stored, chunk c ^ (r % 8).
    Reading one logical column (same c, 8 rows, as ldmatrix does) hits 8 different physical chunks,
    so 8 different groups of 4 banks, instead of the same 4 banks 8 times.
    """
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    for ax, swz in ((ax_logical, False), (ax_physical, True)):
        for r in range(rows):
            for c in range(chunks):
                pos = c ^ (r % 8) if swz else c
                ax.add_patch(plt.Rectangle((pos, r), 1, 1, facecolor=cmap(c % 10), edgecolor="white",
                                           alpha=1.0 if c == 0 else 0.45))
                ax.text(pos + 0.5, r + 0.5, str(c), ha="center", va="center", fontsize=7)
        ax.set_xlim(0, chunks); ax.set_ylim(rows, 0); ax.set_aspect("equal")
        ax.set_xticks(np.arange(chunks) + 0.5, [str(c) for c in range(chunks)], fontsize=7)
        ax.set_yticks(np.arange(rows) + 0.5, [str(r) for r in range(rows)], fontsize=7)
        ax.set_xlabel("16-byte chunk in shared memory (banks 4c .. 4c+3)", fontsize=7)
        ax.set_ylabel("tile row r", fontsize=7)
    ax_logical.set_title("no swizzle: chunk c at c\n(column 0 = 8 reads of banks 0-3)", fontsize=8)
    ax_physical.set_title("XOR swizzle: chunk c at c ^ (r % 8)\n(column 0 spread over all 32 banks)", fontsize=8)


# ------------------------------------------------------------------ D = 32 and 96: rows that are not 128 bytes
def smem_chunk(D: int, r: int, c: int, swizzle: str = "project") -> int:
    """Where 16-byte chunk c (0 .. D/8 - 1) of row r of a (rows, D) 16-bit tile is stored, as a chunk of that row.

    "none": c. "xor8": c ^ (r % 8) on every chunk (the 128-byte pattern; where a row does not end on a whole group of
    8 chunks, D = 32 or 96, it sends some chunks past the row's end). "project": smem_tiles.cuh's ``swz``:
    c ^ (r % 8) inside each whole group of 8 chunks, and on the last 4 chunks of a row of D = 32 or 96 the
    64-byte swizzle c ^ ((r // 2) % 4), which keeps them in their row.
    """
    if swizzle == "none":
        return c
    if swizzle == "xor8":
        return c ^ (r % 8)
    whole = D // 64 * 8  # chunks in whole 128-byte groups
    return c ^ (r % 8) if c < whole else c ^ ((r >> 1) & 3)


def ldmatrix_bank_groups(D: int, c: int, swizzle: str = "project", r0: int = 0):
    """The 16-byte bank groups (g = 0 .. 7: banks 4g .. 4g + 3) that ldmatrix's 8 row reads of logical chunk c,
    rows r0 .. r0 + 7 of a (rows, D) tile, land in; None where the swizzle puts one of them outside its row."""
    groups = []
    for r in range(r0, r0 + 8):
        p = smem_chunk(D, r, c, swizzle)
        if p >= D // 8:
            return None
        groups.append((r * D * 2 // 16 + p) % 8)
    return groups


def conflict_ways(D: int, swizzle: str = "project"):
    """The worst n-way bank conflict of ldmatrix's 8-row reads over every chunk of a (rows, D) tile (1: none);
    None where the swizzle sends a chunk outside its row."""
    worst = 1
    for c in range(D // 8):
        for r0 in (0, 8):
            g = ldmatrix_bank_groups(D, c, swizzle, r0)
            if g is None:
                return None
            worst = max(worst, max(g.count(x) for x in g))
    return worst


def draw_swizzle_96(ax_xor8, ax_project, rows: int = 8) -> None:
    """A (rows, 96) tile: 12 chunks a row (192 bytes). Left: c ^ (r % 8) on every chunk, which moves chunks 8 .. 11
    to 8 .. 15, past the row's end (drawn in red, over the next row's bytes). Right: the project's rule, 64-byte
    swizzle on the last 4 chunks."""
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab20")
    for ax, swz in ((ax_xor8, "xor8"), (ax_project, "project")):
        for r in range(rows):
            for c in range(12):
                pos = smem_chunk(96, r, c, swz)
                out = pos >= 12
                ax.add_patch(plt.Rectangle((pos, r), 1, 1, facecolor="tab:red" if out else cmap(c % 20),
                                           edgecolor="white", alpha=1.0 if c in (0, 8) or out else 0.45))
                ax.text(pos + 0.5, r + 0.5, str(c), ha="center", va="center", fontsize=6)
        ax.axvline(12, color="black", lw=1.2)
        ax.text(12.1, -0.3, "row ends", fontsize=6)
        ax.set_xlim(0, 16); ax.set_ylim(rows, 0); ax.set_aspect("equal")
        ax.set_xticks(np.arange(16) + 0.5, [str(c) for c in range(16)], fontsize=6)
        ax.set_yticks(np.arange(rows) + 0.5, [str(r) for r in range(rows)], fontsize=6)
        ax.set_xlabel("16-byte chunk of the row in shared memory", fontsize=7)
        ax.set_ylabel("tile row r", fontsize=7)
    ax_xor8.set_title("D = 96, c ^ (r % 8) on every chunk:\nchunks 8-11 leave the row (red)", fontsize=8)
    ax_project.set_title("D = 96, smem_tiles.cuh: c ^ (r % 8) on chunks 0-7,\nc ^ ((r // 2) % 4) on chunks 8-11",
                         fontsize=8)


# ------------------------------------------------------------------ rung 3c: the consumers' turns, drawn
# Illustrative durations of one tile step of one consumer warp group at D = 128, Bc = 128, in cycles of one SM:
# each product is 64 x 128 x 128 multiply-adds, 2.1 MFLOP at the 4096 FLOP a cycle of an H100 SM's tensor cores;
# the softmax's 64 exp2 a thread run on the multi-function units, 16 lanes a cycle; acc's rescale is 64 FMUL a
# thread, P's packing 32 conversions.
PINGPONG_CYCLES = {"S": 512, "PV": 512, "softmax": 600, "rescale": 64, "pack": 32}


def pingpong_schedule(consumers: int = 2, tiles: int = 6, rescale_in_turn: bool = True, cycles=None) -> dict:
    """A small model of the loop of ``wgmma.cu`` (consumers = 1) and ``wgmma_ws.cu`` (2: ping-pong), per step j
    of one consumer warp group (64 query rows):

        wait for its turn; issue S_j+1 = Q K_j+1^T; [rescale acc]; issue acc += P_j V_j; pass the turn on
        wait for S_j+1; softmax of it (under P_j V_j); wait for P_j V_j; [rescale acc]; pack P_j+1

    The tensor cores run the issued products one after another in issue order; the turn goes round the
    consumers in a ring (with one consumer there is no turn to wait for); acc's rescale runs inside the turn
    (rescale_in_turn, FlashAttention-3's order) or after P_j V_j. Loads never stall (the producer is ahead).
    Durations: ``cycles`` (default PINGPONG_CYCLES). An illustration of the order of the work, not a
    prediction of any timing.

    Returns {"tc": [(start, end, consumer, "S" or "PV", step)], "wg": [(start, end, consumer, what)] with what
    in "softmax", "rescale", "pack", and "end": when the last product finishes}.
    """
    c = dict(PINGPONG_CYCLES, **(cycles or {}))
    if consumers < 1 or tiles < 1:
        raise ValueError(f"pingpong_schedule: consumers and tiles must be >= 1, got {consumers} and {tiles}")
    tc_free, tc, wg = 0.0, [], []
    t = [0.0] * consumers      # when each consumer is ready for its next instruction
    turn = [0.0] * consumers   # when each consumer's turn is passed to it
    turn[1:] = [float("inf")] * (consumers - 1)

    def product(start, kind, who, step):
        nonlocal tc_free
        begin = max(start, tc_free)
        tc_free = begin + c[kind]
        tc.append((begin, tc_free, who, kind, step))
        return tc_free

    def work(who, what):
        wg.append((t[who], t[who] + c[what], who, what))
        t[who] += c[what]

    for step in range(tiles):
        for who in range(consumers):
            t[who] = max(t[who], turn[who])                 # wait for my turn
            s_done = product(t[who], "S", who, step + 1)    # S_j+1 = Q K_j+1^T
            if rescale_in_turn:
                work(who, "rescale")                        # acc *= exp2(m_old - m_new), beside S_j+1
            pv_done = product(t[who], "PV", who, step)      # acc += P_j V_j
            if consumers > 1:
                turn[(who + 1) % consumers] = t[who]        # pass the turn on
                turn[who] = float("inf")
            t[who] = max(t[who], s_done)                    # wait for S_j+1
            work(who, "softmax")                            # m_new, P = exp2(S - m_new), l_i (under P_j V_j)
            t[who] = max(t[who], pv_done)                   # wait for P_j V_j
            if not rescale_in_turn:
                work(who, "rescale")
            work(who, "pack")                               # P_j+1 -> fp16/bf16 registers
    return {"tc": tc, "wg": wg, "end": tc_free}


def tensor_core_idle(schedule: dict) -> float:
    """Cycles between the first product's start and the last one's end in which the tensor cores ran nothing."""
    spans = sorted((s, e) for s, e, *_ in schedule["tc"])
    return sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:]))


def draw_pingpong(ax, schedule: dict, title: str = "") -> None:
    """One lane for the tensor cores and one per consumer warp group: the products (S, P V) coloured by the
    consumer that issued them, the softmax, rescale and packing on the consumers' own lanes, and the tensor
    cores' idle gaps hatched."""
    consumers = 1 + max(who for _, _, who, *_ in schedule["tc"])
    colours = ["tab:blue", "tab:orange", "tab:green"]
    work_colour = {"softmax": "tab:purple", "rescale": "tab:red", "pack": "tab:gray"}
    lanes = {"tc": consumers}
    for s, e, who, kind, step in schedule["tc"]:
        ax.broken_barh([(s, e - s)], (lanes["tc"] - 0.4, 0.8), facecolors=colours[who % 3],
                       alpha=0.95 if kind == "S" else 0.55, edgecolor="white")
        ax.text((s + e) / 2, lanes["tc"], f"{'S' if kind == 'S' else 'PV'}{step}", ha="center", va="center",
                fontsize=6)
    spans = sorted((s, e) for s, e, *_ in schedule["tc"])
    for a, b in zip(spans, spans[1:]):
        if b[0] > a[1]:
            ax.broken_barh([(a[1], b[0] - a[1])], (lanes["tc"] - 0.4, 0.8), facecolors="none", hatch="///",
                           edgecolor="tab:red", linewidth=0)
    for s, e, who, what in schedule["wg"]:
        ax.broken_barh([(s, e - s)], (consumers - 1 - who - 0.3, 0.6), facecolors=work_colour[what], alpha=0.8)
    ax.set_yticks([lanes["tc"]] + [consumers - 1 - w for w in range(consumers)],
                  ["tensor cores"] + [f"consumer {w}" for w in range(consumers)], fontsize=7)
    ax.set_xlabel("cycles (illustrative)", fontsize=7)
    ax.tick_params(axis="x", labelsize=6)
    ax.set_xlim(0, schedule["end"])
    busy = 1 - tensor_core_idle(schedule) / (schedule["end"] - schedule["tc"][0][0])
    ax.set_title(f"{title}  (tensor cores busy {100 * busy:.0f} % of this drawing)", fontsize=8)


def pingpong_legend(fig) -> None:
    """The colours of draw_pingpong, once for a figure, under its panels."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=col, alpha=a, label=name) for name, col, a in (
        ("S = Q K^T", "tab:blue", 0.95), ("P V", "tab:blue", 0.55), ("(second warp group's)", "tab:orange", 0.75),
        ("softmax", "tab:purple", 0.8), ("rescale acc", "tab:red", 0.8), ("pack P", "tab:gray", 0.8))]
    handles.append(Patch(facecolor="none", edgecolor="tab:red", hatch="///", label="tensor cores idle"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)


def longest_hidden_softmax(consumers: int = 2, rescale_in_turn: bool = True, cycles=None) -> int:
    """The longest softmax (whole cycles) for which pingpong_schedule's tensor cores never wait, the other
    durations as given; -1 if they wait even with no softmax (one warp group: its packing)."""
    base = dict(PINGPONG_CYCLES, **(cycles or {}))
    hidden = lambda t: tensor_core_idle(pingpong_schedule(consumers, 8, rescale_in_turn, dict(base, softmax=t))) == 0  # noqa: E731
    if not hidden(0):
        return -1
    lo, hi = 0, 8 * (base["S"] + base["PV"])  # hidden(lo); the idle time grows with the softmax
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if hidden(mid) else (lo, mid - 1)
    return lo


# ------------------------------------------------------------------ notebook 08: the dQ sums' 8-byte stores
def dq_chunk(r: int, c: int, swizzle: str = "new") -> int:
    """Where 16-byte chunk c of row r of a warp group's dQ buffer is stored in wgmma_backward.cu (DqReduce):
    "new" c ^ 2 (r % 4) (``dq_chunk`` there, since commit 82d7a26), "old" c ^ (r % 8), "none" c; "64" c ^ (r & 2)
    (``dq_chunk_64``: the rows of 16 or 48 floats of D = 32 and 96)."""
    return {"new": c ^ ((r & 3) << 1), "old": c ^ (r % 8), "none": c, "64": c ^ (r & 2)}[swizzle]


def dq_store_banks(lane: int, n: int = 0, swizzle: str = "new", row_floats: int = 64) -> tuple[int, int]:
    """The two shared-memory banks (4 bytes each) that ``lane`` of a warp writes with its 8-byte store of
    accumulator columns 8n + 2t, 8n + 2t + 1 in row g (g = lane // 4, t = lane % 4) of a buffer whose rows are
    ``row_floats`` floats long (64 at D = 128; 48 and 16 at D = 96 and 32): float 2t % 4 of chunk 2n + t // 2."""
    g, t = divmod(lane, 4)
    chunk = dq_chunk(g, 2 * n + t // 2, swizzle)
    first = (g * row_floats + 4 * chunk + 2 * (t % 2)) % 32
    return first, first + 1


def fragment_banks(lane: int) -> tuple[int, int]:
    """The two banks ``lane`` writes with its first 8-byte store of dQ's sums (warp 0, register pair 0: rows 0-7,
    columns 0-7) when the block is laid out as the Triton rung's Gluon backward lays it out,
    ``hopper_backward.dq_fragment_layout`` (the accumulator's register order): where that layout puts row lane // 4,
    column 2 (lane % 4). Offset bit i of the layout adds its basis i to (row, column)."""
    from flash_attention_triton.hopper_backward import dq_fragment_layout

    bases = dq_fragment_layout().offset_bases
    want = (lane // 4, 2 * (lane % 4))
    for off in range(64 * 64):
        if tuple(sum(b[d] for i, b in enumerate(bases) if off >> i & 1) for d in (0, 1)) == want:
            return off % 32, off % 32 + 1
    raise ValueError(f"fragment_banks: the layout does not hold (row, column) {want}")


def dq_pieces(D: int, wg: int) -> list[tuple[int, int]]:
    """The products (first column of K_j, columns) warp group ``wg`` (0 or 1) issues for its D / 2 columns of
    dQ_i += dS_ij K_j in the one-kernel wgmma backward with tiles of 64 queries (wgmma_backward.cu, DqReduce). K_j
    is stored in panels of 64 columns (32 at D = 32 and 96), and a product's columns stay inside one panel: at
    D = 96 both warp groups issue 32 columns from 64 wg and 16 from 32 + 16 wg."""
    if D == 96:
        return [(64 * wg, 32), (32 + 16 * wg, 16)]
    return [(wg * D // 2, D // 2)]


def draw_dq_pieces(ax, dims=(32, 64, 96, 128)) -> None:
    """K_j's column panels for each head dim (a row each), and the products of the two warp groups on them."""
    import matplotlib.pyplot as plt

    for y, D in enumerate(dims):
        cols = 64 if D % 64 == 0 else 32
        for p0 in range(0, D, cols):  # the panels
            ax.add_patch(plt.Rectangle((p0, y + 0.05), cols, 0.9, fill=False, edgecolor="black", lw=1.2))
        for wg, color in ((0, "tab:blue"), (1, "tab:orange")):
            for c0, n in dq_pieces(D, wg):
                ax.add_patch(plt.Rectangle((c0 + 0.6, y + 0.2 + 0.3 * wg), n - 1.2, 0.28, color=color))
                ax.text(c0 + n / 2, y + 0.34 + 0.3 * wg, f"wg{wg} n{n}", ha="center", va="center", fontsize=6,
                        color="white")
    ax.set_xlim(0, max(dims)); ax.set_ylim(len(dims), 0)
    ax.set_yticks([y + 0.5 for y in range(len(dims))], [f"D = {D}" for D in dims])
    ax.set_xticks(range(0, max(dims) + 1, 16)); ax.tick_params(labelsize=6)
    ax.set_xlabel("column of K_j (black: a panel; a product's columns stay inside one)", fontsize=7)


def draw_dq_store_banks(axes, n: int = 0) -> None:
    """For the 16 lanes of a half warp (served together for 8-byte stores), the banks each writes in its row,
    without a swizzle, with the old one and the new one; the title says how many lanes meet in a bank (the
    wavefronts the store takes)."""
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab20")
    for ax, swizzle in zip(axes, ("old", "new")):
        hits = {}
        for lane in range(16):
            for b in dq_store_banks(lane, n, swizzle):
                hits.setdefault(b, []).append(lane)
                ax.add_patch(plt.Rectangle((b, lane // 4), 1, 1, facecolor=cmap(lane), edgecolor="white"))
                ax.text(b + 0.5, lane // 4 + 0.5, str(lane), ha="center", va="center", fontsize=5)
        ways = max(len(v) for v in hits.values())
        rule = {"old": "c ^ (r % 8)", "new": "c ^ 2 (r % 4)"}[swizzle]
        ax.set_title(f"chunk c of row r at {rule}: {len(hits)} banks, up to {ways} lane{'s' if ways > 1 else ''} a bank "
                     f"({ways} wavefront{'s' if ways > 1 else ''})", fontsize=8)
        ax.set_xlim(0, 32); ax.set_ylim(4, 0)
        ax.set_xticks(range(0, 32, 4)); ax.set_yticks([0.5, 1.5, 2.5, 3.5], ["row 0", "row 1", "row 2", "row 3"])
        ax.tick_params(labelsize=6); ax.set_xlabel("bank", fontsize=7)
