"""The OpenAI-compatible HTTP coach against a fake server on 127.0.0.1.

``FakeOpenAIServer`` is a fake: it scripts replies (scores, errors, hangs, garbage) so the
client's retry, corrective-retry and fallback logic can be tested, including a training
run that must carry on through them. The real llama.cpp server is used by
``test_integration_llamacpp.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import tiny_run_config

from mappa.coach.base import CoachFallbackError, CoachFatalError, FallbackGuard
from mappa.coach.context import CoachContext
from mappa.coach.http import HttpCoach, request_fingerprint
from mappa.coach.templates import load_template
from mappa.config import HttpCoachConfig
from mappa.records import Score

Reply = tuple[int, str, dict[str, str]]
"""status, text, headers. The text is the coach's reply, or one of: ``HANG`` (say nothing
past the client's timeout), ``TRICKLE`` (send the headers, then a byte every 0.1 s for
10 s: no read timeout ever fires), ``GARBAGE`` (not JSON), ``ECHO`` (score = the task's
number), ``RAW:<json>`` (this exact body, for odd reply shapes)."""


class FakeOpenAIServer:
    """Fake chat-completions server: pops one scripted reply per request (then a default)."""

    def __init__(self, default: Reply = (200, "PROCESS_SCORE: 5", {})) -> None:
        self.script: list[Reply] = []
        self.default = default
        self.requests: list[dict] = []
        self.logprobs: list[dict] | None = None  # sent with 200 replies when set
        self.cut_off = 0  # TRICKLE replies the client hung up on before their end
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server dispatches to
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(
                        {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
                    )
                    status, text, headers = (
                        server.script.pop(0) if server.script else server.default
                    )
                if text == "ECHO":  # score = the number in the task line, to check ordering
                    number = body["messages"][1]["content"].split("\n")[1].split()[-1]
                    text = f"PROCESS_SCORE: {int(number) % 11}"
                if text == "HANG":
                    time.sleep(3.0)  # past the client's timeout
                    return
                if text == "TRICKLE":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    try:
                        for _ in range(100):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(0.1)
                    except OSError:  # the client gave up and closed the connection
                        with server.lock:
                            server.cut_off += 1
                    return
                if text.startswith("RAW:"):
                    payload = text.removeprefix("RAW:").encode()
                elif text == "GARBAGE":
                    payload = b"<html>not json"
                elif status == 200:
                    choice: dict = {"message": {"content": text}}
                    if server.logprobs is not None:
                        choice["logprobs"] = {"content": server.logprobs}
                    payload = json.dumps(
                        {"choices": [choice], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
                    ).encode()
                else:
                    payload = text.encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The coach's waits between attempts, recorded instead of slept (a fake ``asyncio.sleep``:
    what is tested is how long the coach decides to wait, not the clock)."""
    asked: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(delay: float) -> None:
        asked.append(delay)
        await real_sleep(0)

    monkeypatch.setattr("mappa.coach.http.asyncio.sleep", fake_sleep)
    return asked


@pytest.fixture()
def server() -> Iterator[FakeOpenAIServer]:
    s = FakeOpenAIServer()
    yield s
    s.close()


def ctx(final: bool = False, task: str = "2+2?") -> CoachContext:
    return CoachContext(
        task,
        "verifier" if final else "problem_solver",
        "role",
        0,
        "input",
        "output",
        None,
        final,
        "4" if final else None,
    )


def coach(url: str, **kw: object) -> HttpCoach:
    settings: dict[str, object] = {"max_retries": 3, "timeout_s": 1.0, **kw}
    return HttpCoach(
        HttpCoachConfig(base_url=url, **settings), load_template("mathchat"), backoff_base_s=0.01
    )


