"""The workflow-function runner above the policy interface: calls batched per agent across
episodes, every call an action with its exact tokens, code run in the episode's workspace,
failures recorded or stopping the run (fakes: docs/workflows.md's contract, not a model)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes import FakeCharChat, FakeScriptedPolicy

from mappa.config import AgentConfig, RunConfig, SandboxConfig
from mappa.run.build import make_sandbox_pool, sampling_params
from mappa.tasks import Task
from mappa.workflow.chat import plain_transcript
from mappa.workflow.function import FunctionRunner, WorkflowFailed
from mappa.workflow.interface import RolloutInput
from mappa.workflow.team import Team, TeamError, WorkflowFn

AGENTS = [
    AgentConfig(name="critic", role="You check.", max_actions=3),
    AgentConfig(name="solver", role="You solve.", max_actions=4),
]


def _runner(fn: WorkflowFn, policy: FakeScriptedPolicy, tmp_path: Path, **workflow: object):
    cfg = RunConfig(
        agents=AGENTS,
        workflow={"preset": None, **workflow},
        sandbox=SandboxConfig(pool_size=2, timeout_s=5.0, memory_mb=512),
    )
    return FunctionRunner(
        fn,
        policy,
        FakeCharChat(),  # type: ignore[arg-type]  # a fake chat format
        cfg.agents,
        cfg.workflow,
        sampling_params(cfg),
        cfg.rollout.max_prompt_tokens,
        make_sandbox_pool(cfg.sandbox),
        tmp_path,
    )


def _run(runner: FunctionRunner, prompts: list[str], answer: str = "4"):
    try:
        return runner.run(RolloutInput([Task(f"t{i}", p, answer) for i, p in enumerate(prompts)]))
    finally:
        runner.close()


async def revise(task: str, team: Team) -> str | None:
    """Episode ``n`` (its task's last character) revises ``n`` times."""
    reply = await team.solver(task)
    for _ in range(int(task[-1])):
        verdict = await team.critic(f"Check: {reply}")
        reply = await team.call(
            "solver",
            [
                {"role": "user", "content": task},
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"Critic: {verdict}"},
            ],
        )
    return None


def test_calls_pending_together_are_one_batch_per_agent_and_every_call_is_an_action(
    tmp_path: Path,
) -> None:
    chat = FakeCharChat()
    policy = FakeScriptedPolicy(
        chat.encode,
        {"solver": ["\\boxed{3}", "\\boxed{4}", "\\boxed{5}"], "critic": ["no", "still no"]},
    )
    out = _run(_runner(revise, policy, tmp_path), ["2+2 n=0", "2+2 n=1", "2+2 n=2"])

    # episodes wait for each other: 3 solver prompts, then 2 critics, 2 solvers, 1, 1
    assert [(agent, len(prompts)) for agent, prompts in policy.seen] == [
        ("solver", 3),
        ("critic", 2),
        ("solver", 2),
        ("critic", 1),
        ("solver", 1),
    ]
    e0, e1, e2 = out.episodes
    assert [(a.agent, a.turn) for a in e2.actions] == [
        ("solver", 0),
        ("critic", 0),
        ("solver", 1),
        ("critic", 1),
        ("solver", 2),
    ]
    assert len(e0.actions) == 1 and len(e1.actions) == 3
    # the grader reads the last reply: \boxed{3}, \boxed{4}, \boxed{5} against 4
    assert [e.correct for e in out.episodes] == [False, True, False]
    last = e2.actions[-1]
    messages = [
        {"role": "system", "content": "You solve."},
        {"role": "user", "content": "2+2 n=2"},
        {"role": "assistant", "content": "\\boxed{4}"},
        {"role": "user", "content": "Critic: still no"},
    ]
    assert last.prompt_ids == chat.prompt(messages)
    assert last.prompt_text == plain_transcript(messages)
    assert last.completion_ids == chat.encode("\\boxed{5}")
    assert last.sample_logprobs == [-0.5] * len(last.completion_ids)
    # the solver is the final agent (listed last): its replies are read as answers
    assert [a.oracle for a in e1.actions] == [False, False, True]
    assert out.generated_tokens == sum(
        len(a.completion_ids) for e in out.episodes for a in e.actions
    )


