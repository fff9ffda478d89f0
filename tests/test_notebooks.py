"""Every notebook of the learning path (notebooks/NN_*.ipynb) runs, draws its pictures, teaches, and is committed clean.

* ``test_notebook_runs``: executes the notebook with nbclient in a fresh kernel of this interpreter
  (kernel ``python3``), working directory ``notebooks/``, with matplotlib's **inline** backend (CI exports
  ``MPLBACKEND=Agg``, under which ``plt.show()`` draws nothing, so the test overrides it) and, without a
  GPU, ``TRITON_INTERPRET=1``. It fails on any cell that raises, on fewer ``image/png`` outputs than
  ``MIN_PNGS`` lists, on a missing tile-walk animation (notebook 03), on an exercise check that does not
  say "Correct:" (the worked answers are in the notebook), and, without a GPU, on a notebook slower than
  ``BUDGET_S`` (60 s; on a GPU the notebooks run real sweeps and only the per-cell timeout applies).
  The executed copy is saved to ``build/executed_notebooks/`` (git-ignored), where
  ``tools/build_site.py`` picks it up instead of executing the notebook again.
* ``test_course_structure``: learning goals at the top, at least three exercises, answers hidden by the
  convention the student release relies on (code cell tagged ``solution`` with ``source_hidden``, between
  the exercise cell and its check cell; markdown tagged ``answer`` inside ``<details>``), and a last cell
  linking a lab and the next notebook.
* ``test_runs_without_solutions``: with the ``solution`` and ``answer`` cells removed, no remaining cell
  uses a name that only a solution cell defines (checked statically with ``ast``);
  ``test_stripped_notebook_executes`` executes one stripped notebook and sees every check say "Not yet".
* ``test_committed_without_outputs``: no outputs and no execution counts in the committed JSON.
"""
from __future__ import annotations

import ast
import builtins
import copy
import os
import pathlib
import re
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib_inline")

ROOT = pathlib.Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
EXECUTED_DIR = ROOT / "build" / "executed_notebooks"
NOTEBOOKS = sorted(p.name for p in NB_DIR.glob("[0-9][0-9]_*.ipynb"))
TIMEOUT_S = 300                                                  # per cell
BUDGET_S = float(os.environ.get("NOTEBOOK_BUDGET_S", "60"))      # per notebook, 2 CPU cores, no GPU
INLINE = "module://matplotlib_inline.backend_inline"
# image/png outputs each notebook must produce on a CPU-only machine (a GPU run draws at least as many)
MIN_PNGS = {"01": 2, "02": 1, "03": 2, "04": 1, "05": 1, "06": 3, "07": 4, "08": 1}


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _read(name):
    return nbformat.read(str(NB_DIR / name), as_version=4)


def _tags(cell):
    return set(cell.get("metadata", {}).get("tags", []))


def strip_answers(nb):
    """The student version: a copy without the cells tagged ``solution`` or ``answer``."""
    out = copy.deepcopy(nb)
    out.cells = [c for c in out.cells if not (_tags(c) & {"solution", "answer"})]
    return out


def _execute(nb, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", INLINE)
    if not _has_cuda():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    # the kernel imports the repository through notebooks/_setup.py; PYTHONPATH too, for good measure
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(NB_DIR)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def _outputs(nb):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]


def _text(out):
    if out.get("output_type") == "stream":
        return out.get("text", "")
    return str(out.get("data", {}).get("text/plain", ""))


