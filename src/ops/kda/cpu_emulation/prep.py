"""Copies CUDA sources into an emulation tree (CPU C++): dynamic shared memory from a host
buffer, <<<...>>> launches through emu_launch, the backend registered as a CPU one.
Usage: prep.py DST SRC_FILE...   (each file lands in DST/<its directory relative to the root>)."""
import os
import re
import sys

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
sys.path.insert(0, os.path.join(root, "src/ops/gated_delta_rule/cpu_emulation"))
from prep import emulate_ptx  # noqa: E402  (the one PTX rewrite, shared with the GDN emulation)

dst = sys.argv[1]
for path in sys.argv[2:]:
    rel = os.path.relpath(os.path.abspath(path), root)
    s = open(path).read()
    s = s.replace("extern __shared__ float smem[];",
                  "float* smem = reinterpret_cast<float*>(g_emu_smem.data());")
    s = s.replace("extern __shared__ double dsmem[];",
                  "double* dsmem = reinterpret_cast<double*>(g_emu_smem.data());")
    s = re.sub(r"(\w+)<<<(.+?)>>>\(", lambda m: f"emu_launch({m.group(1)}, {m.group(2)}, ", s,
               flags=re.S)
    s = s.replace("DeviceKind::kCUDA, 80", "DeviceKind::kCPU, 0")
    s = emulate_ptx(s)
    out = os.path.join(dst, rel[:-3] + ".cpp" if rel.endswith(".cu") else rel)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    open(out, "w").write(s)
