"""Pure functions from core objects to pictures: the program graph and the device grid.

Nothing here holds state or imports widgets; see README.md.
"""

from workbench.viz.graph import program_graph, to_svg
from workbench.viz.grid import device_blocks, device_grid, device_grid_text
from workbench.viz.style import PALETTE, REPLICATED, axis_colors, partial_note

__all__ = [
    "PALETTE",
    "REPLICATED",
    "axis_colors",
    "device_blocks",
    "device_grid",
    "device_grid_text",
    "partial_note",
    "program_graph",
    "to_svg",
]
