"""Pure functions from core objects to pictures: the program graph, device grids, charts
of the simulator's estimates, the collective plan, what the workbench sees in a program,
where a mesh's devices lie on a hardware's levels (and the reductions synthesised there),
and the course's pictures (a ring all-reduce, the roofline, an overlap timeline).

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
from workbench.viz.pipeline import pipeline_memory, pipeline_timeline
from workbench.viz.placement import placement_picture, placement_rows
from workbench.viz.replay import (
    event_elements,
    event_frames,
    filmstrip,
    find_value,
    replay_frames,
    value_elements,
)
from workbench.viz.ring import ring_allreduce, ring_frames
from workbench.viz.roofline import attainable, ridge, roofline
from workbench.viz.style import PALETTE, REPLICATED, axis_colors, partial_note
from workbench.viz.synthesis import synthesis_rows, synthesis_timeline
from workbench.viz.table import collective_rows, collective_table
from workbench.viz.timeline import overlap_timeline, timeline_segments

__all__ = [
    "PALETTE",
    "REPLICATED",
    "Picture",
    "anatomy_html",
    "anatomy_rows",
    "attainable",
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
    "overlap_timeline",
    "partial_note",
    "pipeline_memory",
    "pipeline_timeline",
    "placement_picture",
    "placement_rows",
    "program_graph",
    "replay_frames",
    "ridge",
    "ring_allreduce",
    "ring_frames",
    "roofline",
    "schedule_estimates",
    "schedule_labels",
    "synthesis_rows",
    "synthesis_timeline",
    "time_breakdown",
    "timeline_segments",
    "to_svg",
    "value_elements",
]
