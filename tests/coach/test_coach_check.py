"""``mappa coach-check``: labelled actions (built-in or ``--cases``), a run's episodes
rescored (``--episodes``), and the coach server it starts and stops (``--serve``, an
experiment's ``coach_server:``). Unit tests score with fake coaches; one integration test
runs the real demo coach (SmolLM2-135M)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SMOKE_CONFIG

from mappa.cli import main
from mappa.coach import CoachFatalError
from mappa.coach.base import CoachView
from mappa.coach.check import (
    CASES,
    ROLES,
    CaseError,
    case_contexts,
    case_episode,
    check_report,
    discrimination,
    mode_share,
    pair_accuracy,
    parse_case,
    parse_cases,
    spaced,
    tie_rate,
)
from mappa.coach.context import CoachContext
from mappa.coach.rules import ORACLE, RuleCoach, answer_oracle
from mappa.config import RunConfig, load_config
from mappa.records import Action, Episode, Score, append_episodes, read_episodes

AGENTS = ["problem_solver", "code_executor", "verifier"]


class FakeKeywordCoach:
    """Fake coach: 8 for an output that says ``right``, 2 otherwise; a digit mass of 0.9
    for the verifier only; records every context it was asked about and the config it was
    built from."""

    name = "fake-keyword"

    def __init__(self) -> None:
        self.seen: list[CoachContext] = []
        self.cfg: RunConfig | None = None

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        self.seen += contexts
        return [
            Score(
                8.0 if "right" in c.output else 2.0,
                digit_mass=0.9 if c.agent == "verifier" else None,
            )
            for c in contexts
        ]


class FakeOracleCoach:
    """Fake coach that knows the built-in check set: 8 for good actions, 2 for bad."""

    name = "oracle"

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        return [Score(8.0 if case.good else 2.0) for case, _ in zip(CASES, contexts, strict=True)]


class FakeServer:
    """Fake coach server: records starts and stops; its URL is never asked (a fake coach)."""

    name = "fake-server"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs
        self.base_url = "http://127.0.0.1:9/v1"
        self.log = Path("/dev/null")
        self.started = self.stopped = 0

    def start(self) -> FakeServer:
        self.started += 1
        return self

    def stop(self) -> None:
        self.stopped += 1


@pytest.fixture
def fake_coach(monkeypatch: pytest.MonkeyPatch) -> FakeKeywordCoach:
    """The CLI's coach is the fake (no model is loaded); it keeps the config it got. The
    default config is the smoke config, so these tests pin what the demo may change."""
    coach = FakeKeywordCoach()
    monkeypatch.setattr("mappa.cli.default_config", lambda: SMOKE_CONFIG)

    def build(cfg: RunConfig) -> FakeKeywordCoach:
        coach.cfg = cfg
        return coach

    monkeypatch.setattr("mappa.cli._check_coach", build)
    return coach


def _line(agent: str, good: bool, **extra: Any) -> str:
    row = {
        "agent": agent,
        "task": f"task for {agent}",
        "answer": "42",
        "output": f"{'right' if good else 'wrong'} work by {agent}",
        "observation": None,
        "good": good,
        **extra,
    }
    return json.dumps(row)


def _cases_file(tmp_path: Path, lines: Sequence[str]) -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


FOUR = [
    _line("code_executor", True, observation="42\n" + "x" * 5000, input="Problem: t\nwrite code"),
    _line("code_executor", False, observation="NameError", truncated=True, error="name_error"),
    _line("verifier", True),
    _line("verifier", False),
]


# --- statistics --------------------------------------------------------------------------


def test_pair_accuracy_and_tie_rate_match_their_pairwise_definitions() -> None:
    """The sorted implementations equal the O(n^2) definitions, ties (to 1e-9) included."""
    rng = random.Random(0)
    for _ in range(50):
        pos = [rng.choice([2.0, 5.0, 5.0 + 1e-12, 7.5, rng.uniform(0, 10)]) for _ in range(7)]
        neg = [rng.choice([2.0, 5.0, 7.5, rng.uniform(0, 10)]) for _ in range(5)]
        pairs = [
            1.0 if p - n > 1e-9 else 0.5 if abs(p - n) <= 1e-9 else 0.0 for p in pos for n in neg
        ]
        assert pair_accuracy(pos, neg) == pytest.approx(sum(pairs) / len(pairs))
        both = pos + neg
        ties = [abs(a - b) <= 1e-9 for i, a in enumerate(both) for b in both[i + 1 :]]
        assert tie_rate(both) == pytest.approx(sum(ties) / len(ties))


def test_small_statistics() -> None:
    assert pair_accuracy([5.0, 5.0], [5.0]) == 0.5  # all ties: chance
    assert pair_accuracy([1.0], [9.0]) == 0.0 and pair_accuracy([1.0], []) is None
    assert tie_rate([3.0, 3.0]) == 1.0 and tie_rate([]) is None
    assert mode_share([5.0, 5.02, 4.98, 9.0]) == (5.0, 0.75) and mode_share([]) is None
    assert spaced([1, 2, 3], None) == [1, 2, 3] and spaced([1, 2, 3], 5) == [1, 2, 3]


def test_builtin_table_and_json() -> None:
    """The oracle ranks every pair; a coach that says 5 to everything ranks half."""
    scores = FakeOracleCoach().score([None] * len(CASES))  # type: ignore[list-item]
    report = check_report(scores, CASES, 3.0)
    assert report.overall == 1.0 and report.usable and "usable" in report.table()
    assert "problem_solver" in report.table() and report.seconds_per_action == 0.25
    assert report.to_json()["roles"]["verifier"]["n_bad"] == 2
    assert report.to_json()["scores"] == [s.value for s in scores]  # per case, in order
    rows = discrimination([Score(5.0)] * len(CASES))
    assert all(r.pairs_right == 0.5 for r in rows)
    flagged = [Score(8.0 if c.good else 2.0, flagged=c.agent == "verifier") for c in CASES]
    assert "NOT reliable" in check_report(flagged, CASES, 1.0).table()  # perfect, but flagged


# --- labelled cases: validation -------------------------------------------------------------

GOOD, BAD = _line("verifier", True), _line("verifier", False)
BAD_FILES = [
    ([GOOD, "{not json"], "cases.jsonl: line 2: not valid JSON"),
    ([GOOD, BAD, "[1, 2]"], "cases.jsonl: line 3: not a JSON object"),
    ([GOOD, json.dumps({**json.loads(BAD), "good": None})], "line 2: 'good' must be true or"),
    ([GOOD, json.dumps({**json.loads(BAD), "good": 0})], "line 2: 'good' must be true or false"),
    ([GOOD, json.dumps({**json.loads(BAD), "task": 7})], "line 2: 'task' must be a string"),
    ([GOOD, json.dumps({**json.loads(BAD), "answer": True})], "line 2: 'answer' must be a"),
    ([GOOD, json.dumps({**json.loads(BAD), "truncated": "no"})], "line 2: 'truncated' must"),
    ([GOOD, json.dumps({**json.loads(BAD), "error": 3})], "line 2: 'error' must be a string"),
    ([GOOD, json.dumps({**json.loads(BAD), "obs": "x"})], "line 2: unknown key 'obs'"),
    (
        [GOOD, json.dumps({**json.loads(BAD), "tool_status": "crashed"})],
        "line 2: 'tool_status' must be one of ok, error, timeout, limit or null",
    ),
    (
        [GOOD, json.dumps({k: v for k, v in json.loads(BAD).items() if k != "observation"})],
        "line 2: missing 'observation'",
    ),
    ([GOOD, _line("critic", False)], "line 2: agent 'critic' is not one of the config's agents"),
    ([GOOD, GOOD, _line("code_executor", False), BAD], "agent 'code_executor' has 0 good and 1"),
    ([GOOD, GOOD], "agent 'verifier' has 2 good and 0 bad cases"),
    (["", "  "], "cases.jsonl: no cases"),
]


@pytest.mark.parametrize(("lines", "message"), BAD_FILES)
def test_bad_cases_are_refused_naming_the_line(lines: list[str], message: str) -> None:
    with pytest.raises(CaseError) as err:
        parse_cases(lines, AGENTS, "cases.jsonl")
    assert message in str(err.value)


@pytest.mark.parametrize("name", ["coach_cases_dev.jsonl", "coach_cases_test.jsonl"])
def test_the_benchmark_case_files_parse_with_both_labels_per_role(name: str) -> None:
    """The labelled sets docs/coach.md measures on stay valid cases for the MathChat roles."""
    path = Path(__file__).parents[2] / "benchmarks" / "data" / name
    cases = parse_cases(path.read_text().splitlines(), AGENTS, name)
    for agent in AGENTS:
        labels = [c.good for c in cases if c.agent == agent]
        assert labels.count(True) == labels.count(False) >= 12


def test_the_cli_refuses_a_bad_cases_file_with_exit_2_before_any_coach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_coach: FakeKeywordCoach
) -> None:
    path = _cases_file(tmp_path, [GOOD, _line("critic", True)])
    assert main(["coach-check", "--cases", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mappa: {path}: line 2: agent 'critic' is not one of") and not (
        fake_coach.seen
    )
    assert main(["coach-check", "--cases", str(tmp_path / "none.jsonl")]) == 2
    assert "no such cases file" in capsys.readouterr().err


# --- labelled cases: through the CLI ---------------------------------------------------------


def test_cases_file_scored_as_training_builds_contexts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_coach: FakeKeywordCoach
) -> None:
    """Roles from the config, the reference for the final agent only (the default scope),
    the output limit, the observation cut to coach.observation_chars, the optional input
    and truncated keys; the JSON has the documented shape."""
    out = tmp_path / "out" / "check.json"
    rc = main(
        [
            "coach-check",
            "--cases",
            str(_cases_file(tmp_path, FOUR)),
            "--json",
            str(out),
            "coach.observation_chars=200",
            "rollout.max_new_tokens=77",
            "agents.verifier.role=You check.",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "code_executor" in printed and "overall pairs right: 100%" in printed
    seen = {(c.agent, "right" in c.output): c for c in fake_coach.seen}
    good_code, bad_code = seen["code_executor", True], seen["code_executor", False]
    assert good_code.agent_input == "Problem: t\nwrite code" and not good_code.truncated
    assert bad_code.agent_input == "Problem: task for code_executor" and bad_code.truncated
    assert good_code.observation is not None and len(good_code.observation) < 400
    assert good_code.observation.startswith("42\n") and bad_code.observation == "NameError"
    assert seen["verifier", True].role == "You check." and seen["verifier", True].is_final
    assert [c.ground_truth for c in fake_coach.seen] == [None, None, "42", "42"]
    assert {c.output_limit for c in fake_coach.seen} == {77}
    result = json.loads(out.read_text())
    assert result["overall"] == 1.0 and result["flagged"] == 0 and result["digit_mass"] == 0.9
    assert set(result["roles"]) == {"code_executor", "verifier"}
    assert result["roles"]["verifier"] == {
        "n_good": 1,
        "n_bad": 1,
        "good": 8.0,
        "bad": 2.0,
        "gap": 6.0,
        "pairs_right": 1.0,
        "flagged": 0,
        "digit_mass": 0.9,
        "by_error": {},
    }
    assert result["roles"]["code_executor"]["digit_mass"] is None
    assert result["roles"]["code_executor"]["by_error"] == {"name_error": 1.0}
    assert "code_executor pairs right by bad kind: name_error 100%" in printed
    assert result["seconds_per_action"] >= 0 and result["coach"]["backend"] == "local"


@pytest.mark.parametrize(
    ("overrides", "shown"),
    [
        ([], {"verifier"}),
        (["coach.reference_for=all"], set(AGENTS)),
        (["coach.show_ground_truth=false"], set()),
    ],
)
def test_builtin_set_follows_the_configs_reference_scope(
    overrides: list[str],
    shown: set[str],
    fake_coach: FakeKeywordCoach,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The view used is reported in the text and the JSON: who saw the reference."""
    out = tmp_path / "check.json"
    assert main(["coach-check", *overrides, "--json", str(out)]) == 0
    view = json.loads(out.read_text())["view"]
    assert set(view["reference_for"]) == shown
    assert set(view["no_reference"]) == set(AGENTS) - shown
    assert view["answer_check"] is False and view["self_solve"] is False
    printed = capsys.readouterr().out
    assert f"view: reference shown to {', '.join(view['reference_for']) or 'no agent'}" in printed
    assert len(fake_coach.seen) == len(CASES)
    assert {c.agent for c in fake_coach.seen if c.ground_truth is not None} == shown
    assert {c.output_limit for c in fake_coach.seen} == {
        96
    }  # the smoke config's rollout.max_new_tokens


