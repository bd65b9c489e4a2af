"""Named strategies: textbook partitionings as composite tactics over Tile/Replicate/Atomic,
one module per family, each registered where it is defined (see README.md).

Each takes the mesh axis it uses; what it acts on comes from the program's anatomy, read
from structure alone; a selector passed to a strategy overrides it, and a ``Role`` step in
the schedule corrects it. ``expand`` is how you read what a strategy does:

    [BP("batch"), MP("model"), Z3("batch")]
"""

# every family registers its tactics in ``named`` as it is imported
from workbench.core.strategies import (  # noqa: F401
    context,
    data,
    embedding,
    experts,
    pipeline,
    placing,
    roles,
    sequence,
    tensor,
    zero,
)
from workbench.core.strategies.named import NAMED, STRATEGIES, register, suggested_axis

__all__ = ["NAMED", "STRATEGIES", "register", "suggested_axis"]
