"""Coach prompt templates, loaded from YAML files and checked before a run starts.

Shipped templates live in ``mappa/coach/prompts/`` (``mathchat``, ``dsbench``); a user
template is any YAML file with the same sections. Every placeholder must be one the context
can fill: an unknown one is a config error at start, not a ``KeyError`` at step 40.
"""

from __future__ import annotations

import dataclasses
import hashlib
import string
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from mappa.coach.context import CoachContext
from mappa.config import AgentConfig, ConfigError
from mappa.config.loading import read_yaml
from mappa.records import ToolStatus

# Placeholders each section may use.
ALLOWED_FIELDS: dict[str, set[str]] = {
    "system": {"output_limit", "pipeline"},
    "final_system": {"output_limit", "pipeline"},
    "reference": {"ground_truth", "answer_check"},
    "worked": {"worked_answer"},
    "hindsight": {"hindsight"},
    "answer_check": {"verdict"},
    "final_answer": {"final_answer"},
    "user": {
        "task",
        "agent",
        "role",
        "turn",
        "agent_input",
        "output",
        "observation",
        "files",
        "output_limit",
        "truncated_note",
        "reference",
        "answer_check",
        "task_type",
    },
    "corrective": {"final_corrective"},
}
SHIPPED = ("mathchat", "mathchat_brief", "mathchat_facts", "dsbench")

TOOL_STATUS_WORDS: dict[ToolStatus, str] = {
    "ok": "ok, every block ran without an error",
    "error": "error, the program failed (an exception, a non-zero exit or a crash)",
    "timeout": "timeout, the program ran out of time and was stopped",
    "limit": "limit, the program hit a resource limit (memory, CPU, output, files) and was stopped",
}
"""How the coach is told the way an action's code run ended."""


WORKED = (
    "\n\n## The coach's own worked answer (NOT a reference: the coach solved the problem "
    "itself and may be wrong)\n{worked_answer}"
)
"""How a template shows the coach's own answer unless it has a ``worked`` section."""


class TemplateError(ValueError):
    """A template file that cannot be used; the message names the file and the section."""


@dataclass(frozen=True)
class CoachTemplate:
    name: str
    system: str
    final_system: str
    reference: str
    user: str
    corrective: str
    source: str
    answer_check: str = "\n\n## Checked by the grader\n{verdict}"
    worked: str = WORKED
    """Where no reference is shown, the coach's own worked answer (``coach.self_solve``), in
    the reference's place (``{reference}``)."""
    hindsight: str = (
        "\n\n## What the episode showed later (no label: the team's own runs)\n{hindsight}"
    )
    """With ``coach.hindsight``, the episode's evidence about the action, after the reference."""
    final_answer: str = "\n\n## The final agent's answer, read from its reply\n{final_answer}"
    """``CoachContext.final_answer`` after the reference (the paper's view: the final agent
    shown the reference without the grader's verdict), so a small coach compares two
    numbers instead of searching a long reply for one."""
    pipeline: str = ""
    """The team, described from the run's agents (``{pipeline}``; see ``for_pipeline``)."""

    @property
    def digest(self) -> str:
        """Hash of the text the coach is shown (part of the cache key: editing the template
        or the pipeline it describes invalidates cached scores)."""
        parts = [self.system, self.final_system, self.reference, self.user, self.corrective]
        extra = [self.answer_check, self.worked, self.hindsight, self.final_answer, self.pipeline]
        text = "\x00".join([*parts, *extra])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def shows_answer_check(self) -> bool:
        """Whether ``{answer_check}`` appears where the coach reads it (reference or user)."""
        return "answer_check" in _fields(self.reference) | _fields(self.user)

    def for_pipeline(self, agents: Sequence[AgentConfig]) -> CoachTemplate:
        """This template with ``{pipeline}`` describing ``agents``: the coach prompt then
        follows the run's pipeline (its roles, action limits, code and files) instead of
        restating it."""
        return dataclasses.replace(self, pipeline=describe_pipeline(agents))


def describe_pipeline(agents: Sequence[AgentConfig]) -> str:
    """One line per agent, in order: its title and what it may do (actions, code, files it
    owes). The judged agent's own role is shown with each action (``{role}``), so the roles
    are not repeated here: every coach call reads this text, and on a CPU its length is time.

    >>> from mappa.config import AgentConfig
    >>> print(describe_pipeline([
    ...     AgentConfig(name="solver", role="Solve it.", input_template="{task}"),
    ...     AgentConfig(name="code_executor", role="Run code.", input_template="{task}",
    ...                 max_actions=2, run_code=True, produces=["out.csv"]),
    ... ]))
    1. Solver: 1 action
    2. Code Executor: up to 2 actions; its ```python blocks are run and it sees their output; must leave out.csv
    """  # noqa: E501 - a doctest's expected output line cannot be wrapped
    lines = []
    for i, agent in enumerate(agents, 1):
        can = [f"up to {agent.max_actions} actions" if agent.max_actions > 1 else "1 action"]
        if agent.run_code:
            can.append("its ```python blocks are run and it sees their output")
        if agent.produces:
            can.append("must leave " + ", ".join(agent.produces))
        title = agent.name.replace("_", " ").title()
        lines.append(f"{i}. {title}: {'; '.join(can)}")
    return "\n".join(lines)


