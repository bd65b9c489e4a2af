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

At scale each evaluation costs what a propagation and an estimate of the whole program
cost, so the search spends them where they count: the data inputs are one group (as BP
tiles them), small groups (under ``SMALL_SHARE`` of an axis's input bytes: norm scales
and biases) are decided together when alike in shape, the states after each path's prefixes are
kept in a bounded cache owned by the search (a rollout or a refinement pays only for the
actions after the prefix it shares), rollouts follow the best path found so far half the
time (unless the episode before found nothing new), and a budget in seconds stops before an evaluation that would overrun it.

    schedule = [BP("batch"), Auto("model")]   # BP by hand, the search decides "model"
"""

from __future__ import annotations

import math
import random
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from workbench.core import progress
from workbench.core.errors import TacticError, WorkbenchError
from workbench.core.estimate import estimate
from workbench.core.estimate.placements import placed_for
from workbench.core.ir.selectors import exact
from workbench.core.layout.mesh import Mesh
from workbench.core.layout.state import State
from workbench.core.plan.plan import build_plan
from workbench.core.propagate.tactics import Tactic, Tile, apply_tactic
from workbench.core.search import candidates
from workbench.core.search.arguments import check_auto, check_axes, hardware_of
from workbench.core.search.candidates import AutoReport
from workbench.core.search.groups import Group, decision_groups
from workbench.core.units import format_bytes, format_seconds

__all__ = [
    "SKIP",
    "Auto",
    "AutoReport",
    "Group",
    "Progress",
    "Search",
    "StateCache",
    "decision_groups",
]

SKIP = -1  # the "leave it" action
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Progress:
    """What a search has done so far, for progress bars."""

    evaluations: int
    budget: int
    best_step_s: float
    best_tactics: tuple[Tactic, ...]
    elapsed_s: float


#: A search stops after this many episodes in a row that price no new path: every rollout
#: lands on a path seen before, and the unpriced ones are too far apart to reach.
STALL_EPISODES = 2000
#: The share of the budget (evaluations and seconds) spent refining the tree's best path.
POLISH_SHARE = 0.25
#: Groups of parameters holding less than this share of their axis's open input bytes are
#: decided together with the others of their shape (norm scales and biases).
SMALL_SHARE = 1e-3
#: How often a rollout takes the best path's action for a group (when still open there and
#: the episode before priced a new path).
FOLLOW_BEST = 0.5
#: The state cache's size, in value shardings held: about 2,000,000 (some hundreds of MB).
STATE_CACHE_VALUES = 2_000_000


def merge_small(program, groups: list[Group]) -> list[Group]:
    """``groups`` with those of parameters under ``SMALL_SHARE`` of their bytes merged by
    shape (norm scales and biases: one decision for all, after the large groups)."""
    total = sum(g.nbytes for g in groups)
    large = [g for g in groups if g.data or g.nbytes >= SMALL_SHARE * total]
    small: dict[tuple, list[Group]] = {}
    for g in groups:
        if not (g.data or g.nbytes >= SMALL_SHARE * total):
            small.setdefault((program.values[g.members[0]].shape, g.dims), []).append(g)
    for (_, dims), alike in small.items():
        members = tuple(m for g in alike for m in g.members)
        key = ", ".join(g.key for g in alike)
        large.append(Group(key, alike[0].axis, members, dims, sum(g.nbytes for g in alike)))
    return large


class _Node:
    __slots__ = ("children", "reward", "visits")

    def __init__(self):
        self.visits = 0
        self.reward = 0.0
        self.children: dict[int, _Node] = {}


class StateCache:
    """The states after paths of actions, the most recently used ``capacity`` of them (the
    start state is always held). Owned by one search; dropped with it."""

    def __init__(self, start: State, capacity: int):
        self.start, self.capacity = start, max(0, capacity)
        self.items: OrderedDict[tuple, State | None] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, path: tuple):
        if not path:
            return self.start
        if path in self.items:
            self.hits += 1
            self.items.move_to_end(path)
            return self.items[path]
        self.misses += 1
        return _MISSING

    def put(self, path: tuple, state: State | None) -> None:
        if not path or not self.capacity:
            return
        self.items[path] = state
        if len(self.items) > self.capacity:
            self.items.popitem(last=False)


class Search:
    """One run of the tree search from ``state`` (see module doc). ``state_cache`` is the
    number of prefix states kept (default: what ``STATE_CACHE_VALUES`` allows); ``status``
    the `progress.Status` it reports to (default: one calling ``auto.callback`` only)."""

    def __init__(self, program, mesh, state, auto: Auto, state_cache=None, status=None):
        self.start = time.perf_counter()
        self.program, self.mesh, self.auto = program, mesh, auto
        self.status = status or progress.Status(str(auto), callback=auto.callback, enabled=False)
        # priced where a Place step before it put the mesh's axes, where the hardware takes it
        self.hardware = placed_for(mesh, state.placement, hardware_of(auto))[0]
        self.groups = []
        for axis in auto.axes:
            self.groups += merge_small(
                program, decision_groups(program, mesh, state, axis, auto.inputs)
            )
        self.rng = random.Random(auto.seed)
        if state_cache is None:  # at least a path's prefixes and a refinement's suffix
            state_cache = max(
                STATE_CACHE_VALUES // max(1, len(program.values)), 2 * len(self.groups) + 2
            )
        self.states = StateCache(state, state_cache)
        self.scores: dict[tuple, float] = {}
        self.evaluations = 0
        self.follow = True  # rollouts may take the best path's actions
        self.applied, self.applying_s = 0, 0.0  # actions applied, and their seconds
        self.base = self.measure(state)
        self.best: tuple[float, tuple] = (self.reward(state, self.base), ())

    # -- the environment -------------------------------------------------------------------
    def options(self, path: tuple) -> list[int]:
        """Actions open after ``path`` (a group propagation already decided is left alone):
        SKIP first, the group's prior dim next."""
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
        if g.prior in dims:
            dims.remove(g.prior)
            dims.insert(0, g.prior)
        return [SKIP, *dims]

    def tactic(self, depth: int, action: int, state: State) -> Tactic | None:
        if action == SKIP:
            return None
        g = self.groups[depth]
        members = [m for m in g.members if not state.shardings[m].uses(g.axis)]
        if not members:
            return None
        return Tile([exact(self.program.values[m].name) for m in members], action, g.axis)

    def state(self, path: tuple) -> State | None:
        """The state after the actions on ``path`` (None when one cannot be applied): from
        the longest prefix in the cache, one propagation per action after it."""
        found = self.states.get(path)
        if found is not _MISSING:
            return found
        cut = len(path) - 1
        while cut > 0 and path[:cut] not in self.states.items:
            cut -= 1
        state = self.states.get(path[:cut])
        for depth in range(cut, len(path)):
            if state is not None:
                t = self.tactic(depth, path[depth], state)
                started = time.perf_counter()
                try:
                    state = state if t is None else apply_tactic(self.program, self.mesh, state, t)
                except WorkbenchError:
                    state = None
                self.applied += 1
                self.applying_s += time.perf_counter() - started
            self.states.put(path[: depth + 1], state)
        return state

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
                prior = self.groups[len(path)].prior
                action = (
                    prior
                    if prior in untried
                    else untried[0]
                    if len(path) == 0 and not node.children
                    else self.rng.choice(untried)
                )
                node.children[action] = _Node()
                node, path = node.children[action], (*path, action)
                visited.append(node)
                break
            node, action = self.select(node)
            path = (*path, action)
            visited.append(node)
        best = self.best[1]
        while len(path) < len(self.groups):  # rollout: the best path's action half the time,
            options = self.options(path)  # else leave the group alone half the time
            depth = len(path)
            follow = self.follow and depth < len(best) and best[depth] in options
            if follow and self.rng.random() < FOLLOW_BEST:
                action = best[depth]
            elif len(options) == 1 or self.rng.random() < 0.5:
                action = SKIP
            else:
                action = self.rng.choice(options[1:])
            path = (*path, action)
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
        budget, seconds = self.auto.budget, self.auto.seconds
        tree_budget = max(1, math.ceil(budget * (1 - POLISH_SHARE)))
        tree_seconds = None if seconds is None else seconds * (1 - POLISH_SHARE)
        root = _Node()
        stalled = 0
        while self.groups and self.within(tree_budget, tree_seconds):
            before = self.evaluations
            self.episode(root)
            if self.evaluations == before and root.visits > 4 * _paths(self.groups):
                break  # the tree keeps landing on priced paths: it has seen them all
            stalled = 0 if self.evaluations > before else stalled + 1
            self.follow = stalled == 0  # landed on a priced path: explore instead
            if stalled >= STALL_EPISODES:
                break  # episodes keep landing on priced paths: the rest of the space is far
            self.report()
        if self.groups:
            self.polish(budget, seconds)
        self.report()
        return self.tactics(self.best[1])

    def within(self, budget: int, seconds: float | None) -> bool:
        """Whether another evaluation fits the budget: in seconds, one more at the mean cost
        so far, then the replay of a whole path's actions (the result applied), must end
        within it."""
        if self.evaluations >= budget:
            return False
        if seconds is None:
            return True
        elapsed = time.perf_counter() - self.start
        replay = len(self.groups) * self.applying_s / max(self.applied, 1)
        return elapsed + elapsed / max(self.evaluations, 1) + replay <= seconds

    def report(self, chosen: AutoReport | None = None) -> None:
        """Progress so far to ``status`` (a line, or a `Progress` for a callback); with
        ``chosen``, the candidate that won (the last report)."""

        def info() -> Progress:
            tactics = self.tactics(self.best[1]) if chosen is None else chosen.tactics
            elapsed = time.perf_counter() - self.start
            return Progress(self.evaluations, self.auto.budget, best, tactics, elapsed)

        best = self.base[0] / max(self.best[0] if chosen is None else chosen.winner.score, 1e-30)
        shown = format_bytes(best) if self.auto.goal == "memory" else format_seconds(best)
        what = "peak memory" if self.auto.goal == "memory" else "step"
        line = f"{self.evaluations}/{self.auto.budget} evaluations, best {what} {shown}"
        self.status.show(line + (", chosen" if chosen else ""), info)

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

    def polish(self, budget: int, seconds: float | None) -> None:
        """First-improvement hill climbing from the best path until no move improves it or
        the budget is spent (a tree search settles which groups matter; this settles the
        groups it left to chance)."""
        path = self.full(self.best[1])
        score = self.score(path)
        improved = True
        while improved and self.within(budget, seconds):
            improved = False
            moves = self.neighbours(path)  # each made only once the budget allows it
            while self.within(budget, seconds):
                candidate = next(moves, None)
                if candidate is None:
                    break
                if candidate != path and self.score(candidate) > score:
                    path, score, improved = candidate, self.scores[candidate], True
                    self.report()
                    break

    def tactics(self, path: tuple) -> tuple[Tactic, ...]:
        """The path as the tile tactics that had an effect, in order."""
        out, state = [], self.states.start
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


