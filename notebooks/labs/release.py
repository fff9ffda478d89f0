#!/usr/bin/env python
"""Write a student release of the repository: a copy a course can hand out, without the answers.

    python notebooks/labs/release.py --out DIR [--force]

The copy holds the files of ``git ls-files`` (tracked, plus new files that git does not ignore), except:

* ``notebooks/labs/solutions/`` and ``notebooks/labs/instructor/`` (the hidden-case seed) are left out;
* ``flash_attention_cuda/kernels/tiled.cu`` (lab 3's solution is the repository's own kernel) is replaced
  by lab 3's template, ``notebooks/labs/lab3_cuda_tiled.cu``; the ``cuda-tiled`` backend and the nvcc
  compile test of tiled.cu then skip, saying so, and everything else runs;
* in every Markdown file, the blocks between ``<!-- answer -->`` and ``<!-- /answer -->`` (the lab guide's
  answers) are replaced by a one-line note;
* in every notebook, code cells tagged ``solution`` and Markdown cells tagged ``answer`` are removed (the
  notebooks are written to run without them).

The lab templates stay as they are, and the graders work on them (``grade.py LAB`` says which TODO is
open). Without the instructor's seed a student's grader draws the hidden cases from a fresh random seed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

EXCLUDED_DIRS = ("notebooks/labs/solutions/", "notebooks/labs/instructor/")
TILED = "flash_attention_cuda/kernels/tiled.cu"
LAB3_TEMPLATE = "notebooks/labs/lab3_cuda_tiled.cu"
# the markers stand on lines of their own (a marker quoted inside a sentence is left alone)
ANSWER_RE = re.compile(r"^[ \t]*<!--\s*answer\s*-->[ \t]*$.*?^[ \t]*<!--\s*/answer\s*-->[ \t]*$", re.S | re.M)
ANSWER_NOTE = {"en": "*(Answer left out of the student release.)*", "zh": "*（学生版中不含答案。）*"}
REMOVED_TAGS = {"code": "solution", "markdown": "answer"}


def repository_files(root=ROOT) -> list:
    """Relative paths of the files git knows (tracked) or would add (untracked, not ignored), that exist."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"release.py: `git ls-files` failed in {root} ({exc}); the release needs a git checkout")
    names = sorted({p for p in out.decode().split("\0") if p})
    return [p for p in names if os.path.isfile(os.path.join(root, p))]


def strip_answers(text: str, lang: str = "en") -> tuple:
    """(text without the <!-- answer --> ... <!-- /answer --> blocks, how many were removed)."""
    return ANSWER_RE.subn(ANSWER_NOTE[lang], text)


def strip_notebook(text: str) -> tuple:
    """(notebook JSON without the cells tagged 'solution' (code) / 'answer' (markdown), how many removed)."""
    nb = json.loads(text)
    keep = []
    for cell in nb.get("cells", []):
        tags = cell.get("metadata", {}).get("tags", []) or []
        if REMOVED_TAGS.get(cell.get("cell_type")) in tags:
            continue
        keep.append(cell)
    removed = len(nb.get("cells", [])) - len(keep)
    nb["cells"] = keep
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n", removed


def make_release(out: str, *, root: str = ROOT, force: bool = False, quiet: bool = False) -> dict:
    """Write the student release to ``out``; returns counts of what was left out or changed."""
    out = os.path.abspath(out)
    root = os.path.abspath(root)
    if out == root or out.startswith(root + os.sep):
        raise SystemExit(f"release.py: --out must be outside the repository, got {out}")
    if os.path.exists(out) and os.listdir(out):
        if not force:
            raise SystemExit(f"release.py: {out} exists and is not empty (use --force to replace it)")
        shutil.rmtree(out)
    stats = dict(files=0, left_out=0, answers=0, cells=0)
    for rel in repository_files(root):
        if rel.startswith(EXCLUDED_DIRS):
            stats["left_out"] += 1
            continue
        src = os.path.join(root, LAB3_TEMPLATE if rel == TILED else rel)
        dst = os.path.join(out, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if rel.endswith(".md"):
            with open(src, encoding="utf-8") as f:
                text, n = strip_answers(f.read(), "zh" if "/zh/" in rel or rel.endswith(".zh.md") else "en")
            stats["answers"] += n
            with open(dst, "w", encoding="utf-8") as f:
                f.write(text)
        elif rel.endswith(".ipynb"):
            with open(src, encoding="utf-8") as f:
                text, n = strip_notebook(f.read())
            stats["cells"] += n
            with open(dst, "w", encoding="utf-8") as f:
                f.write(text)
        else:
            shutil.copyfile(src, dst)
        shutil.copymode(os.path.join(root, rel), dst)
        stats["files"] += 1
    if not quiet:
        print(f"student release written to {out}: {stats['files']} files; left out {stats['left_out']} "
              f"(solutions/, instructor/); {stats['answers']} lab-guide answers and {stats['cells']} notebook "
              f"solution/answer cells removed; {TILED} is lab 3's template")
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder to write the release to (outside the repository)")
    ap.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = ap.parse_args(argv)
    make_release(args.out, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