def _fields(text: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}


def load_template(name_or_path: str) -> CoachTemplate:
    """Load a shipped template by name, or a user template from a YAML path, and check it."""
    if name_or_path in SHIPPED:
        source = str(resources.files("mappa.coach") / "prompts" / f"{name_or_path}.yaml")
    else:
        source = name_or_path
    path = Path(source).expanduser()
    if not path.is_file():
        raise TemplateError(f"coach template {name_or_path!r}: no such template or file")
    try:
        data = read_yaml(path)
    except ConfigError as err:  # the YAML syntax, in one line
        raise TemplateError(str(err)) from None
    if not isinstance(data, dict):
        raise TemplateError(f"{path}: expected a mapping of sections")
    unknown = set(data) - set(ALLOWED_FIELDS) - {"name"}
    if unknown:
        raise TemplateError(f"{path}: unknown sections {sorted(unknown)}")
    for section in ("system", "user"):
        if not data.get(section):
            raise TemplateError(f"{path}: section {section!r} is required")
    for section, allowed in ALLOWED_FIELDS.items():
        try:
            bad = _fields(str(data.get(section) or "")) - allowed
        except ValueError as err:
            raise TemplateError(f"{path}: section {section!r}: malformed: {err}") from err
        if bad:
            raise TemplateError(
                f"{path}: section {section!r} uses placeholders {sorted(bad)} the context "
                f"cannot fill; allowed: {sorted(allowed)}"
            )
    return CoachTemplate(
        name=str(data.get("name") or path.stem),
        system=data["system"],
        final_system=data.get("final_system") or "",
        reference=data.get("reference") or "{ground_truth}",
        **({"answer_check": data["answer_check"]} if data.get("answer_check") else {}),
        **({"worked": data["worked"]} if data.get("worked") else {}),
        **({"hindsight": data["hindsight"]} if data.get("hindsight") else {}),
        **({"final_answer": data["final_answer"]} if data.get("final_answer") else {}),
        user=data["user"],
        corrective=data.get("corrective")
        or "Answer again with only the line `PROCESS_SCORE: x` (x from 0 to 10){final_corrective}.",
        source=str(path),
    )


def render_messages(template: CoachTemplate, ctx: CoachContext) -> list[dict[str, str]]:
    """Chat messages asking the coach to judge one action."""
    limit = str(ctx.output_limit) if ctx.output_limit else "a fixed number of"
    system = template.system.format(output_limit=limit, pipeline=template.pipeline)
    if ctx.is_final:
        system += template.final_system.format(output_limit=limit, pipeline=template.pipeline)
    check = template.answer_check.format(verdict=ctx.answer_check) if ctx.answer_check else ""
    if ctx.ground_truth is not None:
        reference = template.reference.format(ground_truth=ctx.ground_truth, answer_check=check)
    elif ctx.worked_answer is not None:
        reference = template.worked.format(worked_answer=ctx.worked_answer)
    else:
        reference = ""
    if ctx.final_answer is not None:
        reference += template.final_answer.format(final_answer=ctx.final_answer)
    if ctx.hindsight is not None:
        reference += template.hindsight.format(hindsight=ctx.hindsight)
    user = template.user.format(
        task=ctx.task,
        agent=ctx.agent,
        role=ctx.role,
        turn=ctx.turn + 1,
        agent_input=ctx.agent_input,
        output=ctx.output,
        observation=shown_observation(ctx),
        files=ctx.files or "(no files)",
        output_limit=limit,
        truncated_note=" (cut off at the length limit)" if ctx.truncated else "",
        reference=reference,
        answer_check=check,
        task_type=ctx.task_type,
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def shown_observation(ctx: CoachContext) -> str:
    """The action's tool output as the coach reads it (``{observation}``): the output, then
    a line with the run's status from the sandbox, so every template, the user's own too,
    shows whether the program ran, without the coach guessing it from the text.

    >>> from mappa.coach.context import CoachContext
    >>> ctx = CoachContext("t", "a", "r", 0, "in", "out", "[exit code 1]", False, None,
    ...                    tool_status="error")
    >>> print(shown_observation(ctx))
    [exit code 1]
    [tool status: error, the program failed (an exception, a non-zero exit or a crash)]
    """
    if ctx.observation is None:
        return "(no code was run)"
    if ctx.tool_status is None:
        return ctx.observation
    return f"{ctx.observation}\n[tool status: {TOOL_STATUS_WORDS[ctx.tool_status]}]"


def corrective_message(template: CoachTemplate, ctx: CoachContext) -> dict[str, str]:
    final = ", then the line `ANSWER_CORRECT: 0` or `ANSWER_CORRECT: 1`" if ctx.is_final else ""
    return {"role": "user", "content": template.corrective.format(final_corrective=final)}
