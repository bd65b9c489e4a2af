"""Answers to the exercises of notebooks/course_09_rooflines.ipynb: each ``# %% N.M`` section
replaces the cell marked ``"exercise": "N.M"``."""


# %% 9.1
# Your turn: the ridge of the roofline, from the spec's figures.
def critical_intensity(hardware):
    return hardware.peak_flops("bfloat16") / hardware.hbm_bandwidth


# %% 9.2
# Your turn: equate compute and communication per step, solve for the tokens per device.
def dp_critical_tokens(hardware, n, dtype="bfloat16"):
    # 6·P·T / C  =  2·(n-1)/n · b·P / W   (b bytes per gradient value, W the node's link)
    b = jnp.dtype(dtype).itemsize
    return 2 * (n - 1) / n * b / hardware.links[0].bandwidth * hardware.peak_flops(dtype) / 6


# %% 9.3
# Your turn: tokens per device for own_large on 8 H100s.
own_critical_tokens = dp_critical_tokens(hw.H100, 8, gradient.dtype)
