"""OpenAI-compatible chat-completions coach (vLLM, llama.cpp server, Ollama, Gemini, ...).

Requests run ``concurrency`` at a time. 429, 5xx, timeouts and connection errors are
retried with exponential backoff and jitter, honouring ``Retry-After``. A reply without a
``PROCESS_SCORE`` line gets one corrective follow-up, then a lenient parse; if all of that
fails, or the server never answers, the action gets a neutral 5.0 marked ``flagged``.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from tqdm import tqdm

from mappa.coach.context import CoachContext
from mappa.coach.parse import parse_score
from mappa.coach.templates import corrective_message, render_messages
from mappa.config import HttpCoachConfig
from mappa.workflow.records import Score

log = logging.getLogger(__name__)

NEUTRAL = 5.0
_RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class CoachUnavailable(RuntimeError):
    """The server did not give a usable answer after all retries."""


class HttpCoach:
    """Coach backend over ``POST {base_url}/chat/completions``."""

    name = "http"

    def __init__(self, cfg: HttpCoachConfig, backoff_base_s: float = 1.0) -> None:
        self.cfg = cfg
        self.backoff_base_s = backoff_base_s
        headers = {"Content-Type": "application/json"}
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise ValueError(
                    f"coach.http.api_key_env names {cfg.api_key_env!r}, which is not set"
                )
            headers["Authorization"] = f"Bearer {key}"
        self.client = httpx.Client(
            base_url=cfg.base_url.rstrip("/"), headers=headers, timeout=cfg.timeout_s
        )

    def _post(self, messages: list[dict[str, str]]) -> tuple[str, int]:
        """One chat completion with retries; returns (text, total tokens)."""
        body: dict[str, Any] = {
            "model": self.cfg.model,
            "messages": messages,
            "temperature": self.cfg.temperature,
            "max_tokens": self.cfg.max_tokens,
        }
        last: str = ""
        for attempt in range(self.cfg.max_retries + 1):
            delay = self.backoff_base_s * 2**attempt * (0.5 + random.random())
            try:
                resp = self.client.post("/chat/completions", json=body)
            except httpx.TransportError as err:  # timeouts, refused connections
                last = f"{type(err).__name__}: {err}"
            else:
                if resp.status_code == 200:
                    data = resp.json()
                    text = data["choices"][0]["message"].get("content") or ""
                    return text, int((data.get("usage") or {}).get("total_tokens", 0))
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                if resp.status_code not in _RETRY_STATUS:
                    break
                retry_after = resp.headers.get("Retry-After")
                if retry_after and retry_after.replace(".", "", 1).isdigit():
                    delay = max(delay, float(retry_after))
            if attempt < self.cfg.max_retries:
                log.warning("coach request failed (%s); retry in %.1fs", last, delay)
                time.sleep(delay)
        raise CoachUnavailable(last)

    def score_one(self, ctx: CoachContext) -> Score:
        start = time.monotonic()
        messages = render_messages(ctx)
        tokens = 0
        try:
            text, tokens = self._post(messages)
            parsed = parse_score(text)
            if parsed.process_score is None:
                retry_messages = [*messages, {"role": "assistant", "content": text}, corrective_message(ctx)]
                fixed, more = self._post(retry_messages)
                tokens += more
                parsed = parse_score(fixed)
                if parsed.process_score is None:
                    parsed = parse_score(text + "\n" + fixed, lenient=True)
                text = text + "\n---\n" + fixed
        except CoachUnavailable as err:
            return Score(NEUTRAL, f"coach unavailable: {err}", None, True, self.name,
                         time.monotonic() - start, tokens)
        if parsed.process_score is None:
            return Score(NEUTRAL, text, parsed.answer_correct, True, self.name,
                         time.monotonic() - start, tokens)
        return Score(parsed.process_score, text, parsed.answer_correct, False, self.name,
                     time.monotonic() - start, tokens)

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        with ThreadPoolExecutor(max_workers=self.cfg.concurrency) as pool:
            jobs = pool.map(self.score_one, contexts)
            return list(tqdm(jobs, total=len(contexts), desc="coach", leave=False))
