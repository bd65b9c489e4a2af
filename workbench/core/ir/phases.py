"""Phases of a training step from its dataflow: forward, backward and optimizer.

The backward pass is what JAX's ``transpose`` made (capture reads it off each equation's
name stack). The rest is placed by dataflow alone, never by a scope or value name:

- *optimizer*: ops downstream of the backward pass (the update reads the gradients), and
  ops that feed only such ops (a step counter, a learning-rate schedule);
- *forward*: everything else: the residuals the backward pass reads, and the loss.

A program with no backward pass (inference, a loss alone) is all forward.
"""

from __future__ import annotations

from collections.abc import Sequence


def dataflow_phases(
    n_ops: int,
    reads: Sequence[Sequence[int]],
    readers: Sequence[Sequence[int]],
    backward: Sequence[bool],
) -> list[str]:
    """Each op's phase. ``reads[o]``: the ops whose results op ``o`` reads (its producers);
    ``readers[o]``: the ops that read its results; ``backward[o]``: made by ``transpose``.

    Ops are numbered so that producers come before readers (capture's program order).
    """
    phase = ["forward"] * n_ops
    if not any(backward):
        return phase
    for o in range(n_ops):
        if backward[o]:
            phase[o] = "backward"
    # downstream of the backward pass, outside it: the update
    after = [False] * n_ops
    for o in range(n_ops):
        if not backward[o] and any(backward[p] or after[p] for p in reads[o]):
            after[o] = True
    # upstream of the backward pass: residuals; upstream of the update only: its inputs
    feeds_backward = [False] * n_ops
    feeds_update_only = [False] * n_ops
    for o in reversed(range(n_ops)):
        if backward[o] or after[o]:
            continue
        users = readers[o]
        feeds_backward[o] = any(backward[u] or feeds_backward[u] for u in users)
        feeds_update_only[o] = bool(users) and all(after[u] or feeds_update_only[u] for u in users)
    for o in range(n_ops):
        if after[o] or (feeds_update_only[o] and not feeds_backward[o]):
            phase[o] = "optimizer"
    return phase
