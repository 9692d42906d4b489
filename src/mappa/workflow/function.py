"""The rollout of a workflow function (docs/workflows.md): any team topology, written as
``async def solve(task, team)``, batched across episodes.

Every episode's workflow runs as an asyncio task on one event loop; a team call queues its
prompt and waits. When every live episode waits (``_settle``), the queued prompts go to the
engine as one ``generate`` batch per agent, the calls that run code go to the sandbox pool
as one batch, every call becomes an ``Action`` of its episode, and the workflows resume.
``FunctionRunner`` implements the ``Rollout`` interface; it is the one runner: a preset
pipeline runs on it as a workflow function too (``mappa.workflow.preset``).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from mappa.config import AgentConfig, AnswerFormat, WorkflowConfig
from mappa.models.interface import Sample, SamplingPolicy
from mappa.records import Action, Episode, ToolStatus
from mappa.sandbox import SandboxPool, Workspace
from mappa.tasks import Task
from mappa.workflow.chat import ChatFormat, plain_transcript
from mappa.workflow.code_runs import execute_replies, missing_artifacts
from mappa.workflow.episodes import grade_episode, open_episodes
from mappa.workflow.interface import Phase, RolloutInput, RolloutOutput, SamplingParams
from mappa.workflow.outcome import judge
from mappa.workflow.team import (
    PromptTooLong,
    Reply,
    StubBackend,
    Team,
    Thread,
    WorkflowFn,
    run_sync,
)


class WorkflowFailed(RuntimeError):
    """More of a rollout's workflows raised than ``workflow.max_failed_share`` allows."""


