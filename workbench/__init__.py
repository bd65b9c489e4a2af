"""workbench: plan, see and run the partitioning of JAX programs across accelerator meshes."""

from workbench.core.capture import capture, tag
from workbench.core.errors import WorkbenchError
from workbench.core.mesh import Mesh
from workbench.core.program import Program
from workbench.core.session import Session
from workbench.core.sharding import Sharding
from workbench.core.tactics import Atomic, Replicate, Tactic, Tile

__all__ = [
    "Atomic",
    "Mesh",
    "Program",
    "Replicate",
    "Session",
    "Sharding",
    "Tactic",
    "Tile",
    "WorkbenchError",
    "capture",
    "tag",
]
