"""Sandbox throughput: executions per second of a trivial script, per backend.

For each local backend available here (bwrap, process) it runs ``print(1)`` N times one
after another, then N times through a ``SandboxPool`` (one workspace per execution, like
the episodes of a rollout step), and N cells of one persistent interpreter. Timings on a
shared 2-core machine are noisy: run it alone and read the numbers as rough.

    .venv/bin/python benchmarks/sandbox.py [--n 100] [--pool 4] [--python PATH]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from mappa.sandbox import (
    BwrapBackend,
    Job,
    Limits,
    ProcessBackend,
    SandboxIsolationWarning,
    SandboxPool,
    Workspace,
    bwrap_problem,
)
from mappa.sandbox.backends.local import LocalBackend

CODE = "print(1)"


def rate(n: int, run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return n / (time.perf_counter() - start)


def measure(
    backend: LocalBackend, n: int, pool_size: int, root: Path
) -> tuple[float, float, float]:
    limits = Limits()
    ws = root / f"{backend.name}-seq"

    def sequential() -> None:
        for _ in range(n):
            assert backend.execute(CODE, ws, limits).status == "ok"

    workspaces = [Workspace(root / f"{backend.name}-e{i}") for i in range(n)]

    def pooled() -> None:
        with SandboxPool(backend, limits, size=pool_size) as pool:
            results = pool.run([Job(w, "agent", 0, [CODE]) for w in workspaces])
        assert all(r.status == "ok" for rs in results for r in rs)

    session = backend.open_session(root / f"{backend.name}-persistent", limits)

    def persistent() -> None:
        for _ in range(n):
            assert session.run(CODE).status == "ok"

    backend.execute(CODE, ws, limits)  # warm the file cache and the backend's probes
    try:
        return rate(n, sequential), rate(n, pooled), rate(n, persistent)
    finally:
        session.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="executions per measurement")
    ap.add_argument("--pool", type=int, default=4, help="pool size")
    ap.add_argument("--python", default=None, help="interpreter for the code (default: this one)")
    args = ap.parse_args()
    warnings.simplefilter("ignore", SandboxIsolationWarning)
    backends: list[LocalBackend] = []
    problem = bwrap_problem(args.python)
    if problem is None:
        backends.append(BwrapBackend(args.python))
    else:
        print(f"bwrap skipped: {problem}")
    process = ProcessBackend(args.python)
    backends.append(process)
    pool_header = f"pool({args.pool})/s"
    print(
        f"{'backend':>8} {'runs as':>14} {'sequential/s':>13} {pool_header:>12}"
        f" {'persistent/s':>13}"
    )
    with tempfile.TemporaryDirectory(prefix="mappa-bench-") as tmp:
        for backend in backends:
            seq, pool, persistent = measure(backend, args.n, args.pool, Path(tmp))
            who = "sandbox uid" if backend.runs_as_sandbox_uid() else "host uid"
            print(f"{backend.name:>8} {who:>14} {seq:>13.1f} {pool:>12.1f} {persistent:>13.1f}")


if __name__ == "__main__":
    main()
