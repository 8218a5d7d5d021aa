"""Resumable training checkpoints: everything a run needs to continue bit for bit.

A checkpoint holds the model, optimiser and scheduler states, every random number generator
and the loop's own state (step, the running loss, the last evaluation). The data needs no
state of its own: training batch i is a pure function of (seed, i) (see
`harness.train.optim.train_batches`), so the step is the data position.

It is written atomically (temporary file, fsync, rename), so a run killed at any moment leaves
the previous checkpoint or the new one, and it loads with ``weights_only=True``: only tensors
and plain containers, never pickled code.

A file can still be damaged after it was written (a disk filling up while it is copied, a partial
rsync from a cluster), so the last two checkpoints are kept, and each carries a checksum of its
content in its name, `checkpoint-<step>-<sha256 prefix>.pt`, taken from the bytes on disk at
write time. Resuming verifies the newest; a damaged one is reported in one warning line and the
one before it is used. The final weights (model.pt) are verified the same way against the
checksum results.json records for them (`load_model`).
"""
from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from harness.config.digest import config_differences, hashed_items
from harness.errors import DamagedFile, OutputError, first_line, shown, warn
from harness.outputs.atomic import atomic_write, discard, temporary_path
from harness.outputs.results import RESULTS_FILE, parse_results

MODEL_FILE = "model.pt"
FORMAT = 1
KEEP = 2                        # checkpoints kept: the newest, and the one to fall back on
DIGEST_LEN = 16                 # hex digits of sha256 in a checkpoint's name (64 bits: damage, not attack)
_NAME = re.compile(r"checkpoint-(\d+)-([0-9a-f]{%d})\.pt" % DIGEST_LEN)


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


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, as hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _WriteErrors:
    """A file open for writing that keeps the first error of its writes. torch's zip writer does
    not pass a failed write on: a full disk surfaces later as "unexpected pos 289344 vs 289232"
    in a RuntimeError, and the disk's own error (ENOSPC) is only known here."""

    def __init__(self, raw: io.FileIO) -> None:
        self._raw = raw
        self.error: OSError | None = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < len(view):  # a nearly full disk takes part of a write, then refuses
                done += self._raw.write(view[done:]) or 0
        except OSError as exc:
            self.error = self.error or exc
            raise
        return done

    def flush(self) -> None:
        pass  # unbuffered


def write_tensors(payload: dict[str, Any], path: Path) -> None:
    """torch.save into a file the harness opened: a write that fails (a full disk) is the
    OSError of that write ("No space left on device"), whatever torch makes of it; any other
    RuntimeError from torch's zip writer is a failed write too (an OSError saying so)."""
    with open(path, "wb", buffering=0) as raw:
        out = _WriteErrors(raw)
        try:
            torch.save(payload, out)
        except (RuntimeError, OSError) as exc:
            if out.error is not None:
                raise out.error from None
            if isinstance(exc, OSError):
                raise
            raise OSError(errno.EIO, f"torch.save failed ({first_line(exc)})") from exc
        if out.error is not None:  # swallowed on the way and never reported: still a failed write
            raise out.error


def save(path: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """Write payload atomically; returns {"sha256", "bytes"} of what is on disk."""
    atomic_write(path, lambda tmp: write_tensors(payload, tmp))
    return {"sha256": file_digest(path), "bytes": path.stat().st_size}


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=map_location, weights_only=True)


def _load_checked(path: Path, digest: str | None, map_location="cpu") -> dict[str, Any]:
    """Load a file whose sha256 should start with (or equal) ``digest`` (None: unrecorded, only
    loading checks it); DamagedFile (one line) when it does not match or does not load."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DamagedFile(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if digest is not None:
        actual = hashlib.sha256(data).hexdigest()
        if not actual.startswith(digest):
            raise DamagedFile(f"{path} is damaged: its content does not match the checksum recorded "
                              f"when it was written ({len(data):,} bytes, sha256 {actual[:DIGEST_LEN]} "
                              f"instead of {digest[:DIGEST_LEN]})")
    try:
        payload = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as exc:  # a truncated zip, a bad pickle: whatever torch says, one line
        raise DamagedFile(f"{path} is damaged: it does not load ({first_line(exc, 160)})") from None
    if not isinstance(payload, dict):
        raise DamagedFile(f"{path} is damaged: it holds a {type(payload).__name__}, not a dict")
    return payload


# ----- training checkpoints ----------------------------------------------------------------------


def _checkpoint_names(out_dir: Path) -> list[tuple[str, bool]]:
    """(name, is a file) of every entry of out_dir named as a checkpoint is."""
    try:
        with os.scandir(out_dir) as entries:
            return [(e.name, e.is_file()) for e in entries if _NAME.fullmatch(e.name)]
    except OSError:
        return []


def checkpoint_files(out_dir: Path) -> list[tuple[int, Path, str]]:
    """(step, path, digest) of every checkpoint in out_dir, newest first. Only files count: a directory that
    carries a checkpoint's name (a copy gone wrong) is no checkpoint, and never removed."""
    out_dir = Path(out_dir)
    names = [name for name, is_file in _checkpoint_names(out_dir) if is_file]
    found = [(int(m.group(1)), out_dir / name, m.group(2)) for name in names if (m := _NAME.fullmatch(name))]
    found.sort(key=lambda f: f[0], reverse=True)
    return found


