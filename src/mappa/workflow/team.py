"""The team a workflow function calls (docs/workflows.md): agents by name, a chat prompt
in, the reply text out.

``Team`` checks every call against the config (a defined agent, within its
``max_actions``, well-formed messages) and hands it to a ``TeamBackend``: the rollout's
batching backend (``mappa.workflow.function``) or the pre-flight's stub, so a workflow is
dry-run through exactly the checks a rollout makes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from mappa.config import AgentConfig, WorkflowConfig
from mappa.records import ToolStatus
from mappa.text import cut_middle

T = TypeVar("T")

Messages = str | Sequence[Mapping[str, str]]
"""A call's prompt: one user message, or ``{"role": "user"|"assistant", "content": ...}``
messages ending with a user message (the agent's role is the system message)."""


class TeamError(ValueError):
    """A call the run config does not allow: an unknown agent, a call past the agent's
    ``max_actions``, malformed messages."""


class PromptTooLong(ValueError):
    """A call's prompt exceeds ``rollout.max_prompt_tokens``; nothing was sampled."""


@dataclass(frozen=True)
class Thread:
    """The conversation a reply ended, as sampled: what ``Team.follow_up`` continues.

    Attributes:
        agent: who replied.
        messages: the conversation as text (the system role first), without the reply.
        ids: the prompt ids and the reply's ids exactly as sampled.
        last_token: the reply's last id (None: an empty reply).
    """

    agent: str
    messages: list[dict[str, str]]
    ids: list[int]
    last_token: int | None


class Reply(str):
    """An agent's reply text, with its code run when the call ran code.

    Attributes:
        observation: what the sandbox showed of the run (stdout, stderr, status); None: no code ran.
        status: how the run ended (``ok``, ``error``, ``timeout``, ``limit``); None: no code ran.
        stdout: what the programs printed on stdout alone; None: no code ran.
        thread: the conversation it ended (None: a reply no team call returned).
    """

    observation: str | None
    status: ToolStatus | None
    stdout: str | None
    thread: Thread | None

    def __new__(
        cls,
        text: str,
        observation: str | None = None,
        status: ToolStatus | None = None,
        stdout: str | None = None,
        thread: Thread | None = None,
    ) -> Reply:
        reply = super().__new__(cls, text)
        reply.observation, reply.status, reply.stdout = observation, status, stdout
        reply.thread = thread
        return reply


class TeamBackend(Protocol):
    """Answers the calls of one episode that ``Team`` has checked."""

    async def act(
        self,
        agent: AgentConfig,
        turn: int,
        messages: list[dict[str, str]],
        run_code: bool,
        after: Thread | None = None,
    ) -> Reply:
        """Prompt ``agent`` with ``messages``; ``after``: the thread they continue, whose ids
        the prompt extends (``messages[-1]`` is then the new user turn)."""
        ...

    def files(self) -> str: ...

    def has_file(self, name: str) -> bool: ...


WorkflowFn = Callable[[str, "Team"], Coroutine[Any, Any, str | None]]
"""``async def solve(task: str, team: Team) -> str | None``: the final answer, or None for
the last reply of the episode."""


def chat_messages(role: str, messages: Messages) -> list[dict[str, str]]:
    """The conversation an agent is prompted with: its role as the system message, then
    ``messages`` (a string is one user message), checked.

    >>> chat_messages("You check.", "Is 2+2=4?")
    [{'role': 'system', 'content': 'You check.'}, {'role': 'user', 'content': 'Is 2+2=4?'}]
    """
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    out = [{"role": "system", "content": role}]
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or set(m) != {"role", "content"}:
            raise TeamError(f"message {i}: expected {{'role': ..., 'content': ...}}, got {m!r}")
        if m["role"] not in ("user", "assistant") or not isinstance(m["content"], str):
            raise TeamError(
                f"message {i}: role must be 'user' or 'assistant' (the agent's configured role "
                f"is its system message) and content a string, got {m['role']!r}"
            )
        out.append({"role": m["role"], "content": m["content"]})
    if out[-1]["role"] != "user":
        raise TeamError("a call's messages must end with a user message")
    return out


class Team:
    """One episode's team: ``await team.call("critic", messages)`` or ``await
    team.critic(messages)`` prompts that agent and returns its ``Reply``.

    Args:
        agents: the run's agents; a call to any other name raises ``TeamError``.
        backend: answers the checked calls.
        workflow: the tool-turn template and observation budget of ``tool_turn``.
    """

    def __init__(
        self, agents: Sequence[AgentConfig], backend: TeamBackend, workflow: WorkflowConfig
    ) -> None:
        self._agents = {a.name: a for a in agents}
        self._backend = backend
        self._workflow = workflow
        self._turns: dict[str, int] = {}

    @property
    def agents(self) -> list[str]:
        """The names a workflow may call."""
        return list(self._agents)

    async def call(self, agent: str, messages: Messages, *, run_code: bool | None = None) -> Reply:
        """Prompt ``agent`` with ``messages``; ``run_code`` (default: the agent's configured
        ``run_code``) runs the reply's code blocks in the episode's workspace."""
        config, turn = self._next_turn(agent)
        prompt = chat_messages(config.role, messages)
        code = config.run_code if run_code is None else run_code
        return await self._backend.act(config, turn, prompt, code)

    async def follow_up(self, reply: Reply, message: str, *, run_code: bool | None = None) -> Reply:
        """Continue the conversation ``reply`` ended with ``message`` as the next user turn,
        in token space: the prompt is the earlier prompt and reply ids exactly as sampled,
        then the user turn's ids (a preset's tool loop builds its turns the same way), so
        nothing sampled is re-encoded. The same agent replies."""
        if reply.thread is None:
            raise TeamError("follow_up continues a Reply that a team call returned")
        thread = reply.thread
        config, turn = self._next_turn(thread.agent)
        messages = [
            *thread.messages,
            {"role": "assistant", "content": str(reply)},
            {"role": "user", "content": message},
        ]
        code = config.run_code if run_code is None else run_code
        return await self._backend.act(config, turn, messages, code, thread)

    def _next_turn(self, agent: str) -> tuple[AgentConfig, int]:
        """``agent``'s config and the index of the call being made to it in this episode."""
        config = self._agents.get(agent)
        if config is None:
            raise TeamError(
                f"the workflow called agent {agent!r}, which the config does not define "
                f"(agents: {', '.join(self._agents)})"
            )
        turn = self._turns.get(agent, 0)
        if turn >= config.max_actions:
            raise TeamError(
                f"the workflow called {agent} more than agents.{agent}.max_actions="
                f"{config.max_actions} times in one episode"
            )
        self._turns[agent] = turn + 1
        return config, turn

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Reply]]:
        if name.startswith("_"):
            raise AttributeError(name)
        return functools.partial(self.call, name)

    def tool_turn(self, reply: Reply) -> str:
        """The user message that shows ``reply``'s code output (``workflow.tool_turn_template``)."""
        w = self._workflow
        shown = (
            cut_middle(reply.observation, w.observation_chars)
            if reply.observation is not None
            else w.no_code_observation
        )
        return w.tool_turn_template.format(observation=shown)

    def files(self) -> str:
        """The episode's shared workspace: its files and which agent made each."""
        return self._backend.files()

    def has_file(self, name: str) -> bool:
        """Whether the episode's shared workspace holds a file of that name."""
        return self._backend.has_file(name)


