"""Local OpenAI-compatible coach servers on loopback: llama.cpp and vLLM.

``mappa coach-serve`` starts one for the HTTP coach (``coach.backend: http``). Two kinds:

- ``LlamaCppServer``: ``llama-cpp-python``'s server over a GGUF file (extra
  ``coach-server``). It decodes several times faster on a CPU than fp32 transformers
  (docs/design.md §2), but handles one request at a time: concurrent requests queue.
- ``VllmServer``: ``vllm serve`` over a model directory (extra ``vllm``). It batches
  concurrent requests (continuous batching), so ``coach.http.concurrency`` pays.

Each keeps the server's log (its access log included) so callers (tests, benchmarks) can
count the requests that reached it.
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

SERVED_MODEL = "coach"
"""The model name both servers answer to (``coach.http.model``'s default)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalServer:
    """A server process on 127.0.0.1 started by ``command()``; ready when ``/v1/models``
    answers. ``with Server(...) as server: HttpCoachConfig(base_url=server.base_url)``."""

    name = "server"

    def __init__(self, port: int | None = None, startup_timeout_s: float = 300.0) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = Path(tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> LocalServer:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"{self.name} server not ready after {self.startup_timeout_s}s")

    def completion_requests(self) -> int:
        """Chat-completion requests the server has logged so far."""
        return self.log.read_text(errors="replace").count("POST /v1/chat/completions")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LlamaCppServer(LocalServer):
    """llama.cpp's Python server over a GGUF file.

    ``threads`` defaults to 1: on a small machine shared with a training process, ggml's
    spinning worker threads oversubscribe the cores and decoding slows down ~40x.
    """

    name = "llamacpp"

    def __init__(
        self,
        model: Path,
        n_ctx: int = 4096,
        threads: int = 1,
        startup_timeout_s: float = 120.0,
        port: int | None = None,
    ) -> None:
        super().__init__(port, startup_timeout_s)
        self.model = model
        self.n_ctx = n_ctx
        self.threads = threads

    def command(self) -> list[str]:
        return [
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
            SERVED_MODEL,
        ]


class VllmServer(LocalServer):
    """vLLM's OpenAI-compatible server over a Hugging Face model directory, in float32.

    ``kv_cache_gib`` sizes the KV cache (on the CPU build, ``VLLM_CPU_KVCACHE_SPACE``): vLLM
    otherwise reserves a share of the whole host memory.
    """

    name = "vllm"

    def __init__(
        self,
        model: Path,
        max_model_len: int = 4096,
        kv_cache_gib: float = 1.0,
        startup_timeout_s: float = 600.0,
        port: int | None = None,
    ) -> None:
        super().__init__(port, startup_timeout_s)
        self.model = model
        self.max_model_len = max_model_len
        self.kv_cache_gib = kv_cache_gib

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            # the OpenAI server module, not the `vllm` CLI: that reads the version of a
            # distribution named "vllm", and the CPU build's is "vllm-cpu"
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            SERVED_MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            "float32",
            "--kv-cache-memory-bytes",
            str(int(self.kv_cache_gib * 2**30)),
        ]


SERVER_KINDS = {"llamacpp": ("llama_cpp", "install-coach-server"), "vllm": ("vllm", "install-vllm")}
"""Server kind -> (the module it needs, the make target that installs it)."""


def make_server(
    kind: str,
    model: str,
    max_model_len: int = 4096,
    threads: int = 1,
    kv_cache_gib: float = 1.0,
    port: int | None = None,
) -> LocalServer:
    """A server of ``kind`` (``llamacpp`` | ``vllm``) over ``model``, not started yet.

    ``model``: ``pypi:<package>`` (a known GGUF package), or a GGUF file (llamacpp) or a model
    directory (vllm). Raises ``ValueError``/``OSError`` naming the problem: the server is not
    installed, or the model is not what the server reads (checked before anything starts).
    """
    import importlib.util

    from mappa.models.packages import gguf_path

    if kind not in SERVER_KINDS:
        raise ValueError(f"coach server {kind!r}: not one of {sorted(SERVER_KINDS)}")
    module, target = SERVER_KINDS[kind]
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"the {kind} server is not installed; run `make {target}`")
    if kind == "llamacpp":
        try:
            gguf = gguf_path(model)
        except FileNotFoundError:
            raise FileNotFoundError(f"coach server model {model}: no such GGUF file") from None
        return LlamaCppServer(gguf, max_model_len, threads, port=port)
    from mappa.models.loading import resolve_model_path

    model_dir = Path(resolve_model_path(model))
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"coach server model {model}: not a model directory")
    return VllmServer(model_dir, max_model_len, kv_cache_gib, port=port)