def test_scores_and_sends_the_prompt(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_COACH_KEY", "sk-test")
    server.script = [(200, "Fine.\nPROCESS_SCORE: 8\nANSWER_CORRECT: 1", {})]
    [score] = coach(server.url, api_key_env="MY_COACH_KEY").score([ctx(final=True)])
    assert (score.value, score.answer_correct, score.flagged) == (8.0, True, False)
    assert (score.prompt_tokens, score.completion_tokens, score.retries) == (7, 3, 0)
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    user = req["body"]["messages"][1]["content"]
    assert "Reference answer" in user and "4" in user
    assert "ANSWER_CORRECT" in req["body"]["messages"][0]["content"]


def test_ground_truth_only_for_final_agent(server: FakeOpenAIServer) -> None:
    coach(server.url).score([ctx(final=False)])
    body = server.requests[0]["body"]["messages"]
    assert (
        "Reference answer" not in body[1]["content"] and "ANSWER_CORRECT" not in body[0]["content"]
    )


def test_retries_5xx_429_hang_and_garbage_then_succeeds(
    server: FakeOpenAIServer, sleeps: list[float]
) -> None:
    server.script = [
        (500, "oops", {}),
        (429, "slow down", {"Retry-After": "2.5"}),
        (200, "HANG", {}),
        (200, "GARBAGE", {}),
        (200, "PROCESS_SCORE: 3", {}),
    ]
    [score] = coach(server.url, max_retries=4).score([ctx()])
    assert score.value == 3.0 and not score.flagged and score.retries == 4
    assert len(server.requests) == 5 and len(sleeps) == 4
    assert sleeps[1] == 2.5 and max(sleeps[0], *sleeps[2:]) < 1.0  # Retry-After honoured


def test_bad_format_gets_one_corrective_retry(server: FakeOpenAIServer) -> None:
    server.script = [(200, "Looks fine to me.", {}), (200, "PROCESS_SCORE: 6", {})]
    [score] = coach(server.url).score([ctx()])
    assert score.value == 6.0 and not score.flagged
    assert len(server.requests[1]["body"]["messages"]) == 4  # system, user, reply, correction


def test_unparseable_twice_falls_back_to_lenient_then_flagged(server: FakeOpenAIServer) -> None:
    server.script = [(200, "Meh.", {}), (200, "Score: 7/10", {})]
    [lenient] = coach(server.url).score([ctx()])
    assert lenient.value == 7.0 and not lenient.flagged
    server.script = [(200, "I refuse.", {}), (200, "No.", {})]
    [flagged] = coach(server.url).score([ctx()])
    assert (flagged.value, flagged.flagged, flagged.flag_reason) == (5.0, True, "unparseable")


def test_unreachable_coach_is_neutral_and_flagged() -> None:
    [score] = coach("http://127.0.0.1:9/v1", max_retries=1).score([ctx()])
    assert score.value == 5.0 and score.flagged and score.flag_reason == "unavailable"


def test_missing_api_key_env_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOT_SET_KEY", raising=False)
    with pytest.raises(ValueError, match="NOT_SET_KEY"):
        coach("http://127.0.0.1:9/v1", api_key_env="NOT_SET_KEY")


def test_concurrent_requests_keep_order(server: FakeOpenAIServer) -> None:
    server.default = (200, "ECHO", {})
    scores = coach(server.url, concurrency=4).score([ctx(task=f"task {i}") for i in range(12)])
    assert [s.value for s in scores] == [float(i % 11) for i in range(12)]


def test_expected_score_mode_reads_logprobs(server: FakeOpenAIServer) -> None:
    server.logprobs = [
        {"token": "PROCESS", "logprob": 0.0, "top_logprobs": []},
        {"token": "_SCORE:", "logprob": 0.0, "top_logprobs": []},
        {
            "token": " 7",
            "logprob": -0.10536,
            "top_logprobs": [
                {"token": " 7", "logprob": -0.10536},
                {"token": " 2", "logprob": -2.30259},
            ],
        },
    ]
    server.script = [(200, "PROCESS_SCORE: 7", {})]
    [score] = coach(server.url, score_mode="expected").score([ctx()])
    # p(7)=exp(-0.10536)=0.9, p(2)=exp(-2.30259)=0.1 -> 0.9*7 + 0.1*2 = 6.5
    assert abs(score.value - 6.5) < 1e-3 and not score.flagged
    assert score.digit_mass is not None and abs(score.digit_mass - 1.0) < 1e-3
    assert server.requests[0]["body"]["logprobs"] is True


def test_malformed_logprobs_leave_the_sampled_score(server: FakeOpenAIServer) -> None:
    server.logprobs = [
        {"token": "PROCESS_SCORE:", "logprob": None, "top_logprobs": None},
        {"token": " 7", "logprob": None, "top_logprobs": [{"token": " 7", "logprob": None}]},
    ]
    server.script = [(200, "PROCESS_SCORE: 7", {})]
    [score] = coach(server.url, score_mode="expected").score([ctx()])
    assert (score.value, score.flagged, score.digit_mass) == (7.0, False, None)


def test_expected_mode_records_the_digit_mass(server: FakeOpenAIServer) -> None:
    # half the probability at the score position is on a non-score token
    server.logprobs = [
        {"token": "PROCESS_SCORE:", "logprob": 0.0, "top_logprobs": []},
        {
            "token": " 8",
            "logprob": -0.69315,
            "top_logprobs": [
                {"token": " 8", "logprob": -0.69315},
                {"token": " eight", "logprob": -0.69315},
            ],
        },
    ]
    server.script = [(200, "PROCESS_SCORE: 8", {})]
    [score] = coach(server.url, score_mode="expected").score([ctx()])
    assert abs(score.value - 8.0) < 1e-6 and not score.flagged
    assert score.digit_mass is not None and abs(score.digit_mass - 0.5) < 1e-4
    [sampled] = coach(server.url).score([ctx()])
    assert sampled.digit_mass is None  # sample mode reads no probabilities


def test_expected_mode_takes_the_middle_when_ten_is_unresolved(
    server: FakeOpenAIServer,
) -> None:
    # " 1" (P 0.3) beside the written " 9" may start " 10": the expected score lies in
    # 6.5..9.2; the score is its middle, not the 8.86 that dropping " 1" and renormalising
    # gave (off by 2.36 if that "1" is 1)
    server.logprobs = [
        {"token": "PROCESS_SCORE:", "logprob": 0.0, "top_logprobs": []},
        {
            "token": " 9",
            "logprob": math.log(0.6),
            "top_logprobs": [
                {"token": t, "logprob": math.log(p)}
                for t, p in ((" 9", 0.6), (" 1", 0.3), (" 8", 0.1))
            ],
        },
    ]
    server.script = [(200, "PROCESS_SCORE: 9", {})]
    [score] = coach(server.url, score_mode="expected").score([ctx()])
    assert score.value == pytest.approx(7.85) and not score.flagged
    assert score.digit_mass == pytest.approx(1.0)
    assert "the middle of 6.50-9.20" in score.rationale


def test_expected_mode_reads_no_zero_padded_score(server: FakeOpenAIServer) -> None:
    server.logprobs = [
        {"token": "PROCESS_SCORE:", "logprob": 0.0, "top_logprobs": []},
        {
            "token": " 3",
            "logprob": math.log(0.5),
            "top_logprobs": [
                {"token": t, "logprob": math.log(p)} for t, p in ((" 3", 0.5), ("07", 0.5))
            ],
        },
    ]
    server.script = [(200, "PROCESS_SCORE: 3", {})]
    [score] = coach(server.url, score_mode="expected").score([ctx()])
    assert score.value == 3.0 and score.digit_mass is not None
    assert abs(score.digit_mass - 0.5) < 1e-9  # "07" is not 7: it was read as 5.0


def _shape(payload: object) -> Reply:
    return (200, "RAW:" + json.dumps(payload), {})


ODD_BUT_VALID = [
    # message as a bare string; no usage at all
    ({"choices": [{"message": "PROCESS_SCORE: 7"}]}, 7.0, (0, 0)),
    # content as a list of parts (a reasoning part is skipped); usage fields null
    (
        {
            "choices": [
                {
                    "message": {
                        "content": [
                            {"type": "reasoning", "text": "PROCESS_SCORE: 1"},
                            {"type": "text", "text": "Good. "},
                            {"type": "text", "text": "PROCESS_SCORE: [8]"},
                        ]
                    }
                }
            ],
            "usage": {"prompt_tokens": None, "completion_tokens": None},
        },
        8.0,
        (0, 0),
    ),
    # usage null, extra fields everywhere, a string token count
    (
        {
            "id": "x",
            "object": "chat.completion",
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": '**PROCESS_SCORE:** "6"'},
                    "logprobs": None,
                    "extra": [1, 2],
                }
            ],
            "usage": {"prompt_tokens": "11", "total_tokens": 12},
        },
        6.0,
        (11, 0),
    ),
    ({"choices": [{"message": {"content": "PROCESS_SCORE: 4"}}], "usage": None}, 4.0, (0, 0)),
    # a completions-style choice
    ({"choices": [{"text": "PROCESS_SCORE: 2", "index": 0}]}, 2.0, (0, 0)),
]


