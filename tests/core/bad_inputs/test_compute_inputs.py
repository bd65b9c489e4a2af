"""Bad inputs to what computes: hardware (presets by name, specs a user builds), estimates,
Auto (the tree search) and runs. Each is a typed error naming what was given, why and what
would work, raised before any work (nothing compiles here), leaving the session as it was."""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import pytest

import workbench as wb
from tests.core.bad_inputs.common import Snapshot, expect
from workbench.core import hardware as hw
from workbench.core.errors import DeviceError, InputError, LimitError, TacticError
from workbench.core.hardware.calibrate import calibrate
from workbench.core.search import tree
from workbench.core.search.arguments import MAX_BUDGET
from workbench.models import build

EX = build("mlp", "tiny")
PROGRAM = wb.capture(EX.fn, *EX.args)
H = hw.H100
PRESETS = "tpu_v4, tpu_v5e, tpu_v5p, a100, h100, h200, cpu"


@pytest.fixture(scope="module")
def session():
    """A session one step in (BP on "batch") on the 8 devices the tests attach."""
    return wb.Session(PROGRAM, wb.Mesh({"batch": 2, "model": 4}), [wb.BP("batch")])


@pytest.fixture(scope="module")
def big():
    """A session on a mesh of 16: more devices than the tests attach."""
    return wb.Session(PROGRAM, wb.Mesh({"batch": 4, "model": 4}))


# -- hardware by name ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, preset",
    [
        ("h100", hw.H100),
        ("H100", hw.H100),
        ("H100 SXM", hw.H100),
        ("tpu v5e", hw.TPU_V5E),
        ("TPU_V5P", hw.TPU_V5P),
        ("tpu-v4", hw.TPU_V4),
        ("a100", hw.A100),
        (None, hw.CPU),
        (hw.H200, hw.H200),
    ],
    ids=["short", "upper", "full", "spaced", "underscored", "dashed", "a100", "none", "spec"],
)
def test_resolve_takes_names_as_the_cli_does(name, preset):
    assert hw.resolve(name) is preset


def test_estimate_by_name_is_the_estimate_on_the_preset(session):
    assert session.estimate("h100").step_s == session.estimate(hw.H100).step_s
    assert session.estimate("h100").hardware == hw.H100.name


BAD_HARDWARE = [
    ("unknown name", "h1000", r"hardware='h1000' is not a hardware preset.*h100.*did you mean"),
    ("empty name", "", r"hardware='' is not a hardware preset"),
    ("a dict", {"flops": 1e15}, r"hardware=\{'flops': 1000000000000000\.0\} is not hardware"),
    ("an int", 100, r"hardware=100 is not hardware.*wb\.hardware\.Hardware"),
    ("a float", 1e15, r"hardware=1000000000000000\.0 is not hardware"),
    (
        "a list of presets",
        [hw.H100],
        r"hardware=\[Hardware\(name='H100 SXM'.*\.\.\. is not hardware",
    ),
    ("a link", hw.H100.links[0], r"hardware=Link\(name='nvlink'.*\(a Link\) is not hardware"),
    ("a class", hw.Hardware, r"is not hardware"),
]


@pytest.mark.parametrize(
    "given, fragment", [c[1:] for c in BAD_HARDWARE], ids=[c[0] for c in BAD_HARDWARE]
)
def test_resolve_refuses(given, fragment):
    err = expect(lambda: hw.resolve(given), InputError, fragment)
    assert PRESETS in str(err)


@pytest.mark.parametrize(
    "given, fragment", [c[1:] for c in BAD_HARDWARE], ids=[c[0] for c in BAD_HARDWARE]
)
def test_session_estimate_refuses_hardware(session, given, fragment):
    expect(lambda: session.estimate(given), InputError, fragment, session)


@pytest.mark.parametrize(
    "given, fragment",
    [
        ("h1000", r"Auto's hardware='h1000' is not a hardware preset"),
        ({}, r"hardware=\{\} is not hardware"),
    ],
    ids=["unknown name", "a dict"],
)
def test_auto_refuses_hardware(session, given, fragment):
    err = expect(
        lambda: session.apply(wb.Auto("model", hardware=given)), TacticError, fragment, session
    )
    assert isinstance(err, InputError)


