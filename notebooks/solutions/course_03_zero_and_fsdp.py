"""Answers to the exercises of notebooks/course_03_zero_and_fsdp.ipynb: each ``# %% N.M`` section
replaces the cell marked ``"exercise": "N.M"``."""

# %% 3.1
# ZeRO-2: the bf16 weights (2 bytes) whole on every device; the bf16 gradient (2) and the
# fp32 optimizer state (12) sharded over the N devices.
def zero2_bytes(P, N):
    return 2 * P + (2 + 12) * P / N

# %% 3.2
# Data parallel over `data`, and every parameter with its gradient and optimizer state
# sharded over `data` (ZeRO-3).
fsdp = [wb.BP("data"), wb.Z3("data")]

# %% 3.3
# The same schedule: the tactics find the batch and the parameters from the anatomy.
own_fsdp = [wb.BP("data"), wb.Z3("data")]
