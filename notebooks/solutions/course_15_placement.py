"""Answers to the exercises of notebooks/course_15_placement.ipynb: each ``# %% N.M``
section replaces the cell marked ``"exercise": "N.M"``."""

# %% 15.1
# Your turn: compute it from the ranked placements (try the ratio of the model axis's all-reduces to see a hint).
slowdown = ranked[-1].estimate.step_s / ranked[0].estimate.step_s  # noqa: F821

# %% 15.2
# Your turn: ask synthesised(...) (try "RS infiniband, RS nvlink" to see a hint).
rs_syn = synthesised("reduce-scatter", check.RS_BYTES, ("data",), wb.Mesh(check.RS_MESH), hw.H100)  # noqa: F821
rs_program = rs_syn.program.describe([name for name, _ in rs_syn.levels])
rs_speedup = rs_syn.speedup
