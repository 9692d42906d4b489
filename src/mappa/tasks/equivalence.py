"""Symbolic answer equivalence (Hugging Face ``math-verify``) under a hard time limit.

``math-verify`` parses LaTeX into sympy and compares expressions; its own time limit uses
``SIGALRM``, which only works in the main thread and cannot interrupt C code: comparing
against ``10^{10^{10}}`` hangs in a big-integer power for minutes (measured here). So
the comparison runs in one long-lived worker process that is killed and restarted when a
call overruns. The worker starts on first use (about a second: it imports sympy) and most
gradings never need it, because plain numbers are compared in-process first
(``mappa.tasks.math``).

The worker is a fresh interpreter started with ``python -c`` and a few lines of source
(``_WORKER_SOURCE``), not a ``multiprocessing`` child: a spawned child re-imports the
caller's ``__main__``, so a plain script without an ``if __name__ == "__main__"`` guard
would run again in it and fail; a forked one would inherit torch threads and sandbox pipes.
It imports nothing of ours, only ``math_verify``, on the parent's ``sys.path``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time

log = logging.getLogger(__name__)

_WORKER_SOURCE = r"""
import json, logging, os, sys
sys.path[:] = json.loads(sys.argv[1])
out = os.fdopen(os.dup(1), "w", buffering=1)  # replies only; stray prints go to stderr
os.dup2(2, 1)
# Timeouts are the parent's (it kills this process); math-verify warns when its are off.
logging.getLogger("math_verify").setLevel(logging.ERROR)
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

targets = [LatexExtractionConfig(boxed_match_priority=-1), ExprExtractionConfig()]

def equal(gold, predicted):
    g = parse(f"${gold}$", extraction_config=targets, parsing_timeout=None)
    p = parse(f"${predicted}$", extraction_config=targets, parsing_timeout=None)
    return bool(g and p and verify(g, p, timeout_seconds=None))

out.write("ready\n")
for line in sys.stdin:
    gold, predicted = json.loads(line)
    try:
        verdict = equal(gold, predicted)
    except Exception:  # an unparseable answer is simply not equal
        verdict = False
    out.write("1\n" if verdict else "0\n")
"""


class _Worker:
    """One ``python -c`` process, restarted after a timeout; calls are serialized by a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._warm = False  # the worker has answered once: its imports are done

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self.stop()
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_SOURCE, json.dumps(sys.path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        return self._proc

    def stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
        self._proc, self._buffer, self._warm = None, b"", False

    def _line(self, proc: subprocess.Popen[bytes], deadline: float) -> str | None:
        """The worker's next reply line, or None when it did not come by ``deadline``."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:  # the worker died
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def _ask(self, gold: str, predicted: str, timeout_s: float) -> str | None:
        proc = self._start()
        assert proc.stdin is not None
        proc.stdin.write((json.dumps([gold, predicted]) + "\n").encode())
        proc.stdin.flush()
        if not self._warm:  # the first call also waits for the worker's imports
            self._warm = self._line(proc, time.monotonic() + 30.0 + timeout_s) == "ready"
        return self._line(proc, time.monotonic() + timeout_s) if self._warm else None

    def equal(self, gold: str, predicted: str, timeout_s: float) -> bool | None:
        """True when equivalent, False when not, None when no verdict came within
        ``timeout_s`` (the worker is then restarted)."""
        with self._lock:
            try:
                reply = self._ask(gold, predicted, timeout_s)
            except OSError:  # the worker died between calls (a closed pipe): once more
                self.stop()
                reply = self._ask(gold, predicted, timeout_s)
            if reply in ("0", "1"):
                return reply == "1"
            log.warning(
                "answer comparison timed out after %.1fs: %r vs %r", timeout_s, predicted, gold
            )
            self.stop()
            return None


_WORKER = _Worker()
atexit.register(_WORKER.stop)


def equivalent(gold: str, predicted: str, timeout_s: float) -> bool | None:
    r"""Whether two LaTeX answers are mathematically equal (sympy); None when that could not
    be decided within ``timeout_s``.

    >>> equivalent(r"2\sqrt{3}", r"\sqrt{12}", 5.0)
    True
    """
    return _WORKER.equal(gold, predicted, timeout_s)
