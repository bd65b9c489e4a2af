"""Per-device versions of primitives: each record says how it runs on local shards.

Most primitives run unchanged; those whose params carry global shapes, or whose indices are
global (iota, gather, scatter), give their own lowering in their record (``ops``).
"""

from __future__ import annotations

from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import Sharding
from workbench.core.ops import local_lowering


def bind_local(op, args: list, ins: list[Sharding], outs: list[Sharding], mesh: Mesh, plan) -> list:
    """Run ``op`` on local shards laid out as ``ins``, producing ``outs``, as its record says
    (``ops.local_lowering``)."""
    return local_lowering(op.primitive)(op, args, ins, outs, mesh)
