"""transformers' own import-time fallback picks fusedops' flash-linear-attention / causal-conv1d
call forms once ``fusedops.compat.install("fla")`` and ``install("causal_conv1d")`` ran before its
modeling files are imported (a fresh process): the linear-attention layers then compute exactly
what ``apply_fusedops`` with only the kernel-slot switches gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hf_models import transformers  # noqa: F401  (skips without transformers)

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import sys, torch
import fusedops.compat as compat
compat.install("fla"); compat.install("causal_conv1d")
sys.path.insert(0, {here!r}); sys.path.insert(0, {root!r})
from hf_models import build, fused, tokens
from transformers.models.qwen3_next import modeling_qwen3_next as M
for slot in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
             "causal_conv1d_fn", "causal_conv1d_update"):
    impl = [c.cell_contents for c in getattr(M, slot).__closure__
            if callable(c.cell_contents) and c.cell_contents.__module__.startswith("fusedops.compat")]
    assert impl, slot
model = build("qwen3_next")
ours = fused(model, norm=False, experts=False, loss=False)
ids = tokens(2, 24)
with torch.no_grad():
    a = model(input_ids=ids, use_cache=False).logits
    b = ours(input_ids=ids, use_cache=False).logits
assert torch.equal(a, b), (a - b).abs().max()
print("same")
"""


def test_transformers_fallback_picks_compat_forms():
    here = str(Path(__file__).resolve().parent)
    code = SCRIPT.format(here=here, root=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("same")
