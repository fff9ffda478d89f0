"""Every student-facing English page has a Chinese twin with the same outline.

Pairs checked:

* ``README.md``                 -> ``docs/zh/readme.md``
* ``docs/X.md`` (every page)    -> ``docs/zh/X.md``
* ``notebooks/README.md``       -> ``notebooks/README.zh.md``
* ``notebooks/labs/README.md``  -> ``notebooks/labs/README.zh.md``

"Same outline" means: the twin exists and has the same number of Markdown headings at each level
(1 to 6). Headings are found by a CommonMark parser (markdown-it-py), so ``#`` lines inside fenced
code blocks are not headings and setext headings are counted. When an English page gains or loses
a section, this test fails until its twin is updated, and the message says which page and level.

The twin also carries the same generated blocks (``<!-- BEGIN GENERATED: name -->`` ...), so that
``python tools/docs_tables.py`` fills the English page and its twin from the same result files, and
shows the same figures: the image files both pages reference (Markdown ``![..](path)`` or HTML
``<img src="path">``, resolved against each page's folder) are the same set.
"""
import os
import re
from collections import Counter
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent


def _pairs():
    pairs = [("README.md", "docs/zh/readme.md")]
    pairs += [(f"docs/{p.name}", f"docs/zh/{p.name}") for p in sorted((ROOT / "docs").glob("*.md"))]
    pairs += [
        ("notebooks/README.md", "notebooks/README.zh.md"),
        ("notebooks/labs/README.md", "notebooks/labs/README.zh.md"),
    ]
    return pairs


_PARSER = MarkdownIt("commonmark")
_GENERATED = re.compile(r"<!-- BEGIN GENERATED: ([\w.-]+) -->")
_HTML_IMG = re.compile(r"""<img\b[^>]*\bsrc\s*=\s*["']([^"']+)["']""", re.I)


def heading_counts(text: str) -> Counter:
    """Counter {level: number of headings} of a Markdown text (level 1 for ``#``/``===``, ...)."""
    return Counter(int(tok.tag[1]) for tok in _PARSER.parse(text) if tok.type == "heading_open")


def test_heading_counts_ignore_code_fences():
    text = "# Title\n\n```bash\n# a comment, not a heading\n```\n\n## A\n\nSub\n---\n\n~~~\n## not one\n~~~\n"
    assert heading_counts(text) == Counter({1: 1, 2: 2})


@pytest.mark.parametrize("english, chinese", _pairs(), ids=[e for e, _ in _pairs()])
def test_chinese_twin_has_same_headings(english, chinese):
    en_path, zh_path = ROOT / english, ROOT / chinese
    assert zh_path.is_file(), f"{english} has no Chinese twin: expected {chinese}"
    en = heading_counts(en_path.read_text(encoding="utf-8"))
    zh = heading_counts(zh_path.read_text(encoding="utf-8"))
    diff = {
        f"h{level}": f"{english} has {en[level]}, {chinese} has {zh[level]}"
        for level in range(1, 7)
        if en[level] != zh[level]
    }
    assert not diff, f"headings per level differ between {english} and its twin {chinese}: {diff}"


@pytest.mark.parametrize("english, chinese", _pairs(), ids=[e for e, _ in _pairs()])
def test_chinese_twin_has_same_generated_blocks(english, chinese):
    en_path, zh_path = ROOT / english, ROOT / chinese
    if not zh_path.is_file():
        pytest.skip(f"{chinese} is missing (reported by test_chinese_twin_has_same_headings)")
    en = sorted(_GENERATED.findall(en_path.read_text(encoding="utf-8")))
    zh = sorted(_GENERATED.findall(zh_path.read_text(encoding="utf-8")))
    assert en == zh, f"generated blocks differ: {english} has {en}, its twin {chinese} has {zh}"


def image_files(text: str, page: Path) -> set:
    """Image files a page shows, as paths relative to the repository root (URLs kept as they are)."""
    srcs = [c.attrs["src"] for tok in _PARSER.parse(text) if tok.children for c in tok.children if c.type == "image"]
    srcs += _HTML_IMG.findall(text)
    out = set()
    for src in srcs:
        if re.match(r"^[a-z]+:", src):
            out.add(src)
        else:
            out.add(os.path.relpath(os.path.normpath(page.parent / src.split("#")[0]), ROOT).replace(os.sep, "/"))
    return out


def test_image_files_resolve_against_the_page():
    en = "![the tile walk](img/walk.gif)\n\n```\n![not an image](x.png)\n```\n"
    zh = '块的遍历：\n\n<img src="../img/walk.gif" alt="块的遍历">\n'
    assert image_files(en, ROOT / "docs" / "a.md") == {"docs/img/walk.gif"}
    assert image_files(zh, ROOT / "docs" / "zh" / "a.md") == {"docs/img/walk.gif"}


@pytest.mark.parametrize("english, chinese", _pairs(), ids=[e for e, _ in _pairs()])
def test_chinese_twin_shows_same_figures(english, chinese):
    en_path, zh_path = ROOT / english, ROOT / chinese
    if not zh_path.is_file():
        pytest.skip(f"{chinese} is missing (reported by test_chinese_twin_has_same_headings)")
    en = image_files(en_path.read_text(encoding="utf-8"), en_path)
    zh = image_files(zh_path.read_text(encoding="utf-8"), zh_path)
    assert en == zh, (f"figures differ: only in {english}: {sorted(en - zh)}; "
                      f"only in {chinese}: {sorted(zh - en)}")