# --- recorded episodes ---------------------------------------------------------------------


def _action(eid: str, agent: str, turn: int, good: bool, recorded: float) -> Action:
    text = f"{'right' if good else 'wrong'} {agent} {turn}"
    return Action(eid, agent, turn, [1], [2], [-0.1], "in", text, False, coach=Score(recorded))


def _run_dir(
    tmp_path: Path,
    *overrides: str,
    outcomes: Sequence[bool | None] = (True, False, True, False, None),
    turns: Sequence[tuple[str, int]] = (
        ("problem_solver", 0),
        ("code_executor", 0),
        ("code_executor", 1),
        ("verifier", 0),
    ),
) -> Path:
    """A run dir: its config.yaml and episodes.jsonl with one episode per outcome (by
    default 2 correct, 2 wrong, 1 ungraded), each with these (agent, turn) actions; the
    recorded scores rank them backwards."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = load_config(SMOKE_CONFIG, ["coach.cache.mode=off", *overrides])
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    episodes = []
    for i, correct in enumerate(outcomes):
        eid, good = f"ep{i}", bool(correct)
        actions = [_action(eid, a, t, good, 3.0 if good else 6.0) for a, t in turns]
        episodes.append(Episode(eid, f"t{i}", f"task {i}", "42", actions=actions, correct=correct))
    append_episodes(run_dir / "episodes.jsonl", episodes)
    return run_dir


def test_episodes_rescored_against_the_outcome(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_coach: FakeKeywordCoach
) -> None:
    """Without --config the run's own config is used; the AUC leaves ungraded episodes
    out; the recorded coach's AUC is shown beside it."""
    run_dir = _run_dir(tmp_path, "agents.verifier.role=The run's verifier.")
    out = tmp_path / "rescore.json"
    assert main(["coach-check", "--episodes", str(run_dir), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "AUC" in printed and "verifier" in printed
    assert len(fake_coach.seen) == 5 * 4
    assert {c.role for c in fake_coach.seen if c.agent == "verifier"} == {"The run's verifier."}
    assert [c.ground_truth for c in fake_coach.seen[:4]] == [None, None, None, "42"]
    result = json.loads(out.read_text())
    assert result["episodes"] == 5 and result["graded_episodes"] == 4 and result["actions"] == 20
    assert result["overall"] == 1.0 and result["flagged"] == 0
    assert list(result["agents"]) == AGENTS
    code = result["agents"]["code_executor"]
    assert code["actions"] == 10 and code["graded"] == 8
    assert code["auc"] == 1.0 and code["recorded_auc"] == 0.0
    assert code["spread"] == 6.0 and code["std"] == pytest.approx(2.939, abs=1e-3)
    assert code["mode"] == 2.0 and code["mode_share"] == 0.6  # the 3 wrong-looking episodes
    # 10 scores: six 2s and four 8s -> (15 + 6) tied pairs of 45
    assert code["tie_rate"] == pytest.approx(21 / 45)
    assert code["digit_mass"] is None and result["agents"]["verifier"]["digit_mass"] == 0.9
    assert result["seconds_per_action"] >= 0


def test_episodes_rescored_against_each_actions_oracle_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_coach: FakeKeywordCoach
) -> None:
    """The oracle AUC reads each action's own verdict, not its episode's outcome: a code
    run whose result was wrong in an episode the team still won counts as wrong; an agent
    with no verdicts has none."""
    run_dir = _run_dir(tmp_path)
    path = run_dir / "episodes.jsonl"
    episodes = read_episodes(path)
    for ep in episodes:
        for a in ep.actions:
            a.oracle = {"code_executor": not ep.correct, "verifier": bool(ep.correct)}.get(a.agent)
    path.unlink()
    append_episodes(path, episodes)
    out = tmp_path / "rescore.json"
    assert main(["coach-check", "--episodes", str(run_dir), "--json", str(out)]) == 0
    agents = json.loads(out.read_text())["agents"]
    assert agents["code_executor"]["auc"] == 1.0 and agents["code_executor"]["oracle_auc"] == 0.0
    assert agents["verifier"]["oracle_auc"] == 1.0
    assert agents["problem_solver"]["oracle_auc"] is None
    assert "oracle" in capsys.readouterr().out


def test_episodes_limit_and_a_config_without_the_runs_agents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_coach: FakeKeywordCoach
) -> None:
    run_dir = _run_dir(tmp_path)
    assert main(["coach-check", "--episodes", str(run_dir), "--limit", "2"]) == 0
    assert {c.task for c in fake_coach.seen} == {"task 0", "task 2"}  # spread over the run
    other = tmp_path / "other.yaml"
    other.write_text(
        "agents:\n  - {name: solver, role: Solves., input_template: 'Problem: {task}'}\n"
    )
    rc = main(["coach-check", "--config", str(other), "--episodes", str(run_dir)])
    assert rc == 2
    assert "are not among the config's agents ['solver']" in capsys.readouterr().err


