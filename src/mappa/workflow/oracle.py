"""The answer oracle's reading of one action: the result it commits to, and whether that
result is the reference answer.

It reads structured facts, never text soup: a program's result is what it printed on
stdout, and a program that failed (an exception, a non-zero exit, a crash, a timeout, a
limit) has no result, whatever it printed; warnings on stderr are not failures. The final
agent's result is what the grader reads under the run's answer format. The reading is a
pure function of the action and the run's answer format, so the rules coach scores with it
(``mappa.coach.rules.answer_oracle``) and the runner records it on every action of every
run (``Action.oracle``), whatever coach that run trains on.
"""

from __future__ import annotations

import re

from mappa.config import AnswerFormat
from mappa.records import Action, ToolStatus
from mappa.tasks.math import answers_equal, extract_answer

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (integers, decimals, ``1,000``, ``a/b``).

    >>> last_number("12 apples, then 3/4 of 1,000 is 750."), last_number("none")
    ('750', None)
    """
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def stated_result(text: str) -> str | None:
    r"""What a reply states as its result: its boxed answer, else its ``Answer:`` line,
    else the last number it writes.

    >>> stated_result(r"so 2+3 = 5, then \boxed{6} and 7"), stated_result("it is 12.")
    ('6', '12')
    """
    return extract_answer(text, "boxed") or extract_answer(text, "answer_line") or last_number(text)


def action_result(
    output: str,
    *,
    is_final: bool,
    observation: str | None,
    tool_status: ToolStatus | None,
    stdout: str | None,
    answer_format: AnswerFormat,
) -> tuple[str | None, str]:
    r"""The result an action commits to, and where it was read.

    The final agent's: its answer as the grader extracts it under ``answer_format``. An
    action whose code ran: the last number its programs printed on stdout (every block's
    stdout in order, so the last block that printed a number), or none when any block
    failed (``tool_status`` other than ``ok``). The reply around the code was written before
    the code ran, so it is not read. Any other action: the result its reply states.

    A record made before the status or the stdout was kept (an old episode, a labelled case
    without them) has only the observation: its last number is read, as the oracle read it
    then.

    >>> action_result("print(12)", is_final=False, observation="12\nTraceback...",
    ...               tool_status="error", stdout="12\n", answer_format="boxed")
    (None, 'its program failed (error)')
    >>> action_result("Answer: 12", is_final=True, observation=None, tool_status=None,
    ...               stdout=None, answer_format="boxed")
    (None, 'its final answer as the grader reads it (boxed)')
    """
    if is_final:
        where = f"its final answer as the grader reads it ({answer_format})"
        return extract_answer(output, answer_format), where
    if observation is None and tool_status is None:
        return stated_result(output), "the result its reply states"
    if tool_status not in (None, "ok"):
        return None, f"its program failed ({tool_status})"
    if stdout is None:
        return last_number(observation or ""), "the last number of its code's output"
    return last_number(stdout), "the last number its program printed on stdout"


def recorded_result(
    action: Action, *, is_final: bool, answer_format: AnswerFormat
) -> tuple[str | None, str]:
    """``action_result`` of a recorded action: its reply, tool observation, status and
    stdout."""
    return action_result(
        action.completion_text,
        is_final=is_final,
        observation=action.tool_observation,
        tool_status=action.tool_status,
        stdout=action.tool_stdout,
        answer_format=answer_format,
    )


def action_verdict(
    action: Action,
    *,
    is_final: bool,
    reference: str | None,
    answer_format: AnswerFormat,
    timeout_s: float = 5.0,
) -> bool | None:
    """Whether ``action``'s result (``action_result``) equals ``reference`` by the grader's
    comparison; None without a reference (a modeling task). A comparison that timed out
    counts as not equal, as the grader counts it."""
    if reference is None:
        return None
    result, _ = recorded_result(action, is_final=is_final, answer_format=answer_format)
    return result is not None and answers_equal(result, reference, timeout_s)
