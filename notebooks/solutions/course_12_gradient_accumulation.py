"""Answers to the exercises of notebooks/course_12_gradient_accumulation.ipynb: each ``# %% N.M``
section replaces the cell marked ``"exercise": "N.M"``."""

# %% 12.1
# Your turn: try `return micro * k` and `per_example * micro * k` to see the hints.
def global_batch(micro, k, dp):
    return micro * k * dp


def activations(per_example, micro):
    return per_example * micro

# %% 12.2
# Your turn: the number of micro-batches (one of `programs`) to fit `limit`.
k = 2

# %% 12.3
# Your turn: the number of devices for `own` under BP.
own_devices = 4
