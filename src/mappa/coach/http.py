"""OpenAI-compatible chat-completions coach (vLLM, llama.cpp server, Ollama, Gemini, ...).

Requests run asynchronously, ``concurrency`` at a time. 429, 5xx, timeouts, connection
errors and malformed replies are retried with exponential backoff and jitter, honouring
``Retry-After`` (seconds or an HTTP date, capped by ``retry_after_cap_s``). Every attempt
has a total time budget (``timeout_s``), so a server that hangs or trickles bytes forever
cannot hang a run. HTTP 400/401/403/404 and a malformed URL raise ``CoachFatalError`` at
once (retrying cannot fix a wrong path, model or key). A reply without a usable
``PROCESS_SCORE`` (missing, or outside 0-10) gets one corrective follow-up, then a lenient
parse; if all of that fails, or the server never answers, the action gets a neutral 5.0
marked ``flagged`` with its reason. Nothing else raises: any reply shape is either read or
becomes a flagged score. Error texts are stored with credentials redacted.
With ``score_mode: expected`` the score is the expected value over the probabilities of
0-10 at the score position (``logprobs``/``top_logprobs``), falling back to the sampled one;
the probability on any score there is kept as ``Score.digit_mass``. Where "10" is two
tokens and the reply does not show how much of "1" starts "10", the expected score is known
only within a range (``mappa.coach.parse.expected_score_from_logprobs``): the score is its
middle, and the rationale gives the range.
docs/reliability.md has the fault model.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import os
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from tqdm import tqdm

from mappa.coach.base import CoachFatalError
from mappa.coach.context import CoachContext
from mappa.coach.parse import (
    ExpectedScore,
    ParsedScore,
    expected_score_from_logprobs,
    parse_score,
)
from mappa.coach.templates import CoachTemplate, corrective_message, render_messages
from mappa.config import HttpCoachConfig
from mappa.records import Score

log = logging.getLogger(__name__)

NEUTRAL = 5.0
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
_FATAL_STATUS = {400, 401, 403, 404}
_BODY_CHARS = 300  # of an error body kept in logs and in the flagged score's rationale

__all__ = ["CoachFatalError", "CoachUnavailable", "HttpCoach", "redact", "request_fingerprint"]


class CoachUnavailable(RuntimeError):
    """The server did not give a usable answer after all retries (``retries`` made)."""

    def __init__(self, message: str, retries: int) -> None:
        super().__init__(message)
        self.retries = retries


_SECRETS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(?i)\b(bearer|basic|token)(\s+)[^\s\"',;]+"), r"\1\2***"),
    (
        re.compile(r"(?i)([?&;](?:key|api[_-]?key|access[_-]?token|token|secret|sig)=)[^&\s\"'#]+"),
        r"\1***",
    ),
    (
        re.compile(
            r"(?i)([\"']?(?:api[_-]?key|x-goog-api-key|x-api-key|authorization|access[_-]?token"
            r"|secret)[\"']?\s*[:=]\s*[\"']?)(?!\*\*\*|bearer\b|basic\b|token\b)[^\"'\s,}&]+"
        ),
        r"\1***",
    ),
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{8,}"), "***"),
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{20,}"), "***"),
    (re.compile(r"(//)[^/@\s:]+:[^/@\s]+@"), r"\1***@"),  # user:password@host
]


def redact(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` with credentials replaced by ``***``: the given secrets (the API key), bearer
    and basic tokens, ``key=``/``api_key=``/``token=`` query parameters, ``"api_key": ...``
    fields, ``sk-...`` and Google ``AIza...`` keys, and passwords in URLs.

    >>> redact("GET /v1?key=AIzaXYZ&alt=json Authorization: Bearer sk-abc123456789")
    'GET /v1?key=***&alt=json Authorization: Bearer ***'
    >>> redact('{"error": "bad key my-secret-key"}', ["my-secret-key"])
    '{"error": "bad key ***"}'
    """
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def request_fingerprint(cfg: HttpCoachConfig) -> str:
    """Every setting that can change a score, for the score cache's namespace: server,
    model, score mode, temperature, ``max_tokens`` and, in expected mode, ``top_logprobs``
    and the rule that reads them (``ten=bounded``: scores read by the older rule, which
    dropped an unresolved "1" and read "07" as 7, are not reused). Timeouts, retries,
    concurrency and the key's variable name change no reply and are left out, so tuning
    them keeps the cache.

    >>> request_fingerprint(HttpCoachConfig(base_url="http://h/v1", model="m"))
    'http://h/v1|m|sample|t=0.0|max_tokens=512'
    """
    parts = [
        cfg.base_url.rstrip("/"),
        cfg.model,
        cfg.score_mode,
        f"t={cfg.temperature}",
        f"max_tokens={cfg.max_tokens}",
    ]
    if cfg.score_mode == "expected":
        parts += [f"top_logprobs={cfg.top_logprobs}", "ten=bounded"]
    return "|".join(parts)


