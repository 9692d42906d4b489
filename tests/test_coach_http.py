"""The OpenAI-compatible HTTP coach against a fake server on 127.0.0.1.

``FakeOpenAIServer`` is a fake: it scripts replies (scores, errors, bad formats) so the
client's retry, corrective-retry and fallback logic can be tested; the real llama.cpp
server is used by the coach integration tests.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mappa.coach.context import CoachContext
from mappa.coach.http import HttpCoach
from mappa.config import HttpCoachConfig


class FakeOpenAIServer:
    """Fake chat-completions server: pops one scripted (status, body, headers) per request."""

    def __init__(self) -> None:
        self.script: list[tuple[int, str, dict[str, str]]] = []
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body,
                                        "auth": self.headers.get("Authorization")})
                status, text, headers = server.script.pop(0) if server.script else (200, "PROCESS_SCORE: 5", {})
                payload = (
                    json.dumps({"choices": [{"message": {"content": text}}],
                                "usage": {"total_tokens": 10}})
                    if status == 200 else text
                ).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def server() -> Iterator[FakeOpenAIServer]:
    s = FakeOpenAIServer()
    yield s
    s.close()


def ctx(final: bool = False) -> CoachContext:
    return CoachContext("2+2?", "verifier" if final else "problem_solver", "role", 0,
                        "input", "output", None, final, "4" if final else None)


def coach(url: str, **kw: object) -> HttpCoach:
    settings: dict[str, object] = {"max_retries": 3, "timeout_s": 2, **kw}
    return HttpCoach(HttpCoachConfig(base_url=url, **settings), backoff_base_s=0.01)


def test_scores_and_sends_the_prompt(server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_COACH_KEY", "sk-test")
    server.script = [(200, "Fine.\nPROCESS_SCORE: 8\nANSWER_CORRECT: 1", {})]
    [score] = coach(server.url, api_key_env="MY_COACH_KEY").score([ctx(final=True)])
    assert (score.value, score.answer_correct, score.flagged) == (8.0, True, False)
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test"
    user = req["body"]["messages"][1]["content"]
    assert "Reference answer" in user and "4" in user
    assert "ANSWER_CORRECT" in req["body"]["messages"][0]["content"]


def test_ground_truth_only_for_final_agent(server: FakeOpenAIServer) -> None:
    coach(server.url).score([ctx(final=False)])
    assert "Reference answer" not in server.requests[0]["body"]["messages"][1]["content"]


def test_retries_5xx_and_429_then_succeeds(server: FakeOpenAIServer) -> None:
    server.script = [(500, "oops", {}), (429, "slow down", {"Retry-After": "0"}),
                     (200, "PROCESS_SCORE: 3", {})]
    [score] = coach(server.url).score([ctx()])
    assert score.value == 3.0 and not score.flagged and len(server.requests) == 3


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
    assert flagged.value == 5.0 and flagged.flagged


def test_unreachable_coach_is_neutral_and_flagged() -> None:
    [score] = coach("http://127.0.0.1:9/v1", max_retries=1).score([ctx()])
    assert score.value == 5.0 and score.flagged and "unavailable" in score.rationale


def test_missing_api_key_env_fails_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOT_SET_KEY", raising=False)
    with pytest.raises(ValueError, match="NOT_SET_KEY"):
        coach("http://127.0.0.1:9/v1", api_key_env="NOT_SET_KEY")


def test_concurrent_order_is_preserved(server: FakeOpenAIServer) -> None:
    contexts = [CoachContext(f"task {i}", "problem_solver", "r", 0, "in", "out", None, False, None)
                for i in range(12)]
    scores = coach(server.url, concurrency=4).score(contexts)
    assert len(scores) == 12 and all(s.value == 5.0 and not s.flagged for s in scores)
