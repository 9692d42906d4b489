"""Coach prompt templates (MathChat), written from DESIGN.md §1.

The coach sees the task, the agent's role, the agent's full input, its output and the tool
observation; only when scoring the final agent, and only if enabled, the reference answer.
"""

from __future__ import annotations

from mappa.coach.context import CoachContext

MATHCHAT_SYSTEM = """\
You are a strict, fair coach for a team of AI agents that solve math problems together: \
a Problem Solver reasons about the problem, a Code Executor writes and runs Python to \
check or compute the result, and a Verifier states the final answer as \\boxed{{answer}}. \
You judge ONE action of ONE agent: how much it helped the team reach a correct answer.

Judge by evidence. Reward correct reasoning, code that runs and computes the right thing, \
and clear hand-offs. Penalise errors, code that fails or does not answer the question, \
ignoring useful earlier work, and missing the required format. An agent that fails only \
because an earlier agent gave it bad input deserves a middling score (3-5); the agent that \
caused the failure deserves a low one (0-2).

Reply with a short analysis (at most 120 words), then a line `PROCESS_SCORE: x` where x is \
an integer from 0 (harmful) to 10 (exceptional).{final_rule}"""

_FINAL_RULE = (
    " As this is the final agent, add a last line `ANSWER_CORRECT: 1` if its boxed answer "
    "is correct, else `ANSWER_CORRECT: 0`."
)

MATHCHAT_USER = """\
## Problem
{task}

## Agent
{agent} (action {turn}). Role: {role}

## What the agent saw
{agent_input}

## What the agent wrote
{output}

## Tool output
{observation}
{ground_truth}"""

CORRECTIVE = (
    "Your reply lacked the required line. Answer again with only the line "
    "`PROCESS_SCORE: x` (x an integer from 0 to 10){final}."
)


def render_messages(ctx: CoachContext) -> list[dict[str, str]]:
    """Chat messages asking the coach to judge one action."""
    system = MATHCHAT_SYSTEM.format(final_rule=_FINAL_RULE if ctx.is_final else "")
    truth = (
        f"\n## Reference answer (for your judgement only)\n{ctx.ground_truth}"
        if ctx.ground_truth is not None
        else ""
    )
    user = MATHCHAT_USER.format(
        task=ctx.task,
        agent=ctx.agent,
        turn=ctx.turn + 1,
        role=ctx.role,
        agent_input=ctx.agent_input,
        output=ctx.output,
        observation=ctx.observation if ctx.observation is not None else "(no code was run)",
        ground_truth=truth,
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def corrective_message(ctx: CoachContext) -> dict[str, str]:
    final = " and then `ANSWER_CORRECT: 0|1`" if ctx.is_final else ""
    return {"role": "user", "content": CORRECTIVE.format(final=final)}
