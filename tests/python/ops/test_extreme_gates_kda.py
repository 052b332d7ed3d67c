"""KDA (chunk_kda) at extreme gates (one log-decay per key channel, g [B,T,HV,K]): per-step log-gates of -1e4, -88 and
-104 (fp32 exp underflows to 0) on some steps or all of them, and all-zero gates. Forward and
every gradient (dq, dk, dv, dg, dbeta, dh0) of every backend, in fp32 and bf16, stay within 10x
of the same backend's error at ordinary gates, both measured against the float64 per-token
recurrence (tests/common/extreme_gates.py). With an fp32 gate cumsum the CPU and reference
backends were 1e-3 off at -1e4 and 1e-5 off at -88.
"""

from __future__ import annotations

import pytest
import test_kda as fam
import torch

from tests.common import extreme_gates as xg

OP = "chunk_kda"
_errors = xg.make_runner(fam)


@pytest.mark.dtypes(torch.float32, torch.bfloat16)
@pytest.mark.parametrize("setting", xg.SETTINGS, ids=[s[0] for s in xg.SETTINGS])
def test_extreme_gates_stay_in_the_ordinary_error_class(backend_case, setting):
    name, value, fraction = setting
    xg.check(f"{backend_case.id} chunk_kda gates {name}", backend_case, _errors, value, fraction)
