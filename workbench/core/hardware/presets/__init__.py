"""The hardware presets, one module per vendor; `PRESETS` maps each preset's name to it and
`SHORT_NAMES` each short name (as the CLI's ``--hardware`` takes it) to it."""

from workbench.core.hardware.presets.google import TPU_V4, TPU_V5E, TPU_V5P
from workbench.core.hardware.presets.host import CPU
from workbench.core.hardware.presets.nvidia import A100, H100, H200

PRESETS = {h.name: h for h in (TPU_V4, TPU_V5E, TPU_V5P, A100, H100, H200, CPU)}
SHORT_NAMES = {
    "tpu_v4": TPU_V4,
    "tpu_v5e": TPU_V5E,
    "tpu_v5p": TPU_V5P,
    "a100": A100,
    "h100": H100,
    "h200": H200,
    "cpu": CPU,
}

__all__ = ["A100", "CPU", "H100", "H200", "PRESETS", "SHORT_NAMES", "TPU_V4", "TPU_V5E", "TPU_V5P"]
