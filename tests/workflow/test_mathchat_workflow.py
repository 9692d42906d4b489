"""MathChat written as a workflow function samples, on the real tiny model with the same
seed, exactly what the preset pipeline samples: every prompt id, completion id and grade.

The workflow below is the preset pipeline spelled out over the config's own agents: each
agent in order, its ``input_template`` filled from the earlier agents' last replies and
observations, a code agent's tool loop continued in token space (``team.follow_up``). It
covers templates that do not use ``{files}`` or ``{file_warnings}`` (MathChat's)."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import tiny_run_config

from mappa.config import RunConfig
from mappa.models.hf_engine import HfEngine
from mappa.run.build import function_runner_for, load_policies, runner_for
from mappa.tasks import Task
from mappa.text import cut_middle
from mappa.workflow.chat import ChatFormat
from mappa.workflow.interface import Rollout, RolloutInput, RolloutOutput
from mappa.workflow.team import Team, WorkflowFn


def preset_as_workflow(cfg: RunConfig) -> WorkflowFn:
    """The preset pipeline of ``cfg`` as a workflow function."""
    w = cfg.workflow

    async def pipeline(task: str, team: Team) -> str | None:
        fields = {"task": task}
        for agent in cfg.agents:
            reply = await team.call(agent.name, agent.input_template.format(**fields))
            observation = reply.observation
            for _ in range(agent.max_actions - 1):
                if reply.observation is None:
                    break
                reply = await team.follow_up(reply, team.tool_turn(reply))
                observation = reply.observation or observation
            fields[f"{agent.name}_output"] = reply
            fields[f"{agent.name}_observation"] = (
                w.no_code_observation
                if observation is None
                else cut_middle(observation, w.observation_chars)
            )
        return None

    return pipeline


def test_mathchat_as_a_workflow_samples_what_the_pipeline_samples(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run")
    policies = load_policies(cfg)
    engine = HfEngine(policies)
    chat = ChatFormat(policies.tokenizer)
    tasks = [Task(f"t{i}", f"Ava has {i} apples and gets 5 more?", str(i + 5)) for i in range(4)]
    outputs: dict[str, RolloutOutput] = {}
    for kind in ("pipeline", "workflow"):
        root = tmp_path / kind
        runner: Rollout = (
            runner_for(cfg, engine, chat, root)
            if kind == "pipeline"
            else function_runner_for(cfg, engine, chat, root, preset_as_workflow(cfg))
        )
        torch.manual_seed(0)  # the same sampling noise for both
        try:
            outputs[kind] = runner.run(RolloutInput(tasks * 2))
        finally:
            runner.close()
    pipe, flow = outputs["pipeline"].episodes, outputs["workflow"].episodes
    fields = ("agent", "turn", "prompt_ids", "completion_ids", "sample_logprobs", "prompt_text")
    fields += ("tool_observation", "tool_status", "oracle")
    for p, f in zip(pipe, flow, strict=True):
        assert (f.correct, f.final_answer, f.error) == (p.correct, p.final_answer, None)
        assert len(f.actions) == len(p.actions) >= len(cfg.agents)
        for a, b in zip(p.actions, f.actions, strict=True):
            assert [getattr(a, k) for k in fields] == [getattr(b, k) for k in fields]