@pytest.mark.parametrize(("payload", "value", "tokens"), ODD_BUT_VALID)
def test_odd_but_valid_reply_shapes_are_read(
    server: FakeOpenAIServer, payload: dict, value: float, tokens: tuple[int, int]
) -> None:
    server.script = [_shape(payload)]
    [score] = coach(server.url).score([ctx()])
    assert (score.value, score.flagged, score.retries) == (value, False, 0)
    assert (score.prompt_tokens, score.completion_tokens) == tokens
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "payload",
    [
        {"choices": [{"message": {"content": None}}]},  # null content: nothing to read
        {"choices": [{"message": {"content": []}}]},
        {"choices": [{"message": {"content": None, "refusal": "I can't."}}]},
    ],
)
def test_empty_content_gets_the_corrective_retry_then_is_flagged(
    server: FakeOpenAIServer, payload: dict
) -> None:
    server.script = [_shape(payload), _shape(payload)]
    [score] = coach(server.url).score([ctx()])
    assert (score.value, score.flagged, score.flag_reason) == (5.0, True, "unparseable")
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    "payload",
    [[], "PROCESS_SCORE: 7", {"choices": []}, {"error": {"message": "overloaded"}}, None, 7],
)
def test_shapeless_replies_are_retried_then_flagged(
    server: FakeOpenAIServer, payload: object
) -> None:
    server.default = _shape(payload)
    [score] = coach(server.url, max_retries=2).score([ctx()])
    assert (score.value, score.flagged, score.flag_reason) == (5.0, True, "unavailable")
    assert score.retries == 2 and len(server.requests) == 3
    assert "malformed reply" in score.rationale


