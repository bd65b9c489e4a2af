"""A session's schedule through the ways it leaves the workbench: saved and loaded, and
exported as code and rebuilt; each must give the same history."""

import json

import workbench as wb


def round_trip(session, program, tmp_path) -> dict:
    """The strategy file ``session`` saves (as JSON), after checking that loading it and
    running its ``export_code()`` both rebuild the session's history for ``program``."""
    path = tmp_path / "schedule.json"
    session.save(path)
    assert wb.Session.load(program, path).history == session.history
    namespace: dict = {}
    exec(session.export_code(), namespace)
    assert namespace["build"](program).history == session.history
    return json.loads(path.read_text())
