"""The docs' recorded figures come from the result files: generated tables are current, and the figures quoted
in prose match the files they come from (``python tools/docs_tables.py --check``)."""
import json
import os
import re
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import docs_tables  # noqa: E402


def test_generated_tables_and_quoted_figures_match_the_result_files():
    problems = docs_tables.run(ROOT, check=True)
    assert not problems, "\n".join(problems) + "\n(rebuild the tables with: python tools/docs_tables.py)"


def test_every_table_name_is_used_and_every_block_is_known():
    """Each generator has a block in some page, so none of them is dead code."""
    used = set()
    for path in docs_tables.pages(ROOT):
        with open(path, encoding="utf-8") as f:
            used |= {m.group(3) for m in docs_tables.MARKER.finditer(f.read())}
    assert used == set(docs_tables.TABLES), set(docs_tables.TABLES) ^ used


def _copy(tmp_path):
    """The pages and the result files (no images) in a scratch copy of the repository."""
    root = tmp_path / "repo"
    for path in docs_tables.pages(ROOT):
        rel = os.path.relpath(path, ROOT)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, root / rel)
    shutil.copytree(os.path.join(ROOT, "docs", "results"), root / "docs" / "results", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.png", "*.log", "cases.jsonl", "results.csv"))
    for log in ("gpu_tests/pytest_harness.log", "gpu_tests/pytest_all_files.log", "triton/gpu_pytest.log",
                "gpu_tests/h200-full-suite/pytest_harness.log", "gpu_tests/h200-full-suite/pytest_cuda.log",
                "gpu_tests/h200-full-suite/pytest_gpu_files.log", "gpu_tests/h200-full-suite/pytest_three_files.log"):
        shutil.copy(os.path.join(ROOT, "docs", "results", log), root / "docs" / "results" / log)
    return root


def _edit_json(path, change):
    with open(path) as f:
        doc = json.load(f)
    change(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def _ladder(doc):  # a table (README, performance.md, cuda README) and prose figures
    row = max(doc["rows"], key=lambda r: r["wgmma_tflops"])
    row["wgmma_tflops"] += 10.0


def _tail_bug(doc):  # prose only (faq.md)
    doc["tail_bug"]["max_abs"] *= 2


def _seed(doc):  # the seed-configuration table of performance.md
    for r in doc["results"]:
        if r["backend"] == "cuda-mma" and r["mode"] == "fwd" and not r["causal"]:
            r["time_ms"] *= 1.5


@pytest.mark.parametrize("rel, change, page", [
    ("cuda/cuda_ladder.json", _ladder, "README.md"),
    ("cpu/measurements.json", _tail_bug, "docs/faq.md"),
    ("benchmark/h100-seed/results.json", _seed, "docs/performance.md"),
])
def test_check_fails_when_one_figure_in_a_result_file_changes(tmp_path, capsys, rel, change, page):
    root = _copy(tmp_path)
    assert docs_tables.run(str(root), check=True) == []  # the copy starts clean
    _edit_json(root / "docs" / "results" / rel, change)
    assert docs_tables.main(["--check", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert page in out, out
    # rewriting brings the tables back in line; only the prose quoting the changed figure stays wrong
    docs_tables.main(["--root", str(root)])
    left = docs_tables.run(str(root), check=True)
    assert all("prose" in p for p in left), left


def test_unknown_block_and_unclosed_marker_are_reported(tmp_path):
    root = _copy(tmp_path)
    page = root / "docs" / "performance.md"
    page.write_text(page.read_text(encoding="utf-8") + "\n<!-- BEGIN GENERATED: no-such-table -->\n"
                    "<!-- END GENERATED: no-such-table -->\n<!-- BEGIN GENERATED: h100-seed -->\n", encoding="utf-8")
    problems = docs_tables.run(str(root), check=True)
    assert any("unknown generated block 'no-such-table'" in p for p in problems), problems
    assert any("without its matching END" in p for p in problems), problems


def test_chinese_pages_get_the_same_numbers():
    R = docs_tables.Results(ROOT)
    for name, fn in docs_tables.TABLES.items():
        en, zh = fn(R, "en"), fn(R, "zh")
        numbers = lambda t: sorted(re.findall(r"\d+(?:\.\d+)?", t))  # noqa: E731
        assert numbers(en) == numbers(zh), name


def test_host_time_target_reads_forward_and_backward_lines(monkeypatch):
    """The hopper-targets host-time row: every forward and causal-backward line of each run of the launch-overhead
    record, the CUDA rungs and Triton apart, each over SDPA's FA2 of the same mode in the same run ('met' only
    when none is slower; where some are, each line's median ratio over the runs beside it)."""
    runs = {"a/run1.txt": (20.0, 15.0, 40.0, 100.0, 150.0, 90.0), "a/run2.txt": (10.0, 9.0, 30.0, 100.0, 95.0, 120.0)}
    monkeypatch.setattr(docs_tables, "HOST_TIME_RECORDS", tuple(runs))

    class Fake:
        def text(self, rel):
            fa2, mma, tri, fa2_b, mma_b, tri_b = runs[rel]
            return (f"call  host us/call\nsdpa FLASH_ATTENTION (FA2)   {fa2}\nflash_attn_cuda kernel=mma   {mma}\n"
                    f"flash_attn_triton   {tri}\nsdpa FLASH_ATTENTION (FA2) backward (causal)   {fa2_b}\n"
                    f"flash_attn_cuda kernel=mma backward (causal)   {mma_b}\n"
                    f"flash_attn_triton backward (causal)   {tri_b}\n")

    label, measured, verdict = docs_tables._host_time_target(Fake(), "en")
    assert measured == ("forward: CUDA rungs 9–15 µs, Triton 30–40 (FA2 10–20); backward: CUDA rungs 95–150, "
                        "Triton 90–120 (FA2 100)")
    assert verdict == ("no: CUDA rungs forward 0.75–0.90× (met); CUDA rungs backward 0.95–1.50× (1 of 2 above; each "
                       "line's median over the runs 1.23×); Triton forward 2.00–3.00× (2 of 2 above; each line's "
                       "median over the runs 2.50×); Triton backward 0.90–1.20× (1 of 2 above; each line's median "
                       "over the runs 1.05×)")


