"""What a run leaves behind: resolved config, metrics.jsonl, results.json, environment.

results.json schema (version 1) is documented in the README; analysis/loader.py reads it.
"""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from harness.errors import DamagedFile, OutputError, shown
from harness.outputs.atomic import write_text

SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"
METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"  # the resolved config, the first file a run writes
def _git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parent  # a clone: the repository; installed: not a git tree
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def env_info(device: str | None = None) -> dict[str, Any]:
    versions = {}
    for pkg in ("torch", "numpy", "scipy", "hydra-core", "omegaconf", "wandb", "pandas"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    info = {
        "device": device,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": versions["torch"],
        "git_commit": _git_commit(),
        "versions": versions,
        "cpu_threads": None,
    }
    try:
        import torch

        info["cpu_threads"] = torch.get_num_threads()
        if device and device.startswith("cuda"):
            info["device_name"] = torch.cuda.get_device_name(torch.device(device))
    except Exception:  # informational only
        pass
    return info


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every reader parses the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return _clean(value.item())
    return value


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Atomic write: a killed run never leaves a half-written results.json behind."""
    write_text(path, json.dumps(_clean(payload), indent=2, sort_keys=False) + "\n")


# A results.json the harness writes is kilobytes (a probe's table at most a few megabytes): a
# larger file is not one, and reading it whole could exhaust the memory of whoever loads it.
MAX_RESULTS_BYTES = 64 * 2**20


class DamagedResults(DamagedFile):
    """A results.json that is not one the harness wrote; ``reason`` says why, without the path."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path} is damaged: {reason}")
        self.path, self.reason = path, reason


def read_bounded(path: Path, limit: int = MAX_RESULTS_BYTES) -> bytes:
    """The bytes of ``path`` when it is a regular file (a link is followed) of at most ``limit``
    bytes, inflated when its name ends in .gz; DamagedResults otherwise: a device (/dev/zero never ends), a FIFO (a read would wait
    for a writer), a directory, a file too large. FileNotFoundError when there is nothing."""
    import stat

    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket")
        raise DamagedResults(path, f"it is {kind}, not a regular file")
    with open(path, "rb") as f:
        data = f.read(limit + 1)  # the size read is bounded even if the file grows meanwhile
    if len(data) <= limit and path.name.endswith(".gz"):
        data = _gunzip_bounded(path, data, limit)
    if len(data) > limit:
        raise DamagedResults(path, f"it holds more than {limit:,} bytes, more than any results.json")
    return data


def _gunzip_bounded(path: Path, data: bytes, limit: int) -> bytes:
    """The content of a gzip'd file (committed results: analysis.archive), at most ``limit`` + 1
    bytes of it: a small file that inflates past any results.json is not one."""
    import gzip
    import io
    import zlib

    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as inflated:
            return inflated.read(limit + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise DamagedResults(path, f"it is not a whole gzip file ({exc})") from None


def parse_results_file(path: Path) -> dict[str, Any]:
    """A results.json read (bounded, as read_bounded) and checked as the harness writes it: a JSON
    object of schema SCHEMA_VERSION. FileNotFoundError when there is none; DamagedResults (one
    line: the file and the reason) for anything else."""
    path = Path(path)
    try:
        text = read_bounded(path).decode()
    except (FileNotFoundError, DamagedResults):
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise DamagedResults(path, f"cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past what json parses
        raise DamagedResults(path, f"it is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DamagedResults(path, f"it holds a {type(data).__name__}, not a JSON object")
    schema = data.get("schema", "absent")
    if type(schema) is not int or schema != SCHEMA_VERSION:
        raise DamagedResults(path, f"'schema' is {schema!r}; this harness reads schema {SCHEMA_VERSION}")
    why = recorded_hash_differs(data)
    if why:
        raise DamagedResults(path, why)
    return data


def recorded_hash_differs(data: dict[str, Any]) -> str | None:
    """Why a results.json's identity is not its own, or None: the config it records must hash to
    the config_hash it records (what a sweep's skip check and harness.load_run match on), or the
    file was edited to describe another run than the one that wrote it."""
    from harness.config.digest import flat_config, flat_hash

    digest, recorded = data.get("config_hash"), data.get("config")
    if digest is None or not isinstance(recorded, dict):
        return None  # nothing to compare (the loader says what is wrong with a config that is no object)
    if not isinstance(digest, str):
        return f"'config_hash' is {type(digest).__name__} ({shown(repr(digest))}), not a hash"
    actual = flat_hash(flat_config(recorded))
    if actual != digest:
        return (f"'config_hash' is {shown(digest)}, but the config it records hashes to {actual}: the file "
                "was edited, or holds the parts of two runs")
    return None


def parse_results(run_dir: Path) -> dict[str, Any] | None:
    """A run's results.json (parse_results_file), None if there is none."""
    try:
        return parse_results_file(Path(run_dir) / RESULTS_FILE)
    except FileNotFoundError:
        return None


def read_results(run_dir: Path) -> dict[str, Any] | None:
    """A run's results.json as a dict, or None if it is missing or damaged (what a skip check
    wants: such a run is redone)."""
    try:
        return parse_results(run_dir)
    except DamagedFile:
        return None


def model_name(cfg: DictConfig) -> str:
    """model.name, or a hybrid's layers in order (harness.model.label: gated_deltanet*3+softmax);
    model.name itself for a config that builds no ModelConfig (its error is the run's)."""
    from harness.config.build import model_config
    from harness.model import label

    try:
        return label(model_config(cfg.model))
    except (ValueError, TypeError):
        return cfg.model.name


def base_results(cfg: DictConfig, flat: dict[str, Any], digest: str) -> dict[str, Any]:
    """What every results.json begins with: cfg's mode, task and model, its flat form and hash
    (a run's plan holds both: harness.config.plan)."""
    return {
        "schema": SCHEMA_VERSION,
        "mode": cfg.mode,
        "status": "ok",
        "error": None,
        "task": cfg.task.name if cfg.mode == "train" else None,
        "model": model_name(cfg),
        "config_hash": digest,
        "config": flat,
        "summary": {},
    }


def _row_step(line: str) -> int | None:
    """The step of a metrics.jsonl row; None for a line cut short by a killed process."""
    try:
        return int(json.loads(line)["step"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


class MetricsLog:
    """metrics.jsonl: one JSON line per evaluation, flushed as it is written.

    ``resume_step``: continue a resumed run's file, keeping the rows up to that step (those
    written after its checkpoint are computed again, identically)."""

    def __init__(self, path: Path, resume_step: int | None = None):
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None or not path.exists():
            self._file = open(path, "w")
            return
        kept = [line for line in path.read_text().splitlines()
                if (step := _row_step(line)) is not None and step <= resume_step]
        write_text(path, "".join(line + "\n" for line in kept))
        self._file = open(path, "a")

    def write(self, row: dict[str, Any]) -> None:
        try:
            self._file.write(json.dumps(_clean(row)) + "\n")
            self._file.flush()
        except OSError as exc:
            raise OutputError(f"cannot write {self._file.name}: {exc.strerror or exc}") from exc

    def close(self) -> None:
        self._file.close()
