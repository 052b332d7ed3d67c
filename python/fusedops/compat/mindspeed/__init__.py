"""MindSpeed Ops' call forms (``mindspeed_ops.api...``, ``torch.ops.mindspeed_ops.*``) on
fusedops; ``fusedops.compat.install("mindspeed_ops")`` makes ``import mindspeed_ops`` resolve
here. Importing this package registers the ``torch.ops.mindspeed_ops`` aliases (see
:mod:`fusedops.compat.mindspeed.ops`).

MindSpeed Ops is not published on PyPI or GitHub; the forms mirrored here come from its public
documentation and from the public code of its callers (MindSpeed, MindSpeed-LLM, MindSpeed-MM).
docs/compat.md marks, per name, which signatures were seen and which follow FLA / TE / torch_npu
conventions.
"""

from . import api, ops, utils  # noqa: F401

__all__ = ["api", "ops", "utils"]