# --- the coach server ----------------------------------------------------------------------


def test_serve_starts_the_server_points_the_coach_at_it_and_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_coach: FakeKeywordCoach
) -> None:
    servers: list[FakeServer] = []

    def make_server(*args: Any, **kwargs: Any) -> FakeServer:
        servers.append(FakeServer(*args, **kwargs))
        return servers[-1]

    monkeypatch.setattr("mappa.coach.servers.make_server", make_server)
    path = _cases_file(tmp_path, FOUR)
    argv = ["coach-check", "--cases", str(path), "coach.cache.mode=off"]
    assert main([*argv, "--serve", "llamacpp:pypi:some-coach", "--threads", "3"]) == 0
    (server,) = servers
    assert server.args == ("llamacpp", "pypi:some-coach") and server.kwargs == {"threads": 3}
    assert server.started == 1 and server.stopped == 1
    assert fake_coach.cfg is not None and fake_coach.cfg.coach.backend == "http"
    assert fake_coach.cfg.coach.http.base_url == server.base_url

    for failure, rc in [(KeyboardInterrupt(), 130), (CoachFatalError("coach: HTTP 401"), 1)]:

        def fail(cfg: RunConfig, failure: BaseException = failure) -> FakeKeywordCoach:
            raise failure

        monkeypatch.setattr("mappa.cli._check_coach", fail)
        assert main([*argv, "--serve", "vllm:/models/coach"]) == rc
        assert servers[-1].started == 1 and servers[-1].stopped == 1  # stopped on the way out