# -- hardware a user builds ----------------------------------------------------------------------
SPECS = [
    ("flops zero", dict(flops={"bfloat16": 0}), r"positive peak FLOP/s.*'bfloat16': 0"),
    ("flops negative", dict(flops={"bfloat16": -1e15}), r"positive peak FLOP/s"),
    ("flops nan", dict(flops={"bfloat16": math.nan}), r"positive peak FLOP/s.*nan"),
    ("flops infinite", dict(flops={"bfloat16": math.inf}), r"positive peak FLOP/s.*inf"),
    ("flops a number", dict(flops=1e15), r"flops=1000000000000000\.0; give a dict"),
    ("flops empty", dict(flops={}), r"positive peak FLOP/s.*got \{\}"),
    ("flops not a dtype", dict(flops={"fast": 1e15}), r"'fast' is not a dtype"),
    (
        "hbm zero",
        dict(hbm_bandwidth=0),
        r"hbm_bandwidth=0; .*positive, finite number of bytes per second",
    ),
    ("hbm negative", dict(hbm_bandwidth=-3e12), r"hbm_bandwidth=-3000000000000\.0"),
    ("hbm nan", dict(hbm_bandwidth=math.nan), r"hbm_bandwidth=nan"),
    ("hbm a string", dict(hbm_bandwidth="3TB/s"), r"hbm_bandwidth='3TB/s'"),
    ("memory zero", dict(memory_bytes=0), r"memory_bytes=0; .*number of bytes\."),
    ("memory nan", dict(memory_bytes=math.nan), r"memory_bytes=nan"),
    ("memory infinite", dict(memory_bytes=math.inf), r"memory_bytes=inf"),
    ("op overhead negative", dict(op_overhead=-1e-6), r"op_overhead=-1e-06.*non-negative"),
    ("op overhead nan", dict(op_overhead=math.nan), r"op_overhead=nan"),
    ("combine bytes zero", dict(all_reduce_combine_bytes=0), r"all_reduce_combine_bytes=0"),
    ("fresh buffers negative", dict(fresh_buffer_bytes=-1), r"fresh_buffer_bytes=-1.*or None"),
    ("first touch nan", dict(first_touch_bandwidth=math.nan), r"first_touch_bandwidth=nan"),
    ("transpose negative", dict(transpose_bandwidth=-1.0), r"transpose_bandwidth=-1\.0"),
    ("transpose curve ragged", dict(transpose_bandwidth=((1e6,),)), r"transpose_bandwidth="),
    ("name a number", dict(name=3), r"needs a name.*got 3"),
    ("links a string", dict(links="nvlink"), r"links='nvlink'; give a tuple of Link"),
    ("links empty", dict(links=()), r"at least one Link"),
    ("links of strings", dict(links=("nvlink",)), r"at least one Link"),
    ("devices per node zero", dict(devices_per_node=0), r"devices_per_node=0"),
    (
        "fuses per reader a string",
        dict(fuses_per_reader="yes"),
        r"fuses_per_reader='yes'; give True",
    ),
    ("sources a number", dict(sources=3), r"sources=3; give a dict"),
]


@pytest.mark.parametrize("change, fragment", [c[1:] for c in SPECS], ids=[c[0] for c in SPECS])
def test_hardware_spec_refuses(change, fragment):
    expect(lambda: dataclasses.replace(H, **change), hw.HardwareError, fragment)


LINKS = [
    ("bandwidth zero", dict(bandwidth=0), r"bandwidth 0 .*positive number of bytes/s"),
    ("bandwidth nan", dict(bandwidth=math.nan), r"bandwidth nan"),
    ("bandwidth infinite", dict(bandwidth=math.inf), r"bandwidth inf"),
    ("latency negative", dict(latency=-1e-6), r"latency -1e-06.*non-negative"),
    ("latency nan", dict(latency=math.nan), r"latency nan"),
    (
        "topology unknown",
        dict(topology="ring"),
        r"topology 'ring'; use one of \('switch', 'torus'\)",
    ),
    ("group size zero", dict(group_size=0), r"group_size=0.*positive integer"),
    ("group size fractional", dict(group_size=2.5), r"group_size=2\.5"),
    ("kind unknown", dict(kinds=(("broadcast", 1e9, 0.0),)), r"per-kind figures.*kind one of"),
    ("name empty", dict(name=""), r"a link needs a name"),
]


