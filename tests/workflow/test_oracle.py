"""The answer oracle on real program runs: each action's code runs in the real sandbox
through the pipeline runner (the policy is scripted), and the verdict the runner records
(``Action.oracle``) and the score the rules coach gives (``answer_oracle``) both read only
what the program printed on stdout, and nothing from a program that failed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeCharChat, FakeScriptedPolicy

from mappa.coach import CoachView, build_context
from mappa.coach.rules import answer_oracle
from mappa.config import AgentConfig, AnswerFormat, RunConfig, SandboxConfig
from mappa.config.schema import TaskConfig
from mappa.records import Episode
from mappa.run.build import runner_for
from mappa.tasks import Task
from mappa.workflow.function import FunctionRunner
from mappa.workflow.interface import RolloutInput

pytestmark = pytest.mark.filterwarnings("ignore::mappa.sandbox.SandboxIsolationWarning")

AGENTS = [
    AgentConfig(name="code_executor", role="Runs code.", input_template="{task}", run_code=True),
    AgentConfig(name="verifier", role="Checks.", input_template="{task}"),
]
ROLES = {a.name: a.role for a in AGENTS}
BOXED_12 = r"The program printed 12. \boxed{12}"


def _code(*blocks: str) -> str:
    return "\n".join(f"```python\n{b}\n```" for b in blocks)


# (what the Code Executor wrote, the reference answer): good actions print the reference on
# stdout and exit 0; bad ones crash, time out, hit a limit, or print a wrong number, many of
# them with the reference somewhere in the text an old oracle read.
GOOD = {
    "prints the answer": (_code("print(3 * 4)"), "12"),
    "prints it, then warns with 99 on stderr": (
        _code("import warnings\nprint(12)\nwarnings.warn('value 99 is deprecated', UserWarning)"),
        "12",
    ),
    "prints working, the answer last": (_code("print('5 + 7 =', 5 + 7)"), "12"),
    "writes to stderr, prints the answer": (
        _code("import sys\nprint('12', flush=True)\nsys.stderr.write('note: 7 rows, 3 cols\\n')"),
        "12",
    ),
    "the last of two blocks prints it": (_code("print(5)", "print(12)"), "12"),
}
BAD = {
    "crashes with no output": (_code("import sys\nsys.exit(1)"), "1"),
    "times out": (_code("import time\ntime.sleep(60)"), "2"),  # "limit of 2 s exceeded"
    "prints the answer, then times out": (_code("import time\nprint(12)\ntime.sleep(60)"), "12"),
    "a traceback naming the answer": (_code("x = 1234\nraise ValueError(f'bad {x}')"), "1234"),
    "a traceback after printing the answer": (_code("print(12)\n1 / 0"), "12"),
    "prints a wrong number": (_code("print(13)"), "12"),
    "prints nothing": (_code("x = 12"), "12"),
    "floods the output after the answer": (_code("print(12)\nprint('12\\n' * 2_000_000)"), "12"),
    "runs out of memory after the answer": (_code("print(12)\nx = bytearray(2**33)"), "12"),
    "a later block fails": (_code("print(12)", "raise SystemExit(3)"), "12"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Episode]]:
    """Every case, run once through the real sandbox: case name -> its episode."""
    cases = {**GOOD, **BAD}
    chat = FakeCharChat()
    policy = FakeScriptedPolicy(
        chat.encode,
        {
            "code_executor": [code for code, _ in cases.values()],
            "verifier": [BOXED_12] * len(cases),
        },
    )
    cfg = RunConfig(
        agents=AGENTS,
        sandbox=SandboxConfig(pool_size=1, timeout_s=2.0, max_output_mb=1.0, memory_mb=512),
    )
    root = tmp_path_factory.mktemp("oracle")
    runner = runner_for(cfg, policy, chat, root)  # type: ignore[arg-type]  # a fake chat format
    try:
        yield {name: _one(runner, name, reference) for name, (_, reference) in cases.items()}
    finally:
        runner.close()


def _one(runner: FunctionRunner, name: str, reference: str) -> Episode:
    [episode] = runner.run(RolloutInput([Task(name, "Compute it.", reference)])).episodes
    return episode


def _score(episode: Episode, agent: str = "code_executor") -> float:
    """The rules coach's score of ``agent``'s action, seen as training shows it."""
    [action] = episode.agent_actions(agent)
    view = CoachView(reference_for="all", observation_chars=200)
    return answer_oracle(build_context(episode, action, ROLES, "verifier", view)).value


def test_the_issues_cases_on_real_program_runs(runs: dict[str, Episode]) -> None:
    crash = runs["crashes with no output"].actions[0]
    assert (crash.tool_observation, crash.tool_status) == ("[exit code 1]", "error")
    timeout = runs["times out"].actions[0]
    assert timeout.tool_status == "timeout" and "2 s" in (timeout.tool_observation or "")
    warned = runs["prints it, then warns with 99 on stderr"].actions[0]
    assert warned.tool_status == "ok" and "99" in (warned.tool_observation or "")
    assert warned.tool_stdout == "12\n"
    traced = runs["a traceback naming the answer"].actions[0]
    assert traced.tool_status == "error" and "1234" in (traced.tool_observation or "")
    assert runs["floods the output after the answer"].actions[0].tool_status == "limit"
    # crash with "[exit code 1]" against 1, a timeout message naming its limit, a traceback
    # naming the answer, a wrong print: 0; the right print with a warning on stderr: 10
    assert _score(runs["crashes with no output"]) == 0.0
    assert _score(runs["times out"]) == 0.0
    assert _score(runs["a traceback naming the answer"]) == 0.0
    assert _score(runs["prints a wrong number"]) == 0.0
    assert _score(runs["prints it, then warns with 99 on stderr"]) == 10.0


def test_the_oracle_ranks_every_good_program_above_every_bad_one(
    runs: dict[str, Episode],
) -> None:
    good = {name: _score(runs[name]) for name in GOOD}
    bad = {name: _score(runs[name]) for name in BAD}
    assert min(good.values()) > max(bad.values()), (good, bad)
    # the verdict every run records agrees, whatever coach the run trains on
    assert all(runs[name].actions[0].oracle is True for name in GOOD)
    assert all(runs[name].actions[0].oracle is False for name in BAD)


@pytest.mark.parametrize(
    ("answer_format", "reply", "right"),
    [
        ("boxed", "Answer: 12", False),  # the grader reads boxes only: no answer
        ("boxed", r"So \boxed{12}.", True),
        ("answer_line", "Answer: 12", True),
        ("answer_line", r"So \boxed{12}.", False),
    ],
)
def test_the_final_agents_result_is_what_the_grader_reads(
    tmp_path: Path, answer_format: AnswerFormat, reply: str, right: bool
) -> None:
    chat = FakeCharChat()
    policy = FakeScriptedPolicy(
        chat.encode, {"code_executor": [_code("print(12)")], "verifier": [reply]}
    )
    cfg = RunConfig(
        agents=AGENTS,
        sandbox=SandboxConfig(pool_size=1),
        tasks=TaskConfig(answer_format=answer_format),
    )
    runner = runner_for(cfg, policy, chat, tmp_path)  # type: ignore[arg-type]  # a fake chat format
    try:
        episode = _one(runner, "final", "12")
    finally:
        runner.close()
    [final] = episode.agent_actions("verifier")
    view = CoachView(reference_for="all", answer_format=answer_format)
    score = answer_oracle(build_context(episode, final, ROLES, "verifier", view))
    assert score.value == (10.0 if right else 0.0)
    assert final.oracle is right is episode.correct  # the oracle reads as the grader grades
