"""Set-up and installation: the torch build chosen per machine, and the package installed from a
wheel into a fresh environment, run from an unrelated directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHOOSE = ROOT / "scripts" / "choose_torch.py"


def chosen(cuda: str, reachable: str) -> tuple[str, str]:
    env = {**os.environ, "HARNESS_TORCH_CUDA": cuda, "HARNESS_CPU_INDEX_REACHABLE": reachable}
    out = subprocess.run([sys.executable, str(CHOOSE)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), out.stderr.strip()


def test_a_cpu_machine_takes_the_cpu_wheel_index():
    args, why = chosen("0", "1")
    assert args == "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert "no CUDA device" in why


def test_a_cpu_machine_without_that_index_falls_back_to_the_configured_one():
    args, why = chosen("0", "0")
    assert args == "torch==2.13.0" and "unreachable" in why


def test_a_cuda_machine_takes_a_cuda_build():
    args, why = chosen("1", "0")
    assert args == "torch" and "CUDA device found" in why


FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for the venv's python: imports fail until "installed", pip is noisy, may fail
case "$*" in
  *"-m pip install"*)
    echo "WARNING: Location 'file:///opt/pypi/x/' is ignored" >&2
    echo "Collecting torch"
    [ -n "${FAKE_PIP_FAILS:-}" ] && { echo "ERROR: no matching distribution for torch" >&2; exit 1; }
    touch "$(dirname "$0")/../installed"; exit 0 ;;
  *"import torch"*) [ -f "$(dirname "$0")/../installed" ] ;;
  *) exit 0 ;;
esac
"""


def fake_setup(tmp_path, **env):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    env = {**os.environ, "HARNESS_VENV": str(venv), "HARNESS_TORCH_CUDA": "0", "HARNESS_CPU_INDEX_REACHABLE": "0",
           **env}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env), venv


def test_setup_prints_only_its_own_lines(tmp_path):
    out, venv = fake_setup(tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert lines and all(line.startswith("[setup]") for line in lines), lines
    assert any("torch==2.13.0 from the configured index" in line for line in lines)
    assert "is ignored" in (venv / "setup.log").read_text()  # pip's noise went to the log


def test_a_failing_setup_step_shows_the_end_of_its_log(tmp_path):
    out, _ = fake_setup(tmp_path, FAKE_PIP_FAILS="1")
    assert out.returncode == 1
    assert "[setup] failed:" in out.stderr and "no matching distribution for torch" in out.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh virtual environment with the harness installed from a wheel; its dependencies
    (torch among them) are this environment's, on the path through a .pth line, so nothing is
    downloaded and the editable install of the checkout is not seen."""
    import shutil

    base = tmp_path_factory.mktemp("install")
    source, wheels = base / "source", base / "wheels"  # built from a copy: setuptools writes build/ beside it
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for part in ("harness", "analysis"):
        shutil.copytree(ROOT / part, source / part, ignore=skip)
    for part in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / part, source / part)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    wheel = next(wheels.glob("recall_harness-*.whl"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    inst = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                           str(wheel)], capture_output=True, text=True, timeout=600)
    if inst.returncode != 0 and "no such option: --python" in inst.stderr:  # older pip: unpack the wheel
        import zipfile

        zipfile.ZipFile(wheel).extractall(site)
    elif inst.returncode != 0:
        raise AssertionError(inst.stderr)
    return python


def test_the_installed_package_runs_from_an_unrelated_directory(installed, tmp_path):
    where = subprocess.run([str(installed), "-c", "import harness; print(harness.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert where.returncode == 0 and ROOT.as_posix() not in where.stdout, where.stdout + where.stderr
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": ""}
    out = tmp_path / "run"
    run = subprocess.run([str(installed), "-m", "harness", "trainer=debug", "trainer.max_steps=1", "logger=none",
                          f"out_dir={out}"], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "results.json").read_text())["status"] == "ok"


def test_an_outside_mixer_with_the_installed_package(installed, tmp_path):
    (tmp_path / "mine.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn

        class Mean(nn.Module):
            def __init__(self, d_model):
                super().__init__()
                self.proj = nn.Linear(d_model, d_model)

            def forward(self, x):
                return self.proj(x).cumsum(1) / torch.arange(1, x.shape[1] + 1)[:, None]
        '''))
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": ""}
    out = tmp_path / "run"
    run = subprocess.run([str(installed), "-m", "harness", "model.name=mine.Mean", "trainer=debug",
                          "trainer.max_steps=1", "logger=none", f"out_dir={out}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr
    res = json.loads((out / "results.json").read_text())
    # no effective_weights: sharpness comes from the black-box Jacobian estimate
    assert res["model"] == "mine.Mean" and res["measure"]["sharpness"] == "jacobian estimate"


def test_conf_and_tasks_at_the_top_are_links_into_the_package():
    for name in ("conf", "tasks"):
        link = ROOT / name
        assert link.is_symlink() and not Path(os.readlink(link)).is_absolute(), link
        assert link.resolve() == (ROOT / "harness" / name).resolve()
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-s", "conf", "tasks"], capture_output=True,
                            text=True, timeout=60)
    if listed.returncode == 0 and listed.stdout:  # a git checkout: stored as links (mode 120000)
        assert [line.split()[0] for line in listed.stdout.splitlines()] == ["120000", "120000"]