@pytest.mark.parametrize("change, fragment", [c[1:] for c in LINKS], ids=[c[0] for c in LINKS])
def test_link_refuses(change, fragment):
    expect(lambda: dataclasses.replace(H.links[0], **change), hw.HardwareError, fragment)


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: H.with_axis_links({"model": "pcie"}), r"no link named 'pcie'.*nvlink"),
        (lambda: H.with_axis_links("model"), r"with_axis_links\('model'\): give a dict"),
        (lambda: H.with_group_sizes({"nvlink": 0}), r"group_size=0"),
        (lambda: H.with_group_sizes(16), r"with_group_sizes\(16\): give a dict"),
    ],
    ids=["axis link unknown", "axis links a string", "group size zero", "group sizes a number"],
)
def test_hardware_methods_refuse(call, fragment):
    expect(call, hw.HardwareError, fragment)


def test_hardware_errors_are_input_errors():
    assert issubclass(hw.HardwareError, InputError) and issubclass(hw.HardwareError, ValueError)


# -- overlap -------------------------------------------------------------------------------------
OVERLAPS = [
    ("unknown word", "partial", r"overlap='partial' is not an overlap policy.*'prefetch'"),
    ("misspelt", "ful", r"overlap='ful' is not an overlap policy.*did you mean 'full'"),
    ("capitalised none", "None", r"overlap='None' is not an overlap policy"),
    ("two", 2, r"overlap=2 is not a fraction in \[0, 1\]"),
    ("negative", -0.1, r"overlap=-0\.1 is not a fraction"),
    ("nan", math.nan, r"overlap=nan is not a fraction"),
    ("infinite", math.inf, r"overlap=inf is not a fraction"),
    ("a bool", True, r"overlap=True is neither a policy's name nor a fraction"),
    ("None", None, r"overlap=None is neither"),
    ("a list", ["full"], r"overlap=\['full'\] is neither"),
]


@pytest.mark.parametrize(
    "overlap, fragment", [c[1:] for c in OVERLAPS], ids=[c[0] for c in OVERLAPS]
)
def test_estimate_refuses_overlap(session, overlap, fragment):
    expect(lambda: session.estimate("h100", overlap=overlap), InputError, fragment, session)


# -- Auto ----------------------------------------------------------------------------------------
AUTOS = [
    ("budget zero", dict(budget=0), LimitError, r"budget=0 evaluations is outside 1 to 100,000"),
    ("budget negative", dict(budget=-5), LimitError, r"budget=-5 evaluations is outside"),
    (
        "budget huge",
        dict(budget=10**12),
        LimitError,
        r"budget=1,000,000,000,000 .*outside 1 to 100,000",
    ),
    ("budget fractional", dict(budget=2.5), InputError, r"budget=2\.5 is not a whole number"),
    ("budget a string", dict(budget="300"), InputError, r"budget='300' is not a whole number"),
    ("budget a bool", dict(budget=True), InputError, r"budget=True is not a whole number"),
    ("budget None", dict(budget=None), InputError, r"budget=None is not a whole number"),
    ("seconds zero", dict(seconds=0), LimitError, r"seconds=0 is not a duration.*seconds=60"),
    ("seconds negative", dict(seconds=-1.0), LimitError, r"seconds=-1\.0 is not a duration"),
    ("seconds nan", dict(seconds=math.nan), LimitError, r"seconds=nan is not a duration"),
    ("seconds infinite", dict(seconds=math.inf), LimitError, r"seconds=inf is not a duration"),
    ("seconds huge", dict(seconds=1e9), LimitError, r"seconds=1000000000\.0 .*86,400"),
    ("seconds a string", dict(seconds="60"), LimitError, r"seconds='60' is not a duration"),
    (
        "memory limit negative",
        dict(memory_limit=-1),
        LimitError,
        r"memory_limit=-1 is not a positive",
    ),
    ("memory limit zero", dict(memory_limit=0), LimitError, r"memory_limit=0 is not a positive"),
    ("memory limit nan", dict(memory_limit=math.nan), LimitError, r"memory_limit=nan"),
    (
        "memory limit a string",
        dict(memory_limit="16GB"),
        LimitError,
        r"memory_limit='16GB'.*16 \* 2\*\*30",
    ),
    (
        "goal unknown",
        dict(goal="speed"),
        InputError,
        r"goal must be 'time' or 'memory'; got goal='speed'",
    ),
    (
        "exploration negative",
        dict(exploration=-1),
        InputError,
        r"exploration=-1 is not a finite number",
    ),
    ("exploration nan", dict(exploration=math.nan), InputError, r"exploration=nan"),
    ("seed fractional", dict(seed=1.5), InputError, r"seed=1\.5 is not an integer"),
    ("inputs a number", dict(inputs=3), InputError, r"inputs=3 is not a selector"),
    ("callback not callable", dict(callback=3), InputError, r"callback=3 is not callable"),
]