def test_the_learning_path_is_complete():
    numbers = [name[:2] for name in NOTEBOOKS]
    assert numbers == [f"{i:02d}" for i in range(1, len(NOTEBOOKS) + 1)], f"notebooks are not numbered 01..N: {NOTEBOOKS}"
    assert len(NOTEBOOKS) >= 8, f"expected the 8 notebooks of the learning path, found {NOTEBOOKS}"
    for readme in ("README.md", "README.zh.md"):
        text = (NB_DIR / readme).read_text(encoding="utf-8")
        missing = [name for name in NOTEBOOKS if name not in text]
        assert not missing, f"notebooks/{readme} does not link {missing}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs(name):
    nb = _read(name)
    nbformat.validate(nb)
    dirty = [i for i, cell in enumerate(nb.cells)
             if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{name}: code cells {dirty} carry outputs; clear them with "
                       f"`jupyter nbconvert --clear-output --inplace notebooks/{name}`")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_course_structure(name):
    nb = _read(name)
    cells = nb.cells
    assert "After this notebook you will be able to" in cells[0].source, f"{name}: the first cell states no learning goals"
    exercises = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and re.match(r"\*\*Exercise \d+ ", c.source)]
    assert len(exercises) >= 3, f"{name}: {len(exercises)} exercises, expected at least 3"
    for i, c in enumerate(cells):
        tags = _tags(c)
        if "solution" in tags:
            where = f"{name} cell {i} (solution)"
            assert c.cell_type == "code", f"{where}: must be a code cell"
            assert c.metadata.get("jupyter", {}).get("source_hidden") is True, f"{where}: set metadata.jupyter.source_hidden"
            before, after = cells[i - 1], cells[i + 1]
            assert before.cell_type == "code" and "None  # TODO" in before.source, \
                f"{where}: the cell before must be the student's version with `answer = None  # TODO`"
            assert after.cell_type == "code" and "check(" in after.source and not (_tags(after) & {"solution", "answer"}), \
                f"{where}: the cell after must be an untagged check cell calling check(...)"
        if "answer" in tags:
            assert c.cell_type == "markdown" and "<details><summary>Answer</summary>" in c.source, \
                f"{name} cell {i}: an answer cell is markdown inside <details><summary>Answer</summary>"
    last = cells[-1].source
    assert cells[-1].cell_type == "markdown" and "labs/" in last and "README.md" in last, \
        f"{name}: the last cell must link its lab (labs/...) and the path (README.md)"
    missing = [link for link in re.findall(r"\]\(([^)#]+)\)", last) if not (NB_DIR / link).exists()]
    assert not missing, f"{name}: the last cell links files that do not exist: {missing}"
    number = int(name[:2])
    nxt = [n for n in NOTEBOOKS if int(n[:2]) == number + 1]
    assert not nxt or nxt[0] in last, f"{name}: the last cell does not link the next notebook {nxt}"


def _names(tree):
    """(names bound, names loaded) by a cell's code; IPython magics are not used in these notebooks."""
    bound, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else loaded).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, loaded


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_runs_without_solutions(name):
    nb = _read(name)
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    only_in_solutions, elsewhere = set(), set(dir(builtins)) | {"display", "get_ipython"}
    for i, c in code:
        bound, _ = _names(ast.parse(c.source))
        (only_in_solutions if "solution" in _tags(c) else elsewhere).update(bound)
    from_setup = set(ast.literal_eval(re.search(r"__all__ = (\[.*?\])", (NB_DIR / "_setup.py").read_text(), re.S).group(1)))
    only_in_solutions -= elsewhere | from_setup
    problems = []
    for i, c in code:
        if "solution" in _tags(c):
            continue
        _, loaded = _names(ast.parse(c.source))
        used = sorted(loaded & only_in_solutions)
        if used:
            problems.append(f"cell {i} uses {used}, defined only in solution cells")
    assert not problems, f"{name}: without the solution cells the notebook would fail: {problems}"


@pytest.mark.slow
def test_stripped_notebook_executes(monkeypatch):
    """The student version of notebook 02 runs top to bottom and every check says "Not yet"."""
    name = next(n for n in NOTEBOOKS if n.startswith("02"))
    nb = strip_answers(_read(name))
    _execute(nb, monkeypatch)
    outs = _outputs(nb)
    errors = [o for o in outs if o.get("output_type") == "error"]
    assert not errors, f"{name} without solutions: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    texts = "".join(_text(o) for o in outs)
    checks = sum(1 for c in nb.cells if c.cell_type == "code" and c.source.startswith("check("))
    assert texts.count("Not yet:") == checks and "Correct:" not in texts, \
        f"{name} without solutions: expected {checks} 'Not yet' messages, got {texts.count('Not yet:')}"


