"""wandb unreachable or misconfigured: one warning line on stderr, training and local results go on.

Each test runs the real CLI with wandb online against 127.0.0.1 only: a closed port, no API key,
or a server that answers wandb.init and then goes away. Everything that could reach outside
(error reporting, system/machine probes, proxies, a user's wandb settings) is turned off in the
child's environment. (conftest's run_harness forces WANDB_MODE=disabled, so it is not used here.)
"""
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
FAKE_API_KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 characters, like a real key
# Short limits keep these tests fast; the logger's own defaults (30 s / 60 s) apply to real runs.
TIMEOUT_S = 3


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
        WANDB_INIT_TIMEOUT=str(TIMEOUT_S),
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
        PYTHONUNBUFFERED="1",
    )
    env.update(env_overrides)
    out_dir = tmp_path / "run"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "task=recall", "model=elu", "trainer=debug",
         "trainer.measure=false", "trainer.checkpoint=false",
         "logger=wandb", "logger.mode=online", f"out_dir={out_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return proc, out_dir, time.monotonic() - started  # the subprocess timeout bounds a hang


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
    proc, out_dir, _ = run_online(tmp_path, free_port())  # a hang would hit the subprocess timeout
    line = assert_soft_failure(proc, out_dir, "init")
    assert "connection refused" in line


def test_missing_api_key_warns_once_and_training_completes(tmp_path):
    proc, out_dir, _ = run_online(tmp_path, free_port(), WANDB_API_KEY="")
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
    server.timeout = 60                 # handle_request gives up if no request ever comes
    port = server.server_address[1]

    def answer_once_then_close():
        server.handle_request()
        server.server_close()

    thread = threading.Thread(target=answer_once_then_close, daemon=True)
    thread.start()
    # The server answers at once; a generous init limit keeps a loaded machine from failing init.
    proc, out_dir, _ = run_online(tmp_path, port, WANDB_INIT_TIMEOUT="30")
    thread.join(timeout=60)
    line = assert_soft_failure(proc, out_dir, "finish")
    assert "Timed out" in line


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