def test_out_of_range_is_flagged_not_clamped(server: FakeOpenAIServer) -> None:
    server.script = [(200, "PROCESS_SCORE: 11", {}), (200, "PROCESS_SCORE: 12", {})]
    [score] = coach(server.url).score([ctx()])
    assert (score.value, score.flagged, score.flag_reason) == (5.0, True, "out_of_range")
    server.script = [(200, "PROCESS_SCORE: -1", {}), (200, "PROCESS_SCORE: [9]", {})]
    [fixed] = coach(server.url).score([ctx()])  # the corrective retry gave a real score
    assert (fixed.value, fixed.flagged) == (9.0, False)


def test_retry_after_as_an_http_date_is_honoured_and_capped(
    server: FakeOpenAIServer, sleeps: list[float]
) -> None:
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    server.script = [(429, "slow down", {"Retry-After": soon}), (200, "PROCESS_SCORE: 7", {})]
    [score] = coach(server.url).score([ctx()])
    assert score.value == 7.0 and score.retries == 1
    [waited] = sleeps
    assert 15 <= waited <= 20  # until that date (a second-resolution date, read a bit later)
    sleeps.clear()
    # a server asking for an hour (either form) waits only retry_after_cap_s
    later = format_datetime(datetime.now(UTC) + timedelta(hours=1), usegmt=True)
    server.script = [
        (503, "busy", {"Retry-After": "3600"}),
        (429, "busy", {"Retry-After": later}),
        (200, "PROCESS_SCORE: 8", {}),
    ]
    [score] = coach(server.url, retry_after_cap_s=0.3).score([ctx()])
    assert score.value == 8.0 and score.retries == 2 and len(sleeps) == 2
    assert all(0.0 < s <= 0.3 for s in sleeps)


