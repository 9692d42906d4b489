"""How an action becomes the coach's view: the reference scope, the answer check and the
tool status."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mappa.cli import default_config
from mappa.coach import CoachView, build_context
from mappa.coach.templates import SHIPPED, load_template, render_messages
from mappa.config import ConfigError, load_config
from mappa.records import Action, Episode
from mappa.run import preflight
from mappa.tasks import Task
from mappa.workflow.outcome import judge

ROLES = {"solver": "Solves.", "verifier": "Checks."}


def _episode(
    *agents: str, final_answer: str | None = "13", correct: bool | None = False
) -> Episode:
    actions = [
        Action("e", agent, turn, [1], [2], [-0.1], "in", f"{agent} {turn} \\boxed{{13}}", False)
        for turn, agent in enumerate(agents)
    ]
    return Episode(
        "e",
        "t",
        "What is 5 + 6?",
        "11",
        actions=actions,
        final_answer=final_answer,
        correct=correct,
    )


def _checks(ep: Episode, view: CoachView) -> list[str | None]:
    return [build_context(ep, a, ROLES, "verifier", view).answer_check for a in ep.actions]


def test_the_verdict_goes_with_the_final_agents_last_action_only() -> None:
    ep = _episode("solver", "verifier", "verifier")
    checks = _checks(ep, CoachView(reference_for="all", answer_check=True))
    assert checks[:2] == [None, None]  # the solver's, and the verifier's earlier action
    assert checks[2] == (
        "The final answer in this reply is 13: it does NOT equal the reference answer 11."
    )
    right = _episode("verifier", final_answer="11", correct=True)
    assert _checks(right, CoachView(answer_check=True)) == [
        "The final answer in this reply is 11: it equals the reference answer."
    ]
    none = _episode("verifier", final_answer=None, correct=False)
    assert "no final answer" in str(_checks(none, CoachView(answer_check=True))[0])


@pytest.mark.parametrize(
    "view",
    [
        CoachView(answer_check=False),  # off: the paper's view
        CoachView(reference_for="none", answer_check=True),  # no reference, no verdict on it
    ],
)
def test_no_verdict_when_off_or_without_the_reference(view: CoachView) -> None:
    assert _checks(_episode("solver", "verifier"), view) == [None, None]


def test_no_verdict_for_an_ungraded_episode_or_a_modeling_task() -> None:
    view = CoachView(answer_check=True)
    assert _checks(_episode("verifier", correct=None), view) == [None]
    modeling = _episode("verifier", final_answer=None, correct=True)
    modeling.metrics = {"success": 1.0}  # its reference is the graded outcome already
    assert _checks(modeling, view) == [None]


def test_the_brief_template_shows_the_verdict_under_the_reference() -> None:
    ep = _episode("verifier")
    template = load_template("mathchat_brief")
    on = build_context(ep, ep.actions[0], ROLES, "verifier", CoachView(answer_check=True))
    user = render_messages(template, on)[1]["content"]
    assert user.endswith(
        "## Reference answer (for your judgement only; the agent did not see it)\n11\n\n"
        "## Checked by the grader\n"
        "The final answer in this reply is 13: it does NOT equal the reference answer 11."
    )
    off = build_context(ep, ep.actions[0], ROLES, "verifier", CoachView())
    assert "grader" not in render_messages(template, off)[1]["content"]
    assert template.shows_answer_check and not load_template("mathchat").shows_answer_check
    assert on.digest() != off.digest()  # cached scores without the verdict are not reused


@pytest.mark.parametrize("name", SHIPPED)
def test_without_the_verdict_the_final_answer_is_shown_beside_the_reference(name: str) -> None:
    """The paper's view (reference to the final agent, no verdict): the coach is shown the
    answer the grader would read, a fact beside the reference, never whether they agree;
    not for an upstream agent, not where the verdict is shown, not on a modeling task (its
    reference is the graded outcome), "none" without a box."""
    template = load_template(name)
    ep = _episode("solver", "verifier")
    header = "## The final agent's answer, read from its reply\n"

    def user(view: CoachView, action: int = 1, ep: Episode = ep) -> str:
        ctx = build_context(ep, ep.actions[action], ROLES, "verifier", view)
        return render_messages(template, ctx)[1]["content"]

    paper = user(CoachView(reference_for="final"))
    assert f"{header}13" in paper and "equal" not in paper.split(header)[1]
    assert header not in user(CoachView(reference_for="all"), action=0)  # upstream
    assert header not in user(CoachView(reference_for="final", answer_check=True))
    assert header not in user(CoachView(reference_for="none"))  # no reference shown
    unboxed = dataclasses.replace(ep.actions[1], completion_text="It is 13.")
    ep_unboxed = dataclasses.replace(ep, actions=[ep.actions[0], unboxed])
    assert f"{header}none (no boxed answer)" in user(
        CoachView(reference_for="final"), ep=ep_unboxed
    )
    modeling = dataclasses.replace(ep, metrics={"success": 1.0})  # its reference: the outcome
    modeling.actions[1].coach_reference = "success 1.0"
    assert header not in user(CoachView(reference_for="final"), ep=modeling)


def test_answer_check_with_a_template_that_never_shows_it_is_a_config_error() -> None:
    cfg = load_config(default_config(), ["coach.answer_check=true", "coach.template=mathchat"])
    with pytest.raises(ConfigError, match="coach.answer_check: template 'mathchat' never shows"):
        preflight.check(cfg)
    brief = load_config(
        default_config(), ["coach.answer_check=true", "coach.template=mathchat_brief"]
    )
    preflight.check(brief)


def test_the_view_follows_the_config() -> None:
    cfg = load_config(
        default_config(),
        ["coach.answer_check=true", "coach.show_ground_truth=false", "coach.observation_chars=300"],
    )
    view = CoachView.of(cfg)
    assert (view.answer_check, view.reference_for, view.observation_chars) == (True, "none", 300)
    assert view.output_limit == cfg.rollout.max_new_tokens
    assert view.answer_format == cfg.tasks.answer_format


def test_reference_for_none_shows_no_agent_the_reference() -> None:
    cfg = load_config(default_config(), ["coach.reference_for=none"])
    view = CoachView.of(cfg)
    assert view.reference_for == "none" == cfg.coach.reference_scope
    ep = _episode("solver", "verifier")
    assert [build_context(ep, a, ROLES, "verifier", view).ground_truth for a in ep.actions] == [
        None,
        None,
    ]


def test_a_grader_that_timed_out_is_not_worded_as_a_wrong_answer(tmp_path: Path) -> None:
    """A comparison that hangs (a tower of powers) gives no verdict in time: the episode is
    graded wrong, as the grader counts it, but the coach is told it was never checked."""
    outcome = judge(
        Task("t", "What is 5 + 6?", "11"), r"\boxed{10^{10^{10}}}", tmp_path, "boxed", 1.0
    )
    assert outcome.grader_timed_out and outcome.correct is False
    ep = _episode("solver", "verifier", final_answer=outcome.final_answer, correct=False)
    ep.grader_timed_out = outcome.grader_timed_out
    check = str(_checks(ep, CoachView(answer_check=True))[-1])
    assert "could not check" in check and "does NOT equal" not in check
    assert "10^{10^{10}}" in check and "reference answer 11 " in check


def test_on_a_modeling_task_upstream_agents_never_see_the_final_outcome() -> None:
    """The episode's final outcome is later than an upstream action: with the reference for
    every agent, an upstream agent sees the outcome as of its own action, which only the
    final agent's actions have (the submission is theirs)."""
    ep = _episode("solver", "verifier", "verifier", final_answer=None, correct=True)
    ep.answer, ep.metrics = None, {"success": 1.0, "accuracy": 0.9}
    ep.coach_reference = "classification: accuracy=0.9"
    ep.actions[1].coach_reference = "classification: no valid submission: missing"
    ep.actions[2].coach_reference = ep.coach_reference
    view = CoachView(reference_for="all")
    shown = [build_context(ep, a, ROLES, "verifier", view).ground_truth for a in ep.actions]
    assert shown == [None, "classification: no valid submission: missing", ep.coach_reference]


