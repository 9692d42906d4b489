"""Rule-based per-action rewards: a coach backend that scores each action with a Python
function instead of a model (``coach.backend: rules``).

A rule is any importable callable ``rule(context: CoachContext) -> float | Score`` that
returns a score in 0-10; ``coach.rules.function`` names it as ``module:function``. It sees
the same ``CoachContext`` a model coach would (role, input, output, tool output, and the
reference for the agents ``coach.reference_for`` names, the tool status and stdout of its
code run), so a team can reward its own checks per action with the rest of the loop
(advantages, health metrics, report) unchanged.

Built-in rules, each a yardstick for a model coach:

- ``answer_oracle``: each action's result checked against the reference answer
  (``mappa.workflow.oracle``), the best a coach could do on an answer task. The gap between
  a run trained on it and one trained on a model coach is the price of the real coach.
- ``format_rule``: form only, no label: a reply not cut off that commits to a result in
  the form its role owes (for an agent that runs code: a program that ran and printed a
  number). It separates "an LLM judges the process" from "any dense shaping of form".
- ``random_score``: a uniform score per action, a fixed function of the action: the
  control for "more full-size optimizer steps" against "better credit".
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import math
import time
from collections.abc import Callable, Sequence

from mappa.coach.base import CoachFatalError
from mappa.coach.context import CoachContext
from mappa.records import Score
from mappa.tasks.math import answers_equal
from mappa.workflow.oracle import action_result

Rule = Callable[[CoachContext], "float | Score"]

ORACLE = "mappa.coach.rules:answer_oracle"
"""The built-in rule, ``coach.rules.function``'s default."""

RIGHT, WRONG = 10.0, 0.0
"""The oracle's two scores: the action's result equals the reference, or it does not (or
there is no result to check)."""


def context_result(ctx: CoachContext) -> tuple[str | None, str]:
    """``mappa.workflow.oracle.action_result`` of the action a coach is shown, and where it
    was read."""
    return action_result(
        ctx.output,
        is_final=ctx.is_final,
        observation=ctx.observation,
        tool_status=ctx.tool_status,
        stdout=ctx.stdout,
        answer_format=ctx.answer_format,
    )


def answer_oracle(ctx: CoachContext) -> Score:
    """10 when the action's result (``mappa.workflow.oracle.action_result``: what its
    program printed on stdout, nothing when the program failed; the final agent's answer as
    the grader reads it) equals the reference answer, else 0.

    Needs the reference for every agent (``coach.reference_for: all``); an action whose
    context carries none is a configuration error, not a zero.
    """
    if ctx.ground_truth is None:
        raise CoachFatalError(
            f"rule {ORACLE}: the {ctx.agent!r} action was scored without the reference "
            "answer; the oracle checks every agent's result against it: set "
            "coach.show_ground_truth: true and coach.reference_for: all"
        )
    result, where = context_result(ctx)
    if result is None:
        return Score(WRONG, f"no result found ({where}); reference {ctx.ground_truth}")
    right = answers_equal(result, ctx.ground_truth)
    verdict = "equals" if right else "does not equal"
    return Score(
        RIGHT if right else WRONG,
        f"{where} is {result}: it {verdict} the reference {ctx.ground_truth}",
        answer_correct=right,
    )


FORMAT_PART = 5.0
"""``format_rule``'s points for each of its two checks."""


def format_rule(ctx: CoachContext) -> Score:
    """Form, not content: 5 points for a reply not cut off at the token limit, 5 for one
    that commits to a result in the form its role owes (``action_result``: the final
    agent's answer as the grader reads it; for an agent that runs code, a program that ran
    and printed a number, so a reply that ran none earns nothing for the number it states;
    any other reply's stated result). Never reads the reference."""
    if ctx.runs_code and ctx.tool_status is None and not ctx.is_final:
        result, where = None, "it ran no program"
    else:
        result, where = context_result(ctx)
    whole = not ctx.truncated
    value = FORMAT_PART * whole + FORMAT_PART * (result is not None)
    said = f"{where}: {result}" if result is not None else f"no result ({where})"
    return Score(value, f"{'not ' if whole else ''}cut off; {said}")


def random_score(ctx: CoachContext) -> Score:
    """A score uniform in 0-10, drawn from a hash of everything the coach would see: the
    same action always gets the same score (a rerun or resume agrees), and no score says
    anything about the action.

    >>> a = CoachContext("t", "solver", "r", 0, "in", "out", None, False, None)
    >>> random_score(a) == random_score(a), 0 <= random_score(a).value <= 10
    (True, True)
    """
    draw = int.from_bytes(hashlib.sha256(ctx.digest().encode()).digest()[:8], "big")
    return Score(10.0 * draw / 2**64, "a random score (the control rule)")


def load_rule(spec: str) -> Rule:
    """The callable ``spec`` names (``package.module:function``); ``ValueError`` saying what
    is wrong when it cannot be imported or is not callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"coach.rules.function: {spec!r} is not of the form module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"coach.rules.function: cannot import {module_name!r}: {err}") from None
    rule = getattr(module, attr, None)
    if not callable(rule):
        raise ValueError(f"coach.rules.function: {module_name} has no callable {attr!r}")
    return rule


class RuleCoach:
    """Coach backend over a rule function. A rule is code, so a failure is a bug to fix, not
    a fallback to train through: a raising rule or a score outside 0-10 stops the run
    (``CoachFatalError``) naming the action."""

    name = "rules"

    def __init__(self, rule: Rule, label: str) -> None:
        self.rule = rule
        self.label = label

    def _one(self, ctx: CoachContext) -> Score:
        start = time.monotonic()
        try:
            out = self.rule(ctx)
        except CoachFatalError:
            raise
        except Exception as err:  # noqa: BLE001 - any bug in user code, reported with the action
            raise CoachFatalError(
                f"rule {self.label} raised on the {ctx.agent!r} action of task "
                f"{ctx.task[:80]!r}: {type(err).__name__}: {err}"
            ) from err
        score = out if isinstance(out, Score) else Score(float(out))
        if not (math.isfinite(score.value) and 0.0 <= score.value <= 10.0):
            raise CoachFatalError(
                f"rule {self.label} returned {score.value!r} for the {ctx.agent!r} action; "
                "a score must be a number in 0-10"
            )
        return dataclasses.replace(score, backend=self.name, latency_s=time.monotonic() - start)

    def score(self, contexts: Sequence[CoachContext]) -> list[Score]:
        return [self._one(c) for c in contexts]
