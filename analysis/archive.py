"""Committed results: a finished profile's runs copied into the repository, gzip'd, without weights.

    python -m analysis.archive results/findings docs/results/findings --profile findings
    python -m analysis.figures --results docs/results/findings --out figs   # every CSV again

For every run directory under the source (one holding a results.json), the files the figures
read are copied, each gzip'd beside its relative path: ``results.json``, the resolved
``config.yaml``, ``metrics.jsonl`` (learning curves) and Hydra's ``.hydra/overrides.yaml``
(what the rate pilot reads); checkpoints, model.pt, logs and locks are left behind. The gzip
streams carry no time stamp, so copying the same results twice gives the same bytes (a commit
changes only what changed). ``MANIFEST`` names the profile, so that `--results` draws that
profile's figures; the loader (analysis.loader) reads the .gz files as the plain ones, so every
CSV drawn from the copy is, byte for byte, the one drawn from the source.

The copy is built beside the destination and renamed into place: a command killed half-way
leaves the previous copy whole.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

from analysis.loader import GZ, METRICS_FILE, RESULTS_FILE, NoResultsError, find_results

MANIFEST = "MANIFEST.json"
# What each run keeps, relative to its directory: the figures read nothing else.
KEPT = (RESULTS_FILE, "config.yaml", METRICS_FILE, ".hydra/overrides.yaml")


def run_files(source: Path) -> list[Path]:
    """The files to keep under ``source``, relative to it, in a stable order."""
    out = []
    for results in find_results(source):
        run_dir = results.parent
        for name in KEPT:
            if (run_dir / name).is_file():
                out.append((run_dir / name).relative_to(source))
            elif (run_dir / f"{name}{GZ}").is_file():  # an archive archived again
                out.append((run_dir / f"{name}{GZ}").relative_to(source))
    return sorted(set(out))


def gzip_bytes(data: bytes) -> bytes:
    """``data`` gzip'd with no name and no time stamp: the same input, the same bytes."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def copy_results(source: Path, dest: Path, profile: str) -> dict:
    """Copy ``source``'s run files into ``dest`` (replacing what was there), each gzip'd; returns
    the manifest written there."""
    source, dest = Path(source), Path(dest)
    files = run_files(source)
    staging = dest.with_name(f".{dest.name}.staging")
    if staging.exists():
        shutil.rmtree(staging)
    experiments: dict[str, int] = {}
    for rel in files:
        raw = (source / rel).read_bytes()
        name = rel.name if rel.name.endswith(GZ) else f"{rel.name}{GZ}"
        target = staging / rel.parent / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(raw if rel.name.endswith(GZ) else gzip_bytes(raw))
        if rel.name.startswith(RESULTS_FILE):  # a run, counted under its experiment's folder
            experiment = rel.parts[0] if len(rel.parts) > 1 else "."
            experiments[experiment] = experiments.get(experiment, 0) + 1
    manifest = {"profile": profile, "runs": sum(experiments.values()), "files": len(files),
                "experiments": dict(sorted(experiments.items()))}
    staging.mkdir(parents=True, exist_ok=True)
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    old = dest.with_name(f".{dest.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if dest.exists():
        dest.rename(old)
    staging.rename(dest)
    if old.exists():
        shutil.rmtree(old)
    return manifest


def profile_of(results: Path) -> str | None:
    """The profile committed results say they are (their MANIFEST), or None."""
    try:
        return json.loads((Path(results) / MANIFEST).read_text()).get("profile")
    except (OSError, ValueError, AttributeError):
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.archive", description=__doc__.split("\n")[0])
    parser.add_argument("source", help="a finished profile's results (results/findings)")
    parser.add_argument("dest", help="the folder to commit (docs/results/findings); replaced")
    parser.add_argument("--profile", default="findings", help="the profile the results are (default findings)")
    args = parser.parse_args(argv)
    source, dest = Path(args.source), Path(args.dest)
    if source.resolve() == dest.resolve():
        print("python -m analysis.archive: error: the source and the destination are one folder", file=sys.stderr)
        return 2
    try:
        manifest = copy_results(source, dest, args.profile)
    except NoResultsError as err:
        print(f"python -m analysis.archive: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"python -m analysis.archive: error: cannot write {dest}: {err.strerror or err}", file=sys.stderr)
        return 1
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"copied {manifest['runs']} runs ({manifest['files']} files, {size / 2**20:.1f} MiB gzip'd) "
          f"of the {args.profile} profile to {dest}: " +
          ", ".join(f"{name} {n}" for name, n in manifest["experiments"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
