"""Build the rendered learning path (docs pages, Chinese pages, executed notebooks) with mkdocs-material.

    python tools/build_site.py                         # -> build/site/ (open through a web server)
    python tools/build_site.py --out site/ --execute none
    python -m http.server -d build/site 8000           # then http://localhost:8000/

Why this toolchain: mkdocs-material and mkdocs-jupyter are pure Python (pip-installable, no Node, no
Ruby), render Markdown and notebooks with their outputs (plots, the tile-walk animation) into one
static site with search, and read the docs as they are.

Steps: (1) stage ``docs/`` (with ``docs/zh/``, ``docs/img/``, ``docs/results/``) and ``notebooks/``
(README, README.zh, the labs README and its twin, the notebooks) into ``build/site_src/``, rewriting the
``../notebooks/`` links of the docs to the staged copies; (2) for every notebook use its executed
copy in ``build/executed_notebooks/`` (written by ``tests/test_notebooks.py`` and by this script) when its
code cells match the current notebook (the markdown is taken from the current notebook), otherwise execute it when ``--execute`` says so (inline matplotlib
backend; ``TRITON_INTERPRET=1`` without a GPU), otherwise render it without outputs; (3) copy MathJax
from the ``jupyter_server_mathjax`` package next to the pages, so the site needs no network; (4) run
``mkdocs build`` with ``mkdocs.yml`` plus a navigation in learning order (written beside the stage: ``build/mkdocs.site_src.yml``).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "executed_notebooks"
STAGE = ROOT / "build" / "site_src"


def _code(nb) -> list[tuple[str, str]]:
    """What decides the outputs: the cell types and the code (markdown edits need no re-execution)."""
    return [(c.cell_type, c.source if c.cell_type == "code" else "") for c in nb.cells]


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def execute_notebook(path: pathlib.Path, timeout: int = 300):
    """Execute a notebook (fresh kernel, working directory notebooks/, inline backend); return it and the seconds."""
    import nbclient
    import nbformat

    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if not _has_gpu():
        os.environ["TRITON_INTERPRET"] = "1"
    nb = nbformat.read(str(path), as_version=4)
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NB_DIR)}}).execute()
    return nb, time.perf_counter() - t0


def _rewrite_links(text: str, up: str) -> str:
    """Docs link the notebooks as ``<up>notebooks/...``; in the site they sit one level lower."""
    return text.replace(f"]({up}notebooks/", f"]({up[3:]}notebooks/")


def stage(execute: str, stage_dir: pathlib.Path = STAGE) -> dict[str, str]:
    """Fill ``stage_dir``; return {notebook: 'executed copy' | 'executed now' | 'no outputs'}."""
    import nbformat

    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    docs = ROOT / "docs"
    for src in docs.rglob("*"):
        if src.is_dir():
            continue
        rel = src.relative_to(docs)
        dst = stage_dir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".md":
            depth = len(rel.parts) - 1
            dst.write_text(_rewrite_links(src.read_text(encoding="utf-8"), "../" * (depth + 1)), encoding="utf-8")
        else:
            shutil.copy2(src, dst)
    # the site's home page also lists the rendered notebooks and shows the tile walk
    names = sorted(p.name for p in NB_DIR.glob("[0-9][0-9]_*.ipynb"))
    home = stage_dir / "README.md"
    listing = "\n".join(f"{n + 1}. [{name[:-6].replace('_', ' ')}](notebooks/{name})" for n, name in enumerate(names))
    home.write_text(home.read_text(encoding="utf-8") + "\n\n## The notebooks, executed\n\n"
                    "The learning path as rendered pages, with every plot ([README](notebooks/README.md), "
                    "[中文](notebooks/README.zh.md)):\n\n" + listing +
                    "\n\n![The v1 and v2 tile walks, causal blocks skipped, with the running m, l and O of one row]"
                    "(img/tile_walk.gif)\n", encoding="utf-8")
    nb_stage = stage_dir / "notebooks"
    (nb_stage / "labs").mkdir(parents=True)
    for readme in ("README.md", "README.zh.md"):
        if (NB_DIR / readme).exists():
            text = (NB_DIR / readme).read_text(encoding="utf-8").replace("](../docs/", "](../")
            (nb_stage / readme).write_text(text, encoding="utf-8")
    for readme in ("README.md", "README.zh.md"):
        if (NB_DIR / "labs" / readme).exists():
            shutil.copy2(NB_DIR / "labs" / readme, nb_stage / "labs" / readme)
    wanted = set(names) if execute == "all" else set() if execute in ("none", "missing") else \
        {n for n in names for key in execute.split(",") if n.startswith(key.strip())}
    report = {}
    for name in names:
        nb = nbformat.read(str(NB_DIR / name), as_version=4)
        cached = EXECUTED / name
        if execute != "all" and cached.exists():
            done = nbformat.read(str(cached), as_version=4)
            if _code(done) == _code(nb):
                for old, new in zip(done.cells, nb.cells):   # the current text, the recorded outputs
                    old.source, old.metadata = new.source, new.metadata if old.cell_type != "code" else old.metadata
                nbformat.write(done, str(nb_stage / name))
                report[name] = "executed copy"
                continue
        if name in wanted or execute == "missing":
            done, seconds = execute_notebook(NB_DIR / name)
            EXECUTED.mkdir(parents=True, exist_ok=True)
            nbformat.write(done, str(cached))
            nbformat.write(done, str(nb_stage / name))
            report[name] = f"executed now ({seconds:.0f} s)"
        else:
            nbformat.write(nb, str(nb_stage / name))
            report[name] = "no outputs"
    assets = stage_dir / "assets" / "mathjax"
    try:
        import jupyter_server_mathjax

        shutil.copytree(pathlib.Path(jupyter_server_mathjax.__file__).parent / "static", assets)
        # the package ships only the STIX-Web fonts: tell MathJax to use them (mkdocs.yml loads local/offline)
        (assets / "config" / "local").mkdir(parents=True, exist_ok=True)
        (assets / "config" / "local" / "offline.js").write_text(
            'MathJax.Hub.Config({"HTML-CSS": {availableFonts: ["STIX-Web"], preferredFont: "STIX-Web", '
            'webFont: "STIX-Web", imageFont: null, '
            # MathJax's font probe, url(about:blank), is refused by Chromium with a console error
            'styles: {"@font-face": {"font-family": "MathJax_Blank", src: "local(\'MathJax_Blank\')"}}}});\n'
            'MathJax.Ajax.loadComplete("[MathJax]/config/local/offline.js");\n')
    except ImportError:   # no MathJax available offline: formulas show as TeX source, nothing is fetched
        assets.mkdir(parents=True)
        (assets / "MathJax.js").write_text("/* jupyter-server-mathjax is not installed: math is shown as TeX */\n")
        (assets / "config" / "local").mkdir(parents=True)
        (assets / "config" / "local" / "offline.js").write_text("/* no MathJax */\n")
    return report


DOC_ORDER = ["algorithm.md", "backend_numpy.md", "backend_torch_split.md", "backend_triton.md", "backend_cuda.md",
             "performance.md", "faq.md", "lab_guide.md"]


def site_config(stage_dir: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """mkdocs.yml plus a navigation in learning order (pages it does not name are listed after, sorted)."""
    import yaml

    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def ordered(folder: str, first: list[str]) -> list[str]:
        there = sorted(p.name for p in (stage_dir / folder).glob("*.md"))
        names = [n for n in first if n in there] + [n for n in there if n not in first and n != "README.md"]
        return [f"{folder}{n}" for n in names]

    notebooks = sorted(p.name for p in (stage_dir / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    nav = [{"Home": "README.md"},
           {"Notebooks": ["notebooks/README.md"] + [f"notebooks/{n}" for n in notebooks] + ["notebooks/labs/README.md"]},
           {"Docs": ordered("", DOC_ORDER)}]
    if (stage_dir / "zh").is_dir():
        zh = ["zh/README.md"] if (stage_dir / "zh" / "README.md").exists() else []
        zh += [p for p in ("notebooks/README.zh.md", "notebooks/labs/README.zh.md") if (stage_dir / p).exists()]
        nav.append({"中文": zh + ordered("zh/", ["readme.md"] + DOC_ORDER)})
    results = sorted(str(p.relative_to(stage_dir)) for p in (stage_dir / "results").rglob("*.md"))
    if results:
        nav.append({"Recorded results": results})
    cfg.update(nav=nav, docs_dir=str(stage_dir), site_dir=str(out))
    path = stage_dir.parent / f"mkdocs.{stage_dir.name}.yml"
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "site", help="site folder (default build/site)")
    ap.add_argument("--stage", type=pathlib.Path, default=STAGE,
                    help="where docs/ and notebooks/ are staged for mkdocs (default build/site_src); builds that run "
                         "at the same time need one each")
    ap.add_argument("--execute", default="missing",
                    help="which notebooks to execute: 'missing' (default: those with no up-to-date executed copy), "
                         "'all', 'none', or a comma list of prefixes such as '02,03'")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"missing|all|none|\d\d(,\d\d)*", args.execute):
        ap.error(f"--execute: expected missing, all, none or prefixes like 02,03; got {args.execute!r}")
    t0 = time.perf_counter()
    report = stage(args.execute, args.stage.resolve())
    for name, how in report.items():
        print(f"{name}: {how}")
    out = args.out.resolve()
    cmd = [sys.executable, "-m", "mkdocs", "build", "--clean", "-q", "-f", str(site_config(args.stage.resolve(), out))]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    print(f"site written to {out} in {time.perf_counter() - t0:.0f} s; view it with: python -m http.server -d {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
