"""Answers to the exercises of notebooks/course_13_pipelining.ipynb: each ``# %% N.M``
section replaces the cell marked ``"exercise": "N.M"``."""

# %% 13.1
# Your turn: try `return (S - 1) / M` to see a hint.
def bubble_share(S, M):
    return (S - 1) / (M + S - 1)

# %% 13.2
# Your turn: try `return S - 1 - i` for "1f1b" to see a hint.
def in_flight(kind, S, M, i):
    return M if kind == "gpipe" else min(M, S - i)

# %% 13.3
# Your turn: simulate each v; leave out `p2p=` to see a hint.
def fastest_v(S, M, forward, backward, p2p):
    def step(v):
        kind = "1f1b" if v == 1 else "interleaved"
        f = [x / v for x in forward]
        b = [x / v for x in backward]
        return simulate(schedule(kind, S, M, v), f, b, p2p=p2p).makespan  # noqa: F821

    return min((1, 2, 4), key=step)

# %% 13.4
# Your turn: the number of microbatches for `own` on 2 stages.
own_M = 2
