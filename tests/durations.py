"""The suite's two speeds: each test's recorded time (setup, call and teardown) in
tests/durations.json, and the `slow` mark on every test recorded at SLOW_S seconds or more, so
`scripts/test.sh --fast` (pytest -m "not slow") runs what is quick. A test the file does not name
(a new one) counts as quick until the next recording: `scripts/test.sh --record-durations`."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
SLOW_S = 1.0  # seconds on one of two idle cores (the suite's own setting), setup included


def recorded() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help="write each test's time to tests/durations.json at the end of the run")


def pytest_collection_modifyitems(config, items):
    times = recorded()
    for item in items:
        if times.get(item.nodeid, 0.0) >= SLOW_S:
            item.add_marker(pytest.mark.slow)
    items[:] = longest_files_first(items, times)


def longest_files_first(items, times: dict[str, float]) -> list:
    """The items file by file, the files in order of their recorded time, longest first (each
    file's own order kept). Under `-n 2 --dist loadfile` a worker takes a whole file at a time in
    this order, so no long file starts last with the other worker idle; every worker computes
    the same order, as xdist requires."""
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    total = {f: sum(times.get(i.nodeid, 0.0) for i in its) for f, its in by_file.items()}
    return [i for f in sorted(by_file, key=lambda f: -total[f]) for i in by_file[f]]


class Recorder:
    """Sums each test's phases as the reports arrive (in the controller, under xdist too)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = collections.defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.times[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session) -> None:
        if hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes
            return
        times = {**recorded(), **{k: round(v, 2) for k, v in self.times.items()}}
        DURATIONS.write_text(json.dumps(dict(sorted(times.items())), indent=0) + "\n")


def pytest_configure(config):
    if config.getoption("--record-durations", default=False):
        config.pluginmanager.register(Recorder(), "durations-recorder")