@pytest.mark.parametrize(
    "change, error, fragment", [c[1:] for c in AUTOS], ids=[c[0] for c in AUTOS]
)
def test_auto_refuses(session, change, error, fragment):
    err = expect(lambda: session.apply(wb.Auto("model", **change)), error, fragment, session)
    assert isinstance(err, TacticError)  # as Auto's other argument errors have always been


@pytest.mark.parametrize(
    "axes, fragment",
    [
        (3, r"axes=3"),
        ("", r"axes=\(''.*\)"),
        ([], r"axes=\(\)"),
        (["model", 2], r"axes=\('model', 2\)"),
    ],
    ids=["a number", "empty name", "no axes", "a number among names"],
)
def test_auto_refuses_axes(session, axes, fragment):
    expect(
        lambda: session.apply(wb.Auto(axes)),
        TacticError,
        "needs a mesh axis name.*" + fragment,
        session,
    )


def test_a_huge_budget_is_refused_before_any_work(session):
    started = time.perf_counter()
    expect(lambda: session.apply(wb.Auto("model", budget=10**12)), LimitError, "outside", session)
    assert time.perf_counter() - started < 1.0
    assert MAX_BUDGET == 100_000  # the notebook's budget box allows as much


def _interrupt_after(n: int):
    calls = []

    def callback(progress):
        calls.append(progress)
        if len(calls) >= n:
            raise KeyboardInterrupt

    return callback, calls


def test_a_keyboard_interrupt_from_progress_leaves_the_session_as_it_was():
    s = wb.Session(PROGRAM, wb.Mesh({"batch": 2, "model": 4}), [wb.BP("batch")])
    before = Snapshot.of(s)
    callback, calls = _interrupt_after(2)
    with pytest.raises(KeyboardInterrupt):
        s.apply(wb.Auto("model", budget=8, callback=callback))
    assert len(calls) == 2 and calls[0].budget == 8  # progress was shown, then interrupted
    assert Snapshot.of(s) == before
    s.apply(wb.Auto("model", budget=8))  # the session works on, and the search runs anew
    fresh = wb.Session(PROGRAM, s.mesh, [wb.BP("batch"), wb.Auto("model", budget=8)])
    assert s.state.shardings == fresh.state.shardings