def test_the_tool_status_travels_to_every_coach() -> None:
    """A model coach reads it in every shipped template; it is part of the cache key."""
    ep = _episode("solver")
    ep.actions[0].tool_observation, ep.actions[0].tool_stdout = "[exit code 1]", ""
    crashed = dataclasses.replace(ep.actions[0], tool_status="error")
    ran = dataclasses.replace(ep.actions[0], tool_status="ok")
    view = CoachView(reference_for="all")
    bad, good = (build_context(ep, a, ROLES, "verifier", view) for a in (crashed, ran))
    assert (bad.tool_status, bad.stdout, good.tool_status) == ("error", "", "ok")
    assert bad.digest() != good.digest()
    for name in SHIPPED:
        user = render_messages(load_template(name), bad)[1]["content"]
        assert "[exit code 1]\n[tool status: error, the program failed" in user, name
        assert "[tool status: ok" in render_messages(load_template(name), good)[1]["content"]
    no_code = build_context(_episode("solver"), _episode("solver").actions[0], ROLES, "v", view)
    assert "tool status" not in render_messages(load_template("mathchat"), no_code)[1]["content"]


# --- hindsight -----------------------------------------------------------------------------

TEAM = {"problem_solver": "Solves.", "code_executor": "Codes.", "verifier": "Checks."}


