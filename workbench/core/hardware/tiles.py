"""How a chip's matrix units cut a matmul: tile and wave quantization.

A matmul's result is computed in tiles of (rows, columns) over the contraction in steps of
its third dim; a dim that does not fill its last tile is padded (tile quantization). A GPU
runs one tile per streaming multiprocessor at a time, so a matmul of several waves of
tiles waits on its last, partial wave (wave quantization). Both are NVIDIA's "Matrix
Multiplication Background" guide; on TPUs XLA pads a matmul's operands to the matrix
unit's tiles (Cloud TPU's performance guide). `Tiles.share` is what a matmul of a shape
keeps of the rate a large, well-shaped one reaches (``Hardware.matmul_flops``, measured
at a shape that loses nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.core.hardware.levels import HardwareError


@dataclass(frozen=True)
class Tiles:
    """A chip's matmul tiles: ``shapes``, the (rows, columns, contraction) tiles its
    libraries choose between (each matmul takes the one that wastes least), and ``units``,
    the tiles that run at once (a GPU's SMs; 0: no waves). A matmul of less than a wave is
    priced at the full rate: a library fills the units with smaller tiles or splits the
    contraction (and such a matmul is bound by its launch and its bytes, not its tiles)."""

    shapes: tuple[tuple[int, int, int], ...]
    units: int = 0

    def __post_init__(self):
        shapes = tuple(tuple(s) for s in self.shapes)
        ok = shapes and all(
            len(s) == 3 and all(isinstance(x, int) and x > 0 for x in s) for s in shapes
        )
        if not ok or not isinstance(self.units, int) or self.units < 0:
            raise HardwareError(
                f"Tiles needs (rows, columns, contraction) tiles of positive ints and a count "
                f"of units >= 0, e.g. Tiles(((128, 128, 1),), units=132); got {self.shapes!r}, "
                f"units={self.units!r}."
            )
        object.__setattr__(self, "shapes", shapes)

    def share(self, gemm: tuple[int, int, int, int] | None) -> float:
        """The share of a large matmul's rate that one of ``gemm`` = (batch, rows, columns,
        contraction) reaches (1 for None: a shape not known)."""
        if gemm is None:
            return 1.0
        batch, m, n, k = gemm
        if not m * n * k * batch:
            return 1.0
        best = 0.0
        for tm, tn, tk in self.shapes:
            rm, rn, rk = math.ceil(m / tm), math.ceil(n / tn), math.ceil(k / tk)
            tiles = batch * rm * rn
            if self.units and tiles <= self.units:
                return 1.0  # less than a wave: nothing better is possible
            share = m * n * k / (rm * tm * rn * tn * rk * tk)
            if self.units:
                share *= tiles / (math.ceil(tiles / self.units) * self.units)
            best = max(best, share)
        return best

    def figures(self) -> dict[str, float]:
        """Its numbers under the keys ``Hardware.sources`` files them under."""
        out = {f"matmul_tiles.{m}x{n}x{k}": float(m * n * k) for m, n, k in self.shapes}
        if self.units:
            out["matmul_tiles.units"] = float(self.units)
        return out