def test_a_keyboard_interrupt_mid_search_propagates_and_changes_nothing(monkeypatch):
    s = wb.Session(PROGRAM, wb.Mesh({"batch": 2, "model": 4}), [wb.BP("batch")])
    before = Snapshot.of(s)
    episode, seen = tree.Search.episode, []

    def interrupted(self, root):
        seen.append(self.evaluations)
        if len(seen) == 3:
            raise KeyboardInterrupt
        return episode(self, root)

    monkeypatch.setattr(tree.Search, "episode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        s.apply(wb.Auto("model", budget=20, seed=7))
    assert len(seen) == 3 and Snapshot.of(s) == before


# -- run -----------------------------------------------------------------------------------------
def _args(change):
    params, batch = EX.args
    return change(params, batch)


def _swap(params, batch):
    return (batch, params)


RUNS = [
    (
        "lowering unknown",
        dict(lowering="fast"),
        InputError,
        r"lowering='fast' is not a lowering.*'explicit'",
    ),
    ("lowering None", dict(lowering=None), InputError, r"lowering=None is not a lowering"),
    ("repeats a string", dict(repeats="5"), InputError, r"repeats='5' is not an integer"),
    ("repeats fractional", dict(repeats=2.5), InputError, r"repeats=2\.5 is not an integer"),
    ("repeats a bool", dict(repeats=True), InputError, r"repeats=True is not an integer"),
    ("repeats zero", dict(repeats=0), LimitError, r"repeats=0 is outside 1 to 10,000"),
    ("repeats negative", dict(repeats=-3), LimitError, r"repeats=-3 is outside"),
    ("repeats huge", dict(repeats=10**9), LimitError, r"repeats=1000000000 is outside"),
    (
        "training loop a string",
        dict(training_loop="yes"),
        InputError,
        r"training_loop='yes' is not True or False",
    ),
    (
        "devices a string",
        dict(devices="cpu"),
        InputError,
        r"devices='cpu' is not a list of JAX devices.*jax\.devices\(\)\[:8\]",
    ),
    (
        "devices numbers",
        dict(devices=[0, 1]),
        InputError,
        r"devices=\[0, 1\] is not a list of JAX devices",
    ),
    (
        "devices one device",
        dict(devices=jax.devices()[0]),
        InputError,
        r"is not a list of JAX devices",
    ),
    ("devices repeated", dict(devices=[jax.devices()[0]] * 8), InputError, r"lists a device twice"),
    (
        "devices too few",
        dict(devices=jax.devices()[:4]),
        DeviceError,
        r"needs 8 devices but 4 cpu device\(s\) are given; give 8",
    ),
    (
        "args missing one",
        dict(args=_args(lambda p, b: p)),
        InputError,
        r"holds 6 arrays but .* takes 8.*args=\(params, batch\)",
    ),
    (
        "args swapped",
        dict(args=_args(_swap)),
        InputError,
        r"array #0 is float32\[16, 32\] but input 'params/layers/0/b' is float32\[64\]",
    ),
    (
        "args wrong shape",
        dict(args=_args(lambda p, b: (p, {**b, "x": jnp.zeros((8, 32))}))),
        InputError,
        r"array #6 is float32\[8, 32\] but input 'batch/x' is float32\[16, 32\]",
    ),
    (
        "args wrong dtype",
        dict(args=_args(lambda p, b: (p, {**b, "x": jnp.zeros((16, 32), "int32")}))),
        InputError,
        r"array #6 is int32\[16, 32\].*float32\[16, 32\].*dtypes",
    ),
    (
        "args a string",
        dict(args=_args(lambda p, b: (p, {**b, "x": "data"}))),
        InputError,
        r"holds something that is not an array",
    ),
]


@pytest.mark.parametrize("change, error, fragment", [c[1:] for c in RUNS], ids=[c[0] for c in RUNS])
def test_run_refuses_before_compiling(session, change, error, fragment):
    expect(lambda: session.run(**change), error, fragment, session)


def test_a_mesh_larger_than_the_attached_devices(big):
    err = expect(
        big.run,
        DeviceError,
        r"Mesh.* needs 16 devices but 8 cpu device\(s\) are attached; use a mesh whose sizes "
        r"multiply to 8, or on a CPU set XLA_FLAGS=--xla_force_host_platform_device_count=16 "
        r"before jax is imported",
        big,
    )
    assert "16" in str(err)


# -- calibrate -----------------------------------------------------------------------------------
CALIBRATES = [
    ("no devices", dict(devices=[]), r"calibrate\(devices=\[\]\): give distinct JAX devices"),
    ("devices a string", dict(devices="cpu"), r"calibrate\(devices='cpu'\)"),
    ("devices repeated", dict(devices=[jax.devices()[0]] * 2), r"give distinct JAX devices"),
    ("quick a string", dict(quick="yes"), r"calibrate\(quick='yes'\): give True or False"),
    (
        "collectives a number",
        dict(collectives=1),
        r"calibrate\(collectives=1\): give True or False",
    ),
    ("dtypes a string", dict(dtypes="float32"), r"calibrate\(dtypes='float32'\): give a list"),
    ("dtypes unknown", dict(dtypes=("float32", "fast")), r"dtypes=\('float32', 'fast'\)"),
    ("dtypes empty", dict(dtypes=()), r"calibrate\(dtypes=\(\)\)"),
]


@pytest.mark.parametrize(
    "change, fragment", [c[1:] for c in CALIBRATES], ids=[c[0] for c in CALIBRATES]
)
def test_calibrate_refuses_before_measuring(change, fragment):
    expect(lambda: calibrate(**change), InputError, fragment)
