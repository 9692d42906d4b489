"""The OpenAI-compatible HTTP coach against a fake server on 127.0.0.1.

``FakeOpenAIServer`` is a fake: it scripts replies (scores, errors, hangs, garbage) so the
client's retry, corrective-retry and fallback logic can be tested, including a training
run that must carry on through them. The real llama.cpp server is used by
``test_integration_llamacpp.py``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import tiny_run_config

from mappa.coach.context import CoachContext
from mappa.coach.http import HttpCoach
from mappa.coach.templates import load_template
from mappa.config import HttpCoachConfig

Reply = tuple[int, str, dict[str, str]]  # status, text (or "HANG"/"GARBAGE"), headers


class FakeOpenAIServer:
    """Fake chat-completions server: pops one scripted reply per request (then a default)."""

    def __init__(self, default: Reply = (200, "PROCESS_SCORE: 5", {})) -> None:
        self.script: list[Reply] = []
        self.default = default
        self.requests: list[dict] = []
        self.logprobs: list[dict] | None = None  # sent with 200 replies when set
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
                if text == "GARBAGE":
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


def test_retries_5xx_429_hang_and_garbage_then_succeeds(server: FakeOpenAIServer) -> None:
    server.script = [
        (500, "oops", {}),
        (429, "slow down", {"Retry-After": "0.2"}),
        (200, "HANG", {}),
        (200, "GARBAGE", {}),
        (200, "PROCESS_SCORE: 3", {}),
    ]
    start = time.monotonic()
    [score] = coach(server.url, max_retries=4).score([ctx()])
    assert score.value == 3.0 and not score.flagged and score.retries == 4
    assert len(server.requests) == 5
    assert time.monotonic() - start >= 0.2 + 1.0  # honoured Retry-After, waited out the hang


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
    assert server.requests[0]["body"]["logprobs"] is True


def test_training_continues_through_a_faulty_coach(tiny_model_dir: Path, tmp_path: Path) -> None:
    """500s, 429s, hangs and garbage: every action still gets a score, the run finishes,
    and the flagged ones are counted and left out of training."""
    from mappa.jsonl import read_jsonl
    from mappa.train import train

    faulty = FakeOpenAIServer(default=(200, "PROCESS_SCORE: 6", {}))
    faulty.script = [
        (500, "x", {}),
        (429, "x", {"Retry-After": "0"}),
        (200, "HANG", {}),
        (200, "GARBAGE", {}),
    ] * 3 + [(503, "down", {})] * 8
    try:
        cfg = tiny_run_config(
            tiny_model_dir,
            tmp_path / "run",
            "train.steps=1",
            "coach.backend=http",
            f"coach.http.base_url={faulty.url}",
            "coach.http.timeout_s=1.0",
            "coach.http.max_retries=1",
            "coach.http.concurrency=4",
        )
        run_dir = train(cfg)
    finally:
        faulty.close()
    [m] = read_jsonl(run_dir / "metrics.jsonl")
    assert m["coach/flagged"] >= 1 and m["coach/failures"] >= 1 and m["coach/retries"] >= 1
    total = sum(m[f"actions/{a}"] for a in ("problem_solver", "code_executor", "verifier"))
    assert m["trained_actions"] == total - m["coach/flagged"] > 0
    assert (run_dir / "adapters" / "verifier" / "adapter_model.safetensors").is_file()
