"""Copies the cuda_sm80 GDN sources into an emulation tree (CPU C++): dynamic shared memory
from a host buffer, <<<...>>> launches through emu_launch, the backend registered as a CPU one."""
import os
import re
import sys


def emulate_ptx(s):
    """The PTX of gdn_sm80.cuh (cvt.rna.tf32, mma.sync m16n8k8 tf32) as calls of emu_core.h."""
    s = re.sub(r'asm\("cvt\.rna\.tf32\.f32 %0, %1;" : "=r"\(r\) : "f"\(x\)\);', "r = emu_cvt_rna_tf32(x);", s)
    s = re.sub(r'asm volatile\(\s*"mma\.sync\.aligned\.m16n8k8.*?\);', "emu_mma_tf32(c, a, b0, b1);", s,
               flags=re.S)
    if "asm" in re.sub(r"//.*", "", s):
        raise SystemExit("prep.py: PTX left that the emulation does not cover")
    return s


def emulate(s):
    """A CUDA source rewritten for the emulation: dynamic shared memory from a host buffer,
    <<<...>>> launches through emu_launch, the backend registered as a CPU one, PTX as calls."""
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
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    for f in ["gdn_sm80.cuh", "gated_delta_rule_fwd_sm80.cu", "gated_delta_rule_bwd_sm80.cu",
              "gated_delta_rule_fwd_sm90.cu", "gated_delta_rule_bwd_sm90.cu", "gated_delta_rule_bwd_dqkwg_sm90.cu"]:
        s = emulate(open(os.path.join(src, f)).read())
        open(os.path.join(dst, f.replace(".cu", ".cpp") if f.endswith(".cu") else f), "w").write(s)
