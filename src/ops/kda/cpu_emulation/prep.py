"""Copies CUDA sources into an emulation tree (CPU C++), rewritten by the GDN emulation's emulate().
Usage: prep.py DST SRC_FILE...   (each file lands in DST/<its directory relative to the root>)."""
import os
import sys

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
sys.path.insert(0, os.path.join(root, "src/ops/gated_delta_rule/cpu_emulation"))
from prep import emulate  # noqa: E402  (the one rewrite, shared with the GDN emulation)

dst = sys.argv[1]
for path in sys.argv[2:]:
    rel = os.path.relpath(os.path.abspath(path), root)
    s = emulate(open(path).read())
    out = os.path.join(dst, rel[:-3] + ".cpp" if rel.endswith(".cu") else rel)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    open(out, "w").write(s)