def load_workflow(spec: str) -> WorkflowFn:
    """The async function ``spec`` names: ``path/to/file.py:function`` (the file's directory
    goes on ``sys.path`` so it may import its neighbours) or ``package.module:function``.
    ``ValueError`` saying what is wrong when it cannot be loaded or is not ``async def``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"workflow.function: {spec!r} is not of the form module:function or file.py:function"
        )
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ImportError(f"no such file {path}")
            if str(path.parent) not in sys.path:
                sys.path.insert(0, str(path.parent))
            loader_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[path.stem] = module
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as err:  # an import runs the user's module: any error is its problem
        raise ValueError(
            f"workflow.function: cannot import {module_name}: {type(err).__name__}: {err}"
        ) from None
    fn = getattr(module, attr, None)
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(
            f"workflow.function: {module_name} has no async function {attr!r} "
            "(async def f(task, team) -> str | None)"
        )
    return fn


def dry_run(fn: WorkflowFn, agents: Sequence[AgentConfig], workflow: WorkflowConfig) -> None:
    """Run ``fn`` on one small task with a stub team (every reply a fixed stub text, no model,
    no code run): an unknown agent, a call past ``max_actions``, malformed messages or any
    exception on stub replies raises here, before a model loads."""
    team = Team(agents, StubBackend(), workflow)
    result: object = run_sync(fn("What is 1 + 1?", team))
    if result is not None and not isinstance(result, str):
        raise TypeError(f"returned {type(result).__name__}; a workflow returns str or None")


@dataclass
class _Call:
    """A team call waiting for the next batch."""

    episode: int
    agent: AgentConfig
    turn: int
    messages: list[dict[str, str]]
    prompt: list[int]
    run_code: bool
    reply: asyncio.Future[Reply] = field(repr=False)


async def _settle() -> None:
    """Yield until no other task can run now: every live workflow then waits on a team call
    (or on something outside the team). Read from the event loop's queue of callbacks due
    now: asyncio has no public "idle" signal, and without one a batch would be cut at a
    guessed depth of nested ``gather``s. A loop without that queue gets a fixed number of
    rounds (a batch flushed early is smaller, never wrong)."""
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    for _ in range(64):
        await asyncio.sleep(0)
        if ready is not None and not ready:
            return


class _Rollout:
    """One rollout's shared state: the episodes, their workspaces and the queued calls."""

    def __init__(
        self,
        runner: FunctionRunner,
        tasks: Sequence[Task],
        episodes: list[Episode],
        workspaces: dict[str, Workspace],
        params: SamplingParams,
    ) -> None:
        self.runner, self.tasks, self.episodes = runner, tasks, episodes
        self.workspaces, self.params = workspaces, params
        self.queue: list[_Call] = []

    async def run_all(self, fn: WorkflowFn, desc: str) -> list[asyncio.Task[str | None]]:
        """Every episode's workflow to its end, calls answered in batches; a progress bar
        (``desc``) counts finished episodes and the actions taken so far."""
        r = self.runner
        teams = [
            Team(r.agents, _EpisodeBackend(self, i), r.workflow) for i in range(len(self.tasks))
        ]
        runs = [
            asyncio.ensure_future(fn(task.prompt, team))
            for task, team in zip(self.tasks, teams, strict=True)
        ]
        with tqdm(total=len(runs), desc=desc, unit="episode", leave=False) as bar:
            while True:
                await _settle()
                live = [t for t in runs if not t.done()]
                bar.update(len(runs) - len(live) - bar.n)
                if not live:
                    return runs
                if self.queue:
                    self.flush()
                    bar.set_postfix(actions=sum(len(e.actions) for e in self.episodes))
                else:  # every live workflow awaits something outside the team
                    await asyncio.wait(live, timeout=0.01)

    def flush(self) -> None:
        """Answer every queued call: one ``generate`` per agent, one sandbox batch."""
        r, p = self.runner, self.params
        calls, self.queue = self.queue, []
        order = {a.name: k for k, a in enumerate(r.agents)}
        calls.sort(key=lambda c: (order[c.agent.name], c.episode))
        samples: list[Sample] = []
        for name in order:
            group = [c for c in calls if c.agent.name == name]
            if group:
                prompts = [c.prompt for c in group]
                samples += r.policy.generate(
                    name, prompts, p.max_new_tokens, p.temperature, p.batch_size, p.greedy
                )
        texts = [r.chat.decode(s.completion_ids) for s in samples]
        ran = iter(
            execute_replies(
                r.sandbox,
                [
                    (self.workspace(c), c.agent.name, c.turn, text)
                    for c, text in zip(calls, texts, strict=True)
                    if c.run_code
                ],
            )
        )
        runs = [next(ran) if c.run_code else (None, None, None) for c in calls]
        for call, sample, text, run in zip(calls, samples, texts, runs, strict=True):
            obs, status, stdout = run
            self.record(call, sample, text, obs, status, stdout)
            ids = list(sample.prompt_ids) + list(sample.completion_ids)
            last = sample.completion_ids[-1] if sample.completion_ids else None
            thread = Thread(call.agent.name, call.messages, ids, last)
            if not call.reply.done():  # a sibling's exception may have ended its episode
                call.reply.set_result(Reply(text, obs, status, stdout, thread))

    def workspace(self, call: _Call) -> Workspace:
        return self.workspaces[self.episodes[call.episode].episode_id]

    def record(
        self,
        call: _Call,
        sample: Sample,
        text: str,
        obs: str | None,
        status: ToolStatus | None,
        stdout: str | None,
    ) -> None:
        r = self.runner
        episode, task = self.episodes[call.episode], self.tasks[call.episode]
        workspace = self.workspace(call)
        reference = None
        if task.dsbench is not None and call.agent.name == r.final_agent:
            reference = judge(
                task, text, workspace.path, r.answer_format, r.grade_timeout_s
            ).reference
        episode.actions.append(
            Action(
                episode_id=episode.episode_id,
                agent=call.agent.name,
                turn=call.turn,
                prompt_ids=list(sample.prompt_ids),
                completion_ids=list(sample.completion_ids),
                sample_logprobs=list(sample.logprobs),
                prompt_text=plain_transcript(call.messages),
                completion_text=text,
                truncated=sample.truncated,
                tool_observation=obs,
                tool_status=status,
                tool_stdout=stdout,
                workspace_files=workspace.describe() if call.run_code else None,
                coach_reference=reference,
            )
        )


