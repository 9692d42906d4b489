"""Score cache and replay, templates as files, accounting and bias statistics."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from mappa.cli import default_config
from mappa.coach.cache import CachedCoach, CoachCacheMiss, ScoreCache
from mappa.coach.context import CoachContext
from mappa.coach.stats import accounting, bias, point_biserial
from mappa.coach.templates import SHIPPED, TemplateError, load_template, render_messages
from mappa.config import load_config
from mappa.records import Action, Episode, Score
from mappa.run.preflight import check


class FakeCountingCoach:
    """Fake backend: scores by output length and counts the contexts it was asked about."""

    name = "fake"

    def __init__(self, fail: bool = False) -> None:
        self.seen = 0
        self.fail = fail

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        self.seen += len(contexts)
        if self.fail:
            return [Score(5.0, "down", flagged=True, flag_reason="unavailable") for _ in contexts]
        return [
            Score(float(len(c.output) % 11), "ok", latency_s=0.5, prompt_tokens=10)
            for c in contexts
        ]


def ctx(i: int) -> CoachContext:
    return CoachContext("task", "solver", "role", 0, "in", "x" * i, None, False, None)


def test_cache_then_replay_pays_nothing(tmp_path: Path) -> None:
    inner = FakeCountingCoach()
    cached = CachedCoach(inner, ScoreCache(tmp_path / "c.sqlite"), "ns")
    first = cached.score([ctx(i) for i in range(6)])
    assert inner.seen == 6 and not any(s.cached for s in first)
    again = cached.score([ctx(i) for i in range(8)])
    assert inner.seen == 8  # only the two new contexts were scored
    assert [s.cached for s in again] == [True] * 6 + [False] * 2
    assert [s.value for s in again[:6]] == [s.value for s in first]

    replay = CachedCoach(None, ScoreCache(tmp_path / "c.sqlite"), "ns", replay=True)
    assert [s.value for s in replay.score([ctx(i) for i in range(8)])] == [s.value for s in again]
    with pytest.raises(CoachCacheMiss, match="1 of 2 actions"):
        replay.score([ctx(1), ctx(99)])
    other_template = CachedCoach(None, ScoreCache(tmp_path / "c.sqlite"), "ns2", replay=True)
    with pytest.raises(CoachCacheMiss):
        other_template.score([ctx(1)])


def test_unavailable_scores_are_not_cached(tmp_path: Path) -> None:
    cache = ScoreCache(tmp_path / "c.sqlite")
    CachedCoach(FakeCountingCoach(fail=True), cache, "ns").score([ctx(1)])
    assert len(cache) == 0
    inner = FakeCountingCoach()
    CachedCoach(inner, cache, "ns").score([ctx(1)])
    assert inner.seen == 1 and len(cache) == 1


def test_shipped_templates_render_only_what_they_may(tmp_path: Path) -> None:
    for name in SHIPPED:
        t = load_template(name)
        final = CoachContext(
            "T",
            "verifier",
            "R",
            1,
            "IN",
            "OUT",
            "OBS",
            True,
            "GT-42",
            truncated=True,
            output_limit=256,
            files="train.csv (given)",
        )
        sys_msg, user = (m["content"] for m in render_messages(t, final))
        assert "GT-42" in user and "ANSWER_CORRECT" in sys_msg and "256" in sys_msg
        assert "cut off" in user and "action 2" in user
        mid = CoachContext("T", "solver", "R", 0, "IN", "OUT", None, False, None)
        sys_msg, user = (m["content"] for m in render_messages(t, mid))
        assert "Reference" not in user and "ANSWER_CORRECT" not in sys_msg
    assert "train.csv (given)" in render_messages(load_template("dsbench"), final)[1]["content"]
    assert load_template("mathchat").digest != load_template("dsbench").digest


def test_user_template_with_unknown_placeholder_fails_at_config_load(tmp_path: Path) -> None:
    bad = tmp_path / "coach.yaml"
    bad.write_text("system: judge\nuser: 'Task {task} by {agent_name}'\n")
    with pytest.raises(TemplateError, match="agent_name"):
        load_template(str(bad))
    with pytest.raises(TemplateError, match="agent_name"):  # before any model loads
        check(load_config(default_config(), [f"coach.template={bad}"]))
    broken = tmp_path / "broken.yaml"
    broken.write_text("system: judge\nuser: 'Task {task}\n")
    with pytest.raises(TemplateError) as err:  # PyYAML's message spans lines
        load_template(str(broken))
    assert str(err.value).startswith(f"{broken}: not valid YAML: line 3, column 1: found ")
    assert str(err.value).endswith("; fix the YAML syntax") and "\n" not in str(err.value)
    good = tmp_path / "ok.yaml"
    good.write_text("system: judge\nuser: 'Task {task}, output {output}'\n")
    assert load_config(default_config(), [f"coach.template={good}"]).coach.template == str(good)


def test_accounting() -> None:
    scores = [
        Score(7, latency_s=1.0, prompt_tokens=100, completion_tokens=20, retries=1),
        Score(
            5,
            latency_s=3.0,
            prompt_tokens=50,
            completion_tokens=10,
            flagged=True,
            flag_reason="unavailable",
        ),
        Score(6, latency_s=2.0, prompt_tokens=10, completion_tokens=5, cached=True),
    ]
    acc = accounting(scores, price_prompt=2.0, price_completion=10.0)
    assert (acc["coach/calls"], acc["coach/cache_hits"], acc["coach/retries"]) == (2, 1, 1)
    assert (acc["coach/failures"], acc["coach/flagged"]) == (1, 1)
    assert (acc["coach/latency_p50_s"], acc["coach/latency_p95_s"]) == (1.0, 3.0)
    # (150 * 2 + 30 * 10) / 1e6 = 600e-6 ; the cached call costs nothing
    assert acc["coach/cost_usd"] == pytest.approx(600e-6)


def _episode(task_type: str, scores: list[float], correct: bool) -> Episode:
    ep = Episode("e", "t", "task", "1", task_type=task_type, correct=correct)
    for agent, v in zip(["solver", "verifier"], scores, strict=True):
        ep.actions.append(Action("e", agent, 0, [1], [2], [0.0], "", "", False, coach=Score(v)))
    return ep


def test_bias_statistics() -> None:
    eps = [
        _episode("regression", [8, 9], True),
        _episode("regression", [6, 8], True),
        _episode("classification", [4, 2], False),
        _episode("classification", [6, 1], False),
    ]
    b = bias(eps, "verifier")
    assert b["coach_bias/task_type/regression/mean"] == pytest.approx(7.75)  # (8+9+6+8)/4
    assert b["coach_bias/task_type/classification/mean"] == pytest.approx(3.25)  # (4+2+6+1)/4
    assert b["coach_bias/agent/solver/mean"] == pytest.approx(6.0)
    # verifier 9, 8, 2, 1 vs outcomes 1, 1, 0, 0: means 5 and .5; cov sum 4*.5+3*.5+3*.5+4*.5=7;
    # sum sq 16+9+9+16=50 and 4*.25=1 ; r = 7/sqrt(50) = 0.989949
    assert b["coach_bias/final_vs_outcome_r"] == pytest.approx(0.989949, abs=1e-5)
    assert point_biserial([1.0, 2.0], [True, True]) is None


def test_coach_check_cli_with_a_real_local_model(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mappa.cli import main

    rc = main(["coach-check", f"model.path={tiny_model_dir}", "coach.cache.mode=off"])
    out = capsys.readouterr().out
    assert rc == 0 and "pairs right" in out and "verifier" in out


def test_cache_uses_wal_and_a_busy_timeout(tmp_path: Path) -> None:
    cache = ScoreCache(tmp_path / "c.sqlite")
    assert cache.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert cache.db.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
    other = ScoreCache(tmp_path / "c.sqlite")  # a second run on the same file
    CachedCoach(FakeCountingCoach(), cache, "ns").score([ctx(1)])
    assert other.get(CachedCoach(None, other, "ns", replay=True).key(ctx(1))) is not None


def test_a_corrupt_cache_is_moved_aside_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    cache = ScoreCache(path)
    assert "moved aside" in caplog.text
    [aside] = tmp_path.glob("c.sqlite.corrupt-*")
    assert aside.read_bytes().startswith(b"this is not a database")
    inner = FakeCountingCoach()
    CachedCoach(inner, cache, "ns").score([ctx(1), ctx(2)])
    assert inner.seen == 2 and len(cache) == 2


def test_a_failed_cache_write_warns_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import sqlite3

    path = tmp_path / "c.sqlite"
    cache = ScoreCache(path)
    cache.db.close()
    cache.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)  # writes now fail
    inner = FakeCountingCoach()
    scores = CachedCoach(inner, cache, "ns").score([ctx(1), ctx(3)])
    assert [s.value for s in scores] == [1.0, 3.0] and "storing 2 scores failed" in caplog.text
    assert len(cache) == 0
    cache.db.close()
    cache.db = sqlite3.connect(":memory:")  # reads fail too (no table): a miss, not a crash
    assert cache.get("k") is None and "reading a score failed" in caplog.text


def test_an_unopenable_cache_falls_back_to_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = ScoreCache(blocker / "c.sqlite")  # its folder cannot exist
    assert "in memory" in caplog.text
    inner = FakeCountingCoach()
    CachedCoach(inner, cache, "ns").score([ctx(1)])
    CachedCoach(inner, cache, "ns").score([ctx(1)])
    assert inner.seen == 1  # still a cache for this run


def test_a_user_template_under_home_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``~`` is the home directory, as in a shell: a config is not read by one."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "judge.yaml").write_text("system: judge\nuser: 'Task {task}, output {output}'\n")
    assert load_template("~/judge.yaml").user == "Task {task}, output {output}"
