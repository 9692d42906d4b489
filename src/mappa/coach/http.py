"""OpenAI-compatible chat-completions coach (vLLM, llama.cpp server, Ollama, Gemini, ...).

Requests run asynchronously, ``concurrency`` at a time. 429, 5xx, timeouts and connection
errors are retried with exponential backoff and jitter, honouring ``Retry-After``. A reply
without ``PROCESS_SCORE`` gets one corrective follow-up, then a lenient parse; if all of
that fails, or the server never answers, the action gets a neutral 5.0 marked ``flagged``.
With ``score_mode: expected`` the score is the expected value over the probabilities of
0-10 at the score position (``logprobs``/``top_logprobs``), falling back to the sampled one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from tqdm import tqdm

from mappa.coach.context import CoachContext
from mappa.coach.parse import expected_score_from_logprobs, parse_score
from mappa.coach.templates import CoachTemplate, corrective_message, render_messages
from mappa.config import HttpCoachConfig
from mappa.workflow.records import Score

log = logging.getLogger(__name__)

NEUTRAL = 5.0
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class CoachUnavailable(RuntimeError):
    """The server did not give a usable answer after all retries."""


@dataclass
class _Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    retries: int
    logprobs: list[dict] | None


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class HttpCoach:
    """Coach backend over ``POST {base_url}/chat/completions``."""

    name = "http"

    def __init__(
        self, cfg: HttpCoachConfig, template: CoachTemplate, backoff_base_s: float = 1.0
    ) -> None:
        self.cfg = cfg
        self.template = template
        self.backoff_base_s = backoff_base_s
        self.headers = {"Content-Type": "application/json"}
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise ValueError(
                    f"coach.http.api_key_env names {cfg.api_key_env!r}, which is not set"
                )
            self.headers["Authorization"] = f"Bearer {key}"

    async def _post(self, client: httpx.AsyncClient, messages: list[dict[str, str]]) -> _Reply:
        body: dict[str, Any] = {
            "model": self.cfg.model,
            "messages": messages,
            "temperature": self.cfg.temperature,
            "max_tokens": self.cfg.max_tokens,
        }
        if self.cfg.score_mode == "expected":
            body.update(logprobs=True, top_logprobs=self.cfg.top_logprobs)
        last = ""
        for attempt in range(self.cfg.max_retries + 1):
            delay = self.backoff_base_s * 2**attempt * (0.5 + random.random())
            try:
                resp = await client.post("/chat/completions", json=body)
            except httpx.TransportError as err:  # timeouts, refused or dropped connections
                last = f"{type(err).__name__}: {err}"
            else:
                if resp.status_code == 200:
                    try:
                        data = resp.json()
                        choice = data["choices"][0]
                        text = choice["message"].get("content") or ""
                    except (ValueError, KeyError, IndexError, TypeError) as err:
                        last = f"malformed response: {err}: {resp.text[:200]!r}"
                    else:
                        usage = data.get("usage") or {}
                        return _Reply(
                            text,
                            int(usage.get("prompt_tokens", 0)),
                            int(usage.get("completion_tokens", 0)),
                            attempt,
                            ((choice.get("logprobs") or {}).get("content")),
                        )
                else:
                    last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                    if resp.status_code not in _RETRY_STATUS:
                        break
                    delay = max(delay, _retry_after(resp) or 0.0)
            if attempt < self.cfg.max_retries:
                log.warning("coach request failed (%s); retry in %.1fs", last, delay)
                await asyncio.sleep(delay)
        raise CoachUnavailable(last)

    async def _score_one(self, client: httpx.AsyncClient, ctx: CoachContext) -> Score:
        start = time.monotonic()
        messages = render_messages(self.template, ctx)
        replies: list[_Reply] = []
        try:
            replies.append(await self._post(client, messages))
            first = replies[0]
            parsed = parse_score(first.text)
            if parsed.process_score is None:
                fix = [
                    *messages,
                    {"role": "assistant", "content": first.text},
                    corrective_message(self.template, ctx),
                ]
                replies.append(await self._post(client, fix))
                parsed = parse_score(replies[1].text)
                if parsed.process_score is None:
                    parsed = parse_score(first.text + "\n" + replies[1].text, lenient=True)
        except CoachUnavailable as err:
            return Score(
                NEUTRAL,
                f"coach unavailable: {err}",
                None,
                True,
                self.name,
                time.monotonic() - start,
                flag_reason="unavailable",
                retries=sum(r.retries for r in replies) + self.cfg.max_retries,
            )
        value = parsed.process_score
        if self.cfg.score_mode == "expected":
            for reply in reversed(replies):
                expected = expected_score_from_logprobs(reply.logprobs or [])
                if expected is not None:
                    value = expected
                    break
        prompt = sum(r.prompt_tokens for r in replies)
        completion = sum(r.completion_tokens for r in replies)
        return Score(
            value=NEUTRAL if value is None else value,
            rationale="\n---\n".join(r.text for r in replies),
            answer_correct=parsed.answer_correct,
            flagged=value is None,
            backend=self.name,
            latency_s=time.monotonic() - start,
            tokens=prompt + completion,
            prompt_tokens=prompt,
            completion_tokens=completion,
            retries=sum(r.retries for r in replies),
            flag_reason="unparseable" if value is None else "",
        )

    async def _score_all(self, contexts: Sequence[CoachContext]) -> list[Score]:
        limits = httpx.Limits(max_connections=self.cfg.concurrency)
        timeout = httpx.Timeout(self.cfg.timeout_s)
        sem = asyncio.Semaphore(self.cfg.concurrency)
        async with httpx.AsyncClient(
            base_url=self.cfg.base_url.rstrip("/"),
            headers=self.headers,
            timeout=timeout,
            limits=limits,
        ) as client:
            with tqdm(total=len(contexts), desc="coach", leave=False) as bar:

                async def one(ctx: CoachContext) -> Score:
                    async with sem:
                        score = await self._score_one(client, ctx)
                    bar.update(1)
                    return score

                return list(await asyncio.gather(*(one(c) for c in contexts)))

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        return asyncio.run(self._score_all(contexts))
