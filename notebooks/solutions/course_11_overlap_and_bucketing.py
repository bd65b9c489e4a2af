"""Answers to the exercises of notebooks/course_11_overlap_and_bucketing.ipynb: each ``# %% N.M``
section replaces the cell marked ``"exercise": "N.M"``."""

# %% 11.1
# Your turn: try `return compute + comm` to see a failure.
def full_step(compute, comm):
    return max(compute, comm)

# %% 11.2
# Your turn: True where the strategy's communication hides behind compute under "prefetch".
hides = {"DP": True, "ZeRO-3": True, "MP": False}

# %% 11.3
# Your turn: a schedule for `own` on `own_mesh` whose communication all hides.
own_schedule = [wb.BP("data")]  # noqa: F821 (the notebook imports wb)
