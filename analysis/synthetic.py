"""Synthetic runs in results.json's layout, for drawing a figure without training anything.

A figure declares beside itself the runs its tests draw it from (``FigureSpec(synthetic=...)``,
a function of a numpy Generator returning payloads built with :func:`result`);
tests/fixtures/make_results.py writes them as a sweep, as it writes the built-in figures' own.
"""
from __future__ import annotations

ENV = {"device": "cpu", "torch": "2.13.0", "python": "3.11.7", "git_commit": None,
       "versions": {"numpy": "2.0"}}


def result(mode: str, task: str, model: str, config: dict, summary: dict | None = None,
           *, status: str = "ok", error: str | None = None, **tables) -> dict:
    """A results.json payload; ``config`` holds flat keys (model.d_model, ...), ``tables`` the
    list-valued top-level keys (slices=[...], ...)."""
    config = {"task.name": task, "model.name": model, "seed": 0, **config}
    out = {"schema": 1, "mode": mode, "status": status, "error": error, "task": task,
           "model": model, "config": config, "summary": summary or {}, "env": ENV}
    out.update(tables)
    return out
