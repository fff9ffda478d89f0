"""The variants benchmark's plumbing on the CPU (the recorded run is on a GPU: .ci/gpu_run.sh variants)."""
import json

import numpy as np
import pytest

from flash_attention_py.common import attention_flops
from flash_attention_py.masks import flex_mask_mod, visible, visible_pairs

pytest.importorskip("torch")


@pytest.mark.parametrize("Nq,Nk,window", [(7, 11, (-1, 0)), (11, 7, (2, 3)), (10, 10, (-1, -1)), (5, 9, (0, 0)),
                                          (16, 16, (3, -1)), (9, 4, (-1, 0))])
def test_visible_pairs_and_flex_mask_mod_follow_the_rule(Nq, Nk, window):
    import torch

    seen = visible(np.arange(Nq), np.arange(Nk), Nq, Nk, window)
    assert visible_pairs(Nq, Nk, window) == seen.sum()
    mod = flex_mask_mod(Nq, Nk, window)
    grid = mod(0, 0, torch.arange(Nq)[:, None], torch.arange(Nk)[None, :])
    assert np.array_equal(grid.numpy(), seen)


def test_attention_flops_counts_visible_scores():
    assert attention_flops(2, 3, 8, 8, 4, window_size=(-1, -1)) == attention_flops(2, 3, 8, 8, 4)
    assert attention_flops(1, 1, 8, 8, 4, causal=True, window_size=(-1, -1)) == 0.5 * 4 * 64 * 4
    assert attention_flops(1, 1, 8, 8, 4, window_size=(1, 1), mode="bwd") == 2.5 * 4 * 4 * (8 * 3 - 2)


def test_variants_quick_run_writes_its_files(tmp_path):
    from benchmarks import variants

    rc = variants.main(["--quick", "--device", "cpu", "--backends", "torch-split", "--sections", "window,gqa,dropout",
                        "--no-progress", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "variants.json").read_text())
    ok = {(r["section"], r["backend"]) for r in doc["rows"] if r["status"] == "ok"}
    assert {("window", "torch-split"), ("gqa", "torch-split"), ("dropout", "torch-split")} <= ok
    # the window case has an alternative here (FlexAttention, eager on the CPU), and the outputs agree
    win = [r for r in doc["rows"] if r["section"] == "window" and r["backend"] == "torch-split" and r["mode"] == "fwd"]
    assert win[0]["max_abs_vs_alternative"] is not None and win[0]["max_abs_vs_alternative"] < 1e-2
    assert "## Sliding window" in (tmp_path / "variants.md").read_text()
    assert (tmp_path / "variants.png").stat().st_size > 0


@pytest.mark.parametrize("order", ["run", "case"])
def test_variants_rounds_time_each_backend_in_turn(tmp_path, monkeypatch, order):
    """--rounds 3: every backend of a case is timed once a round, in turn (ours and the alternatives
    interleaved), and its row keeps the median of its rounds, with each round's time. --round-order run (the
    default): each round is a pass over every case, so a row's rounds are a whole pass apart; case: back to back."""
    from benchmarks import measure, variants

    order_seen, clock = [], iter(range(1, 1000))
    monkeypatch.setattr(measure, "time_call", lambda fn, **kw: (order_seen.append(fn) or float(next(clock)),))
    rc = variants.main(["--quick", "--device", "cpu", "--backends", "torch-split", "--sections", "gqa", "--rounds", "3",
                        "--round-order", order, "--no-progress", "--out", str(tmp_path)])
    assert rc == 0
    doc = json.loads((tmp_path / "variants.json").read_text())
    ok = [r for r in doc["rows"] if r["status"] == "ok"]
    assert ok and all(len(r["round_ms"]) == 3 and r["time_ms"] == sorted(r["round_ms"])[1] for r in ok)
    assert doc["meta"]["round_order"] == order
    first = [r for r in ok if (r["mode"], r["causal"], r["Hk"], r["N"]) == (ok[0]["mode"], ok[0]["causal"],
                                                                           ok[0]["Hk"], ok[0]["N"])]
    gap = len(ok) if order == "run" else len(first)  # timings between two rounds of one row
    assert all(r["round_ms"][2] - r["round_ms"][1] == r["round_ms"][1] - r["round_ms"][0] == gap for r in first)
    md = (tmp_path / "variants.md").read_text()
    assert "the median of 3 rounds" in md and (("each round a pass over the whole run" in md) == (order == "run"))
    with pytest.raises(SystemExit, match="--rounds must be at least 1, got 0"):
        variants.main(["--quick", "--rounds", "0", "--out", str(tmp_path)])


def test_variants_rejects_unknown_names(tmp_path):
    from benchmarks import variants

    with pytest.raises(SystemExit, match="--sections"):
        variants.main(["--quick", "--sections", "windows", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--backends"):
        variants.main(["--quick", "--backends", "nope", "--out", str(tmp_path)])