@pytest.mark.slow   # 10-35 s each on 2 busy cores; about 3 minutes for all eight
@pytest.mark.timeout(3 * TIMEOUT_S)   # a GPU run of 07 does two sweeps of up to 280 s each
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, monkeypatch):
    nb = _read(name)
    seconds = _execute(nb, monkeypatch)
    outs = _outputs(nb)
    pngs = sum(1 for o in outs if "image/png" in o.get("data", {}))
    print(f"{name}: executed in {seconds:.1f} s, {pngs} image/png outputs")
    EXECUTED_DIR.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(EXECUTED_DIR / name))
    errors = [o for o in outs if o.get("output_type") == "error"]
    assert not errors, f"{name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    assert pngs >= MIN_PNGS.get(name[:2], 1), f"{name}: {pngs} image/png outputs under the inline backend, expected >= {MIN_PNGS.get(name[:2], 1)}"
    if name.startswith("03"):
        html = [o["data"]["text/html"] for o in outs if "text/html" in o.get("data", {})]
        assert any("anim" in h and "<img" in h for h in html), f"{name}: no tile-walk animation (to_jshtml) in the outputs"
    texts = "".join(_text(o) for o in outs)
    checks = sum(1 for c in nb.cells if c.cell_type == "code" and c.source.startswith("check("))
    assert texts.count("Correct:") == checks and "Not yet:" not in texts, \
        f"{name}: {checks} exercise checks, {texts.count('Correct:')} said 'Correct:' with the worked answers in place"
    if not _has_cuda():   # the budget is for the CPU path; on a GPU the notebooks run real sweeps (minutes)
        assert seconds <= BUDGET_S, f"{name} took {seconds:.0f} s, over the {BUDGET_S:.0f} s budget per notebook on 2 cores"


# ------------------------------------------------------------------ notebook 06's model of rung 3c's turns
def _pictures():
    import importlib
    import sys

    if str(NB_DIR) not in sys.path:
        sys.path.insert(0, str(NB_DIR))
    return importlib.import_module("_pictures")


def test_pingpong_model():
    """pingpong_schedule (notebook 06, docs/img/pingpong.png): the tensor cores run one product at a time in
    issue order, the consumers take their turns in a ring, and the idle time and the longest hidden softmax are
    the closed forms the notebook's exercise asks for."""
    pic = _pictures()
    C = pic.PINGPONG_CYCLES
    for consumers in (1, 2, 3):
        for in_turn in (False, True):
            s = pic.pingpong_schedule(consumers, 5, in_turn)
            tc = s["tc"]
            assert all(a[1] <= b[0] for a, b in zip(tc, tc[1:])), "products overlap on the tensor cores"
            assert [who for _, _, who, kind, _ in tc if kind == "S"] == [w for _ in range(5) for w in range(consumers)]
            assert s["end"] == tc[-1][1] and len(s["wg"]) == 3 * 5 * consumers
    # one warp group alone: per step, the softmax beyond its own P V, the rescale (after P V) and the packing
    alone = pic.pingpong_schedule(1, 6, rescale_in_turn=False)
    assert pic.tensor_core_idle(alone) == 5 * (C["softmax"] - C["PV"] + C["rescale"] + C["pack"])
    assert pic.tensor_core_idle(pic.pingpong_schedule(2, 6)) == 0
    # two in ping-pong: a softmax up to 2 (T_S + T_PV) - T_S - T_pack is hidden (less the rescale after P V)
    full = 2 * (C["S"] + C["PV"]) - C["S"] - C["pack"]
    assert pic.longest_hidden_softmax() == full
    assert pic.longest_hidden_softmax(rescale_in_turn=False) == full - C["rescale"]
    assert pic.longest_hidden_softmax(1) == -1
    with pytest.raises(ValueError, match="pingpong_schedule: consumers and tiles must be >= 1, got 0 and 3"):
        pic.pingpong_schedule(0, 3)


def _make_doc_images():
    """tools/make_doc_images.py as a module (tools/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_doc_images", ROOT / "tools" / "make_doc_images.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


@pytest.mark.parametrize("image,file,extra,absent", [("pingpong", "pingpong.png", ["--steps", "2"], "tile_walk.gif"),
                                                   ("swizzle-96", "swizzle_96.png", [], "pingpong.png")])
def test_doc_figure(image, file, extra, absent, tmp_path):
    """tools/make_doc_images.py draws the figures of docs/backend_cuda.md (committed as docs/img/pingpong.png, the
    consumers' turns of rung 3c, and docs/img/swizzle_96.png, the D = 96 swizzle), and only the one asked for."""
    tool = _make_doc_images()
    assert tool.main(["--out-dir", str(tmp_path), "--only", image] + extra) == 0
    assert (tmp_path / file).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / absent).exists()
    committed = ROOT / "docs" / "img" / file
    assert committed.exists() and committed.stat().st_size < 300_000, "python tools/make_doc_images.py"
    for page in ("docs/backend_cuda.md", "docs/zh/backend_cuda.md"):
        assert f"img/{file}" in (ROOT / page).read_text(encoding="utf-8"), page


