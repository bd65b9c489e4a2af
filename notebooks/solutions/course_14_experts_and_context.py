"""Answers to the exercises of notebooks/course_14_experts_and_context.ipynb: each ``# %% N.M``
section replaces the cell marked ``"exercise": "N.M"``."""

# %% 14.1
# Your turn: estimate both plans at each E in EXPERTS (try the E where the peaks, .memory.peak, cross, to see a hint).
def moe_step(E, plan):
    return wb.Session(moe_program(E), moe_mesh, moe_plans[plan]).estimate(hw.H100).step_s  # noqa: F821

E_ep = next(E for E in EXPERTS if moe_step(E, "expert parallel") < moe_step(E, "replicated"))  # noqa: F821

# %% 14.2
# Your turn: estimate both plans at each L in LENGTHS (try 128 to see a hint).
def cp_step(L, plan):
    return wb.Session(lm_program(L), cp_mesh, cp_plans[plan]).estimate(hw.H100).step_s  # noqa: F821

L_cp = next(L for L in LENGTHS if cp_step(L, "context parallel") < cp_step(L, "batch only"))  # noqa: F821
