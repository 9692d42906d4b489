"""The self-solving coach (``coach.self_solve``): the coach's own answer, written once per
task, stands where the view shows no reference, and its agreement check moves the score.
Logic above the ``Writer`` and ``CoachBackend`` interfaces, with fakes; the real writer is
the local scorers' (tests/models/test_llamacpp_scorer.py, tests/models/test_scorer.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from conftest import SMOKE_CONFIG

from mappa.coach.base import CoachView
from mappa.coach.check import CASES, ROLES, case_contexts
from mappa.coach.context import CoachContext
from mappa.coach.self_solve import SelfSolvingCoach, WorkedAnswers, agrees
from mappa.coach.templates import load_template, render_messages
from mappa.config import ConfigError, load_config
from mappa.records import Score
from mappa.run import preflight


class FakeWriter:
    """Fake writer: a fixed solution per task text; counts the conversations it answered."""

    def __init__(self, solutions: dict[str, str]) -> None:
        self.solutions = solutions
        self.calls: list[list[dict[str, str]]] = []
        self.batches: list[int] = []

    def write(self, conversations: Sequence[list[dict[str, str]]], max_tokens: int) -> list[str]:
        self.calls += conversations
        self.batches.append(len(conversations))
        return [self.solutions[c[-1]["content"]] for c in conversations]


class FakeFlatCoach:
    """Fake coach: 5 for every action; keeps the contexts it was shown."""

    name = "fake-flat"

    def __init__(self) -> None:
        self.seen: list[CoachContext] = []

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        self.seen += contexts
        return [Score(5.0) for _ in contexts]


def _solutions(answers: dict[str, str]) -> dict[str, str]:
    return {t: f"Step.\n\\boxed{{{a}}}" if a else "I ran out of room" for t, a in answers.items()}


def _paper_view() -> list[CoachContext]:
    return case_contexts(CASES, ROLES, "verifier", CoachView(reference_for="final"))


def test_the_worked_answer_stands_only_where_no_reference_is_and_is_written_once_per_task() -> None:
    contexts = _paper_view()
    tasks = list(dict.fromkeys(c.task for c in contexts))
    writer = FakeWriter(_solutions({tasks[0]: "24", tasks[1]: "33"}))
    inner = FakeFlatCoach()
    coach = SelfSolvingCoach(inner, WorkedAnswers(writer, 320))
    coach.score(contexts)
    coach.score(contexts)  # a later step: the answers are remembered
    assert len(writer.calls) == len(tasks) == 2
    assert writer.batches == [2]  # the step's tasks solved together, in one call
    for ctx in inner.seen:
        if ctx.agent == "verifier":  # the paper's view: it has the reference
            assert ctx.ground_truth is not None and ctx.worked_answer is None
        else:
            assert ctx.ground_truth is None
            assert ctx.worked_answer == ("24" if ctx.task == tasks[0] else "33")


def test_a_brief_solution_without_a_box_gives_the_result_it_states() -> None:
    """A brief solution often ends on its last line's number without boxing it."""
    writer = FakeWriter({"13 * 2?": "13 * 2 = 26\nDiego has 26 marbles now.", "x?": "\\boxed{4} 5"})
    answers = WorkedAnswers(writer, 320)
    assert answers.answer("13 * 2?") == "26" and answers.answer("x?") == "4"


def test_a_solution_that_states_no_result_gives_no_worked_answer() -> None:
    contexts = case_contexts(CASES, ROLES, "verifier", CoachView(reference_for="none"))
    tasks = list(dict.fromkeys(c.task for c in contexts))
    inner = FakeFlatCoach()
    writer = FakeWriter(_solutions({t: "" for t in tasks}))
    coach = SelfSolvingCoach(inner, WorkedAnswers(writer, 9))
    assert [s.value for s in coach.score(contexts)] == [5.0] * len(contexts)
    assert {c.worked_answer for c in inner.seen} == {None}


def test_the_worked_answer_is_shown_as_the_coachs_own_not_as_a_reference() -> None:
    ctx = _paper_view()[0]
    template = load_template("mathchat_brief")
    plain = render_messages(template, ctx)[1]["content"]
    worked = CoachContext(**{**ctx.__dict__, "worked_answer": "24"})
    text = render_messages(template, worked)[1]["content"]
    assert "worked answer" not in plain and "Reference answer" not in plain
    assert "The coach's own worked answer (NOT a reference" in text and text.endswith("24")
    assert "Reference answer" not in text


def test_agreement_moves_each_score_toward_the_check_where_no_reference_is() -> None:
    """With weight 0.5 a flat 5 becomes 7.5 for an action whose result is the worked
    answer and 2.5 for one whose is not (a wrong sum, a crashed program, no box); the
    verifier, judged with the reference, keeps the model's score."""
    contexts = _paper_view()
    tasks = list(dict.fromkeys(c.task for c in contexts))
    writer = FakeWriter(_solutions({tasks[0]: "24", tasks[1]: "33"}))
    coach = SelfSolvingCoach(FakeFlatCoach(), WorkedAnswers(writer, 320), agreement_weight=0.5)
    scores = coach.score(contexts)
    expected = [5.0 if case.agent == "verifier" else (7.5 if case.good else 2.5) for case in CASES]
    assert [s.value for s in scores] == expected
    assert "does not equal the coach's worked answer" in scores[2].rationale


def test_agreement_reads_the_action_as_the_oracle_does() -> None:
    """A program's printed number, not its reply; a failed program has no result."""
    ctx = CoachContext("t", "code_executor", "r", 0, "in", "print(24)  # 24", "19", False, None)
    assert not agrees(ctx, "24") and agrees(ctx, "19")
    failed = CoachContext(**{**ctx.__dict__, "observation": "24", "tool_status": "error"})
    assert not agrees(failed, "24")


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (["coach.self_solve=true"], False),  # the smoke config's coach is transformers
        (["coach.self_solve=true", "coach.local.engine=llamacpp"], False),
        (["coach.self_solve=true", "coach.backend=http"], True),  # a server writes no solution
        (["coach.self_solve=false", "coach.backend=http"], False),
    ],
)
def test_self_solve_needs_an_in_process_coach(overrides: list[str], refused: bool) -> None:
    cfg = load_config(SMOKE_CONFIG, ["coach.cache.mode=off", *overrides])
    problems = preflight._coach_problems(cfg)
    assert any("coach.self_solve" in p for p in problems) is refused
    if refused:
        with pytest.raises(ConfigError, match="coach.self_solve"):
            preflight.check(cfg)
