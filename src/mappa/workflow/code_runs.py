"""An agent's code runs and the files it owes: the sandbox side of a rollout.

A reply's code blocks run in its episode's shared workspace; what they printed, how they
ended and which files agents promised (``produces``) but did not write is what the coach,
the oracle and later agents are shown.
"""

from __future__ import annotations

from collections.abc import Sequence

from mappa.config import AgentConfig
from mappa.records import ToolStatus
from mappa.sandbox import ExecutionResult, Job, SandboxPool, Workspace, extract_code_blocks

CodeRun = tuple[str | None, ToolStatus | None, str | None]
"""One message's code run: its observation, status and stdout (all None: no code)."""


def execute_replies(
    pool: SandboxPool, replies: Sequence[tuple[Workspace, str, int, str]]
) -> list[CodeRun]:
    """Run each reply's code blocks in its workspace (replies in parallel, blocks in order).

    Args:
        replies: (workspace, agent, turn, reply text) per reply.

    Returns:
        (observation, status, stdout) per reply, all None where a reply has no code (which
        ends a preset agent's tool loop). The stdout is every block's, in order.
    """
    runs: list[CodeRun] = [(None, None, None)] * len(replies)
    jobs, where = [], []
    for i, (workspace, agent, turn, text) in enumerate(replies):
        blocks = extract_code_blocks(text)
        if blocks:
            jobs.append(Job(workspace, agent, turn, blocks))
            where.append(i)
    for i, results in zip(where, pool.run(jobs), strict=True):
        runs[i] = (
            "\n".join(r.observation() for r in results),
            tool_status(results),
            "\n".join(r.stdout for r in results),
        )
    return runs


def tool_status(results: Sequence[ExecutionResult]) -> ToolStatus:
    """One action's run status: ``ok``, or how its first failing block ended."""
    for r in results:
        if r.status == "timeout":
            return "timeout"
        if r.limit is not None:
            return "limit"
        if r.status != "ok":
            return "error"
    return "ok"


def missing_artifacts(ws: Workspace, agents: Sequence[AgentConfig]) -> dict[str, list[str]]:
    """Agent -> the files it owes (``produces``) that are not in the workspace."""
    return {
        a.name: missing for a in agents if (missing := [f for f in a.produces if f not in ws.files])
    }


def missing_note(missing: dict[str, list[str]]) -> str:
    """The warning later agents see about files earlier agents did not deliver."""
    return "".join(
        f"WARNING: {', '.join(files)} expected from {agent} is missing.\n"
        for agent, files in missing.items()
    )
