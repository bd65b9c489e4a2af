"""The course's exercise checks: one module per chapter (``ch01`` ... ``ch15``) over
``common``.

A chapter's notebook marks each exercise cell with the cell metadata ``"exercise": "N.M"``
and the cell that checks it with ``"check": "N.M"``. An exercise cell ships with a
placeholder (``...``) that its check refuses with a hint; the answers live apart, in
``notebooks/solutions/<notebook name>.py``, one ``# %% N.M`` section per exercise. The tests
run every chapter both ways: as shipped (each check fails with a hint and nothing else
fails) and with the solutions put in (each check passes).

A check rebuilds what the exercise asks for with the real engine and judges the answer by
its properties, read from the program's anatomy (parameters, gradients, data inputs, blocks)
rather than from the zoo's names, so every check also runs on a model the learner brings.
On success it prints a line starting with "✓"; on failure it raises ``CheckFailed`` whose
message is a hint: what is wrong and where to look, never the answer.
"""
