"""The ring all-reduce picture: its steps, its chunks, its bytes (core's) and bad input."""

import re
import xml.etree.ElementTree as ET

import pytest

from workbench.core.errors import InputError
from workbench.core.layout.redistribute import wire_bytes
from workbench.viz.ring import ring_allreduce, ring_frames


@pytest.mark.parametrize("n", [4, 8])
def test_steps_and_chunks(n):
    frames = ring_frames(n, 4096)
    assert [f["phase"] for f in frames] == ["reduce-scatter"] * (n - 1) + ["all-gather"] * (n - 1)
    for f in frames:
        assert [(s, t) for s, t, _ in f["sends"]] == [(i, (i + 1) % n) for i in range(n)]
        assert sorted(c for _, _, c in f["sends"]) == list(range(n))  # each chunk once a step
    # after the reduce-scatter, each chunk has passed through every device but one
    for chunk in range(n):
        senders = [s for f in frames[: n - 1] for s, _, c in f["sends"] if c == chunk]
        assert len(set(senders)) == n - 1
    # what one device sends in all is core's wire bytes for an all-reduce
    assert sum(f["bytes"] for f in frames) == pytest.approx(wire_bytes("all-reduce", 4096, n))


@pytest.mark.parametrize("n", [4, 8])
def test_it_draws_one_panel_per_step_and_one_arrow_per_device(n):
    svg = ring_allreduce(n, 8192)
    root = ET.fromstring(svg)  # well-formed
    assert root.tag.endswith("svg")
    steps = re.findall(r'class="wb-ring-step"', svg)
    sends = re.findall(r'class="wb-ring-send" data-chunk="(\d+)"', svg)
    assert len(steps) == 2 * (n - 1)
    assert len(sends) == 2 * (n - 1) * n
    assert {int(c) for c in sends} == set(range(n))
    assert f"{2 * (n - 1)} steps" in svg


@pytest.mark.parametrize("bad", [1, 0, -3, 2.5, "4", True])
def test_bad_n_is_refused(bad):
    with pytest.raises(InputError, match="ring"):
        ring_allreduce(bad)


def test_too_many_and_bad_bytes_are_refused():
    with pytest.raises(InputError, match="too small to read"):
        ring_frames(64)
    with pytest.raises(InputError, match="nbytes"):
        ring_frames(4, -1)