class _EpisodeBackend:
    """One episode's ``TeamBackend``: queues its calls for the next batch."""

    def __init__(self, rollout: _Rollout, episode: int) -> None:
        self.rollout, self.episode = rollout, episode

    async def act(
        self,
        agent: AgentConfig,
        turn: int,
        messages: list[dict[str, str]],
        run_code: bool,
        after: Thread | None = None,
    ) -> Reply:
        r = self.rollout.runner
        if after is None:
            prompt = r.chat.prompt(messages)
        else:
            turn_ids = r.chat.tool_turn(messages[-1]["content"], last_token=after.last_token)
            prompt = after.ids + turn_ids
        if len(prompt) > r.max_prompt_tokens:
            raise PromptTooLong(
                f"agent {agent.name}: prompt of {len(prompt)} tokens exceeds "
                f"rollout.max_prompt_tokens={r.max_prompt_tokens}"
            )
        reply: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.rollout.queue.append(
            _Call(self.episode, agent, turn, messages, prompt, run_code, reply)
        )
        return await reply

    def _workspace(self) -> Workspace:
        return self.rollout.workspaces[self.rollout.episodes[self.episode].episode_id]

    def files(self) -> str:
        return self._workspace().describe()

    def has_file(self, name: str) -> bool:
        return name in self._workspace().files


class FunctionRunner:
    """Runs tasks through a workflow function; fills ``Episode.actions`` and grades.

    Args:
        function: the workflow (``load_workflow``).
        policy: samples for each agent (its own adapter).
        chat: the tokenizer's chat format, in token space.
        agents: the team; the last is the final agent, whose actions the oracle reads as
            final answers (and, on modeling tasks, are each judged as they leave the
            workspace).
        workflow: tool-turn template, the tool-output budget agents see, and how many
            failed episodes a rollout tolerates.
        sampling: how each phase samples.
        max_prompt_tokens: the context limit; a call that would exceed it raises
            ``PromptTooLong`` in the workflow.
        pool: runs agents' code; owned from here on (``close()`` closes it).
        workspace_root: episodes' shared directories go under ``<root>/<phase>/step<N>/``.
        answer_format, grade_timeout_s: how the final answer is graded.
    """

    def __init__(
        self,
        function: WorkflowFn,
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
        self.function = function
        self.policy = policy
        self.chat = chat
        self.agents = list(agents)
        self.final_agent = self.agents[-1].name
        self.workflow = workflow
        self.sampling = dict(sampling)
        self.max_prompt_tokens = max_prompt_tokens
        self.sandbox = pool
        self.workspace_root = workspace_root
        self.workspaces: dict[str, Workspace] = {}
        """The last rollout's episode id -> its shared workspace, with who made which file."""
        self.answer_format: AnswerFormat = answer_format
        self.grade_timeout_s = grade_timeout_s

    def close(self) -> None:
        """End the sandbox pool (and any persistent interpreters)."""
        self.sandbox.close()

    def run(self, batch: RolloutInput) -> RolloutOutput:
        start = time.monotonic()
        tasks = batch.tasks
        episodes, workspaces = open_episodes(tasks, batch.step, batch.phase, self.workspace_root)
        self.workspaces = workspaces
        rollout = _Rollout(self, tasks, episodes, workspaces, self.sampling[batch.phase])
        desc = f"{batch.phase} rollout step {batch.step}"
        runs = run_sync(rollout.run_all(self.function, desc))
        for ep, task, done in zip(episodes, tasks, runs, strict=True):
            workspace = workspaces[ep.episode_id]
            for agent in self.agents:
                self.sandbox.end(workspace, agent.name)
            ep.missing_artifacts = missing_artifacts(workspace, self.agents)
            answer = None if done.exception() else done.result()
            if done.exception() is not None:
                ep.error = "".join(traceback.format_exception(done.exception()))
            elif answer is not None and not isinstance(answer, str):
                ep.error = f"the workflow returned {type(answer).__name__}; expected str or None"
                answer = None
            if answer is None:
                answer = ep.actions[-1].completion_text if ep.actions else ""
            grade_episode(
                ep,
                task,
                answer,
                self.final_agent,
                workspace.path,
                self.answer_format,
                self.grade_timeout_s,
            )
        self._check_failures(episodes)
        tokens = sum(len(a.completion_ids) for e in episodes for a in e.actions)
        return RolloutOutput(episodes, tokens, time.monotonic() - start)

    def _check_failures(self, episodes: Sequence[Episode]) -> None:
        """Stop the run when more than ``workflow.max_failed_share`` of the episodes failed."""
        failed = [e for e in episodes if e.error is not None]
        if len(failed) > self.workflow.max_failed_share * len(episodes):
            raise WorkflowFailed(
                f"{len(failed)} of {len(episodes)} episodes' workflows failed (more than "
                f"workflow.max_failed_share={self.workflow.max_failed_share}); the first, "
                f"{failed[0].episode_id}:\n{failed[0].error}"
            )
