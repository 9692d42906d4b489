"""The pipeline runner: a batch of episodes advances agent by agent.

Each stage batches one agent's generations across all episodes (and, within a tool loop,
across the episodes still looping), so a 3-agent pipeline costs a handful of batched
generate calls per rollout rather than one call per episode. The runner talks to the model
only through the small ``SamplingPolicy`` protocol, which keeps it testable above that interface.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from mappa.config import AgentConfig, RolloutConfig, SandboxConfig, WorkflowConfig
from mappa.models.interface import SamplingPolicy
from mappa.sandbox import (
    Job,
    Limits,
    SandboxPool,
    Workspace,
    cut_middle,
    extract_code_blocks,
    make_backend,
)
from mappa.sandbox.limits import MiB
from mappa.tasks import Task
from mappa.workflow.chat import ChatFormat
from mappa.workflow.outcome import judge
from mappa.workflow.records import Action, Episode


@dataclass
class _Slot:
    """Per-episode state while one agent is acting."""

    prompt: list[int]
    output: str = ""
    observation: str | None = None


class PipelineRunner:
    """Runs tasks through the configured agents; fills ``Episode.actions`` and grades."""

    def __init__(
        self,
        policy: SamplingPolicy,
        chat: ChatFormat,
        agents: Sequence[AgentConfig],
        workflow: WorkflowConfig,
        rollout: RolloutConfig,
        sandbox: SandboxConfig,
        workspace_root: Path,
        observation_chars: int = 2000,
    ) -> None:
        self.policy = policy
        self.chat = chat
        self.agents = list(agents)
        self.workflow = workflow
        self.rollout = rollout
        backend = make_backend(
            sandbox.backend,
            python=sandbox.python,
            uid_base=sandbox.uid_base,
            sandboxfusion_url=sandbox.sandboxfusion_url,
        )
        self.sandbox = SandboxPool(
            backend, sandbox_limits(sandbox), sandbox.pool_size, sandbox.mode
        )
        self.workspaces: dict[str, Workspace] = {}
        """Episode id -> its shared workspace, with who made which file (for the coach)."""
        self.workspace_root = workspace_root
        self.observation_chars = observation_chars

    def run(self, tasks: Sequence[Task], step: int = 0, greedy: bool = False) -> list[Episode]:
        episodes = []
        self.workspaces = {}
        for i, task in enumerate(tasks):
            eid = f"s{step}-e{i}"
            ws = self.workspace_root / f"step{step}" / eid
            shutil.rmtree(ws, ignore_errors=True)
            ws.mkdir(parents=True)
            if task.dsbench is not None:  # the task's inputs, present before anyone acts
                for name, source in task.dsbench.agent_files().items():
                    shutil.copyfile(source, ws / name)
            self.workspaces[eid] = Workspace(ws)
            episodes.append(
                Episode(
                    eid,
                    task.task_id,
                    task.prompt,
                    task.answer,
                    step=step,
                    task_type=task.task_type,
                    workspace=str(ws),
                )
            )
        fields: list[dict[str, str]] = [{"task": t.prompt} for t in tasks]
        for k, agent in enumerate(tqdm(self.agents, desc=f"rollout step {step}", leave=False)):
            for ep, f in zip(episodes, fields, strict=True):
                ws = self.workspaces[ep.episode_id]
                f["files"] = ws.describe()
                f["file_warnings"] = _missing_note(self._missing(ws, self.agents[:k]))
            self._run_agent(agent, episodes, fields, greedy)
            for ep in episodes:  # an agent acts in one stage only: its interpreters can go
                self.sandbox.end(self.workspaces[ep.episode_id], agent.name)
        final = self.agents[-1].name
        for ep, task in zip(episodes, tasks, strict=True):
            ws = self.workspaces[ep.episode_id]
            ep.missing_artifacts = self._missing(ws, self.agents)
            outcome = judge(task, ep.agent_actions(final)[-1].completion_text, ws.path)
            ep.correct, ep.final_answer = outcome.correct, outcome.final_answer
            ep.metrics, ep.coach_reference = outcome.metrics, outcome.reference
        return episodes

    @staticmethod
    def _missing(ws: Workspace, agents: Sequence[AgentConfig]) -> dict[str, list[str]]:
        """Agent -> the files it owes (``produces``) that are not in the workspace."""
        return {
            a.name: missing
            for a in agents
            if (missing := [f for f in a.produces if f not in ws.files])
        }

    def _run_agent(
        self,
        agent: AgentConfig,
        episodes: list[Episode],
        fields: list[dict[str, str]],
        greedy: bool,
    ) -> None:
        slots = []
        for f in fields:
            prompt = self.chat.first_prompt(agent.role, agent.input_template.format(**f))
            if len(prompt) > self.rollout.max_prompt_tokens:
                raise ValueError(
                    f"agent {agent.name}: prompt of {len(prompt)} tokens exceeds "
                    f"rollout.max_prompt_tokens={self.rollout.max_prompt_tokens}"
                )
            slots.append(_Slot(prompt))
        active = list(range(len(episodes)))
        for turn in range(agent.max_actions):
            if not active:
                break
            samples = self.policy.generate(
                agent.name,
                [slots[i].prompt for i in active],
                self.rollout.max_new_tokens,
                self.rollout.temperature,
                self.rollout.batch_size,
                greedy,
            )
            texts = [self.chat.decode(s.completion_ids) for s in samples]
            observations = self._execute_all(
                [episodes[i].episode_id for i in active], texts, agent, turn
            )
            still = []
            for i, sample, text, obs in zip(active, samples, texts, observations, strict=True):
                episodes[i].actions.append(
                    Action(
                        episode_id=episodes[i].episode_id,
                        agent=agent.name,
                        turn=turn,
                        prompt_ids=list(sample.prompt_ids),
                        completion_ids=list(sample.completion_ids),
                        sample_logprobs=list(sample.logprobs),
                        prompt_text=self.chat.decode(list(sample.prompt_ids), skip_special=False),
                        completion_text=text,
                        truncated=sample.truncated,
                        tool_observation=obs,
                        workspace_files=(
                            self.workspaces[episodes[i].episode_id].describe()
                            if agent.run_code
                            else None
                        ),
                    )
                )
                slot = slots[i]
                slot.output = text
                if obs is None:
                    continue  # no code: the tool loop ends here
                slot.observation = obs
                shown = cut_middle(obs, self.observation_chars)
                nxt = (
                    list(sample.prompt_ids)
                    + list(sample.completion_ids)
                    + self.chat.tool_turn(
                        self.workflow.tool_turn_template.format(observation=shown),
                        completion_ended_with_stop=not sample.truncated,
                    )
                )
                if len(nxt) <= self.rollout.max_prompt_tokens:
                    slot.prompt = nxt
                    still.append(i)
            active = still
        for f, slot in zip(fields, slots, strict=True):
            f[f"{agent.name}_output"] = slot.output
            f[f"{agent.name}_observation"] = (
                cut_middle(slot.observation, self.observation_chars)
                if slot.observation is not None
                else self.workflow.no_code_observation
            )

    def _execute_all(
        self, episode_ids: list[str], texts: list[str], agent: AgentConfig, turn: int
    ) -> list[str | None]:
        """Run every episode's code blocks in its workspace (episodes in parallel, blocks in
        order); None where a message has no code, which ends that agent's tool loop."""
        if not agent.run_code:
            return [None] * len(texts)
        jobs, where = [], []
        for i, (eid, text) in enumerate(zip(episode_ids, texts, strict=True)):
            blocks = extract_code_blocks(text)
            if blocks:
                jobs.append(Job(self.workspaces[eid], agent.name, turn, blocks))
                where.append(i)
        observations: list[str | None] = [None] * len(texts)
        for i, results in zip(where, self.sandbox.run(jobs), strict=True):
            observations[i] = "\n".join(r.observation() for r in results)
        return observations


def _missing_note(missing: dict[str, list[str]]) -> str:
    """The warning later agents see about files earlier agents did not deliver."""
    return "".join(
        f"WARNING: {', '.join(files)} expected from {agent} is missing.\n"
        for agent, files in missing.items()
    )


def sandbox_limits(cfg: SandboxConfig) -> Limits:
    """The run's sandbox limits from its config (sizes there are in MiB)."""
    return Limits(
        wall_time_s=cfg.timeout_s,
        cpu_time_s=cfg.cpu_time_s if cfg.cpu_time_s is not None else 2 * cfg.timeout_s,
        memory_bytes=cfg.memory_mb * MiB,
        max_processes=cfg.max_processes,
        file_size_bytes=cfg.file_size_mb * MiB,
        tmp_bytes=cfg.tmp_size_mb * MiB,
        max_output_chars=cfg.max_output_chars,
        max_output_bytes=max(int(cfg.max_output_mb * MiB), cfg.max_output_chars),
    )
