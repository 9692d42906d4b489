"""Two real training steps of the 3-agent pipeline on a tiny random model."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tiny_run_config
from safetensors.torch import load_file

from mappa.jsonl import read_jsonl
from mappa.models.loading import load_base
from mappa.records import read_episodes
from mappa.run.build import load_policies
from mappa.run.checkpoint import latest_checkpoint
from mappa.run.loop import train

AGENTS = ("problem_solver", "code_executor", "verifier")


def test_two_steps_change_each_adapter_and_not_the_base(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run")
    policies = load_policies(cfg)
    base_before = {k: v.clone() for k, v in policies.base_parameters().items()}
    names = [a.name for a in cfg.agents]
    adapters_before = {
        n: [p.detach().clone() for p in policies.adapter_parameters(n)] for n in names
    }

    run_dir = train(cfg, policies)

    for name, tensor in policies.base_parameters().items():
        assert torch.equal(tensor, base_before[name]), f"base weight {name} changed"
    after = {n: [p.detach() for p in policies.adapter_parameters(n)] for n in names}
    for n in names:
        assert any(
            not torch.equal(a, b) for a, b in zip(after[n], adapters_before[n], strict=True)
        ), n
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert any(not torch.equal(x, y) for x, y in zip(after[a], after[b], strict=True)), (
                a,
                b,
            )

    # Outputs: one standard PEFT adapter per agent, equal to the trained weights.
    from peft import PeftModel

    for n in names:
        saved = load_file(run_dir / "adapters" / n / "adapter_model.safetensors")
        assert saved and any(t.abs().sum() > 0 for k, t in saved.items() if "lora_B" in k)
        assert json.loads((run_dir / "adapters" / n / "adapter_config.json").read_text())["r"] == 8
    ids = torch.tensor([[1, 5, 9, 12, 3]])
    for n in names:
        base, _ = load_base(str(tiny_model_dir), dtype="float32", device="cpu")
        loaded = PeftModel.from_pretrained(base, run_dir / "adapters" / n).eval()
        with torch.no_grad(), policies.use(n):
            expected = policies.model(input_ids=ids).logits
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5), n

    episodes = read_episodes(run_dir / "episodes.jsonl")
    assert len(episodes) == 2 * 2 * 2  # steps x prompts x samples
    for ep in episodes:
        assert [a.agent for a in ep.actions][0] == "problem_solver"
        for a in ep.actions:
            assert a.coach is not None and 0.0 <= a.coach.value <= 10.0
            assert a.prompt_ids and len(a.completion_ids) == len(a.sample_logprobs) > 0
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        for n in names:
            assert m[f"rl/{n}/tokens"] > 0 and m[f"coach/{n}"] is not None
            assert m[f"coach_health/{n}/signal"] in (0, 1)
            assert m[f"coach_health/{n}/no_signal_streak"] <= m["step"] + 1
            assert 0 <= m[f"sync/{n}/probe_gap"] < 1e-4  # the engine samples the new weights
        assert m["sync/probe_s"] > 0
        assert m["coach_health/agents"] == len(names)
        assert m["rollout_tokens_per_s"] > 0 and m["mean_kl"] is not None


def test_an_agent_sampled_without_its_adapter_stops_the_run(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hf engine's sync is the switch to the agent's adapter before it samples; skipped,
    the engine samples the base. Before step 0 that passes (LoRA B starts at zero, so every
    adapter is the base); the probe after step 0's update stops the run, naming the agent,
    the engine and the fix (test_two_steps_... is the same run with the switch, passing)."""
    from mappa.models.hf_engine import HfEngine
    from mappa.models.sync_probe import StaleAdapterError

    monkeypatch.setattr(HfEngine, "_weights", lambda self, agent: self.policies.use(None))
    run_dir = tmp_path / "run"
    with pytest.raises(StaleAdapterError) as err:
        train(tiny_run_config(tiny_model_dir, run_dir))
    message = str(err.value)
    assert message.startswith(
        "stale adapter for agent 'problem_solver' on the hf engine: before step 1's rollout"
    )
    assert "rollout.sync_tolerance" in message and "\n" not in message
    assert f"No checkpoint was written in {run_dir}" in "\n".join(err.value.__notes__)
    assert not (run_dir / "metrics.jsonl").exists()  # step 0 never finished


