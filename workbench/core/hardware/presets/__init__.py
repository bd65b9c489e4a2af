"""The hardware presets, one module per vendor; `PRESETS` maps each preset's name to it."""

from workbench.core.hardware.presets.google import TPU_V4, TPU_V5E, TPU_V5P
from workbench.core.hardware.presets.host import CPU
from workbench.core.hardware.presets.nvidia import A100, H100, H200

PRESETS = {h.name: h for h in (TPU_V4, TPU_V5E, TPU_V5P, A100, H100, H200, CPU)}

__all__ = ["A100", "CPU", "H100", "H200", "PRESETS", "TPU_V4", "TPU_V5E", "TPU_V5P"]