def test_an_experiment_file_gives_its_base_config_and_its_coach_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_coach: FakeKeywordCoach
) -> None:
    servers: list[FakeServer] = []
    monkeypatch.setattr(
        "mappa.coach.servers.make_server",
        lambda *a, **k: servers.append(FakeServer(*a, **k)) or servers[-1],
    )
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(
        "base: demo\noverrides: [rollout.max_new_tokens=77]\nseeds: [0]\n"
        "arms:\n  plain: []\n  wide: [coach.observation_chars=150]\n"
        "coach_server: {model: fake.gguf, threads: 2}\n"
    )
    argv = ["coach-check", "--config", str(experiment), "coach.cache.mode=off"]
    assert main([*argv, "--arm", "wide"]) == 0
    (server,) = servers
    assert server.args[:2] == ("llamacpp", "fake.gguf") and server.args[3] == 2
    assert server.started == 1 and server.stopped == 1
    cfg = fake_coach.cfg
    assert cfg is not None and cfg.rollout.max_new_tokens == 77
    assert cfg.coach.observation_chars == 150 and cfg.coach.http.base_url == server.base_url
    assert main([*argv, "--arm", "nope"]) == 2


# --- the real demo coach -------------------------------------------------------------------


@pytest.mark.integration
def test_real_demo_coach_on_a_cases_file_and_a_recorded_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """configs/demo.yaml's local coach (Qwen2.5-Coder-0.5B, the policy base with adapters
    off) scores a 4-line cases file and rescores a tiny recorded run, end to end."""
    out = tmp_path / "cases.json"
    cases = _cases_file(tmp_path, FOUR)
    view = ["coach.cache.mode=off", "coach.observation_chars=200"]  # short prompts: faster
    assert main(["coach-check", "--cases", str(cases), "--json", str(out), *view]) == 0
    result = json.loads(out.read_text())
    assert set(result["roles"]) == {"code_executor", "verifier"}
    assert 0.0 <= result["overall"] <= 1.0 and result["seconds_per_action"] > 0
    assert result["coach"] == {"backend": "local", "model": "pypi:qwen2.5-coder-0.5b-instruct"}
    run_dir = _run_dir(tmp_path, outcomes=(True, False), turns=[("verifier", 0)])
    out = tmp_path / "episodes.json"
    assert main(["coach-check", "--episodes", str(run_dir), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["actions"] == 2 and result["graded_episodes"] == 2
    verifier = result["agents"]["verifier"]
    assert verifier["auc"] in (0.0, 0.5, 1.0) and verifier["recorded_auc"] == 0.0
    assert 0.0 <= verifier["spread"] <= 10.0 and verifier["digit_mass"] is not None
    assert "AUC" in capsys.readouterr().out


def test_the_answer_check_grades_the_final_agents_cases_as_a_run_does(
    fake_coach: FakeKeywordCoach,
) -> None:
    """With coach.answer_check on, each verifier case carries the grader's verdict on its
    boxed answer (the built-in set: two right, one wrong, one with no answer)."""
    overrides = ["coach.answer_check=true", "coach.template=mathchat_brief"]
    assert main(["coach-check", *overrides]) == 0
    verdicts = [c.answer_check for c in fake_coach.seen if c.agent == "verifier"]
    assert [v is not None and "it equals the reference" in v for v in verdicts] == [
        True,
        True,
        False,
        False,
    ]
    assert "does NOT equal the reference answer 24" in str(verdicts[2])
    assert "no final answer" in str(verdicts[3])
    assert {c.answer_check for c in fake_coach.seen if c.agent != "verifier"} == {None}


def test_the_builtin_set_carries_each_runs_status_and_the_oracle_ranks_it() -> None:
    """A code action's status reaches the coach (the crash reads as one), and the answer
    oracle, reading what the programs printed, ranks every good case above every bad one."""
    view = CoachView(reference_for="all")
    contexts = case_contexts(CASES, ROLES, "verifier", view)
    statuses = [c.tool_status for c in contexts if c.agent == "code_executor"]
    assert statuses == ["ok", "ok", "ok", "error"]
    rows = discrimination(RuleCoach(answer_oracle, ORACLE).score(contexts))
    assert [r.pairs_right for r in rows] == [1.0, 1.0, 1.0]
    case = parse_case(
        json.loads(_line("code_executor", True, observation="24", tool_status="ok")),
        AGENTS,
        "cases.jsonl: line 1",
    )
    assert case.tool_status == case_episode(case).actions[0].tool_status == "ok"
