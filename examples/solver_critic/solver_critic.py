"""A solver and a critic that revise until the critic accepts or three rounds pass: a team
that is not a pipeline, as a workflow function (docs/workflows.md).

The solver answers; the critic checks the answer and either accepts or says what is wrong;
the solver revises with the critique in its conversation. Every call is one action of its
agent, scored by the coach and trained into that agent's own LoRA adapter.
"""

from __future__ import annotations

from mappa.workflow.team import Team

ROUNDS = 3
"""The most critiques one episode gets (the critic's ``max_actions``)."""


def accepts(verdict: str) -> bool:
    """Whether the critic's reply accepts the solution: it opens with ``ACCEPT``.

    >>> accepts("ACCEPT. The sum is right."), accepts("The total is wrong: REVISE")
    (True, False)
    """
    return verdict.strip().upper().startswith("ACCEPT")


async def solve(task: str, team: Team) -> str | None:
    problem = f"Problem: {task}"
    answer = await team.solver(problem)
    for _ in range(ROUNDS):
        verdict = await team.critic(
            f"{problem}\n\nProposed solution:\n{answer}\n\nReply ACCEPT if it is correct; "
            "otherwise say what is wrong."
        )
        if accepts(verdict):
            break
        answer = await team.follow_up(  # the solver's own conversation goes on
            answer,
            f"A critic checked your solution:\n{verdict}\n\nRevise it and end with the final "
            "answer as \\boxed{number}.",
        )
    return answer
