"""What actually ran: the registry's dispatch trace (include/fusedops/core/trace.h) from Python."""

from __future__ import annotations

import contextlib
from typing import Iterator

from . import _C


class DispatchTrace:
    """The events of one ``dispatch_trace()`` block, filled when the block exits.

    ``events``: one dict per distinct (op, direction, backend, kernel, parent), in first-seen
    order, with its ``count``. ``kernel`` is ``""`` for a dispatch (the registry chose ``backend``
    for ``op``), else the kernel variant that backend named at its launch site; ``parent`` is the
    ``"op direction"`` of the dispatch it ran inside (a step of a composed op), ``""`` at top level.
    """

    def __init__(self) -> None:
        self.events: list[dict] = []

    def dispatches(self) -> list[dict]:
        return [e for e in self.events if not e["kernel"]]

    def kernels(self) -> list[dict]:
        return [e for e in self.events if e["kernel"]]

    def summary(self) -> str:
        """One line per event, steps indented under the composed op they ran in:
        ``op direction: backend [kernel] xcount``."""
        lines = []
        for e in self.events:
            where = f"{e['op']} {e['direction']}".strip() or "(outside any dispatch)"
            what = e["backend"] + (f" {e['kernel']}" if e["kernel"] else "")
            indent = "  " if e["parent"] else ""
            lines.append(f"{indent}{where}: {what.strip()} x{e['count']}")
        return "\n".join(lines)


@contextlib.contextmanager
def dispatch_trace() -> Iterator[DispatchTrace]:
    """Record which backend (and kernel variant) served every fusedops call in the block,
    sub-operators of composed ops included, on every thread (autograd's backward threads too).

    >>> with fusedops.dispatch_trace() as t:
    ...     fusedops.l2norm(x).sum().backward()
    >>> print(t.summary())

    CUDA work is recorded when it is launched: no synchronization is needed. Traces do not nest
    (an inner block ends the outer one's recording).
    """
    trace = DispatchTrace()
    _C.trace_start()
    try:
        yield trace
    finally:
        trace.events = list(_C.trace_stop())
