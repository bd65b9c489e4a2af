"""Sequence parallelism outside attention and MLP (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models"): ``SP`` splits the residual stream on
its sequence dim. After ``MP`` on the same axis it is Megatron's scheme: each of MP's
all-reduces becomes a reduce-scatter onto the stream and an all-gather of a block's input,
for the same bytes and the layer norms' and stream's activations split t ways."""

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
    """Sequence parallelism outside attention and MLP: the residual sums tiled on their
    sequence dim over ``axis``, and through them the layer norms, forward and backward.

    Each value crossing into a block (``anatomy.blocks``: its normalised input in the
    forward pass, the stream's cotangent in the backward) is frozen whole on the axis: it
    is all-gathered once where it is made and serves every projection of the block, and
    the forward input its weight gradients too. What a block returns, a sum pending on the
    axis after ``MP`` (its result; its input's cotangent), is reduce-scattered where the
    stream reads it; a layer norm's bias gradient keeps the sum pending into the gradient's
    reduction. ``stream`` selects the values to tile and ``dim`` their sequence dim,
    overriding the anatomy."""

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
        else:  # the residual sums (a block's input is kept whole, gathered where it is made)
            stream = residual_stream(view, inside)
        seq = view.sequence_class
        if not stream or (self.dim is None and seq is None):
            raise TacticError(
                f"{self}: the workbench sees no residual stream with a sequence dimension in "
                f"{program.name} (program.anatomy() shows what it sees); pass stream= and dim=."
            )
        # a block's sum (pending on the axis, from MP) is reduce-scattered where it is read:
        # left unfrozen, so a use that only reduces it further (a layer norm's bias gradient)
        # carries the pending sum on beside the reduce-scattered uses
        frozen = [v for v in boundary if state.shardings[v].reduction_of(self.axis) is None]
        out = [Atomic(names_of(program, frozen), self.axis)] if frozen else []

        def dim_of(v):
            if self.dim is not None:
                return self.dim
            dims = view.classes.dims_of(v, len(program.values[v].shape))
            return dims.index(seq) if seq in dims else None

        picks = [(v, dim_of(v)) for v in dict.fromkeys(stream)]
        return out + by_dim(program, mesh, state, self.axis, picks, "sequence")