def test_a_trickling_server_is_cut_off_by_the_attempt_deadline(server: FakeOpenAIServer) -> None:
    server.script = [(200, "TRICKLE", {}), (200, "TRICKLE", {})]
    [score] = coach(server.url, timeout_s=0.5, max_retries=1).score([ctx()])
    assert (score.flagged, score.flag_reason, score.retries) == (True, "unavailable", 1)
    assert "timeout_s=0.5" in score.rationale
    for _ in range(100):  # the server sees the hang-up at its next byte (every 0.1 s)
        if server.cut_off == 2:
            break
        time.sleep(0.1)
    assert server.cut_off == 2  # both cut off by the client, neither trickled to its end


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_client_errors_are_fatal_at_once(
    server: FakeOpenAIServer, status: int, monkeypatch: pytest.MonkeyPatch, sleeps: list[float]
) -> None:
    monkeypatch.setenv("MY_COACH_KEY", "sk-live-0123456789abcdef")
    server.script = [
        (status, '{"error": "key sk-live-0123456789abcdef is not valid"}', {}),
        (200, "HANG", {}),  # in flight alongside: cancelled, not waited for
        (200, "HANG", {}),
    ]
    with pytest.raises(CoachFatalError, match=f"HTTP {status}") as err:
        coach(server.url, api_key_env="MY_COACH_KEY", max_retries=4).score([ctx()] * 3)
    assert len(server.requests) <= 3 and sleeps == []  # no retries, no backoff
    assert server.url in str(err.value) and "sk-live" not in str(err.value)


@pytest.mark.parametrize(
    "url", ["localhost:8000/v1", "ftp://127.0.0.1/v1", "http://127.0.0.1:99999/v1", "http:///v1"]
)
def test_a_malformed_url_is_fatal_before_any_request(url: str) -> None:
    with pytest.raises(CoachFatalError, match="base_url"):
        coach(url)


