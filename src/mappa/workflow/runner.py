"""The pipeline runner: a batch of episodes advances agent by agent.

Each stage batches one agent's generations across all episodes (and, within a tool loop,
across the episodes still looping), so a 3-agent pipeline costs a handful of batched
generate calls per rollout rather than one call per episode. The runner talks to the model
only through the small ``SamplingPolicy`` protocol, which keeps it testable above that interface.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from mappa.config import AgentConfig, RolloutConfig, SandboxConfig, WorkflowConfig
from mappa.models.interface import SamplingPolicy
from mappa.sandbox import Limits, execute, extract_code_blocks
from mappa.sandbox.execute import cut_middle
from mappa.tasks import Task
from mappa.tasks.math import grade_answer
from mappa.workflow.chat import ChatFormat
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
        self.limits = Limits(
            wall_time_s=sandbox.timeout_s,
            cpu_time_s=max(1, int(sandbox.timeout_s * 2)),
            max_output_chars=sandbox.max_output_chars,
        )
        self.workspace_root = workspace_root
        self.observation_chars = observation_chars

    def run(self, tasks: Sequence[Task], step: int = 0, greedy: bool = False) -> list[Episode]:
        episodes = []
        for i, task in enumerate(tasks):
            eid = f"s{step}-e{i}"
            ws = self.workspace_root / f"step{step}" / eid
            shutil.rmtree(ws, ignore_errors=True)
            ws.mkdir(parents=True)
            episodes.append(
                Episode(eid, task.task_id, task.prompt, task.answer, step=step,
                        task_type=task.task_type, workspace=str(ws))
            )
        fields: list[dict[str, str]] = [{"task": t.prompt} for t in tasks]
        for agent in tqdm(self.agents, desc=f"rollout step {step}", leave=False):
            self._run_agent(agent, episodes, fields, greedy)
        final = self.agents[-1].name
        for ep in episodes:
            last = ep.agent_actions(final)[-1]
            if ep.answer is not None:
                ep.final_answer, ep.correct = grade_answer(last.completion_text, ep.answer)
        return episodes

    def _run_agent(
        self, agent: AgentConfig, episodes: list[Episode], fields: list[dict[str, str]], greedy: bool
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
                [Path(episodes[i].workspace or ".") for i in active], texts, agent.run_code
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

    def _execute_all(self, workdirs: list[Path], texts: list[str], run_code: bool) -> list[str | None]:
        """Run every episode's code blocks (episodes in parallel, blocks in order)."""
        if not run_code:
            return [None] * len(texts)

        def one(args: tuple[Path, str]) -> str | None:
            workdir, text = args
            blocks = extract_code_blocks(text)
            if not blocks:
                return None
            return "\n".join(execute(b, workdir, self.limits).observation() for b in blocks)

        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(one, zip(workdirs, texts, strict=True)))
