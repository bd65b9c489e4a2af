"""Sequence parallelism outside attention and MLP: ``SP`` tiles the residual stream on its
sequence dim; each block gathers its input and its sum is reduce-scattered back."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.anatomy.blocks import block_interior, crossing, residual_stream
from workbench.core.errors import TacticError
from workbench.core.propagate.tactics import Atomic, Tactic, _check_axis
from workbench.core.strategies.base import by_dim, check_fields, matches, names_of, strict_text
from workbench.core.strategies.named import register
from workbench.core.strategies.roles import roles


@register(axes="model", place=6)
@dataclass(frozen=True, slots=True)
class SP(Tactic):
    """Sequence parallelism outside attention and MLP: the residual stream tiled on its
    sequence dim over ``axis``. Every activation crossing into or out of a block's interior
    (forward and backward; ``ir.blocks``) is atomic on the axis, so each block gathers its
    input and the sum it returns is reduce-scattered back onto the stream; those entering a
    block are tiled like the stream (in the backward pass, the cotangents). ``stream``
    selects the stream's values and ``dim`` their sequence dim, overriding the anatomy."""

    axis: str
    stream: str | None = None
    dim: int | None = None
    strict: bool = False  # any value it targets left whole is an error

    def __post_init__(self):
        check_fields(self, selectors=("stream",), optional_dims=("dim",))

    def __str__(self) -> str:
        if (self.stream, self.dim) == (None, None):
            return strict_text(self, f"SP({self.axis!r})")
        return strict_text(self, f"SP({self.axis!r}, stream={self.stream!r}, dim={self.dim})")

    def expand(self, program, mesh, state):
        _check_axis(self, mesh)
        view = roles(program, state)
        inside = block_interior(view)
        boundary = crossing(program, inside)
        if self.stream is not None:
            stream = matches(program, self.stream)
        else:  # what a block's result is added to (the residual sums) and the blocks' inputs
            stream = residual_stream(view, inside)
        seq = view.sequence_class
        if not stream or (self.dim is None and seq is None):
            raise TacticError(
                f"{self}: the workbench sees no residual stream with a sequence dimension in "
                f"{program.name} (program.anatomy() shows what it sees); pass stream= and dim=."
            )
        out = [Atomic(names_of(program, boundary), self.axis)] if boundary else []
        shapes = {program.values[v].shape for v in stream}
        entering = [
            v
            for v in boundary
            if program.values[v].shape in shapes
            and program.values[v].producer not in inside
            and not state.shardings[v].uses(self.axis)
        ]

        def dim_of(v):
            if self.dim is not None:
                return self.dim
            dims = view.classes.dims_of(v, len(program.values[v].shape))
            return dims.index(seq) if seq in dims else None

        picks = [(v, dim_of(v)) for v in dict.fromkeys((*stream, *entering))]
        return out + by_dim(program, mesh, state, self.axis, picks, "sequence")
