"""The config schema's rules: shipped configs validate; an unknown key, a wrong type, an
input field no agent provides or an agent name PEFT uses is an error naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SMOKE_CONFIG, write_yaml

from mappa.cli import default_config
from mappa.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


def test_shipped_configs_validate() -> None:
    demo = load_config(default_config())
    assert [a.name for a in demo.agents] == ["problem_solver", "code_executor", "verifier"]
    paper = load_config(REPO / "configs" / "mathchat_paper.yaml")
    assert paper.model.path == "Qwen/Qwen3-4B"
    assert (paper.train.prompts_per_step, paper.train.samples_per_prompt) == (32, 2)
    assert (paper.rollout.max_prompt_tokens, paper.rollout.max_new_tokens) == (24576, 4096)
    assert paper.rl.lr == 2e-5  # a LoRA rate; the paper's 1e-6 is for full finetuning


def test_misspelled_key_names_key_and_file(tmp_path: Path) -> None:
    base = SMOKE_CONFIG.read_text()
    path = write_yaml(tmp_path, base.replace("kl_beta:", "kl_betta:"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "rl.kl_betta: unknown key" in str(err.value)
    assert str(path) in str(err.value)


def test_wrong_type_is_reported(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, SMOKE_CONFIG.read_text().replace("steps: 3", "steps: three"))
    with pytest.raises(ConfigError, match=r"train\.steps"):
        load_config(path)


def test_template_field_must_exist_upstream(tmp_path: Path) -> None:
    text = (
        default_config()
        .read_text()
        .replace(
            'input_template: "Problem: {task}"',
            'input_template: "Problem: {task} {verifier_output}"',
        )
    )
    with pytest.raises(ConfigError, match=r"unknown field \{verifier_output\}"):
        load_config(write_yaml(tmp_path, text))


def test_agent_named_like_a_peft_module_is_a_config_error() -> None:
    """Each agent's LoRA adapter is named after it: PEFT's own names are refused up front."""
    for name in ["model", "base_model", "default", "weight", "lora_dropout"]:
        with pytest.raises(ConfigError, match=rf"agents\.{name}\.name: .*rename agent '{name}'"):
            load_config(default_config(), [f"agents.verifier.name={name}"])
    assert load_config(default_config(), ["agents.verifier.name=model_checker"])


def test_agents_and_coach_see_separate_tool_output_budgets() -> None:
    cfg = load_config(default_config(), ["workflow.observation_chars=300"])
    assert (cfg.workflow.observation_chars, cfg.coach.observation_chars) == (300, 2000)


def test_held_out_columns_default_to_the_training_ones(tmp_path: Path) -> None:
    """An ``eval`` column key not given takes the ``tasks`` one (two splits of one
    dataset); one given, even as null, is the held-out set's own; the saved config says
    what was read, so reloading it changes nothing."""
    from mappa.config import RunConfig
    from mappa.tasks import Columns

    gsm8k = ["tasks.answer_after='####'", "tasks.prompt_field=question"]
    same = load_config(default_config(), gsm8k)
    assert Columns.of(same.tasks, same.eval) == Columns(
        "question", None, True, "####", section="eval"
    )
    own = load_config(
        default_config(), [*gsm8k, "eval.answer_after=null", "eval.prompt_field=problem"]
    )
    assert (own.eval.prompt_field, own.eval.answer_after) == ("problem", None)
    assert (own.tasks.prompt_field, own.tasks.answer_after) == ("question", "####")
    for cfg in (same, own):
        assert RunConfig.model_validate(cfg.model_dump(mode="json")) == cfg
