"""Automatic partitioning: a Monte Carlo tree search over tactics, as in Automap and PartIR's
search (arXiv 2112.02958, 2210.06352).

An action decides one *group* of inputs on one mesh axis: tile dimension d, or leave it.
A group is the inputs that must be sharded alike: a parameter with its optimizer moments,
and the same weight in every layer (``params/layers/*/attn/wq``). After each action,
propagation runs (so later groups may already be decided); a finished episode is priced
by the simulator: the reward is the start state's step time over the episode's, cut when
the peak memory per device exceeds the limit. UCT picks the next episode's path; random
rollouts finish it. The last quarter of the budget refines the best path found by hill
climbing: clear one axis entirely, or change one group's action, keeping any improvement.
Deterministic for a given seed (given a budget in evaluations; a budget in seconds depends
on the machine's speed).

    schedule = [BP("batch"), Auto("model")]   # BP by hand, the search decides "model"
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from workbench.core.errors import TacticError, WorkbenchError
from workbench.core.ir.selectors import select
from workbench.core.mesh import Mesh
from workbench.core.plan import build_plan
from workbench.core.simulator import estimate
from workbench.core.state import State
from workbench.core.tactics import Tactic, Tile, apply_tactic

SKIP = -1  # the "leave it" action


@dataclass(frozen=True, slots=True)
class Group:
    """Inputs decided together on one axis, and the dims they may be tiled on."""

    key: str  # e.g. "layers/*/attn/wq"
    axis: str
    members: tuple[int, ...]  # value ids
    dims: tuple[int, ...]  # tileable dims (each member has the same rank and sizes)


@dataclass(frozen=True, slots=True)
class Progress:
    """What a search has done so far, for progress bars."""

    evaluations: int
    budget: int
    best_step_s: float
    best_tactics: tuple[Tactic, ...]
    elapsed_s: float


def _group_key(program, anatomy, v: int) -> str:
    """A group's label: for the same place in repeated blocks, the first member's name with
    its layer numbers starred. Display only: the anatomy's blocks decide the groups."""
    name = program.values[v].name
    return _starred(name) if v in anatomy.layers.slots else name


def _starred(name: str) -> str:
    """``params/layers/3/attn/wq`` -> ``params/layers/*/attn/wq``, for display."""
    return re.sub(r"(?<=/)\d+(?=/|$)|^\d+(?=/)", "*", name)


def decision_groups(program, mesh: Mesh, state: State, axis: str, inputs="**") -> list[Group]:
    """The groups of inputs still open on ``axis``, largest first."""
    size = mesh.axis_size(axis)
    anatomy = program.anatomy()
    layers = anatomy.layers
    state_inputs = set(anatomy.optimizer_state)
    params: dict[tuple, list[int]] = {}
    taken: set[int] = set()
    for v in select(program, inputs, required=False):
        value = program.values[v]
        if value.kind != "input" or not value.shape or v in taken or v in state_inputs:
            continue
        members = [v] + [u for u in anatomy.companions(v) if program.values[u].kind == "input"]
        taken.update(members)
        slot = layers.slots.get(v) if (len(layers.blocks) > 1) else None
        key = ("slot", slot, value.shape, value.dtype) if slot is not None else ("value", v)
        params.setdefault(key, []).extend(members)
    groups = []
    for members in params.values():
        key = _group_key(program, anatomy, members[0])
        shape = program.values[members[0]].shape
        open_members = tuple(
            m
            for m in members
            if not state.shardings[m].uses(axis) and axis not in state.shardings[m].replicated
        )
        if not open_members:
            continue
        dims = tuple(
            d
            for d, n in enumerate(shape)
            if all(n % (state.shardings[m].shards(d, mesh) * size) == 0 for m in open_members)
        )
        if dims:
            groups.append(Group(key, axis, open_members, dims))

    # the data first: tiling it spreads through the whole step and settles most weights;
    # then the weights (they carry optimizer state), largest first
    def order(g):
        has_state = any(m in state_inputs for m in g.members)
        return (has_state, -sum(program.values[m].nbytes for m in g.members))

    groups.sort(key=order)
    return groups


#: A search stops after this many episodes in a row that price no new path: every rollout
#: lands on a path seen before, and the unpriced ones are too far apart to reach.
STALL_EPISODES = 2000
#: The share of the budget (evaluations and seconds) spent refining the tree's best path.
POLISH_SHARE = 0.25


class _Node:
    __slots__ = ("children", "reward", "visits")

    def __init__(self):
        self.visits = 0
        self.reward = 0.0
        self.children: dict[int, _Node] = {}


