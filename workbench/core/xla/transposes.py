"""Read the kernels that transpose an array in memory out of compiled HLO (fusions holding a
``transpose``), with the bytes each reads and writes: what the simulator's transposed
copies are checked against."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.xla.hlo_text import array_bytes, elements, ints, loop_counts, parse_module


@dataclass(frozen=True, slots=True)
class HloTranspose:
    """One compiled kernel that transposes an array in memory: a fusion holding a
    ``transpose`` (after layout assignment, a transpose that only relabels dimensions is a
    bitcast, so one that is left moves data; XLA emits the layout copies a matmul or
    convolution operand needs this way, with the elementwise ops that make the operand)."""

    name: str
    read: int  # bytes of its operands, per run
    written: int  # bytes of its results, per run
    count: int = 1  # times it runs: the trip counts of the while loops around it


def parse_transposes(hlo_text: str) -> list[HloTranspose]:
    """Every transposing fusion in ``hlo_text`` (compiled, per-device HLO), in text order.

    What a fusion reads and writes inside a loop is what it touches: an operand it only
    dynamic-slices counts its slices, the buffer a dynamic-update-slice writes into
    in place counts nothing read and the update written (a scan's stacked arrays)."""
    module = parse_module(hlo_text)
    counts = loop_counts(module)
    found = []
    for comp, instrs in module.computations.items():
        for instr in instrs.values():
            if instr.opcode != "fusion" or "calls" not in instr.attrs:
                continue
            called = instr.attrs["calls"].lstrip("%")
            body = module.computations.get(called, {})
            if not any(inner.opcode == "transpose" for inner in body.values()):
                continue
            params = {
                int(ints(inner.operands[0])[0]): inner.name
                for inner in body.values()
                if inner.opcode == "parameter"
            }
            read, seen = 0, set()
            for k, operand in enumerate(instr.operands):
                if operand in seen:
                    continue
                seen.add(operand)
                uses = module.users.get((called, params.get(k, "")), ())
                read += _touched(uses, instrs[operand].shape)
            root = body.get(module.roots.get(called, ""))
            while root is not None and root.opcode == "bitcast":
                root = body.get(root.operands[0])
            if root is not None and root.opcode == "dynamic-update-slice":
                written = array_bytes(elements(body[root.operands[1]].shape))
            else:
                written = array_bytes(elements(instr.shape))
            found.append((instr.line, HloTranspose(instr.name, read, written, counts.get(comp, 1))))
    return [t for _, t in sorted(found, key=lambda pair: pair[0])]


def _touched(uses, shape) -> int:
    """Bytes a fused computation reads of a parameter of ``shape`` used as ``uses``: the
    slices where it only dynamic-slices it, nothing where it only updates it in place."""
    if uses and all(
        u.opcode in ("dynamic-slice", "dynamic-update-slice") and k == 0 for u, k in uses
    ):
        return array_bytes(
            a for u, _ in uses if u.opcode == "dynamic-slice" for a in elements(u.shape)
        )
    return array_bytes(elements(shape))
