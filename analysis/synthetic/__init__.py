"""Synthetic runs in results.json's layout, for drawing a figure without training anything.

A figure declares beside itself the runs its tests draw it from (``FigureSpec(synthetic=...)``,
a function of a numpy Generator returning payloads built with :func:`result`);
tests/fixtures/make_results.py writes them as a sweep. The built-in figures' are here, one
module per figure module of analysis.plots, each declared on its figure by path
(``synthetic="analysis.synthetic.mqar.mqar_runs"``). Keys of a payload that start with `_` are
for the writer, not results.json: `_metrics` (metrics.jsonl's rows), `_model` (a model.pt
beside it, for a figure that reopens the run). Their numbers follow the theory loosely (accuracy
falls past N = d, SNR ~ sqrt(d/N), time ~ n or n^2) and are deterministic, so tests can assert
on them.
"""
from __future__ import annotations

import math

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


SEEDS = (0, 1, 2, 3, 4)


MIXTURE_OF = {"softmax": "softmax", "swa": "softmax", "linear": "linear", "elu": "linear",
              "favor": "linear", "taylor": "linear", "dpfp": "linear", "retnet": "decay", "mamba": "decay",
              "deltanet": "delta", "gated_deltanet": "delta"}  # summary.family, as the mixer class says


def linear_accuracy(n_over_d: float, softness: float) -> float:
    """Accuracy that holds to N ~ d and decays past it; softmax keeps it (softness 0)."""
    return float(1.0 / (1.0 + softness * n_over_d ** 1.5))


def val_curve(final: float, tau: float, stop: int, every: int = 100) -> list[dict]:
    """Validation rows of metrics.jsonl: accuracy rising to `final` with time constant `tau`."""
    return [{"step": step, "time_s": step * 0.01, "split": "val",
             "accuracy": final * (1 - math.exp(-step / tau)), "loss": 1.0}
            for step in range(every, stop + 1, every)]
