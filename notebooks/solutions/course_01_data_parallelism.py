"""Answers to the exercises of notebooks/course_01_data_parallelism.ipynb: each ``# %% N.M`` section
replaces the cell marked ``"exercise": "N.M"``."""

# %% 1.1
# Tile dim 0 (the examples) of every batch input over "batch"; propagation splits the
# activations with it and leaves every weight gradient a partial sum. Tiling the tokens
# alone works too: the targets meet them in the loss and follow.
my_tactic = wb.Tile("batch/**", 0, "batch")


# %% 1.2
# Each gradient has its parameter's shape and dtype and is all-reduced once, whole: the
# size of the arrays does not depend on the number of devices.
def dp_allreduce_bytes(n_params, bytes_per_param, n_devices):
    return n_params * bytes_per_param


# %% 1.3
# GPT-2's data inputs are batch/input_ids and batch/labels, the examples on dim 0.
own_tactic = wb.Tile("batch/*", 0, "batch")
