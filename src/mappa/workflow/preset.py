"""A preset's linear pipeline as a workflow function: the agents in order, each prompted
with its ``input_template`` and, when it runs code, its tool loop continued in token space.

Every stage's calls from all episodes meet in one batch per agent (and, within a tool
loop, the calls of the episodes still looping), so a 3-agent pipeline costs a handful of
batched generate calls per rollout. A first prompt longer than
``rollout.max_prompt_tokens`` fails its episode; too many failed episodes stop the run
(``workflow.max_failed_share``). With ``sandbox.mode: persistent`` an agent's interpreter
lives until its episode ends, as in any workflow.
"""

from __future__ import annotations

from collections.abc import Sequence

from mappa.config import AgentConfig, WorkflowConfig
from mappa.text import cut_middle
from mappa.workflow.code_runs import missing_note
from mappa.workflow.team import PromptTooLong, Team, WorkflowFn


def preset_workflow(agents: Sequence[AgentConfig], workflow: WorkflowConfig) -> WorkflowFn:
    """The pipeline of ``agents`` (in order) as a workflow function.

    Each agent's template is filled from the task, the workspace (``{files}``, and
    ``{file_warnings}`` for files earlier agents owed), and every earlier agent's last
    reply (``{X_output}``) and last code output (``{X_observation}``). A code agent goes on
    while its reply ran code, up to ``max_actions`` replies, and stops early where the next
    turn would not fit the prompt budget."""
    agents = list(agents)

    async def pipeline(task: str, team: Team) -> str | None:
        fields = {"task": task}
        for k, agent in enumerate(agents):
            fields["files"] = team.files()
            fields["file_warnings"] = missing_note(
                {
                    a.name: missing
                    for a in agents[:k]
                    if (missing := [f for f in a.produces if not team.has_file(f)])
                }
            )
            reply = await team.call(agent.name, agent.input_template.format(**fields))
            observation = reply.observation
            for _ in range(agent.max_actions - 1):
                if reply.observation is None:
                    break  # no code: the tool loop ends
                try:
                    reply = await team.follow_up(reply, team.tool_turn(reply))
                except PromptTooLong:
                    break
                observation = reply.observation or observation
            fields[f"{agent.name}_output"] = reply
            fields[f"{agent.name}_observation"] = (
                workflow.no_code_observation
                if observation is None
                else cut_middle(observation, workflow.observation_chars)
            )
        return None

    return pipeline
