"""The rules coach: the answer oracle's checks per kind of action, the label-free control
rules (form only, random), user rules, and how a broken rule or config is refused."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import SMOKE_CONFIG

from mappa.coach import CoachFatalError
from mappa.coach.context import CoachContext
from mappa.coach.rules import (
    ORACLE,
    RuleCoach,
    answer_oracle,
    format_rule,
    load_rule,
    random_score,
)
from mappa.config import load_config
from mappa.records import Score
from mappa.run import build, preflight

CTX = CoachContext(
    task="Ann has 5 pens and buys 6 more. How many pens?",
    agent="problem_solver",
    role="Solves.",
    turn=0,
    agent_input="in",
    output="",
    observation=None,
    is_final=False,
    ground_truth="11",
)


_RAN = {"agent": "code_executor", "tool_status": "ok", "observation": "11"}
"""An action whose code ran without an error."""
_FINAL = {"agent": "verifier", "is_final": True}


def _oracle(**fields: object) -> Score:
    return answer_oracle(dataclasses.replace(CTX, **fields))


@pytest.mark.parametrize(
    ("fields", "value"),
    [
        # the Problem Solver: the result its reply states (a box wins over later numbers)
        ({"output": r"5 + 6 = 11, so \boxed{11}."}, 10.0),
        ({"output": "5 + 6 = 11 pens"}, 10.0),
        ({"output": r"5 + 6 = \boxed{12}, not 11"}, 0.0),
        ({"output": "Add the pens."}, 0.0),  # no result at all
        # the Code Executor: the last number its program printed on stdout, not its reply
        ({**_RAN, "output": "print(5+6)  # 12", "stdout": "11\n"}, 10.0),
        ({**_RAN, "output": r"\boxed{11}", "stdout": "1,000\n"}, 0.0),
        ({**_RAN, "output": "x = 11", "stdout": ""}, 0.0),  # printed nothing: no result
        # ... and a program that failed has no result, whatever it or its reply printed
        ({**_RAN, "tool_status": "error", "stdout": "11\n", "observation": "11\nTraceback"}, 0.0),
        ({**_RAN, "tool_status": "timeout", "stdout": "11\n"}, 0.0),
        ({**_RAN, "tool_status": "limit", "stdout": "11\n"}, 0.0),
        # stderr is not read: a warning after the right print is still the right print
        ({**_RAN, "stdout": "11\n", "observation": "11\nUserWarning: 99"}, 10.0),
        # a record that kept no stdout apart: its observation, and nothing when it failed
        ({**_RAN, "stdout": None, "observation": "5 + 6 = 11"}, 10.0),
        ({**_RAN, "tool_status": None, "stdout": None, "observation": "11"}, 10.0),
        ({**_RAN, "tool_status": "error", "stdout": None, "observation": "11"}, 0.0),
        # the Verifier: only the answer the grader reads under the run's answer format
        ({**_FINAL, "output": r"\boxed{11.0}"}, 10.0),
        ({**_FINAL, "output": "Answer: 11"}, 0.0),
        ({**_FINAL, "output": "Answer: 11", "answer_format": "answer_line"}, 10.0),
        ({**_FINAL, "output": r"\boxed{11}", "answer_format": "answer_line"}, 0.0),
        ({**_FINAL, "output": "It is 11."}, 0.0),
        ({**_FINAL, "output": r"\boxed{10}"}, 0.0),
    ],
)
def test_the_oracle_checks_each_actions_result_against_the_reference(
    fields: dict[str, object], value: float
) -> None:
    score = _oracle(**fields)
    assert score.value == value
    assert "reference 11" in score.rationale


def test_the_oracle_refuses_an_action_shown_without_the_reference() -> None:
    with pytest.raises(CoachFatalError, match="reference_for: all"):
        _oracle(output=r"\boxed{11}", ground_truth=None)


def test_a_user_rule_scores_every_context_in_order_and_its_failures_stop_the_run() -> None:
    coach = RuleCoach(lambda ctx: len(ctx.output), "len")
    scores = coach.score([dataclasses.replace(CTX, output="x" * n) for n in (3, 0, 10)])
    assert [s.value for s in scores] == [3.0, 0.0, 10.0]
    assert {s.backend for s in scores} == {"rules"} and not any(s.flagged for s in scores)
    with pytest.raises(CoachFatalError, match="returned 11.0 .* 0-10"):
        coach.score([dataclasses.replace(CTX, output="x" * 11)])
    with pytest.raises(CoachFatalError, match="returned nan"):
        RuleCoach(lambda ctx: float("nan"), "nan").score([CTX])

    def broken(ctx: CoachContext) -> float:
        raise KeyError("oops")

    with pytest.raises(CoachFatalError, match="rule b raised on the 'problem_solver' .*KeyError"):
        RuleCoach(broken, "b").score([CTX])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("answer_oracle", "not of the form module:function"),
        ("mappa.no_such_module:f", "cannot import 'mappa.no_such_module'"),
        ("mappa.coach.rules:ORACLE", "no callable 'ORACLE'"),
    ],
)
def test_load_rule_says_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_rule(spec)
    assert load_rule(ORACLE) is answer_oracle


def test_preflight_refuses_the_oracle_without_every_agents_reference_or_a_bad_rule() -> None:
    rules = ["coach.backend=rules", "rl.w_process=1"]
    ok = load_config(SMOKE_CONFIG, [*rules, "coach.reference_for=all"])
    preflight.check(ok)
    with pytest.raises(ValueError, match="to the final agent only: set coach.reference_for: all"):
        preflight.check(load_config(SMOKE_CONFIG, [*rules, "coach.reference_for=final"]))
    with pytest.raises(ValueError, match="shows to no agent: set coach.reference_for: all"):
        preflight.check(load_config(SMOKE_CONFIG, [*rules, "coach.reference_for=none"]))
    with pytest.raises(ValueError, match="cannot import"):
        preflight.check(load_config(SMOKE_CONFIG, [*rules, "coach.rules.function=nope:f"]))
    # an outcome-only run asks no coach: its rule is never loaded, so it is not checked
    preflight.check(
        load_config(
            SMOKE_CONFIG, [*rules, "coach.rules.function=nope:f", "rl.advantage=outcome_only"]
        )
    )


def test_make_coach_builds_the_rule_uncached_and_without_a_model() -> None:
    cfg = load_config(SMOKE_CONFIG, ["coach.backend=rules", "coach.reference_for=all"])
    coach = build.make_coach(cfg, policies=None)
    assert isinstance(coach, RuleCoach) and coach.rule is answer_oracle


@pytest.mark.parametrize(
    ("fields", "value"),
    [
        ({**_FINAL, "output": "So \\boxed{11}."}, 10.0),
        ({**_FINAL, "output": "So \\boxed{11}.", "truncated": True}, 5.0),
        ({**_FINAL, "output": "The answer is 11."}, 5.0),  # the grader reads no boxed answer
        ({**_RAN, "stdout": "11\n"}, 10.0),
        ({**_RAN, "stdout": "done\n"}, 5.0),  # ran, printed no number
        ({**_RAN, "tool_status": "error", "stdout": "11\n"}, 5.0),  # failed: no result
        # asked to run code (shown the workspace), wrote none: the number it states earns nothing
        ({"agent": "code_executor", "files": "(no files)", "output": "It is 11."}, 5.0),
        ({"output": "5 + 6 = 11"}, 10.0),
        ({"output": "Let me think", "truncated": True}, 0.0),
    ],
    ids=[
        "boxed",
        "boxed-cut-off",
        "unboxed",
        "printed",
        "no-number",
        "crashed",
        "ran-no-code",
        "stated",
        "cut-off-nothing",
    ],
)
def test_the_format_rule_scores_form_and_never_the_reference(
    fields: dict[str, object], value: float
) -> None:
    ctx = dataclasses.replace(CTX, **fields)
    score = format_rule(ctx)
    assert score.value == value, score.rationale
    # a wrong reference, or none, changes nothing: the rule reads no label
    for reference in (None, "12"):
        assert format_rule(dataclasses.replace(ctx, ground_truth=reference)) == score


def test_the_random_score_is_a_fixed_uniform_draw_per_action() -> None:
    contexts = [dataclasses.replace(CTX, output=f"reply {i}") for i in range(2000)]
    values = [random_score(c).value for c in contexts]
    assert values == [random_score(c).value for c in contexts]  # a rerun agrees
    assert all(0.0 <= v <= 10.0 for v in values)
    deciles = [sum(k <= v < k + 1 for v in values) for k in range(10)]
    assert min(deciles) > 150 and max(deciles) < 250  # ~200 each: uniform over 0-10


@pytest.mark.parametrize("rule", ["format_rule", "random_score"])
def test_the_control_rules_run_without_any_reference(rule: str) -> None:
    cfg = load_config(
        SMOKE_CONFIG,
        [
            "coach.backend=rules",
            f"coach.rules.function=mappa.coach.rules:{rule}",
            "coach.show_ground_truth=false",
            "rl.w_process=1",
        ],
    )
    preflight.check(cfg)
    coach = build.make_coach(cfg, policies=None)
    assert isinstance(coach, RuleCoach)
    scores = coach.score([CTX, dataclasses.replace(CTX, output="5 + 6 = 11")])
    assert all(s.backend == "rules" and 0 <= s.value <= 10 for s in scores)