async def judged_pair(task: str, team: Team) -> str | None:
    first, second = await asyncio.gather(team.solver(task), team.critic(task))
    return f"{first} {second}"


def test_parallel_calls_join_the_batch_and_a_returned_answer_is_graded(tmp_path: Path) -> None:
    chat = FakeCharChat()
    policy = FakeScriptedPolicy(chat.encode, {"solver": ["\\boxed{1}"], "critic": ["\\boxed{4}"]})
    out = _run(_runner(judged_pair, policy, tmp_path), ["a", "b"])
    assert sorted((agent, len(p)) for agent, p in policy.seen) == [("critic", 2), ("solver", 2)]
    assert all(e.correct and e.final_answer == "4" for e in out.episodes)


async def compute(task: str, team: Team) -> str | None:
    reply = await team.solver(task, run_code=True)
    assert reply.status == "ok" and reply.stdout is not None
    return f"\\boxed{{{reply.stdout.strip()}}}"


def test_run_code_runs_the_reply_in_the_episodes_workspace(tmp_path: Path) -> None:
    chat = FakeCharChat()
    code = "```python\nopen('out.txt', 'w').write('x')\nprint(2 + 2)\n```"
    policy = FakeScriptedPolicy(chat.encode, {"solver": [code]})
    out = _run(_runner(compute, policy, tmp_path), ["2+2?", "2+2?"])
    for ep in out.episodes:
        [action] = ep.actions
        assert action.tool_status == "ok" and action.tool_stdout == "4\n"
        assert action.workspace_files is not None and "out.txt" in action.workspace_files
        assert (Path(str(ep.workspace)) / "out.txt").is_file()
        assert ep.correct is True and ep.error is None


async def fragile(task: str, team: Team) -> str | None:
    reply = await team.solver(task)
    if task.startswith("bad"):
        raise ZeroDivisionError("the workflow's own bug")
    return reply


def test_a_raising_workflow_fails_its_episode_and_the_run_goes_on(tmp_path: Path) -> None:
    chat = FakeCharChat()
    policy = FakeScriptedPolicy(chat.encode, {"solver": ["\\boxed{4}"]})
    out = _run(_runner(fragile, policy, tmp_path), ["bad 1", "good", "good", "good"])
    bad, *good = out.episodes
    assert bad.error is not None and "ZeroDivisionError: the workflow's own bug" in bad.error
    assert "in fragile" in bad.error  # the traceback names the workflow's frame
    assert "During handling" not in bad.error  # and only its own story
    assert len(bad.actions) == 1  # what it did before it raised is kept, scored and trained
    assert all(e.error is None and e.correct for e in good)


def test_failed_episodes_past_the_limit_stop_the_run_with_the_first_traceback(
    tmp_path: Path,
) -> None:
    chat = FakeCharChat()
    policy = FakeScriptedPolicy(chat.encode, {"solver": ["\\boxed{4}"]})
    runner = _runner(fragile, policy, tmp_path, max_failed_share=0.25)
    with pytest.raises(WorkflowFailed, match=r"(?s)2 of 4 .*s0-e1:\nTraceback.*ZeroDivisionError"):
        _run(runner, ["good", "bad 1", "bad 2", "good"])


async def asks_a_stranger(task: str, team: Team) -> str | None:
    return await team.judge(task)


async def talks_too_much(task: str, team: Team) -> str | None:
    for _ in range(4):
        await team.critic(task)
    return None


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (asks_a_stranger, "agent 'judge', which the config does not define"),
        (talks_too_much, "more than agents.critic.max_actions=3"),
    ],
)
def test_calls_the_config_does_not_allow_fail_the_episode(
    fn: WorkflowFn, message: str, tmp_path: Path
) -> None:
    chat = FakeCharChat()
    policy = FakeScriptedPolicy(chat.encode, {"critic": ["ok"] * 3})
    [episode] = _run(_runner(fn, policy, tmp_path, max_failed_share=1.0), ["x"]).episodes
    assert episode.error is not None and message in episode.error
    assert "TeamError" in episode.error and TeamError.__name__ == "TeamError"


