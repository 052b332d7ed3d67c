"""The contract for bad index / offset / label contents (fusedops/core/device_errors.h), as one
test helper: on the CPU the call raises ``ValueError`` before any work; on CUDA it runs, gives a
defined result and leaves a report that ``fusedops.check_errors()`` raises (once), and inside
``fusedops.debug_checks()`` it raises the CPU's message at the call."""

from __future__ import annotations

import re

import fusedops
import pytest


def expect_rejected(device: str, call, message: str, report: str):
    """Run ``call()`` under the contract above. ``message`` (the CPU / debug-checks error) and
    ``report`` (the CUDA kernel's report) are plain text, matched literally. Returns the CUDA
    call's result (None on the CPU), for the caller to check that it is the documented one."""
    if device == "cpu":
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
        with fusedops.debug_checks(), pytest.raises(ValueError, match=re.escape(message)):
            call()
        return None
    fusedops.check_errors()  # nothing left over from earlier tests
    result = call()
    with pytest.raises(ValueError, match=re.escape(report)):
        fusedops.check_errors()
    fusedops.check_errors()  # the report was cleared
    with fusedops.debug_checks(), pytest.raises(ValueError, match=re.escape(message)):
        call()
    fusedops.check_errors()
    return result
