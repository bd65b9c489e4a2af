"""The host CPU preset: placeholder figures for the virtual CPU devices of one process, to be
replaced by what ``calibrate()`` measures on the machine at hand."""

from workbench.core.hardware.levels import Link
from workbench.core.hardware.presets.citations import XLA_CPU_COMBINE
from workbench.core.hardware.spec import XLA_CPU_COMBINE_BYTES, Hardware

_PLACEHOLDER = "placeholder: a modest generic figure for a small CPU host; replace it with workbench.core.hardware.calibrate.calibrate()"

CPU = Hardware(
    name="CPU (placeholder)",
    flops={"float32": 5e10, "float64": 2.5e10},
    hbm_bandwidth=1e10,
    memory_bytes=8e9,
    links=(
        Link(
            "host",
            5e9,
            1e-5,
            group_size=1024,
            sources={
                "bandwidth": _PLACEHOLDER + " (virtual devices exchange data in host memory)",
                "latency": _PLACEHOLDER,
                "group_size": "all virtual CPU devices live in one process",
            },
        ),
    ),
    all_reduce_combine_bytes=XLA_CPU_COMBINE_BYTES,
    fuses_per_reader=True,
    sources={
        "flops.float32": _PLACEHOLDER,
        "flops.float64": _PLACEHOLDER,
        "hbm_bandwidth": _PLACEHOLDER,
        "memory_bytes": _PLACEHOLDER,
        "all_reduce_combine_bytes": XLA_CPU_COMBINE,
    },
    notes="Placeholder figures, not measured: run calibrate() to replace them.",
)
