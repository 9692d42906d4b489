"""A preset run as a workflow function (``preset_workflow``) records what the preset
pipeline records: MathChat on the real tiny model with one seed (every prompt id,
completion id, log-prob and grade), and the DSBench team through the real sandbox with
scripted agents (workspace listings, missing-file warnings, blame, outcome)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from conftest import tiny_run_config
from fakes import FakeScriptedPolicy
from test_dsbench_pipeline import REPO, _tasks, _team

from mappa.config import RunConfig, load_config
from mappa.models.interface import SamplingPolicy
from mappa.records import Episode
from mappa.run.build import function_runner_for, load_policies, runner_for
from mappa.tasks import Task
from mappa.workflow.chat import ChatFormat
from mappa.workflow.interface import Rollout, RolloutInput
from mappa.workflow.preset import preset_workflow

FIELDS = ("agent", "turn", "prompt_ids", "completion_ids", "sample_logprobs", "prompt_text")
FIELDS += ("tool_status", "tool_stdout", "oracle", "coach_reference")


def _side_by_side(
    cfg: RunConfig,
    policy: Callable[[], SamplingPolicy],
    chat: ChatFormat,
    tasks: list[Task],
    root: Path,
) -> tuple[list[Episode], list[Episode]]:
    """The same tasks through the pipeline, then through its workflow, each from seed 0 and
    a policy of its own (``policy()``)."""
    out = []
    for kind in ("pipeline", "workflow"):
        runner: Rollout = (
            runner_for(cfg, policy(), chat, root / kind)
            if kind == "pipeline"
            else function_runner_for(
                cfg, policy(), chat, root / kind, preset_workflow(cfg.agents, cfg.workflow)
            )
        )
        torch.manual_seed(0)  # the same sampling noise for both
        try:
            out.append(runner.run(RolloutInput(tasks)).episodes)
        finally:
            runner.close()
    return out[0], out[1]


def _assert_same(pipe: list[Episode], flow: list[Episode]) -> None:
    for p, f in zip(pipe, flow, strict=True):
        assert (f.correct, f.final_answer, f.metrics) == (p.correct, p.final_answer, p.metrics)
        assert f.missing_artifacts == p.missing_artifacts and f.error is None
        assert len(f.actions) == len(p.actions)
        for a, b in zip(p.actions, f.actions, strict=True):
            assert [getattr(a, k) for k in FIELDS] == [getattr(b, k) for k in FIELDS]


def test_mathchat_as_a_workflow_samples_what_the_pipeline_samples(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from mappa.models.hf_engine import HfEngine

    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run")
    policies = load_policies(cfg)
    chat = ChatFormat(policies.tokenizer)
    tasks = [Task(f"t{i}", f"Ava has {i} apples and gets 5 more?", str(i + 5)) for i in range(4)]
    engine = HfEngine(policies)
    pipe, flow = _side_by_side(cfg, lambda: engine, chat, tasks * 2, tmp_path)
    _assert_same(pipe, flow)


def test_the_dsbench_team_as_a_workflow_records_what_the_pipeline_records(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = load_config(
        REPO / "configs" / "dsbench_cpu.yaml",
        ["sandbox.timeout_s=60", "rollout.max_prompt_tokens=100000"],
    )
    chat = ChatFormat(tokenizer)
    # the data engineer forgets X_test.pkl: later agents are warned, the run fails, it is blamed
    team, stop = _team(saves_test=False), [tokenizer.eos_token_id]
    tasks = _tasks(tmp_path)[:2]
    pipe, flow = _side_by_side(
        cfg, lambda: FakeScriptedPolicy(chat.encode, team, stop), chat, tasks, tmp_path
    )
    assert all(e.missing_artifacts["data_engineer"] == ["X_test.pkl"] for e in flow)
    assert all("missing" in e.agent_actions("analyst")[0].prompt_text for e in flow)
    _assert_same(pipe, flow)
