"""Resumable training checkpoints: everything a run needs to continue bit for bit.

A checkpoint holds the model, optimiser and scheduler states, every random number generator
and the loop's own state (step, the running loss, the last evaluation). The data needs no
state of its own: training batch i is a pure function of (seed, i) (see
`harness.train.loop.train_batches`), so the step is the data position.

It is written atomically (temporary file, fsync, rename), so a run killed at any moment leaves
the previous checkpoint or the new one, and it loads with ``weights_only=True``: only tensors
and plain containers, never pickled code.
"""
from __future__ import annotations

import random
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from harness.outputs.results import atomic_write, config_hash, flat_config, hashed_items, read_results

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 1


def rng_state() -> dict[str, Any]:
    """Every generator a training step may draw from, as tensors and plain containers."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(_as_tuples(state["python"]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


def _as_tuples(value: Any) -> Any:
    """random.setstate wants the nested tuples getstate gave (serialisation may give lists)."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def save(path: Path, payload: dict[str, Any]) -> None:
    atomic_write(path, lambda tmp: torch.save(payload, tmp))


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=map_location, weights_only=True)


def _differences(saved: dict[str, Any], now: dict[str, Any], limit: int = 3) -> str:
    keys = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    shown = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def find_resume(cfg: DictConfig, out_dir: Path) -> dict[str, Any] | None:
    """The checkpoint this run continues from (loaded), or None for a fresh start.

    `trainer.resume=<dir>` demands one (the run continues in that directory); otherwise a
    checkpoint already in out_dir is picked up, so rerunning a killed command continues it.
    Either way the checkpoint must belong to this configuration: a different one is refused
    with the keys that differ, rather than silently mixing two runs.
    """
    path = Path(out_dir) / CHECKPOINT_FILE
    if not path.exists():
        if cfg.trainer.resume:
            done = read_results(Path(out_dir))
            why = ("the run there has finished (results.json status ok)"
                   if done and done.get("status") == "ok" else f"no {CHECKPOINT_FILE} there")
            raise ValueError(f"trainer.resume={cfg.trainer.resume}: nothing to resume, {why}")
        return None
    saved = load(path)
    if saved.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {saved.get('format')!r}, expected {FORMAT}; "
                         "delete it to start over")
    if saved["config_hash"] != config_hash(cfg):
        diff = _differences(hashed_items(saved["config"]), hashed_items(flat_config(cfg)))
        raise ValueError(f"{path} belongs to another configuration ({diff}); use another out_dir, "
                         f"or delete the checkpoint to start over")
    return saved


def resume_dir(cfg: DictConfig) -> Path | None:
    """`trainer.resume` as a directory, checked before anything runs."""
    if not cfg.trainer.resume:
        return None
    path = Path(cfg.trainer.resume)
    if not path.is_dir():
        raise ValueError(f"trainer.resume={cfg.trainer.resume}: not a directory")
    return path



class TerminationRequest:
    """SIGTERM (a cluster pre-empting or cancelling the job) sets ``requested``; the training
    loop then checkpoints after the current step and stops, so the rerun loses no work.
    Only the main thread can own a signal handler; elsewhere this never fires."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._request)

    def _request(self, signum, frame) -> None:
        self.requested = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