def test_smem_swizzle_follows_the_kernel():
    """Notebook 06's D = 32 / 96 swizzle is smem_tiles.cuh's own rule (its two XOR terms, read from the source; the
    wgmma tiles' 64-byte pattern in wgmma_ops.cuh is the same term): every chunk stays in its row and ldmatrix's 8-row
    reads hit 8 bank groups at every compiled head dim, where c ^ (r % 8) alone leaves the row at D = 32 and 96."""
    pic = _pictures()
    src = (ROOT / "flash_attention_cuda" / "kernels" / "smem_tiles.cuh").read_text()
    m = re.search(r"const int c = chunk < WHOLE \? ([^:]+) : ([^;]+);", src)
    whole_rule, tail_rule = m.group(1).strip(), m.group(2).strip()
    wgmma_ops = (ROOT / "flash_attention_cuda" / "kernels" / "wgmma_ops.cuh").read_text()
    assert "((chunk & 3) ^ ((row >> 1) & 3))" in wgmma_ops
    for D in (32, 96):
        for r in range(16):
            for c in range(D // 8):
                rule = whole_rule if c < D // 64 * 8 else tail_rule
                want = eval(rule, {"chunk": c, "row": r})  # noqa: S307 - the kernel's C
                assert pic.smem_chunk(D, r, c) == want, (D, r, c, rule)
    for D in (32, 64, 96, 128, 256):
        assert pic.conflict_ways(D) == 1, D
    assert pic.conflict_ways(32, "xor8") is None and pic.conflict_ways(96, "xor8") is None
    assert pic.conflict_ways(96, "none") == 4 and pic.conflict_ways(128, "none") == 8


def test_dq_store_banks_follow_the_kernel():
    """Notebook 08's drawing of the dQ sums' stores uses wgmma_backward.cu's own rule (dq_chunk, read from the
    source): with it a half warp's 8-byte stores hit all 32 banks once; with the old c ^ (r % 8), 16 banks twice."""
    pic = _pictures()
    src = (ROOT / "flash_attention_cuda" / "kernels" / "wgmma_backward.cu").read_text()
    expr = re.search(r"int dq_chunk\(int r, int c\) \{ return ([^;]+); \}", src).group(1)
    for r in range(16):
        for c in range(8):
            assert pic.dq_chunk(r, c) == eval(expr, {"r": r, "c": c}), (r, c, expr)  # noqa: S307 - the kernel's C
    for n in range(4):
        for swizzle, banks, ways in (("new", 32, 1), ("old", 16, 2)):
            hits = [b for lane in range(16) for b in pic.dq_store_banks(lane, n, swizzle)]
            assert len(set(hits)) == banks and max(hits.count(b) for b in hits) == ways, (n, swizzle)
    # D = 32 and 96: rows of 16 and 48 floats, swizzled by dq_chunk_64 (read from the source too)
    expr = re.search(r"int dq_chunk_64\(int r, int c\) \{ return ([^;]+); \}", src).group(1)
    for r in range(16):
        for c in range(12):
            assert pic.dq_chunk(r, c, "64") == eval(expr, {"r": r, "c": c}), (r, c, expr)  # noqa: S307
    for row_floats, chunks in ((16, 4), (48, 12)):
        for n in range(chunks // 2):
            for swizzle, ways in (("64", 1), ("none", 2)):
                hits = [b for lane in range(16) for b in pic.dq_store_banks(lane, n, swizzle, row_floats)]
                assert max(hits.count(b) for b in hits) == ways, (row_floats, n, swizzle)


def test_dq_pieces_stay_inside_the_panels():
    """Notebook 08's dQ products of the one-kernel wgmma backward: the two warp groups' pieces cover their D / 2
    columns each, and none leaves a panel of K_j (64 columns; 32 at D = 32 and 96: wgmma_ops.cuh's Panels)."""
    pic = _pictures()
    for D in (32, 64, 96, 128):
        cols = 64 if D % 64 == 0 else 32
        for wg in (0, 1):
            pieces = pic.dq_pieces(D, wg)
            covered = sorted(c for c0, n in pieces for c in range(c0, c0 + n))
            assert covered == list(range(wg * D // 2, (wg + 1) * D // 2)), (D, wg)
            assert all(c0 // cols == (c0 + n - 1) // cols and n in (16, 32, 64) for c0, n in pieces), (D, wg)
        assert [n for _, n in pic.dq_pieces(D, 0)] == [n for _, n in pic.dq_pieces(D, 1)], D  # the same products