STUB_REPLY = "(a stub reply: the pre-flight check runs no model)"


class StubBackend:
    """Answers every call with ``STUB_REPLY`` and runs no code (the pre-flight dry run)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    async def act(
        self,
        agent: AgentConfig,
        turn: int,
        messages: list[dict[str, str]],
        run_code: bool,
        after: Thread | None = None,
    ) -> Reply:
        self.calls.append((agent.name, turn))
        thread = Thread(agent.name, messages, [], None)
        if not run_code:
            return Reply(STUB_REPLY, thread=thread)
        return Reply(STUB_REPLY, "(stub: no code was run)", "ok", "", thread)

    def files(self) -> str:
        return "(stub: an empty workspace)"

    def has_file(self, name: str) -> bool:
        return False


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end from synchronous code, on a fresh event loop; in a thread of
    its own when this thread already runs a loop (a notebook), which cannot be re-entered."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # none: run here (outside the handler, so tracebacks stay clean)
        running = False
    else:
        running = True
    if not running:
        return _run_interruptible(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _run_interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` without its Ctrl-C handler. That handler only cancels the main task,
    which takes effect at the next ``await``; a batched ``generate`` is one long synchronous
    call, so Ctrl-C waited for the whole batch (minutes). Here Ctrl-C raises
    ``KeyboardInterrupt`` where the code is, as outside a loop; the tasks left are then
    cancelled and the loop closed, as ``asyncio.run`` does."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
