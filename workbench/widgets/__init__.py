"""The notebook UI: ``Workbench`` over a session. Holds no logic: it calls core and viz and
shows what they return."""

from workbench.widgets.workbench import Workbench

__all__ = ["Workbench"]