def not_checkpoints(out_dir: Path) -> list[Path]:
    """Entries of out_dir that carry a checkpoint's name but are not files (directories)."""
    return [Path(out_dir) / name for name, is_file in _checkpoint_names(out_dir) if not is_file]


def latest_checkpoint(out_dir: Path) -> Path | None:
    files = checkpoint_files(out_dir)
    return files[0][1] if files else None


def save_checkpoint(out_dir: Path, step: int, payload: dict[str, Any]) -> Path | None:
    """Write the checkpoint of ``step`` (checksum in its name), then keep only the newest KEEP.

    The bytes go to a temporary file, are synced, hashed as they are on disk and renamed to the
    name that carries the hash: a kill at any moment leaves the previous checkpoints as they
    were (and at worst a stray temporary file, replaced by the next write). A failed write (a
    full disk) removes its temporary file and is an OutputError naming the directory. If a
    directory already holds this checkpoint's name, the checkpoint is not kept (one warning;
    None), and the run goes on with the ones it has."""
    out_dir = Path(out_dir)
    tmp = out_dir / "checkpoint.tmp"
    try:
        tmp = temporary_path(out_dir / "checkpoint")
        write_tensors(payload, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        path = out_dir / f"checkpoint-{step:08d}-{file_digest(tmp)[:DIGEST_LEN]}.pt"
        if os.path.lexists(path) and not path.is_file():
            discard(tmp)
            warn(f"{path} is a directory, not a checkpoint: the checkpoint of step {step} is not kept "
                 "(move that directory away)")
            return None
        os.replace(tmp, path)
        for _, old, _ in checkpoint_files(out_dir)[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        discard(tmp)
        raise OutputError(f"cannot write a checkpoint in {out_dir}: {exc.strerror or exc}") from exc
    return path


def remove_checkpoints(out_dir: Path) -> None:
    """A finished run's checkpoints (model.pt and results.json replace them), and any temporary
    file a killed write left."""
    for _, path, _ in checkpoint_files(out_dir):
        path.unlink(missing_ok=True)
    for tmp in (Path(out_dir) / "checkpoint.tmp", *Path(out_dir).glob(".checkpoint.*.tmp")):
        discard(tmp)


# ----- final weights -----------------------------------------------------------------------------


def save_model(run_dir: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """Write model.pt; returns its {"sha256", "bytes"} for results.json's "files" record."""
    return save(Path(run_dir) / MODEL_FILE, payload)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def recorded_digest(run_dir: Path, name: str = MODEL_FILE,
                    results: dict[str, Any] | None = None) -> str | None:
    """The sha256 results.json records for one of the run's files; None when it records none
    (no results.json, or one written before checksums were recorded: a warning says the file
    is loaded unverified). DamagedFile (one line) when results.json is damaged or its record
    is not a sha256: a check cannot switch itself off. ``results``: results.json, already read."""
    run_dir = Path(run_dir)
    if results is None:
        results = parse_results(run_dir)
    if results is None or "files" not in results:
        where = f"no {RESULTS_FILE} beside it" if results is None else f"{RESULTS_FILE} records no checksums"
        warn(f"{run_dir / name} is loaded unverified: {where} (a run written before checksums were "
             "recorded, or the files of a run put together by hand)")
        return None
    files = results["files"]
    entry = files.get(name) if isinstance(files, dict) else None
    digest = entry.get("sha256") if isinstance(entry, dict) else None
    if not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
        got = (f"'files' is a {type(files).__name__}" if not isinstance(files, dict) else
               f"it has no entry for {name}" if entry is None else
               f"files.{name}.sha256 is {shown(repr(digest))}")
        raise DamagedFile(f"{run_dir / RESULTS_FILE} is damaged: its checksum record for {name} is not a "
                          f"sha256 ({got}), so {name} cannot be verified")
    return digest


def load_model(path: Path, map_location: str | torch.device = "cpu", *,
               results: dict[str, Any] | None = None) -> dict[str, Any]:
    """A finished run's model.pt ({"model": state dict, "config": ...}), loaded with
    ``weights_only=True`` and verified against the checksum its results.json records (see
    `recorded_digest`: none recorded is a warning). ``path``: the file or its run directory;
    ``results``: its results.json, already read. DamagedFile (a ValueError, one line) if it is
    missing or damaged."""
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    if not path.is_file():
        raise DamagedFile(f"{path}: no such file (the run kept no weights: trainer.checkpoint=false, "
                          "or it did not finish)")
    payload = _load_checked(path, recorded_digest(path.parent, path.name, results), map_location)
    if not isinstance(payload.get("model"), dict):
        raise DamagedFile(f"{path} is damaged: it holds no 'model' state dict")
    if not isinstance(payload.get("config"), dict):
        raise DamagedFile(f"{path} is damaged: it holds no 'config' mapping")
    return payload


def damaged_outputs(run_dir: Path, results: dict[str, Any]) -> str | None:
    """Why a run's recorded outputs cannot be trusted (one line), or None: every file that
    results.json lists under "files" must be there with its recorded checksum."""
    files = results.get("files") or {}
    if not isinstance(files, dict):
        return f"{Path(run_dir) / RESULTS_FILE}: 'files' is not a mapping"
    for name, entry in files.items():
        path = Path(run_dir) / name
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if not path.exists():
            return f"{path} is missing"
        if digest is None or file_digest(path) != digest:
            return f"{path} is damaged: its content does not match the checksum in {RESULTS_FILE}"
    return None


def find_resume(resume: str | None, flat: dict[str, Any], digest: str, out_dir: Path) -> dict[str, Any] | None:
    """The checkpoint this run continues from (loaded), or None for a fresh start.

    `trainer.resume=<dir>` (``resume``) demands one (the run continues in that directory);
    otherwise a checkpoint already in out_dir is picked up, so rerunning a killed command
    continues it. Either way the checkpoint must belong to this configuration (its flat form and
    hash: ``flat``, ``digest``): a different one is refused with the keys that differ, rather
    than silently mixing two runs.
    """
    for odd in not_checkpoints(out_dir):
        warn(f"{odd} is a directory, not a checkpoint: ignored")
    files = checkpoint_files(out_dir)
    if not files:
        if resume:
            raise ValueError(f"trainer.resume={resume}: nothing to resume, {_why_nothing(Path(out_dir))}")
        return None
    path, saved, damaged = _first_usable(files)
    if saved is None:
        names = ", ".join(p.name for _, p, _ in files)
        raise ValueError(f"no usable checkpoint in {out_dir}: {names} {'is' if len(files) == 1 else 'are all'} "
                         f"damaged ({damaged[0]}); resume from a good copy with trainer.resume=<its run dir>, "
                         f"or move {out_dir} aside to start over")
    if damaged:
        warn(f"{damaged[0]}; resuming from the previous checkpoint {path.name} instead")
    saved["path"] = str(path)
    if saved.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {saved.get('format')!r}, expected {FORMAT}; "
                         "delete it to start over")
    if saved.get("config_hash") != digest:
        recorded = saved.get("config") if isinstance(saved.get("config"), dict) else {}
        diff = config_differences(hashed_items(recorded), hashed_items(flat))
        raise ValueError(f"{path} belongs to another configuration ({diff}); use another out_dir, "
                         f"or delete the checkpoint to start over")
    return saved


def _first_usable(files) -> tuple[Path | None, dict[str, Any] | None, list[str]]:
    """The newest checkpoint that verifies and loads: (path, payload, why each newer one failed)."""
    damaged = []
    for _, path, digest in files:
        try:
            return path, _load_checked(path, digest), damaged
        except DamagedFile as exc:
            damaged.append(str(exc))
    return None, None, damaged


def resume_dir(cfg: DictConfig) -> Path | None:
    """`trainer.resume` as a directory, checked before anything runs."""
    from harness.outputs.paths import user_path

    if not cfg.trainer.resume:
        return None
    path = user_path(cfg.trainer.resume)
    if not path.is_dir():
        raise ValueError(f"trainer.resume={cfg.trainer.resume}: not a directory")
    if not checkpoint_files(path):  # refused before the run claims (writes its lock into) the directory
        raise ValueError(f"trainer.resume={cfg.trainer.resume}: nothing to resume, {_why_nothing(path)}")
    return path


def _why_nothing(run_dir: Path) -> str:
    """Why a directory named by trainer.resume holds nothing to resume."""
    try:
        done = parse_results(run_dir)
    except DamagedFile:
        done = {}
    if done and done.get("status") == "ok":
        return "the run there has finished (results.json status ok)"
    if done is not None or (run_dir / "config.yaml").is_file():
        return "no checkpoint there"
    return ("no checkpoint there: it is not a harness run directory (no checkpoint, config.yaml or "
            f"{RESULTS_FILE})")
