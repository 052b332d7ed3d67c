"""Copies CUDA sources into an emulation tree (CPU C++): dynamic shared memory from a host buffer,
<<<...>>> launches through emu_launch, the backends registered as CPU ones, the tf32 PTX of
la_sm80.cuh as calls of emu_core.h (the 16-bit and wgmma layers are replaced whole by emu_mma.h
and emu_wgmma.h). Usage: prep.py DST SRC_FILE...   (each file lands in DST/<its path relative to
the repository root>, .cu renamed .cpp)."""
import os
import re
import sys


def emulate_ptx(s):
    """The PTX of la_sm80.cuh (cvt.rna.tf32, mma.sync m16n8k8 tf32) as calls of emu_core.h."""
    s = re.sub(r'asm\("cvt\.rna\.tf32\.f32 %0, %1;" : "=r"\(r\) : "f"\(x\)\);', "r = emu_cvt_rna_tf32(x);", s)
    s = re.sub(r'asm volatile\(\s*"mma\.sync\.aligned\.m16n8k8.*?\);', "emu_mma_tf32(c, a, b0, b1);", s,
               flags=re.S)
    if "asm" in re.sub(r"//.*", "", s):
        raise SystemExit("prep.py: PTX left that the emulation does not cover")
    return s


def emulate(s):
    """A CUDA source rewritten for the emulation."""
    s = s.replace("extern __shared__ float smem[];",
                  "float* smem = reinterpret_cast<float*>(g_emu_smem.data());")
    s = s.replace("extern __shared__ __align__(1024) uint8_t smem_raw[];",
                  "uint8_t* smem_raw = g_emu_smem.data();")
    s = s.replace("extern __shared__ double dsmem[];",
                  "double* dsmem = reinterpret_cast<double*>(g_emu_smem.data());")
    s = re.sub(r"(\w+(?:<[^<>]*>)?)<<<(.+?)>>>\(", lambda m: f"emu_launch({m.group(1)}, {m.group(2)}, ", s,
               flags=re.S)
    s = s.replace("DeviceKind::kCUDA, 80", "DeviceKind::kCPU, 0")
    s = s.replace("DeviceKind::kCUDA, 90, 90", "DeviceKind::kCPU, 0, INT_MAX")
    return emulate_ptx(s)


if __name__ == "__main__":
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../.."))
    dst = sys.argv[1]
    for path in sys.argv[2:]:
        rel = os.path.relpath(os.path.abspath(path), root)
        out = os.path.join(dst, rel[:-3] + ".cpp" if rel.endswith(".cu") else rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(path) as f:
            s = emulate(f.read())
        with open(out, "w") as f:
            f.write(s)
