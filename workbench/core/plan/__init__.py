"""The execution plan: per-op layouts, fetches and the collectives they need (see README.md)."""

from workbench.core.plan.plan import Fetch, OpPlan, Plan, Planner, build_plan, collective_why
from workbench.core.plan.rows import COLUMNS, collective_rows

__all__ = [
    "COLUMNS",
    "Fetch",
    "OpPlan",
    "Plan",
    "Planner",
    "build_plan",
    "collective_rows",
    "collective_why",
]
