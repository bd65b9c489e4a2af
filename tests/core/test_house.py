"""The house: core's layers point one way, modules stay small and say what they are for,
every subpackage has a README, the public face stays as it is, caches are owned."""

from __future__ import annotations

import ast
import pathlib

import workbench as wb

ROOT = pathlib.Path(wb.__file__).parent
CORE = ROOT / "core"

#: core's floors, bottom to top: a module imports its own floor or a lower one, never a
#: higher one (function-local imports included). Read as the data flow: a captured program
#: (ir, with the anatomy it reads in itself) is laid out (layout) by tactics (propagate), planned,
#: priced (estimate), searched, lowered and run, checked against XLA and exported (io); the
#: session is core's face.
FLOORS = (
    {"errors", "units", "gcpause", "dtypes", "caches", "display", "progress"},
    {"layout"},
    {"ops"},
    {"anatomy"},
    {"ir"},
    {"propagate", "hardware"},
    {"plan", "strategies"},
    {"estimate"},
    {"search"},
    {"lowering"},
    {"xla"},
    {"io"},
    {"session", "partition"},
    {"whatif"},  # sweeps of sessions over clusters and shapes
)
FLOOR = {part: i for i, parts in enumerate(FLOORS) for part in parts}

#: Modules over 500 lines, each with why it is not split.
LONG_MODULES: dict[str, str] = {}

#: What core may import from outside the standard library.
THIRD_PARTY = {"jax", "jaxlib", "numpy", "ml_dtypes", "opt_einsum"}


def modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


MODULES = modules(ROOT)
CORE_MODULES = {m: p for m, p in MODULES.items() if m.startswith("workbench.core.")}


