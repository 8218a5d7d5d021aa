"""A derived run's source: the finished run a mode reads instead of training one.

`mode=ablate` measures a trained run (`ablate.run`); any later mode that reads a run does the same
(its config section has a `run` key, and a `trust_code` beside it). Its results describe the
source's model as it was when they were made, so its identity holds the source's: the source's
config hash and the checksum of its model.pt, as results.json records them.

- `derive(plan)`, while the plan is made (before any directory exists), reads the source's
  results.json (no weights, no import), refuses in one line a source that is no finished
  training run or whose config names code the user has not trusted (harness.outputs.trust,
  naming `<mode>.trust_code=true`), and folds the source's identity into the plan's flat config
  and hash (`source.config_hash`, `source.model_sha256`). A sweep's skip check and the check of a
  finished run in out_dir then tell an ablation of a retrained source from one of the old model.
- `open_source(plan)` loads the source for the mode (harness.load_run, the same trust) and
  refuses it if it is no longer the run the plan was made for.

A new derived mode calls `open_source(plan)` where it needs the run; nothing else.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config.digest import flat_hash
from harness.outputs.checkpoint import MODEL_FILE
from harness.outputs.paths import user_path
from harness.outputs.results import RESULTS_FILE, parse_results
from harness.outputs.trust import check_trusted

if TYPE_CHECKING:
    from harness.config.plan import RunPlan
    from harness.outputs.load import Run

PREFIX = "source."  # the flat config's keys of a source's identity (hashed with the rest)
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Source:
    """The run a derived mode reads: the key naming it (`ablate.run`), its directory, its
    identity, and whether the user trusts the code its config names."""
    key: str
    path: Path
    config_hash: str
    model_sha256: str
    trust_code: bool

    @property
    def flag(self) -> str:
        """What a refusal asks the user to set: `<mode>.trust_code=true`."""
        return f"{self.key.rsplit('.', 1)[0]}.trust_code=true"

    def identity(self) -> dict[str, str]:
        return {f"{PREFIX}config_hash": self.config_hash, f"{PREFIX}model_sha256": self.model_sha256}


def derived_section(cfg) -> str | None:
    """The config section of cfg's mode when that mode reads a run (the section has `run`)."""
    node = cfg.get(cfg.mode) if hasattr(cfg, "get") else None
    return cfg.mode if node is not None and hasattr(node, "keys") and "run" in node else None


def identity_of(results: dict[str, Any]) -> tuple[Any, Any]:
    """(config_hash, model.pt's sha256) as a run's results.json records them."""
    files = results.get("files")
    entry = files.get(MODEL_FILE) if isinstance(files, dict) else None
    return results.get("config_hash"), entry.get("sha256") if isinstance(entry, dict) else None


def read_source(cfg) -> Source | None:
    """The source of cfg's derived mode, checked (one line naming `<mode>.run` otherwise); None
    for a mode that reads no run."""
    section = derived_section(cfg)
    if section is None:
        return None
    node, key = cfg[section], f"{section}.run"
    if not node.run:
        raise ValueError(f"mode={cfg.mode} needs {key}=<a trained run's directory>")
    path = user_path(node.run)
    if not path.is_dir():
        raise ValueError(f"{key}={node.run}: not a directory")
    results = parse_results(path)  # DamagedFile naming the file when it is not a run's results
    if results is None:
        raise ValueError(f"{key}={node.run}: not a finished run (no {RESULTS_FILE} there)")
    if results.get("status") != "ok" or results.get("mode") != "train":
        state = (f"a mode={results.get('mode')} run" if results.get("status") == "ok"
                 else f"a run that did not finish (status {results.get('status')!r})")
        raise ValueError(f"{key}={node.run}: {state}, not a finished training run")
    digest, sha256 = identity_of(results)
    if not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)) or not (path / MODEL_FILE).is_file():
        raise ValueError(f"{key}={node.run}: the run kept no verifiable {MODEL_FILE} (trainer.checkpoint=false, "
                         f"or its {RESULTS_FILE} records no checksum of it)")
    trust, recorded = bool(node.get("trust_code", False)), results.get("config")
    check_trusted(recorded if isinstance(recorded, dict) else {}, trust, where=node.run,
                  flag=f"{section}.trust_code=true")
    return Source(key, path, str(digest), sha256, trust)


def derive(plan: RunPlan) -> RunPlan:
    """The plan of a derived mode with its source read and its identity in the flat config and
    the hash; any other plan as it is."""
    source = read_source(plan.cfg)
    if source is None:
        return plan
    flat = {**plan.flat, **source.identity()}
    return replace(plan, source=source, flat=flat, digest=flat_hash(flat))


def open_source(plan: RunPlan) -> Run:
    """The plan's source run, loaded (weights verified, the trust gate naming `<mode>.trust_code`);
    ValueError (one line) if it is no longer the run the plan was made for."""
    from harness.outputs.load import load_run

    source: Source = plan.source
    run = load_run(source.path, device=str(plan.device), trust_code=source.trust_code, flag=source.flag)
    now = identity_of(run.results)
    if now != (source.config_hash, source.model_sha256):
        raise ValueError(f"{source.key}={source.path}: the run there changed after this run was planned "
                         f"(config hash {source.config_hash} -> {now[0]}, model.pt {source.model_sha256[:12]} -> "
                         f"{str(now[1])[:12]}); run the command again")
    return run