async def linear(task: str, team: Team) -> str | None:
    """The two-agent preset of ``LINEAR``, written as a workflow."""
    solution = await team.problem_solver(f"Problem: {task}")
    return await team.verifier(f"Problem: {task}\n\nSolver: {solution}")


async def with_tool_loop(task: str, team: Team) -> str | None:
    """The three-agent preset of ``TOOL_LOOP`` (MathChat's shape), written as a workflow:
    the code executor's tool loop continues its reply in token space (``follow_up``)."""
    solution = await team.problem_solver(f"Problem: {task}")
    reply = await team.code_executor(f"Problem: {task}\n\nSolver: {solution}")
    observation = reply.observation
    for _ in range(1):  # max_actions 2: one more turn after a run
        if reply.observation is None:
            break
        reply = await team.follow_up(reply, team.tool_turn(reply))
        observation = reply.observation or observation
    return await team.verifier(f"Problem: {task}\n\nCode: {reply}\n\nOutput: {observation}")


SOLVER = AgentConfig(name="problem_solver", role="You solve.", input_template="Problem: {task}")
LINEAR = [
    SOLVER,
    AgentConfig(
        name="verifier",
        role="You verify.",
        input_template="Problem: {task}\n\nSolver: {problem_solver_output}",
    ),
]
TOOL_LOOP = [
    SOLVER,
    AgentConfig(
        name="code_executor",
        role="You run code.",
        input_template="Problem: {task}\n\nSolver: {problem_solver_output}",
        max_actions=2,
        run_code=True,
    ),
    AgentConfig(
        name="verifier",
        role="You verify.",
        input_template="Problem: {task}\n\nCode: {code_executor_output}\n\n"
        "Output: {code_executor_observation}",
    ),
]
SCRIPTS = {
    "problem_solver": ["2 + 2 = 4"],
    "code_executor": ["```python\nprint(2 + 2)\n```", "It printed 4."],
    "verifier": ["\\boxed{4}"],
}


@pytest.mark.parametrize(
    ("agents", "fn"), [(LINEAR, linear), (TOOL_LOOP, with_tool_loop)], ids=["linear", "tool-loop"]
)
def test_a_preset_samples_and_records_what_the_same_team_written_by_hand_does(
    agents: list[AgentConfig], fn: WorkflowFn, tmp_path: Path
) -> None:
    from mappa.run.build import runner_for

    cfg = RunConfig(agents=agents, sandbox=SandboxConfig(pool_size=1, timeout_s=5.0))
    chat = FakeCharChat()
    tasks = [Task(f"t{i}", f"What is 2 + {i}?", "4") for i in range(3)]
    runs = {}
    for kind in ("preset", "by hand"):
        policy = FakeScriptedPolicy(chat.encode, SCRIPTS)
        runner = (
            runner_for(cfg, policy, chat, tmp_path / kind)  # type: ignore[arg-type]  # a fake chat
            if kind == "preset"
            else FunctionRunner(
                fn,
                policy,
                chat,  # type: ignore[arg-type]  # a fake chat format
                cfg.agents,
                cfg.workflow,
                sampling_params(cfg),
                cfg.rollout.max_prompt_tokens,
                make_sandbox_pool(cfg.sandbox),
                tmp_path / kind,
            )
        )
        try:
            runs[kind] = (runner.run(RolloutInput(tasks)).episodes, policy.seen)
        finally:
            runner.close()
    (pipe, pipe_batches), (flow, flow_batches) = runs["preset"], runs["by hand"]
    assert flow_batches == pipe_batches  # the same generate calls, with the same prompts
    fields = ("agent", "turn", "prompt_ids", "completion_ids", "prompt_text", "oracle")
    fields += ("tool_observation", "tool_status", "tool_stdout")
    for p, f in zip(pipe, flow, strict=True):
        assert (f.correct, f.final_answer) == (p.correct, p.final_answer) == (True, "4")
        assert len(f.actions) == len(p.actions) == len(agents) + (fn is with_tool_loop)
        for a, b in zip(p.actions, f.actions, strict=True):
            assert [getattr(a, k) for k in fields] == [getattr(b, k) for k in fields]
