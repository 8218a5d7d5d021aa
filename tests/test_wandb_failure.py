"""wandb unreachable or misconfigured: one warning line on stderr, training and local results go on.

Each test runs the real CLI with wandb online against 127.0.0.1 only: a closed port, no API key,
or a server that answers wandb.init and then goes away. Everything that could reach outside
(error reporting, system/machine probes, proxies, a user's wandb settings) is turned off in the
child's environment. (conftest's run_harness forces WANDB_MODE=disabled, so it is not used here.)

What is timed is the harness's own wandb deadline, read off the run's output: a finish that
cannot reach its server ends within its limit after the run's results are written. The whole
process gets a generous limit that only a real hang reaches (a finish without a limit retries for
many minutes): starting Python, torch and wandb on a loaded two-core machine takes what it takes.
"""
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_API_KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 characters, like a real key
# A short finish limit keeps the lost-server test fast; init gets a long one, so that a busy
# machine starting wandb's service never reads as a timeout (a refused connection or a missing
# key fails at once). The logger's own defaults (30 s / 60 s) apply to real runs.
TIMEOUT_S = 3
INIT_TIMEOUT_S = 120
UNREACHABLE_INIT_S = 20
HANG_S = 600     # the whole process: only a hang gets here, however busy the machine
SLACK_S = 60     # what a busy machine may add to a wandb deadline (scheduling, wandb's own exit)
# As small as a run gets: the wandb calls, not the training, are what these tests are about.
TINY = ["task=recall", "model=elu", "trainer=debug", "trainer.max_steps=2", "trainer.eval_every=2",
        "trainer.eval_examples=8", "model.d_model=16", "model.n_layers=1", "trainer.measure=false",
        "trainer.checkpoint=false", "trainer.threads=1"]


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    stderr_at: list[tuple[float, str]]  # (when it arrived, time.time(); line) of each stderr line


def free_port() -> int:
    """A port that nothing listens on: bound once to find it, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_online(tmp_path: Path, port: int, **env_overrides: str):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env.update(
        WANDB_BASE_URL=f"http://127.0.0.1:{port}",
        WANDB_API_KEY=FAKE_API_KEY,
        WANDB_INIT_TIMEOUT=str(INIT_TIMEOUT_S),
        WANDB_FINISH_TIMEOUT=str(TIMEOUT_S),
        WANDB_ERROR_REPORTING="false",          # wandb-core's error reporting and telemetry
        WANDB__DISABLE_STATS="true",            # system metrics (cloud metadata probes)
        WANDB__DISABLE_META="true",
        WANDB__DISABLE_MACHINE_INFO="true",
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
        # No netrc, settings or cache of the user's is read or written.
        HOME=str(home), WANDB_CONFIG_DIR=str(home), WANDB_CACHE_DIR=str(home),
        WANDB_DATA_DIR=str(home),
        # ...but the fused kernel's build stays where it is: a new HOME would rebuild it (about
        # a minute of both cores) in every one of these runs.
        TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR",
                                            os.path.expanduser("~/.cache/torch_extensions")),
        PYTHONUNBUFFERED="1",
    )
    env.update(env_overrides)
    out_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *TINY, "logger=wandb", "logger.mode=online", f"out_dir={out_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[tuple[float, str]] = []
    readers = [threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True),
               threading.Thread(target=lambda: err.extend((time.time(), line) for line in proc.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the run did not end within {HANG_S} s: a wandb call hung")
    for reader in readers:
        reader.join()
    outcome = Outcome(proc.returncode, "".join(out), "".join(line for _, line in err), err)
    return outcome, out_dir


def assert_soft_failure(proc, out_dir: Path, stage: str) -> str:
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out_dir / "results.json").read_text())["status"] == "ok"
    assert (out_dir / "metrics.jsonl").read_text().strip()
    # The run's own paths are left out: a temporary directory's name may contain "wandb".
    stderr, stdout = (text.replace(str(out_dir), "<out_dir>")
                      for text in (proc.stderr, proc.stdout))
    assert "wandb" not in stdout.lower(), stdout
    about_wandb = [line for line in stderr.splitlines() if "wandb" in line.lower()]
    assert len(about_wandb) == 1, proc.stderr
    line = about_wandb[0]
    assert line.startswith(f"[harness] warning: wandb {stage} failed"), line
    return line


def test_unreachable_server_warns_once_and_training_completes(tmp_path):
    # wandb retries a refused connection until its init limit, then reports it: a limit short
    # enough to keep the test quick, long enough for a busy machine to have tried once
    proc, out_dir = run_online(tmp_path, free_port(), WANDB_INIT_TIMEOUT=str(UNREACHABLE_INIT_S))
    line = assert_soft_failure(proc, out_dir, "init")
    assert "connection refused" in line


def test_missing_api_key_warns_once_and_training_completes(tmp_path):
    proc, out_dir = run_online(tmp_path, free_port(), WANDB_API_KEY="")
    line = assert_soft_failure(proc, out_dir, "init")
    assert "API key" in line


class _AnswerOnce(http.server.BaseHTTPRequestHandler):
    """Any JSON object is enough for wandb.init's one request to succeed."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"data": {}}')

    def log_message(self, *args):
        pass


def test_server_lost_after_init_cannot_hang_finish(tmp_path):
    server = http.server.HTTPServer(("127.0.0.1", 0), _AnswerOnce)
    server.timeout = HANG_S             # handle_request gives up if no request ever comes
    port = server.server_address[1]

    def answer_once_then_close():
        server.handle_request()
        server.server_close()

    thread = threading.Thread(target=answer_once_then_close, daemon=True)
    thread.start()
    proc, out_dir = run_online(tmp_path, port)
    thread.join(timeout=60)
    line = assert_soft_failure(proc, out_dir, "finish")
    assert "Timed out" in line
    # results.json is written just before wandb's finish is called; the warning ends the finish
    warned_at = next(at for at, text in proc.stderr_at if "wandb finish failed" in text)
    finish_s = warned_at - (out_dir / "results.json").stat().st_mtime
    print(f"wandb finish gave up {finish_s:.1f} s after results.json was written (limit {TIMEOUT_S} s)")
    assert finish_s < TIMEOUT_S + SLACK_S, finish_s


def test_a_failing_call_warns_once_and_later_calls_do_nothing(monkeypatch, tmp_path, capsys):
    """log, summary and finish are guarded like init (in process, with wandb.init faked)."""
    import wandb

    from harness.outputs.wandb_logger import WandbLogger

    class BrokenRun:
        calls = 0
        summary: dict = {}

        def log(self, metrics, step):
            BrokenRun.calls += 1
            raise RuntimeError("stream closed")

        def finish(self, exit_code=0):
            raise AssertionError("finish is not called once wandb is off")

    monkeypatch.setattr(wandb, "init", lambda **kwargs: BrokenRun())
    # The logger sets these only where unset; set here, they are restored after the test.
    for var, value in (("WANDB_MODE", "disabled"), ("WANDB_INIT_TIMEOUT", "1"),
                       ("WANDB_FINISH_TIMEOUT", "1")):
        monkeypatch.setenv(var, value)
    cfg = SimpleNamespace(mode="online", project="p", entity=None, group=None, tags=[])
    logger = WandbLogger(cfg, {}, tmp_path, name="run")
    logger.log({"x": 1.0}, step=1)
    logger.log({"x": 2.0}, step=2)
    logger.summary({"accuracy": 1.0})
    logger.finish()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        "[harness] warning: wandb log failed (RuntimeError: stream closed)"), err
    assert BrokenRun.calls == 1 and BrokenRun.summary == {}
