"""Run llama.cpp's OpenAI-compatible server on loopback for a local GGUF coach.

llama.cpp decodes several times faster on a CPU than fp32 transformers (docs/design.md §2), so
this is the practical way to run a real coach model on a laptop. Needs the optional extra
``llama-cpp-python[server]`` (``pip install 'mappa[coach-server]'``). The server's access
log is kept so callers (tests, benchmarks) can count the requests that reached it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaCppServer:
    """``with LlamaCppServer(gguf) as server: HttpCoachConfig(base_url=server.base_url)``.

    ``threads`` defaults to 1: on a small machine shared with a training process, ggml's
    spinning worker threads oversubscribe the cores and decoding slows down ~40x.
    """

    def __init__(
        self, model: Path, n_ctx: int = 4096, threads: int = 1, startup_timeout_s: float = 120.0
    ) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.threads = threads
        self.startup_timeout_s = startup_timeout_s
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = Path(tempfile.mkstemp(prefix="llamacpp-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LlamaCppServer:
        cmd = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            str(self.threads),
            "--model_alias",
            "coach",
        ]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"llama.cpp server not ready after {self.startup_timeout_s}s")

    def completion_requests(self) -> int:
        """Chat-completion requests the server has logged so far."""
        return self.log.read_text(errors="replace").count("POST /v1/chat/completions")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> LlamaCppServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