@pytest.mark.parametrize(
    "overrides",
    [
        ["rl.advantage=grpo", "rl.kl_in_loss=true", "rl.kl_estimator=k3"],
        ["rl.advantage=outcome_only", "rl.norm_scope=global"],
        ["rl.advantage=rloo", "rl.loss_agg=seq_mean", "rl.kl_target=0.01"],
        ["rl.norm_scope=agent_tasktype", "rl.w_outcome=1.0", "rl.clip_eps_high=0.28"],
    ],
    ids=["grpo", "outcome_only", "rloo", "mixed"],
)
def test_alternative_estimators_train_end_to_end(
    tiny_model_dir: Path, tmp_path: Path, overrides: list[str]
) -> None:
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", "train.steps=1", *overrides)
    run_dir = train(cfg)
    [m] = read_jsonl(run_dir / "metrics.jsonl")
    for n in AGENTS:
        assert m[f"rl/{n}/tokens"] > 0 and math.isfinite(m[f"rl/{n}/loss"])
        assert (run_dir / "adapters" / n / "adapter_model.safetensors").is_file()
        if m[f"rl/{n}/skipped"]:
            # outcome_only when the tiny model solves nothing: every outcome is 0, no reward
            # signal, so no optimizer step (docs/algorithm.md §4)
            assert "rl.advantage=outcome_only" in overrides and not m["accuracy"]
            continue
        assert math.isfinite(m[f"rl/{n}/entropy"]) and m[f"rl/{n}/entropy"] > 0