def imports(path: pathlib.Path) -> list[tuple[str, int]]:
    """(module imported, line) for every import in the file, function-local ones included;
    ``from package import submodule`` names the submodule."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub if sub in MODULES else node.module, node.lineno))
    return out


def floor(module: str) -> int:
    return FLOOR[module.split(".")[2]]


def test_every_core_module_stands_on_a_floor():
    missing = {m.split(".")[2] for m in CORE_MODULES} - set(FLOOR)
    assert not missing, f"add these to FLOORS: {sorted(missing)}"


def test_core_imports_point_down():
    bad = []
    for module, path in CORE_MODULES.items():
        for target, line in imports(path):
            if target.startswith("workbench.core.") and floor(target) > floor(module):
                bad.append(
                    f"{path.relative_to(ROOT.parent)}:{line} imports {target} (a higher floor)"
                )
            elif target.startswith("workbench.") and not target.startswith("workbench.core"):
                bad.append(
                    f"{path.relative_to(ROOT.parent)}:{line} imports {target} (outside core)"
                )
    assert not bad, "\n".join(bad)


def test_core_imports_jax_and_numpy_only():
    import sys

    bad = []
    for path in CORE_MODULES.values():
        for target, line in imports(path):
            top = target.split(".")[0]
            if top not in THIRD_PARTY | {"workbench"} and top not in sys.stdlib_module_names:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_no_import_circles():
    graph = {m: {t for t, _ in imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}
    # a package's __init__ that imports its own modules is the package's face, not a circle
    for m in graph:
        graph[m] = {
            t for t in graph[m] if not (MODULES[m].name == "__init__.py" and t.startswith(m + "."))
        }
    seen, stack, circles = {}, [], []

    def visit(m):
        seen[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if seen.get(t) == "open":
                circles.append(" -> ".join([*stack[stack.index(t) :], t]))
            elif t not in seen:
                visit(t)
        stack.pop()
        seen[m] = "done"

    for m in sorted(graph):
        if m not in seen:
            visit(m)
    assert not circles, "\n".join(circles)


def test_modules_stay_under_500_lines():
    long = {
        str(p.relative_to(ROOT.parent)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert set(long) <= set(LONG_MODULES), f"split these or justify them in LONG_MODULES: {long}"


def test_module_docstrings_fit_a_screen():
    long = {}
    for path in MODULES.values():
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if doc and len(doc.splitlines()) > 25:
            long[str(path.relative_to(ROOT.parent))] = len(doc.splitlines())
    assert not long, f"move design notes to the package README or docs/architecture.md: {long}"


def test_every_subpackage_has_a_short_readme():
    packages = [p.parent for p in ROOT.rglob("__init__.py") if p.parent != ROOT]
    missing = [str(p.relative_to(ROOT.parent)) for p in packages if not (p / "README.md").exists()]
    assert not missing, f"no README.md in {missing}"
    long = {
        str(p.relative_to(ROOT.parent)): n
        for p in packages
        if p.is_relative_to(CORE) and (n := len((p / "README.md").read_text().splitlines())) > 70
    }
    assert not long, f"a README is a screen, these run longer: {long}"


def test_the_public_face_is_unchanged():
    assert sorted(wb.__all__) == sorted(
        [
            *(
                "BP",
                "CP",
                "EMB",
                "EP",
                "MP",
                "MQ",
                "PP",
                "Place",
                "SP",
                "Z2",
                "Z3",
                "Atomic",
                "Auto",
                "Imported",
            ),
            *("Mesh",),
            *("Program", "Replicate", "Role", "Session", "Sharding", "Tactic", "Tile"),
            *("Workbench", "WorkbenchError", "capture", "hardware", "partition", "sweep", "tag"),
            *("InputError", "LimitError", "FileFormatError", "DeviceError"),
        ]
    )
    for name in wb.__all__:
        assert getattr(wb, name) is not None
    for preset in ("TPU_V4", "TPU_V5E", "TPU_V5P", "A100", "H100", "H200", "CPU"):
        assert wb.hardware.PRESETS[getattr(wb.hardware, preset).name] is getattr(
            wb.hardware, preset
        )
    for name in ("Hardware", "Link", "HardwareError", "collective_time", "KINDS"):
        assert hasattr(wb.hardware, name)
    session_api = {"apply", "undo", "redo", "reset", "jump", "history", "sharding", "why"}
    session_api |= {"collectives", "estimate", "run", "export_code", "export_jax", "save", "load"}
    session_api |= {"from_jax", "specs", "logical_rules", "conflicts", "plan", "state", "state_at"}
    session_api |= {"placements", "place"}
    assert session_api <= set(dir(wb.Session))


def test_nothing_outside_ir_writes_into_a_program():
    bad = []
    for module, path in CORE_MODULES.items():
        if module.startswith("workbench.core.ir."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "__dict__"
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:  # program.x = ... (setattr on a program)
                value = getattr(target, "value", None)
                if isinstance(target, ast.Attribute) and getattr(value, "id", "") == "program":
                    bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not bad, "derived facts of a Program go in program.cache: " + ", ".join(bad)


def test_a_programs_derived_facts_live_in_its_cache():
    program = wb.capture(*_zoo_mlp())
    own = set(vars(program))
    s = wb.Session(program, wb.Mesh({"batch": 2}), [wb.BP("batch")])
    s.estimate(wb.hardware.H100)
    s.export_jax()
    added = set(vars(program)) - own
    # only the Program's own lazily computed properties appear on it; the rest is in its cache
    assert added <= {n for n in dir(type(program)) if not n.startswith("_")}, added
    assert {"anatomy", "estimate.static"} <= set(program.cache.keys())
    program.cache.clear()
    assert not program.cache.keys()


def _zoo_mlp():
    from workbench.models import build

    ex = build("mlp", "tiny", abstract=True)
    return (ex.fn, *ex.args)


def test_one_clear_caches_empties_every_process_cache():
    from workbench.core import caches
    from workbench.core.ir.selectors import compile_glob
    from workbench.core.layout import redistribute, sharding
    from workbench.core.plan import op_layout as plan

    program = wb.capture(*_zoo_mlp())
    s = wb.Session(program, wb.Mesh({"batch": 2, "model": 2}), [wb.BP("batch"), wb.Z3("model")])
    s.estimate(wb.hardware.H100)
    compile_glob("params/*")
    names = set(caches.registered())
    assert {"layout.canonical shardings", "plan.op layouts", "ir.selector patterns"} <= names
    assert plan._PLAN_CACHE and sharding._CANONICAL and compile_glob.cache_info().currsize
    caches.clear_caches()
    assert not plan._PLAN_CACHE and not sharding._CANONICAL
    assert compile_glob.cache_info().currsize == 0
    assert redistribute._plan.cache_info().currsize == 0
