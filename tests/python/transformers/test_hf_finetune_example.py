"""examples/hf_finetune.py runs (a few small steps) and its two models train alike."""

from __future__ import annotations

import sys
from pathlib import Path

from hf_models import transformers  # noqa: F401  (skips without transformers)

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import hf_finetune  # noqa: E402


def test_example_runs(tmp_path):
    out = tmp_path / "summary.json"
    summary = hf_finetune.main(["--steps", "4", "--hidden", "64", "--head-dim", "16", "--heads", "2",
                                "--experts", "4", "--batch", "2", "--seq-len", "64", "--log-every", "2",
                                "--json", str(out)])
    assert out.exists()
    assert summary["max_rel_loss_diff"] < 1e-5
    assert summary["losses"]["fused"][-1] < summary["losses"]["fused"][0]
    assert set(summary["fwd_bwd_tokens_per_s"]) == set(summary["peak_fwd_bwd_memory_bytes"]) == {"fused", "torch"}
