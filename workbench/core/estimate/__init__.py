"""The simulator: compute, communication, memory and overlap of one step per device.

`estimate(program, mesh, state, plan, hardware, overlap=)` returns an `Estimate`; see
README.md for what each module holds.
"""

from workbench.core.estimate.communication import CollectiveEstimate
from workbench.core.estimate.compute import OpEstimate
from workbench.core.estimate.experts import ExpertLayer, expert_loads, with_load
from workbench.core.estimate.memory import CATEGORIES, Memory, donations
from workbench.core.estimate.overlap import OVERLAPS, check_overlap, overlapped
from workbench.core.estimate.pipelined import PipelineEstimate, price_pipeline
from workbench.core.estimate.step import Estimate, estimate
from workbench.core.estimate.timeline import Timeline, simulate
from workbench.core.plan.schedule import SCHEDULES, Schedule, Work, schedule

__all__ = [
    "CATEGORIES",
    "OVERLAPS",
    "SCHEDULES",
    "CollectiveEstimate",
    "Estimate",
    "ExpertLayer",
    "Memory",
    "OpEstimate",
    "PipelineEstimate",
    "Schedule",
    "Timeline",
    "Work",
    "check_overlap",
    "donations",
    "estimate",
    "expert_loads",
    "overlapped",
    "price_pipeline",
    "schedule",
    "simulate",
    "with_load",
]