class Search:
    """One run of the tree search from ``state`` (see module doc)."""

    def __init__(self, program, mesh, state, auto: Auto):
        from workbench.core import hardware as presets

        self.program, self.mesh, self.auto = program, mesh, auto
        self.hardware = auto.hardware or presets.H100
        self.groups = [
            g
            for axis in auto.axes
            for g in decision_groups(program, mesh, state, axis, auto.inputs)
        ]
        self.rng = random.Random(auto.seed)
        self.states: dict[tuple, State | None] = {(): state}
        self.scores: dict[tuple, float] = {}
        self.evaluations = 0
        self.base = self.measure(state)
        self.best: tuple[float, tuple] = (self.reward(state, self.base), ())

    # -- the environment -------------------------------------------------------------------
    def options(self, path: tuple) -> list[int]:
        """Actions open after ``path``: a group propagation already decided is left alone."""
        state = self.state(path)
        if state is None:
            return [SKIP]
        g, size = self.groups[len(path)], self.mesh.axis_size(self.groups[len(path)].axis)
        members = [m for m in g.members if not state.shardings[m].uses(g.axis)]
        if not members:
            return [SKIP]
        shape = self.program.values[members[0]].shape
        dims = [
            d
            for d in g.dims
            if all(
                shape[d] % (state.shardings[m].shards(d, self.mesh) * size) == 0 for m in members
            )
        ]
        return [SKIP, *dims]

    def tactic(self, depth: int, action: int, state: State) -> Tactic | None:
        if action == SKIP:
            return None
        g = self.groups[depth]
        members = [m for m in g.members if not state.shardings[m].uses(g.axis)]
        if not members:
            return None
        return Tile([self.program.values[m].name for m in members], action, g.axis)

    def state(self, path: tuple) -> State | None:
        """The state after the actions on ``path`` (None when one cannot be applied)."""
        if path in self.states:
            return self.states[path]
        before = self.state(path[:-1])
        result = None
        if before is not None:
            t = self.tactic(len(path) - 1, path[-1], before)
            try:
                result = before if t is None else apply_tactic(self.program, self.mesh, before, t)
            except WorkbenchError:
                result = None
        self.states[path] = result
        return result

    def measure(self, state: State) -> tuple[float, float]:
        e = estimate(
            self.program,
            self.mesh,
            state,
            build_plan(self.program, self.mesh, state),
            self.hardware,
        )
        self.evaluations += 1
        objective = e.memory.peak if self.auto.goal == "memory" else e.step_s
        return objective, e.memory.peak

    def reward(self, state: State, measured=None) -> float:
        objective, peak = measured or self.measure(state)
        reward = self.base[0] / max(objective, 1e-30)
        limit = self.auto.memory_limit
        if limit is not None and peak > limit:
            reward *= 0.1 * limit / peak  # over the limit: worth little, less the more it is over
        return reward

    def score(self, path: tuple) -> float:
        if path not in self.scores:
            state = self.state(path)
            self.scores[path] = 0.0 if state is None else self.reward(state)
            if self.scores[path] > self.best[0]:
                self.best = (self.scores[path], path)
        return self.scores[path]

    # -- the tree ------------------------------------------------------------------------
    def episode(self, root: _Node) -> None:
        node, path, visited = root, (), [root]
        while len(path) < len(self.groups):
            options = self.options(path)
            untried = [a for a in options if a not in node.children]
            if untried:
                action = (
                    untried[0] if len(path) == 0 and not node.children else self.rng.choice(untried)
                )
                node.children[action] = _Node()
                node, path = node.children[action], (*path, action)
                visited.append(node)
                break
            node, action = self.select(node)
            path = (*path, action)
            visited.append(node)
        while len(path) < len(self.groups):  # rollout: leave a group alone half the time
            options = self.options(path)
            leave = len(options) == 1 or self.rng.random() < 0.5
            path = (*path, SKIP if leave else self.rng.choice(options[1:]))
        reward = self.score(path)
        for n in visited:
            n.visits += 1
            n.reward += reward

    def select(self, node: _Node) -> tuple[_Node, int]:
        log_n = math.log(max(node.visits, 1))
        best = max(
            node.children.items(),
            key=lambda kv: (
                kv[1].reward / kv[1].visits
                + self.auto.exploration * math.sqrt(log_n / kv[1].visits)
            ),
        )
        return best[1], best[0]

    def run(self) -> list[Tactic]:
        """The tree search on the first ``1 - POLISH_SHARE`` of the budget (evaluations and
        seconds), then local refinement of the best path on the rest."""
        start = time.perf_counter()
        budget, seconds = self.auto.budget, self.auto.seconds
        tree_budget = max(1, math.ceil(budget * (1 - POLISH_SHARE)))
        tree_seconds = None if seconds is None else seconds * (1 - POLISH_SHARE)
        root = _Node()
        stalled = 0
        while self.groups and self.within(start, tree_budget, tree_seconds):
            before = self.evaluations
            self.episode(root)
            if self.evaluations == before and root.visits > 4 * _paths(self.groups):
                break  # the tree keeps landing on priced paths: it has seen them all
            stalled = 0 if self.evaluations > before else stalled + 1
            if stalled >= STALL_EPISODES:
                break  # episodes keep landing on priced paths: the rest of the space is far
            self.report(start)
        if self.groups:
            self.polish(start, budget, seconds)
        return self.tactics(self.best[1])

    def within(self, start: float, budget: int, seconds: float | None) -> bool:
        return self.evaluations < budget and (
            seconds is None or time.perf_counter() - start <= seconds
        )

    def report(self, start: float) -> None:
        if self.auto.callback is not None:
            self.auto.callback(
                Progress(
                    self.evaluations,
                    self.auto.budget,
                    self.base[0] / self.best[0],
                    self.tactics(self.best[1]),
                    time.perf_counter() - start,
                )
            )

    # -- local refinement ----------------------------------------------------------------
    def full(self, path: tuple) -> tuple:
        """``path`` made complete and valid: an action no longer open after the actions
        before it (or missing) becomes SKIP."""
        out: tuple = ()
        for depth in range(len(self.groups)):
            action = path[depth] if depth < len(path) else SKIP
            out = (*out, action if action in self.options(out) else SKIP)
        return out

    def neighbours(self, path: tuple):
        """Paths one move from ``path``: leave every group of one axis alone, or change one
        group's action."""
        for axis in self.auto.axes:
            cleared = tuple(
                SKIP if g.axis == axis else a for g, a in zip(self.groups, path, strict=True)
            )
            if cleared != path:
                yield self.full(cleared)
        for depth in range(len(self.groups)):
            for action in self.options(path[:depth]):
                if action != path[depth]:
                    yield self.full((*path[:depth], action, *path[depth + 1 :]))

    def polish(self, start: float, budget: int, seconds: float | None) -> None:
        """First-improvement hill climbing from the best path until no move improves it or
        the budget is spent (a tree search settles which groups matter; this settles the
        groups it left to chance)."""
        path = self.full(self.best[1])
        score = self.score(path)
        improved = True
        while improved and self.within(start, budget, seconds):
            improved = False
            for candidate in self.neighbours(path):
                if not self.within(start, budget, seconds):
                    break
                if candidate != path and self.score(candidate) > score:
                    path, score, improved = candidate, self.scores[candidate], True
                    self.report(start)
                    break

    def tactics(self, path: tuple) -> tuple[Tactic, ...]:
        """The path as the tile tactics that had an effect, in order."""
        out, state = [], self.states[()]
        for depth, action in enumerate(path):
            t = self.tactic(depth, action, state)
            nxt = self.state(path[: depth + 1])
            if t is not None and nxt is not None and nxt is not state:
                out.append(t)
            state = nxt if nxt is not None else state
        return tuple(out)