def _results(program) -> weakref.WeakKeyDictionary:
    """The searches run on ``program``, by the state they started from (held weakly: a
    state no session holds takes its results with it), then by tactic and mesh; so export
    and undo do not search again. Owned by the program."""
    return program.cache.get("search.results", weakref.WeakKeyDictionary)


@dataclass(frozen=True, slots=True)
class Auto(Tactic):
    """Decide the sharding of the inputs on ``axes`` by tree search (see module doc).

    ``goal`` "time" minimises the simulated step time, "memory" the peak memory per device;
    ``memory_limit`` (bytes per device) penalises strategies that exceed it. ``budget`` caps
    the simulator evaluations (1 to ``MAX_BUDGET``) and ``seconds`` the wall time (up to
    ``MAX_SECONDS``); ``callback(Progress)`` reports after each episode, else a status line
    on stderr does (`workbench.core.progress`). An exception the callback raises, or a
    KeyboardInterrupt, stops the search and leaves the session and caches as they were.
    ``inputs`` selects the inputs the search may decide. What it
    decides is the best of the search's find and every registered named strategy on its
    axes (``candidates``); ``report`` lists them.
    """

    axes: tuple[str, ...] | str
    goal: str = "time"
    memory_limit: float | None = None
    budget: int = 300
    seconds: float | None = None
    seed: int = 0
    inputs: str = "**"
    hardware: object = None  # a Hardware or a preset's name; default H100
    exploration: float = 0.5
    callback: Callable[[Progress], None] | None = field(
        default=None, compare=False, hash=False, repr=False
    )

    def __post_init__(self):
        object.__setattr__(self, "axes", check_axes(self.axes))
        check_auto(self)

    @property
    def axis(self) -> str:
        """Its one axis; "" when it decides several (every tactic has an ``axis``)."""
        return self.axes[0] if len(self.axes) == 1 else ""

    def __str__(self) -> str:
        axes = self.axes[0] if len(self.axes) == 1 else list(self.axes)
        extra = f", memory_limit={self.memory_limit:.3g}" if self.memory_limit else ""
        return f"Auto({axes!r}{', goal=' + repr(self.goal) if self.goal != 'time' else ''}{extra})"

    def decisions(self, program, mesh: Mesh, state: State) -> list[Tactic]:
        """The tactics the search settles on, from ``state``: what this tactic stands for."""
        return list(self.report(program, mesh, state).tactics)

    def report(self, program, mesh: Mesh, state: State) -> AutoReport:
        """What the search compared from ``state`` (its own find and every named strategy
        on its axes, see ``candidates``), their step times and memory, and which won."""
        for axis in self.axes:
            if axis not in mesh:
                raise TacticError(
                    f"{self}: axis {axis!r} is not in {mesh}; use one of {list(mesh.names)}."
                )
        done = _results(program).get(state, {})
        if (self, mesh) not in done:  # kept only once complete: an interrupted search keeps nothing
            with progress.Status(str(self), callback=self.callback) as status:
                search = Search(program, mesh, state, self, status=status)
                progress.stage("pricing the named strategies")
                found = candidates.compare(program, mesh, state, search)
                search.report(found)
            done = _results(program).setdefault(state, {})
            done[(self, mesh)] = found
        return done[(self, mesh)]

    def expand(self, program, mesh: Mesh, state: State):
        return self.decisions(program, mesh, state)
