"""Symbolic answer equivalence (Hugging Face ``math-verify``) under a hard time limit.

``math-verify`` parses LaTeX into sympy and compares expressions; its own time limit uses
``SIGALRM``, which only works in the main thread and cannot interrupt C code: comparing
against ``10^{10^{10}}`` hangs in a big-integer power for minutes (measured here). So
the comparison runs in one long-lived worker process that is killed and restarted when a
call overruns. The worker starts on first use (about a second: it imports sympy) and most
gradings never need it, because plain numbers are compared in-process first
(``mappa.tasks.math``).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

log = logging.getLogger(__name__)


def _verify(gold: str, predicted: str) -> bool:
    """``predicted`` equals ``gold`` by math-verify (both LaTeX, without ``$``)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    targets = [LatexExtractionConfig(boxed_match_priority=-1), ExprExtractionConfig()]
    g = parse(f"${gold}$", extraction_config=targets, parsing_timeout=None)
    p = parse(f"${predicted}$", extraction_config=targets, parsing_timeout=None)
    return bool(g and p and verify(g, p, timeout_seconds=None))


def _serve(conn: Connection) -> None:
    """Worker loop: answer ``(gold, predicted)`` pairs until the pipe closes."""
    # Timeouts are ours (we kill this process); math-verify warns once when its are off.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    while True:
        try:
            gold, predicted = conn.recv()
        except EOFError:
            return
        try:
            conn.send(_verify(gold, predicted))
        except Exception:  # noqa: BLE001 - an unparseable answer is simply not equal
            conn.send(False)


class _Worker:
    """One spawned process, restarted after a timeout; calls are serialized by a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: BaseProcess | None = None
        self._conn: Connection | None = None
        self._warm = False  # the worker has answered once: its imports are done

    def _start(self) -> Connection:
        if self._proc is None or not self._proc.is_alive() or self._conn is None:
            # spawn, not fork: the parent may hold torch threads and open sandbox pipes.
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe()
            self._proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="math-verify")
            self._proc.start()
            child.close()
            self._conn = parent
        return self._conn

    def stop(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn, self._warm = None, None, False

    def equal(self, gold: str, predicted: str, timeout_s: float) -> bool:
        """True when equivalent; False when not, or when no verdict came within ``timeout_s``."""
        with self._lock:
            conn = self._start()
            conn.send((gold, predicted))
            # The first call also waits for the worker's imports, which are not the answer's fault.
            if conn.poll(timeout_s if self._warm else timeout_s + 30.0):
                self._warm = True
                return bool(conn.recv())
            log.warning(
                "answer comparison timed out after %.1fs: %r vs %r", timeout_s, predicted, gold
            )
            self.stop()
            return False


_WORKER = _Worker()
atexit.register(_WORKER.stop)


def equivalent(gold: str, predicted: str, timeout_s: float) -> bool:
    r"""Whether two LaTeX answers are mathematically equal (sympy), within ``timeout_s``.

    >>> equivalent(r"2\sqrt{3}", r"\sqrt{12}", 5.0)
    True
    """
    return _WORKER.equal(gold, predicted, timeout_s)
