"""Pure functions from core objects to pictures: the program graph, device grids, charts
of the simulator's estimates, the collective plan and what the workbench sees in a program.

Nothing here holds state or imports widgets; see README.md.
"""

from workbench.viz.anatomy import anatomy_html, anatomy_rows
from workbench.viz.blocks import default_expand
from workbench.viz.charts import (
    compare_strategies,
    estimates_over_schedule,
    memory_breakdown,
    schedule_estimates,
    schedule_labels,
    time_breakdown,
)
from workbench.viz.graph import Picture, graph_picture, program_graph, to_svg
from workbench.viz.grid import device_blocks, device_grid, device_grid_text
from workbench.viz.replay import (
    event_elements,
    event_frames,
    filmstrip,
    find_value,
    replay_frames,
    value_elements,
)
from workbench.viz.style import PALETTE, REPLICATED, axis_colors, partial_note
from workbench.viz.table import collective_rows, collective_table

__all__ = [
    "PALETTE",
    "REPLICATED",
    "Picture",
    "anatomy_html",
    "anatomy_rows",
    "axis_colors",
    "collective_rows",
    "collective_table",
    "compare_strategies",
    "default_expand",
    "device_blocks",
    "device_grid",
    "device_grid_text",
    "estimates_over_schedule",
    "event_elements",
    "event_frames",
    "filmstrip",
    "find_value",
    "graph_picture",
    "memory_breakdown",
    "partial_note",
    "program_graph",
    "replay_frames",
    "schedule_estimates",
    "schedule_labels",
    "time_breakdown",
    "to_svg",
    "value_elements",
]
