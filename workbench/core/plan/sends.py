"""A pipeline's point-to-point sends as collectives of the plan, with their why.

`pipeline_sends(program, mesh, state, pipeline, tactic)`: for each cut between (virtual)
stages g and g+1 and each value crossing it (`StageCuts.boundaries`), one
``collective-permute`` over the stage axis from stage g % S to stage (g+1) % S carrying
each microbatch's activation forward, and one carrying its gradient back, ``microbatches``
times a step (with v model chunks per stage, S*v - 1 cuts: the wrap S-1 -> 0 among them); bytes per device are one microbatch's share of
the value as the state lays it out. The simulator prices the same sends (`estimate/
pipelined.py`); the pipeline lowering performs them (`lowering/pipeline.py`).
"""

from __future__ import annotations

from workbench.core.layout.collectives import Collective


def pipeline_sends(program, mesh, state, pipeline, tactic: int | None) -> list[Collective]:
    """The sends of ``pipeline`` (a resolved `strategies.pipeline.Pipeline`, or None: none);
    ``tactic``: the schedule index of the step that pipelines."""
    if pipeline is None:
        return []
    cuts, M, axis = pipeline.cuts, pipeline.microbatches, pipeline.axis
    S, chunked = pipeline.stages, pipeline.schedule.virtual_stages > 1
    batched = batched_values(program)
    stage_of = {o: st.index for st in cuts.stages for o in st.forward}

    def at(g: int) -> str:
        return f"stage {g % S}" + (f" (chunk {g // S})" if chunked else "")

    out = []
    for b in cuts.boundaries:
        a, z = at(b.after), at(b.after + 1)
        for v in b.values:
            sh = state.shardings[v]
            nbytes = sh.local_nbytes(mesh) // (M if v in batched else 1)
            name = program.values[v].name
            readers = [
                u for u in program.users[v] if stage_of.get(program.top_level[u]) == b.after + 1
            ]
            for forward in (True, False):
                why = (
                    f"{a} sends each microbatch's {name} to {z} ({pipeline.tactic})"
                    if forward
                    else f"{z} sends the gradient of each microbatch's {name} back to {a} "
                    f"({pipeline.tactic})"
                )
                out.append(
                    Collective(
                        "collective-permute",
                        v,
                        (axis,),
                        nbytes,
                        readers[0] if readers and forward else None,
                        tactic,
                        sh,
                        sh,
                        why=why,
                        count=M,
                    )
                )
    return out


def batched_values(program) -> set[int]:
    """Values with the batch dimension (a microbatch holds 1/M of them)."""
    a = program.anatomy()
    dims, batch = a.classes, a.batch_class
    if batch is None:
        return set()
    return {v.id for v in program.values if batch in dims.dims_of(v.id, len(v.shape))}
