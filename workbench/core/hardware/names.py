"""Hardware by name: `resolve` turns what a user passes as ``hardware`` into a `Hardware`.

One table serves every caller (``Session.estimate``, ``Auto``, the CLI's ``--hardware``):
a preset answers to its full name (``"H100 SXM"``) and its short name (``"h100"``),
case-insensitive and ignoring spaces, dashes and underscores (``"tpu v5e"``).
"""

from __future__ import annotations

import re

from workbench.core.errors import InputError, closest_names, given
from workbench.core.hardware.presets import CPU, PRESETS, SHORT_NAMES
from workbench.core.hardware.spec import Hardware


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def preset_table() -> dict[str, tuple[Hardware, list[str]]]:
    """Preset name -> (the preset, its short names), in `PRESETS` order."""
    out = {name: (hw, []) for name, hw in PRESETS.items()}
    for short, hw in SHORT_NAMES.items():
        out[hw.name][1].append(short)
    return out


def preset_names() -> str:
    """The short names of the presets, for messages: ``"tpu_v4, ..., cpu"``."""
    return ", ".join(short[0] if short else full for full, (_, short) in preset_table().items())


def find_preset(name: str) -> Hardware | None:
    """The preset called ``name`` (full or short, see the module docstring), or None."""
    for full, (hw, short) in preset_table().items():
        if _key(name) in {_key(full), *map(_key, short)}:
            return hw
    return None


def resolve(hardware=None, what: str = "hardware") -> Hardware:
    """``hardware`` as a `Hardware`: None -> the CPU preset; a preset's name -> that preset;
    a `Hardware` -> itself. Anything else raises `InputError` (``what`` names the argument)."""
    if hardware is None:
        return CPU
    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str):
        found = find_preset(hardware)
        if found is not None:
            return found
        keys = {_key(k): k for full, (_, short) in preset_table().items() for k in (full, *short)}
        near = [keys[k] for k in closest_names(_key(hardware), keys)]
        hint = f" Did you mean {', '.join(map(repr, near))}?" if near else ""
        raise InputError(
            f"{what}={given(hardware)} is not a hardware preset; give one of "
            f"{preset_names()} (case-insensitive), a wb.hardware.Hardware, or None for the "
            f"CPU preset.{hint}"
        )
    raise InputError(
        f"{what}={given(hardware)} is not hardware: give a preset's name (one of "
        f"{preset_names()}), a wb.hardware.Hardware (e.g. wb.hardware.H100, or "
        "dataclasses.replace(wb.hardware.H100, hbm_bandwidth=...)), or None for the CPU preset."
    )