def test_cli_run_ends_with_a_summary_and_adapters_travel(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mappa train` ends with the readable summary; an adapter copied elsewhere reattaches to
    the base its config names, and `mappa eval --adapters RUN` needs no other flag."""
    import shutil

    import yaml
    from peft import PeftModel

    from mappa.cli import main

    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert main(["train", "--config", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    summary = out[out.index(next(line for line in out if line.startswith("mappa: 2 step(s)"))) :]
    assert summary[1] == "  coach score 0-10, step 0 -> step 1, and actions trained:"
    for agent, line in zip(AGENTS, summary[2:5], strict=True):
        assert line.split()[0] == agent and " -> " in line and line.endswith("trained")
        assert int(line.split()[-2]) > 0  # actions trained on over the run
    assert summary[5].startswith("  accuracy (training rollouts): ")
    assert (
        summary[6].startswith("  coach signal: ")
        and " of 6 agent-steps; digit mass " in (summary[6])
    )
    assert f"evaluate: mappa eval --adapters {tmp_path / 'run'}" in summary[-1]

    adapter = tmp_path / "elsewhere" / "verifier"
    shutil.copytree(tmp_path / "run" / "adapters" / "verifier", adapter)
    named = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert named == str(tiny_model_dir)  # the name the user gave, not a cache path
    base, _ = load_base(named, dtype="float32", device="cpu")
    moved = PeftModel.from_pretrained(base, adapter).eval()
    base2, _ = load_base(named, dtype="float32", device="cpu")
    original = PeftModel.from_pretrained(base2, tmp_path / "run" / "adapters" / "verifier").eval()
    ids = torch.tensor([[1, 5, 9, 12, 3]])
    with torch.no_grad():
        assert torch.equal(moved(input_ids=ids).logits, original(input_ids=ids).logits)

    evaluated = tmp_path / "eval"
    args = [
        "eval",
        "--adapters",
        str(tmp_path / "run"),
        "--out",
        str(evaluated),
        "eval.num_tasks=2",
    ]
    assert main(args) == 0
    result = json.loads((evaluated / "eval.json").read_text())
    assert result["adapters"] == str(tmp_path / "run" / "adapters") and result["tasks"] == 2

    # a checkpoint's adapters: its run's config, and the output beside the run, not inside
    # the checkpoint folder (the run's next checkpoint deletes that folder)
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None
    capsys.readouterr()
    assert main(["eval", "--adapters", str(ckpt), "eval.num_tasks=1"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"mappa eval: config {tmp_path / 'run' / 'config.yaml'}")
    assert (tmp_path / "run" / f"eval-{ckpt.name}" / "eval.json").is_file()
    assert not (ckpt / "eval.json").exists()


def test_non_finite_loss_skips_that_agents_step_and_k_in_a_row_stop_the_run(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NaN in one agent's loss: that agent takes no optimizer step (logged as skipped),
    the others train on; ``train.max_nonfinite_steps`` such steps in a row stop the run."""
    from mappa.models.interface import TokenLogprobs
    from mappa.rl import experience, update
    from mappa.rl.update import NON_FINITE, NonFiniteError

    real = experience.action_logprobs

    def poisoned(
        policy: Any, agent: str | None, actions: Any, temperature: float, with_entropy: bool = False
    ) -> TokenLogprobs:
        out = real(policy, agent, actions, temperature, with_entropy)
        return out._replace(logprobs=out.logprobs * float("nan")) if agent == "verifier" else out

    monkeypatch.setattr(update, "action_logprobs", poisoned)
    cfg = tiny_run_config(
        tiny_model_dir, tmp_path / "run", "train.steps=3", "train.max_nonfinite_steps=3"
    )
    policies = load_policies(cfg)
    before = {n: [p.detach().clone() for p in policies.adapter_parameters(n)] for n in AGENTS}
    with pytest.raises(NonFiniteError, match=r"'verifier'.* 3 steps in a row"):
        train(cfg, policies)

    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]  # each step logged before the stop
    for m in metrics:
        assert m["rl/verifier/skipped"] == NON_FINITE
        assert m["rl/problem_solver/skipped"] == "" and m["rl/code_executor/skipped"] == ""
    for n in AGENTS:
        same = all(
            torch.equal(a, b)
            for a, b in zip(policies.adapter_parameters(n), before[n], strict=True)
        )
        assert same == (n == "verifier"), n


def test_non_finite_guard_counts_only_steps_in_a_row() -> None:
    from mappa.rl.update import NON_FINITE, NonFiniteError, NonFiniteGuard

    guard = NonFiniteGuard(["a", "b"], limit=2)
    bad = {"rl/a/skipped": NON_FINITE, "rl/b/skipped": "no actions"}
    guard.check(0, bad)
    guard.check(1, {"rl/a/skipped": ""})  # a finite step resets the count
    guard.check(2, bad)
    assert guard.counts == {"a": 1, "b": 0}
    with pytest.raises(NonFiniteError, match=r"'a'.*2 steps in a row \(up to step 3\)"):
        guard.check(3, bad)


def test_a_run_whose_workflows_fail_stops_with_the_first_traceback(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """More failed workflows than workflow.max_failed_share: `mappa train` stops (exit 1)
    naming the first traceback, after the dry run passed on stub replies."""
    import yaml

    from mappa.cli import main

    team = tmp_path / "flaky_team.py"
    team.write_text(
        "from mappa.workflow.team import STUB_REPLY\n\n\n"
        "async def solve(task, team):\n"
        "    reply = await team.problem_solver(task)\n"
        "    if reply != STUB_REPLY:  # a real model's reply: the bug shows\n"
        "        raise ZeroDivisionError('the workflow broke')\n"
    )
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", f"workflow.function={team}:solve")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert main(["train", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "4 of 4 episodes' workflows failed" in err
    assert "ZeroDivisionError: the workflow broke" in err
    assert "No checkpoint was written" in err  # the stop says what to do next


def test_a_run_on_a_hub_dataset_records_what_it_read(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``tasks.source: hf:...`` (a local dataset folder here: the Hub is out of reach): the
    run dir's data.json names the source, its revision, rows and fingerprint."""
    pytest.importorskip("datasets")
    folder = tmp_path / "arith"
    folder.mkdir()
    rows = [{"question": f"What is {k} + 1?", "answer": str(k + 1)} for k in range(6)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = f"hf:{folder}:train"
    cfg = tiny_run_config(
        tiny_model_dir,
        tmp_path / "run",
        f"tasks.source={source}",
        "tasks.num_tasks=6",
        "train.steps=1",
    )
    run_dir = train(cfg)
    [read] = [r for r in json.loads((run_dir / "data.json").read_text()) if r["source"] == source]
    assert read["rows"] == 6 and read["revision"] is None and len(read["fingerprint"]) > 8
