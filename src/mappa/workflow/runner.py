"""The pipeline runner: a batch of episodes advances agent by agent.

Each stage batches one agent's generations across all episodes (and, within a tool loop,
across the episodes still looping), so a 3-agent pipeline costs a handful of batched
generate calls per rollout rather than one call per episode. The runner implements the
``Rollout`` interface (``mappa.workflow.interface``) and talks to the model only through
the small ``SamplingPolicy`` protocol, which keeps it testable above that interface. The
sandbox pool is injected (built by ``mappa.factory``) and closed with the runner.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from mappa.config import AgentConfig, AnswerFormat, WorkflowConfig
from mappa.models.interface import SamplingPolicy
from mappa.records import Action, Episode, ToolStatus
from mappa.sandbox import (
    ExecutionResult,
    Job,
    SandboxPool,
    Workspace,
    extract_code_blocks,
)
from mappa.tasks import Task
from mappa.text import cut_middle
from mappa.workflow.chat import ChatFormat, plain_transcript
from mappa.workflow.episodes import grade_episode, open_episodes
from mappa.workflow.interface import Phase, RolloutInput, RolloutOutput, SamplingParams
from mappa.workflow.outcome import judge

_Run = tuple[str | None, ToolStatus | None, str | None]
"""One message's code run: its observation, status and stdout (all None: no code)."""


@dataclass
class _Slot:
    """Per-episode state while one agent is acting."""

    prompt: list[int]
    messages: list[dict[str, str]]  # the conversation ``prompt`` renders, as text
    output: str = ""
    observation: str | None = None