def check_base_url(url: str) -> httpx.URL:
    """The parsed ``base_url``, or ``CoachFatalError`` naming what is wrong with it."""
    shown = redact(url)
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as err:
        raise CoachFatalError(f"coach.http.base_url {shown!r} is not a valid URL: {err}") from None
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise CoachFatalError(f"coach.http.base_url {shown!r} has port {parsed.port}")
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise CoachFatalError(
            f"coach.http.base_url {shown!r} is not an http(s) URL with a host "
            "(expected e.g. http://127.0.0.1:8000/v1)"
        )
    return parsed


def retry_after_s(value: str | None, cap: float, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` header as seconds to wait, at most ``cap``: either delay-seconds or
    an HTTP date. None when absent or unreadable.

    >>> retry_after_s("2.5", 60), retry_after_s("3600", 60), retry_after_s("soon", 60)
    (2.5, 60, None)
    >>> now = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    >>> retry_after_s("Thu, 01 Jan 2026 00:00:07 GMT", 60, now)
    7.0
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(cap, max(0.0, seconds))


@dataclass
class _Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    retries: int
    logprobs: list[dict[str, Any]] | None


def _as_int(value: object) -> int:
    """A token count from whatever the server sent (null, a string, a float): 0 if unreadable."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value)) if math.isfinite(value) else 0


def _content_text(content: object) -> str:
    """A message's ``content``: a string, null, or a list of parts (strings or
    ``{"type": "text", "text": ...}``; reasoning and image parts are skipped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") in ("text", "output_text"):
                text = part.get("text")
                if isinstance(text, dict):  # {"text": {"value": ...}}
                    text = text.get("value")
                if isinstance(text, str):
                    texts.append(text)
        return "".join(texts)
    raise ValueError(f"message content is a {type(content).__name__}")


def read_reply(data: object) -> tuple[str, int, int, list[dict[str, Any]] | None]:
    """Text, prompt and completion tokens, and ``logprobs.content`` of a chat-completions
    reply, in any of the shapes servers send; ``ValueError`` if there is no reply in it."""
    if not isinstance(data, dict):
        raise ValueError(f"reply is a JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        error = data.get("error")
        raise ValueError(f"no choices in the reply{f' (error: {error})' if error else ''}")
    choice = choices[0]
    message = choice.get("message")
    if isinstance(message, str):
        text = message
    elif isinstance(message, dict):
        text = _content_text(message.get("content"))
    elif isinstance(choice.get("text"), str):  # a completions-style choice
        text = choice["text"]
    else:
        raise ValueError("the choice has no message")
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    raw = choice.get("logprobs")
    content = raw.get("content") if isinstance(raw, dict) else raw
    logprobs = (
        content if isinstance(content, list) and all(isinstance(t, dict) for t in content) else None
    )
    return (
        text,
        _as_int(usage.get("prompt_tokens")),
        _as_int(usage.get("completion_tokens")),
        logprobs,
    )


def _expected(logprobs: list[dict[str, Any]] | None) -> ExpectedScore | None:
    try:
        read = expected_score_from_logprobs(logprobs or [])
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError):
        return None  # malformed logprobs: the sampled score stands
    return read if read is not None and all(map(math.isfinite, read)) else None


def _unresolved_note(expected: ExpectedScore) -> str:
    """The range an expected score was taken from the middle of, for its rationale."""
    return (
        f"expected score {expected.value:.2f}: the middle of {expected.low:.2f}-"
        f'{expected.high:.2f}, as the reply does not show how much of "1" starts "10"'
    )


def _lenient(first: str, second: str, strict: ParsedScore) -> ParsedScore:
    """After the corrective retry also failed: a looser parse of both replies; an
    out-of-range value from the strict parse is kept so the flag says why."""
    loose = parse_score(first + "\n" + second, lenient=True)
    if loose.process_score is None and loose.out_of_range is None:
        return strict
    return loose


class HttpCoach:
    """Coach backend over ``POST {base_url}/chat/completions``."""

    name = "http"

    def __init__(
        self, cfg: HttpCoachConfig, template: CoachTemplate, backoff_base_s: float = 1.0
    ) -> None:
        self.cfg = cfg
        self.template = template
        self.backoff_base_s = backoff_base_s
        self.base_url = check_base_url(cfg.base_url.rstrip("/"))
        self.headers = {"Content-Type": "application/json"}
        self.secrets: list[str] = []
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise ValueError(
                    f"coach.http.api_key_env names {cfg.api_key_env!r}, which is not set"
                )
            self.headers["Authorization"] = f"Bearer {key}"
            self.secrets.append(key)

    def _redact(self, text: str) -> str:
        return redact(text, self.secrets)

    def _body(self, resp: httpx.Response) -> str:
        """The start of a reply's body, redacted before it is cut (a cut key still leaks)."""
        return self._redact(resp.text[: 20 * _BODY_CHARS])[:_BODY_CHARS]

    async def _attempt(self, client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
        """One request, with the whole of it (connect to last byte) inside ``timeout_s``."""
        async with asyncio.timeout(self.cfg.timeout_s):
            return await client.post("/chat/completions", json=body)

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
        attempt = 0
        for attempt in range(self.cfg.max_retries + 1):
            delay = self.backoff_base_s * 2**attempt * (0.5 + random.random())
            try:
                resp = await self._attempt(client, body)
            except TimeoutError:
                last = f"no complete reply within timeout_s={self.cfg.timeout_s}s"
            except (httpx.UnsupportedProtocol, httpx.InvalidURL) as err:
                raise CoachFatalError(
                    f"coach request to {self._redact(str(self.base_url))} cannot be sent: "
                    f"{self._redact(str(err))}; check coach.http.base_url"
                ) from None
            except httpx.HTTPError as err:  # refused or dropped connections, protocol errors
                last = f"{type(err).__name__}: {err}"
            else:
                status = resp.status_code
                if status == 200:
                    try:
                        text, prompt, completion, logprobs = read_reply(resp.json())
                    except ValueError as err:  # also JSON decode errors
                        last = f"malformed reply: {err}: {self._body(resp)!r}"
                    else:
                        return _Reply(text, prompt, completion, attempt, logprobs)
                elif status in _FATAL_STATUS:
                    raise CoachFatalError(
                        f"coach server answered HTTP {status} to POST "
                        f"{self._redact(str(resp.request.url))} (model {self.cfg.model!r}): "
                        f"{self._body(resp)!r}. Not retried: check "
                        "coach.http.base_url (up to and including /v1), coach.http.model "
                        "and coach.http.api_key_env."
                    )
                else:
                    last = f"HTTP {status}: {self._body(resp)}"
                    if status not in _RETRY_STATUS:
                        break
                    asked = retry_after_s(
                        resp.headers.get("Retry-After"), self.cfg.retry_after_cap_s
                    )
                    delay = max(delay, asked or 0.0)
            last = self._redact(last)
            if attempt < self.cfg.max_retries:
                log.warning("coach request failed (%s); retry in %.1fs", last, delay)
                await asyncio.sleep(delay)
        raise CoachUnavailable(self._redact(last), attempt)

    async def _score_one(self, client: httpx.AsyncClient, ctx: CoachContext) -> Score:
        """Never raises but ``CoachFatalError``: anything else becomes a flagged score."""
        start = time.monotonic()
        try:
            return await self._judge(client, ctx, start)
        except CoachFatalError:
            raise
        except CoachUnavailable as err:
            return self._fallback(start, f"coach unavailable: {err}", err.retries)
        except Exception as err:  # a bug or a shape nobody foresaw: flag it, keep the run
            log.warning("coach scoring failed: %s", self._redact(repr(err)), exc_info=True)
            return self._fallback(start, f"coach error: {type(err).__name__}: {err}", 0)

    def _fallback(self, start: float, why: str, retries: int) -> Score:
        return Score(
            NEUTRAL,
            self._redact(why),
            None,
            True,
            self.name,
            time.monotonic() - start,
            flag_reason="unavailable",
            retries=retries,
        )

    async def _judge(self, client: httpx.AsyncClient, ctx: CoachContext, start: float) -> Score:
        messages = render_messages(self.template, ctx)
        replies: list[_Reply] = []
        try:
            replies.append(await self._post(client, messages))
            first = replies[0]
            parsed = parse_score(first.text)
            if parsed.process_score is None:  # missing or out of range: ask once more
                fix = [
                    *messages,
                    {"role": "assistant", "content": first.text},
                    corrective_message(self.template, ctx),
                ]
                replies.append(await self._post(client, fix))
                parsed = parse_score(replies[1].text)
                if parsed.process_score is None:
                    parsed = _lenient(first.text, replies[1].text, parsed)
        except CoachUnavailable as err:
            raise CoachUnavailable(
                str(err), err.retries + sum(r.retries for r in replies)
            ) from None
        value = parsed.process_score
        digit_mass = None
        notes = []
        if self.cfg.score_mode == "expected":
            for reply in reversed(replies):
                expected = _expected(reply.logprobs)
                if expected is None:
                    continue
                value, digit_mass = expected.value, expected.digit_mass
                if expected.high > expected.low:
                    notes.append(_unresolved_note(expected))
                break
        prompt = sum(r.prompt_tokens for r in replies)
        completion = sum(r.completion_tokens for r in replies)
        reason = ""
        if value is None:
            reason = "out_of_range" if parsed.out_of_range is not None else "unparseable"
        return Score(
            value=NEUTRAL if value is None else value,
            rationale="\n---\n".join([*(r.text for r in replies), *notes]),
            answer_correct=parsed.answer_correct,
            flagged=value is None,
            backend=self.name,
            latency_s=time.monotonic() - start,
            tokens=prompt + completion,
            prompt_tokens=prompt,
            completion_tokens=completion,
            retries=sum(r.retries for r in replies),
            flag_reason=reason,
            digit_mass=digit_mass,
        )

    async def _score_all(self, contexts: Sequence[CoachContext]) -> list[Score]:
        limits = httpx.Limits(max_connections=self.cfg.concurrency)
        timeout = httpx.Timeout(self.cfg.timeout_s)
        sem = asyncio.Semaphore(self.cfg.concurrency)
        async with httpx.AsyncClient(
            base_url=self.base_url,
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

                try:
                    async with asyncio.TaskGroup() as group:
                        tasks = [group.create_task(one(c)) for c in contexts]
                except* CoachFatalError as fatal:  # the only error a task lets out
                    raise fatal.exceptions[0] from None  # the others were cancelled
                return [t.result() for t in tasks]

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        return asyncio.run(self._score_all(contexts))
