"""Hardware specs: what a chip computes and moves per second, with sources; the presets.

``wb.hardware`` is this package: ``wb.hardware.H100``, ``wb.hardware.PRESETS``.
"""

from workbench.core.hardware.collectives import (
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    collective_time,
    permute_time,
    reduce_scatter_time,
)
from workbench.core.hardware.levels import KINDS, TOPOLOGIES, HardwareError, Link
from workbench.core.hardware.names import find_preset, preset_names, preset_table, resolve
from workbench.core.hardware.placement import Placement, placements
from workbench.core.hardware.presets import (
    A100,
    CPU,
    H100,
    H200,
    PRESETS,
    SHORT_NAMES,
    TPU_V4,
    TPU_V5E,
    TPU_V5P,
)
from workbench.core.hardware.rates import FALLBACKS, dtype_name
from workbench.core.hardware.spec import XLA_COMBINE_BYTES, XLA_CPU_COMBINE_BYTES, Hardware

__all__ = [
    "A100",
    "CPU",
    "FALLBACKS",
    "H100",
    "H200",
    "KINDS",
    "PRESETS",
    "SHORT_NAMES",
    "TOPOLOGIES",
    "TPU_V4",
    "TPU_V5E",
    "TPU_V5P",
    "XLA_COMBINE_BYTES",
    "XLA_CPU_COMBINE_BYTES",
    "Hardware",
    "HardwareError",
    "Link",
    "Placement",
    "all_gather_time",
    "all_reduce_time",
    "all_to_all_time",
    "collective_time",
    "dtype_name",
    "find_preset",
    "permute_time",
    "placements",
    "preset_names",
    "preset_table",
    "reduce_scatter_time",
    "resolve",
]