def _team_episode(solver: str, printed: str | None, status: str, boxed: str) -> Episode:
    """Solver, Code Executor (its run printed ``printed`` and ended ``status``), Verifier."""
    actions = [
        Action("e", "problem_solver", 0, [1], [2], [-0.1], "in", solver, False),
        Action(
            "e",
            "code_executor",
            1,
            [1],
            [2],
            [-0.1],
            "in",
            "```python\nprint(x)\n```",
            False,
            tool_observation=printed or "Traceback",
            tool_status=status,  # type: ignore[arg-type]
            tool_stdout=printed,
        ),
        Action("e", "verifier", 2, [1], [2], [-0.1], "in", f"So \\boxed{{{boxed}}}", False),
    ]
    return Episode("e", "t", "What is 13 * 2?", "26", actions=actions)


def _hindsight(ep: Episode, view: CoachView) -> list[str | None]:
    return [build_context(ep, a, TEAM, "verifier", view).hindsight for a in ep.actions]


def test_hindsight_is_off_by_default_and_reads_the_episodes_own_runs() -> None:
    """The solver is told what the program after it printed and whether its result is that
    number, the verifier whether its answer is what the program before it printed; the code
    action sees its own output already. No label is read: the reference is 26 throughout."""
    ep = _team_episode("13 * 2 = 24.", "26\n", "ok", "24")
    assert _hindsight(ep, CoachView(reference_for="none")) == [None, None, None]
    solver, code, verifier = _hindsight(ep, CoachView(reference_for="none", hindsight=True))
    assert solver == (
        "The code executor's program, run after this action, printed 26; this action's "
        "stated result 24 does NOT equal it."
    )
    assert code is None
    assert verifier is not None and "before this action, printed 26" in verifier
    assert "answer 24 does NOT equal it" in verifier
    agree = _team_episode("13 * 2 = 26.", "26\n", "ok", "26")
    assert "stated result 26 equals it" in str(_hindsight(agree, CoachView(hindsight=True))[0])


def test_a_failed_run_gives_no_result_and_the_template_shows_the_evidence() -> None:
    ep = _team_episode("13 * 2 = 26.", None, "error", "26")
    view = CoachView(reference_for="none", hindsight=True)
    solver = build_context(ep, ep.actions[0], TEAM, "verifier", view)
    assert solver.hindsight == (
        "The code executor's program, run after this action, gave no result (error)."
    )
    text = render_messages(load_template("mathchat_brief"), solver)[1]["content"]
    assert "## What the episode showed later (no label" in text and "gave no result" in text