def test_error_bodies_are_stored_with_credentials_redacted(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_COACH_KEY", "my-very-secret-key")
    body = (
        "upstream failed: GET https://x.googleapis.com/v1?key=AIzaSyA1234567890abcdefghijk&alt=1 "
        "with Authorization: Bearer my-very-secret-key (api_key=sk-proj-abcdefghijkl)"
    )
    server.default = (500, body, {})
    [score] = coach(server.url, api_key_env="MY_COACH_KEY", max_retries=1).score([ctx()])
    assert score.flagged and "upstream failed" in score.rationale
    for secret in ("AIzaSy", "my-very-secret-key", "sk-proj"):
        assert secret not in score.rationale
    assert "key=***" in score.rationale and "Bearer ***" in score.rationale
    server.default = (500, "x" * 290 + " my-very-secret-key", {})  # the key straddles the cut
    [score] = coach(server.url, api_key_env="MY_COACH_KEY", max_retries=0).score([ctx()])
    assert "my-very" not in score.rationale


def test_retries_are_counted_truthfully(server: FakeOpenAIServer) -> None:
    server.script = [(500, "x", {}), (502, "x", {}), (200, "PROCESS_SCORE: 6", {})]
    [score] = coach(server.url, max_retries=5).score([ctx()])
    assert score.retries == 2 and len(server.requests) == 3
    server.requests.clear()
    server.script = [(422, "unprocessable", {})]  # not retryable, not fatal: flagged at once
    [score] = coach(server.url, max_retries=5).score([ctx()])
    assert (score.flagged, score.retries, len(server.requests)) == (True, 0, 1)
    server.requests.clear()
    server.script = [(500, "x", {}), (200, "no score", {}), (500, "x", {}), (500, "x", {})]
    [score] = coach(server.url, max_retries=1).score([ctx()])  # corrective retry then down
    assert (score.flagged, score.retries, len(server.requests)) == (True, 2, 4)


def test_every_fault_ends_in_a_flagged_fallback_or_a_fatal_error(server: FakeOpenAIServer) -> None:
    """The acceptance script: each fault alone, scoring always finishes, and every fallback
    is flagged with its reason; 401 and 404 stop at once."""
    date_soon = format_datetime(datetime.now(UTC), usegmt=True)
    faults: list[tuple[list[Reply], str]] = [
        ([(500, "oops", {})] * 2, "unavailable"),
        ([(429, "x", {"Retry-After": "0.1"})] * 2, "unavailable"),
        ([(429, "x", {"Retry-After": date_soon})] * 2, "unavailable"),
        ([(200, "HANG", {})] * 2, "unavailable"),
        ([(200, "TRICKLE", {})] * 2, "unavailable"),
        ([(200, "GARBAGE", {})] * 2, "unavailable"),
        ([_shape({"choices": [{"message": {"content": None}}]})] * 2, "unparseable"),
        ([(200, "PROCESS_SCORE: 42", {})] * 2, "out_of_range"),
        ([(200, "no idea", {})] * 2, "unparseable"),
    ]
    for script, reason in faults:
        server.script = list(script)
        [score] = coach(server.url, timeout_s=0.5, max_retries=1).score([ctx()])
        assert (score.value, score.flagged, score.flag_reason) == (5.0, True, reason), script
    scores: list[Score] = []
    for payload, value, _ in ODD_BUT_VALID:
        server.script = [_shape(payload)]
        scores += coach(server.url, timeout_s=0.5).score([ctx()])
        assert scores[-1].value == value and not scores[-1].flagged
    for status in (401, 404):
        server.script = [(status, "no", {})]
        with pytest.raises(CoachFatalError, match=str(status)):
            coach(server.url, timeout_s=0.5).score([ctx()])


def test_fallback_guard_stops_after_k_all_fallback_steps(server: FakeOpenAIServer) -> None:
    server.default = (503, "down", {})
    down = coach(server.url, max_retries=0)
    guard = FallbackGuard(3)
    for _ in range(2):
        guard.observe(down.score([ctx(), ctx(final=True)]))
    server.script = [(200, "PROCESS_SCORE: 7", {})]
    guard.observe(down.score([ctx(), ctx(final=True)]))  # one real score resets the count
    for _ in range(2):
        guard.observe(down.score([ctx()]))
    guard.observe([])  # a step with nothing scored changes nothing
    with pytest.raises(CoachFallbackError, match="3 consecutive steps.*unavailable"):
        guard.observe(down.score([ctx()]))
    never = FallbackGuard(0)
    for _ in range(5):
        never.observe(down.score([ctx()]))


def test_request_fingerprint_covers_what_changes_replies() -> None:
    base = HttpCoachConfig(base_url="http://h/v1")
    same = HttpCoachConfig(base_url="http://h/v1/", timeout_s=5, max_retries=0, concurrency=2)
    assert request_fingerprint(base) == request_fingerprint(same)
    for change in (
        {"max_tokens": 64},
        {"temperature": 0.7},
        {"model": "other"},
        {"score_mode": "expected"},
        {"base_url": "http://other/v1"},
    ):
        assert request_fingerprint(base) != request_fingerprint(base.model_copy(update=change))
    expected = base.model_copy(update={"score_mode": "expected"})
    assert request_fingerprint(expected) != request_fingerprint(
        expected.model_copy(update={"top_logprobs": 5})
    )
    # scores read by the rule before "1" was bounded and "07" refused are not reused
    assert "ten=bounded" in request_fingerprint(expected)


def _http_run(tiny_model_dir: Path, tmp_path: Path, url: str, *overrides: str) -> Path:
    """A tiny run's config file whose coach is the HTTP one at ``url`` (run dir: tmp/run)."""
    import yaml

    cfg = tiny_run_config(
        tiny_model_dir,
        tmp_path / "run",
        "coach.backend=http",
        f"coach.http.base_url={url}",
        *overrides,
    )
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return config


def test_training_continues_through_a_faulty_coach(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A real ``mappa train`` through 500s, 429s (both Retry-After forms), hangs, trickles,
    garbage, odd shapes and out-of-range scores: every action still gets a score, the run
    finishes, and each fallback is flagged in episodes.jsonl with its reason, counted in
    metrics.jsonl and left out of training."""

    from mappa.cli import main
    from mappa.jsonl import read_jsonl

    faulty = FakeOpenAIServer(default=(200, "PROCESS_SCORE: 6", {}))
    date_now = format_datetime(datetime.now(UTC), usegmt=True)
    faulty.script = (
        [
            (500, "x", {}),
            (429, "x", {"Retry-After": "0"}),
            (200, "HANG", {}),
            (200, "GARBAGE", {}),
        ]
        * 3
        + [
            (200, "TRICKLE", {}),
            (429, "x", {"Retry-After": date_now}),
            (200, "PROCESS_SCORE: 42", {}),
            _shape({"choices": [{"message": {"content": None}}], "usage": None}),
            _shape({"choices": [{"message": "PROCESS_SCORE: [7]"}]}),
            _shape([]),
        ]
        + [(503, "down", {})] * 8
    )
    try:
        config = _http_run(
            tiny_model_dir,
            tmp_path,
            faulty.url,
            "train.steps=1",
            "coach.http.timeout_s=1.0",
            "coach.http.max_retries=1",
            "coach.http.concurrency=4",
        )
        assert main(["train", "--config", str(config)]) == 0
    finally:
        faulty.close()
    run_dir = tmp_path / "run"
    [m] = read_jsonl(run_dir / "metrics.jsonl")
    scores = [a["coach"] for e in read_jsonl(run_dir / "episodes.jsonl") for a in e["actions"]]
    flagged = [s for s in scores if s["flagged"]]
    assert {s["flag_reason"] for s in flagged} >= {"unavailable", "out_of_range"}
    assert all(s["value"] == 5.0 and s["rationale"] for s in flagged)
    assert m["coach/flagged"] == len(flagged) and m["coach/failures"] >= 1
    assert m["coach/retries"] == sum(s["retries"] for s in scores) >= 1
    total = sum(m[f"actions/{a}"] for a in ("problem_solver", "code_executor", "verifier"))
    assert m["trained_actions"] == total - m["coach/flagged"] > 0
    assert (run_dir / "adapters" / "verifier" / "adapter_model.safetensors").is_file()


@pytest.mark.integration
@pytest.mark.parametrize("status", [401, 404])
def test_mappa_train_stops_at_once_on_a_client_error(
    tiny_model_dir: Path, tmp_path: Path, status: int
) -> None:
    """A real ``mappa train`` process against a coach answering 401/404: one request, no
    retry, exit status 1, a one-paragraph message naming the status (no traceback), and no
    step recorded as if it had been trained."""
    import subprocess
    import sys

    server = FakeOpenAIServer(default=(status, '{"error": "no such model or key"}', {}))
    run_dir = tmp_path / "run"
    config = _http_run(
        tiny_model_dir,
        tmp_path,
        server.url,
        "train.steps=3",
        "coach.http.max_retries=4",
        "coach.http.concurrency=1",
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mappa.cli", "train", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.close()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert f"mappa: coach server answered HTTP {status}" in proc.stderr, proc.stderr[-3000:]
    assert "No checkpoint was written" in proc.stderr
    assert len(server.requests) == 1  # the first action's request; nothing retried after it
    assert not (run_dir / "metrics.jsonl").exists()


@pytest.mark.integration
def test_the_fallback_streak_survives_a_resume(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two all-fallback steps, a stop, a resume: the third all-fallback step stops the run,
    as it would have without the stop (the streak is in the checkpoint)."""

    from mappa.cli import main
    from mappa.jsonl import read_jsonl

    down = FakeOpenAIServer(default=(503, "down", {}))
    run_dir = tmp_path / "run"
    config = _http_run(
        tiny_model_dir,
        tmp_path,
        down.url,
        "train.steps=2",
        "coach.http.max_retries=0",
        "coach.max_fallback_steps=3",
    )
    try:
        assert main(["train", "--config", str(config)]) == 0
        # where the server is and how hard to try it may change on resume
        resumed = ["train", "--resume", str(run_dir), "train.steps=5", "coach.http.timeout_s=9"]
        assert main(resumed) == 1
    finally:
        down.close()
    err = capsys.readouterr().err
    assert "fallback for 3 consecutive steps" in err and "newest checkpoint is step 2" in err
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [0, 1]
