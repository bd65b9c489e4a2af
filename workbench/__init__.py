"""workbench: plan, see and run the partitioning of JAX programs across accelerator meshes.

import workbench as wb
program = wb.capture(train_step, params, opt_state, batch)
s = wb.Session(program, wb.Mesh({"batch": 2, "model": 4}))
s.apply(wb.BP("batch")); s.apply(wb.MP("model"))
wb.Workbench(train_step, params, opt_state, batch, mesh=mesh)   # the notebook widget
"""

from workbench.core import hardware
from workbench.core.errors import (
    DeviceError,
    FileFormatError,
    InputError,
    LimitError,
    WorkbenchError,
)
from workbench.core.io.imports import Imported
from workbench.core.ir.capture import capture, tag
from workbench.core.ir.program import Program
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.sharding import Sharding
from workbench.core.partition import partition
from workbench.core.propagate.tactics import Atomic, Replicate, Tactic, Tile
from workbench.core.search.tree import Auto
from workbench.core.session import Session
from workbench.core.strategies import NAMED
from workbench.core.whatif import sweep

# the named strategies, Role and Place, each registered where it is defined (core/strategies/)
globals().update(NAMED)

__all__ = [
    *sorted(NAMED),
    "Atomic",
    "Auto",
    "DeviceError",
    "FileFormatError",
    "Imported",
    "InputError",
    "LimitError",
    "Mesh",
    "Program",
    "Replicate",
    "Session",
    "Sharding",
    "Tactic",
    "Tile",
    "Workbench",
    "WorkbenchError",
    "capture",
    "hardware",
    "partition",
    "sweep",
    "tag",
]
del NAMED


def __getattr__(name):
    # the notebook widget pulls in ipywidgets, plotly and graphviz: imported when first used
    if name == "Workbench":
        from workbench.widgets import Workbench

        return Workbench
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