def _paths(groups) -> int:
    """An upper bound on the number of full decision paths."""
    total = 1
    for g in groups:
        total *= 1 + len(g.dims)
        if total > 10**9:
            break
    return total


_RESULTS: dict = {}  # (auto, id(program), id(state)) -> tactics, so export does not search again


@dataclass(frozen=True, slots=True)
class Auto(Tactic):
    """Decide the sharding of the inputs on ``axes`` by tree search (see module doc).

    ``goal`` "time" minimises the simulated step time, "memory" the peak memory per device;
    ``memory_limit`` (bytes per device) penalises strategies that exceed it. ``budget`` caps
    the simulator evaluations and ``seconds`` the wall time; ``callback(Progress)`` reports
    after each episode. ``inputs`` selects the inputs the search may decide.
    """

    axes: tuple[str, ...] | str
    goal: str = "time"
    memory_limit: float | None = None
    budget: int = 300
    seconds: float | None = None
    seed: int = 0
    inputs: str = "**"
    hardware: object = None  # a workbench.core.hardware.Hardware; default H100
    exploration: float = 0.5
    callback: Callable[[Progress], None] | None = field(
        default=None, compare=False, hash=False, repr=False
    )

    def __post_init__(self):
        if isinstance(self.axes, str):
            object.__setattr__(self, "axes", (self.axes,))
        elif isinstance(self.axes, list | tuple):
            object.__setattr__(self, "axes", tuple(self.axes))
        if not (
            isinstance(self.axes, tuple)
            and self.axes
            and all(isinstance(a, str) for a in self.axes)
        ):
            raise TacticError(
                f"Auto needs a mesh axis name or a list of them, e.g. Auto('model'); "
                f"got axes={self.axes!r}."
            )
        if self.goal not in ("time", "memory"):
            raise TacticError(f"{self}: goal must be 'time' or 'memory'; got {self.goal!r}.")

    def __str__(self) -> str:
        axes = self.axes[0] if len(self.axes) == 1 else list(self.axes)
        extra = f", memory_limit={self.memory_limit:.3g}" if self.memory_limit else ""
        return f"Auto({axes!r}{', goal=' + repr(self.goal) if self.goal != 'time' else ''}{extra})"

    def decisions(self, program, mesh: Mesh, state: State) -> list[Tactic]:
        """The tactics the search settles on, from ``state``: what this tactic stands for."""
        for axis in self.axes:
            if axis not in mesh:
                raise TacticError(
                    f"{self}: axis {axis!r} is not in {mesh}; use one of {list(mesh.names)}."
                )
        key = (self, id(program), id(state))
        if key not in _RESULTS:
            if len(_RESULTS) > 64:
                _RESULTS.clear()
            _RESULTS[key] = list(Search(program, mesh, state, self).run())
        return _RESULTS[key]

    def expand(self, program, mesh: Mesh, state: State):
        return self.decisions(program, mesh, state)