class PipelineRunner:
    """Runs tasks through the configured agents; fills ``Episode.actions`` and grades.

    Args:
        policy: samples for each agent (its own adapter).
        chat: the tokenizer's chat format, in token space.
        agents: the pipeline, in order.
        workflow: tool-turn template and the tool-output budget agents see.
        sampling: how each phase samples.
        max_prompt_tokens: the context limit; a tool loop stops before exceeding it.
        pool: runs agents' code; owned from here on (``close()`` closes it).
        workspace_root: episodes' shared directories go under ``<root>/<phase>/step<N>/``.
        answer_format, grade_timeout_s: how the final agent's answer is graded.
    """

    def __init__(
        self,
        policy: SamplingPolicy,
        chat: ChatFormat,
        agents: Sequence[AgentConfig],
        workflow: WorkflowConfig,
        sampling: Mapping[Phase, SamplingParams],
        max_prompt_tokens: int,
        pool: SandboxPool,
        workspace_root: Path,
        answer_format: AnswerFormat = "boxed",
        grade_timeout_s: float = 5.0,
    ) -> None:
        self.policy = policy
        self.chat = chat
        self.agents = list(agents)
        self.workflow = workflow
        self.sampling = dict(sampling)
        self.max_prompt_tokens = max_prompt_tokens
        self.sandbox = pool
        self.workspaces: dict[str, Workspace] = {}
        """Episode id -> its shared workspace, with who made which file (for the coach)."""
        self.workspace_root = workspace_root
        self.answer_format: AnswerFormat = answer_format
        self.grade_timeout_s = grade_timeout_s

    def close(self) -> None:
        """End the sandbox pool (and any persistent interpreters)."""
        self.sandbox.close()

    def run(self, batch: RolloutInput) -> RolloutOutput:
        start = time.monotonic()
        tasks, step = batch.tasks, batch.step
        params = self.sampling[batch.phase]
        episodes, self.workspaces = open_episodes(tasks, step, batch.phase, self.workspace_root)
        fields: list[dict[str, str]] = [{"task": t.prompt} for t in tasks]
        desc = f"{batch.phase} rollout step {step}"
        for k, agent in enumerate(tqdm(self.agents, desc=desc, leave=False)):
            for ep, f in zip(episodes, fields, strict=True):
                workspace = self.workspaces[ep.episode_id]
                f["files"] = workspace.describe()
                f["file_warnings"] = missing_note(missing_artifacts(workspace, self.agents[:k]))
            final_stage = k == len(self.agents) - 1
            self._run_agent(agent, episodes, fields, params, tasks if final_stage else None)
            for ep in episodes:  # an agent acts in one stage only: its interpreters can go
                self.sandbox.end(self.workspaces[ep.episode_id], agent.name)
        final = self.agents[-1].name
        for ep, task in zip(episodes, tasks, strict=True):
            workspace = self.workspaces[ep.episode_id]
            ep.missing_artifacts = missing_artifacts(workspace, self.agents)
            grade_episode(
                ep,
                task,
                ep.agent_actions(final)[-1].completion_text,
                final,
                workspace.path,
                self.answer_format,
                self.grade_timeout_s,
            )
        tokens = sum(len(a.completion_ids) for e in episodes for a in e.actions)
        return RolloutOutput(episodes, tokens, time.monotonic() - start)

    def _run_agent(
        self,
        agent: AgentConfig,
        episodes: list[Episode],
        fields: list[dict[str, str]],
        params: SamplingParams,
        judged: Sequence[Task] | None = None,
    ) -> None:
        """One agent's tool loop over all episodes. ``judged``: the tasks, when this is the
        final agent of modeling tasks, whose every action is judged against the workspace as
        it stands right after that action (so an early turn is not credited or blamed for
        a submission a later turn wrote)."""
        slots = []
        for f in fields:
            user = agent.input_template.format(**f)
            prompt = self.chat.first_prompt(agent.role, user)
            if len(prompt) > self.max_prompt_tokens:
                raise ValueError(
                    f"agent {agent.name}: prompt of {len(prompt)} tokens exceeds "
                    f"rollout.max_prompt_tokens={self.max_prompt_tokens}"
                )
            messages = [
                {"role": "system", "content": agent.role},
                {"role": "user", "content": user},
            ]
            slots.append(_Slot(prompt, messages))
        active = list(range(len(episodes)))
        for turn in range(agent.max_actions):
            if not active:
                break
            samples = self.policy.generate(
                agent.name,
                [slots[i].prompt for i in active],
                params.max_new_tokens,
                params.temperature,
                params.batch_size,
                params.greedy,
            )
            texts = [self.chat.decode(s.completion_ids) for s in samples]
            runs = self._execute_all([episodes[i].episode_id for i in active], texts, agent, turn)
            still = []
            for i, sample, text, run in zip(active, samples, texts, runs, strict=True):
                obs, status, stdout = run
                episodes[i].actions.append(
                    Action(
                        episode_id=episodes[i].episode_id,
                        agent=agent.name,
                        turn=turn,
                        prompt_ids=list(sample.prompt_ids),
                        completion_ids=list(sample.completion_ids),
                        sample_logprobs=list(sample.logprobs),
                        prompt_text=plain_transcript(slots[i].messages),
                        completion_text=text,
                        truncated=sample.truncated,
                        tool_observation=obs,
                        tool_status=status,
                        tool_stdout=stdout,
                        workspace_files=(
                            self.workspaces[episodes[i].episode_id].describe()
                            if agent.run_code
                            else None
                        ),
                        coach_reference=self._reference_now(judged, i, episodes[i], text),
                    )
                )
                slot = slots[i]
                slot.output = text
                if obs is None:
                    continue  # no code: the tool loop ends here
                slot.observation = obs
                shown = cut_middle(obs, self.workflow.observation_chars)
                tool_turn = self.workflow.tool_turn_template.format(observation=shown)
                nxt = (
                    list(sample.prompt_ids)
                    + list(sample.completion_ids)
                    + self.chat.tool_turn(
                        tool_turn,
                        last_token=sample.completion_ids[-1] if sample.completion_ids else None,
                    )
                )
                if len(nxt) <= self.max_prompt_tokens:
                    slot.prompt = nxt
                    slot.messages += [
                        {"role": "assistant", "content": text},
                        {"role": "user", "content": tool_turn},
                    ]
                    still.append(i)
            active = still
        for f, slot in zip(fields, slots, strict=True):
            f[f"{agent.name}_output"] = slot.output
            f[f"{agent.name}_observation"] = (
                cut_middle(slot.observation, self.workflow.observation_chars)
                if slot.observation is not None
                else self.workflow.no_code_observation
            )

    def _reference_now(
        self, judged: Sequence[Task] | None, i: int, episode: Episode, text: str
    ) -> str | None:
        """What the coach may see of this action's outcome, judged now (modeling tasks only)."""
        if judged is None or judged[i].dsbench is None:
            return None
        workspace = self.workspaces[episode.episode_id].path
        return judge(judged[i], text, workspace, self.answer_format, self.grade_timeout_s).reference

    def _execute_all(
        self, episode_ids: list[str], texts: list[str], agent: AgentConfig, turn: int
    ) -> list[_Run]:
        """Run every episode's code blocks (``execute_replies``); all None where the agent
        runs no code."""
        if not agent.run_code:
            return [(None, None, None)] * len(texts)
        return execute_replies(
            self.sandbox,
            [
                (self.workspaces[eid], agent.name, turn, text)
                for eid, text in zip(episode_ids, texts, strict=True)
            ],
        )


def execute_replies(
    pool: SandboxPool, replies: Sequence[tuple[Workspace, str, int, str]]
) -> list[_Run]:
    """Run each reply's code blocks in its workspace (replies in parallel, blocks in order).

    Args:
        replies: (workspace, agent, turn, reply text) per reply.

    Returns:
        (observation, status, stdout) per reply, all None where a reply has no code (which
        ends a preset agent's tool loop). The stdout is every block's, in order.
    """
    runs: list[_Run] = [(None, None, None)] * len(replies)
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
