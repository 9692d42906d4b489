"""Config validation: typos and wrong types fail early, naming the file and the key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mappa.cli import default_config
from mappa.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]


def test_shipped_configs_validate() -> None:
    demo = load_config(default_config())
    assert [a.name for a in demo.agents] == ["problem_solver", "code_executor", "verifier"]
    paper = load_config(REPO / "configs" / "mathchat_paper.yaml")
    assert paper.model.path == "Qwen/Qwen3-4B"
    assert (paper.train.prompts_per_step, paper.train.samples_per_prompt) == (32, 2)
    assert (paper.rollout.max_prompt_tokens, paper.rollout.max_new_tokens) == (24576, 4096)
    assert paper.rl.lr == 2e-5  # a LoRA rate; the paper's 1e-6 is for full finetuning


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_misspelled_key_names_key_and_file(tmp_path: Path) -> None:
    base = default_config().read_text()
    path = _write(tmp_path, base.replace("kl_beta:", "kl_betta:"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "rl.kl_betta: unknown key" in str(err.value)
    assert str(path) in str(err.value)


def test_wrong_type_is_reported(tmp_path: Path) -> None:
    path = _write(tmp_path, default_config().read_text().replace("steps: 3", "steps: three"))
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
        load_config(_write(tmp_path, text))


def test_agent_named_like_a_peft_module_is_a_config_error() -> None:
    """Each agent's LoRA adapter is named after it: PEFT's own names are refused up front."""
    for name in ["model", "base_model", "default", "weight", "lora_dropout"]:
        with pytest.raises(ConfigError, match=rf"agents\.2\.name: .*rename agent '{name}'"):
            load_config(default_config(), [f"agents.verifier.name={name}"])
    assert load_config(default_config(), ["agents.verifier.name=model_checker"])


def test_overrides_are_typed_and_validated() -> None:
    cfg = load_config(default_config(), ["rl.lr=3e-5", "agents.1.max_actions=3", "seed=7"])
    assert cfg.rl.lr == 3e-5 and cfg.agents[1].max_actions == 3 and cfg.seed == 7
    with pytest.raises(ConfigError, match=r"rl\.nope: unknown key"):
        load_config(default_config(), ["rl.nope=1"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(default_config(), ["rl.lr"])


def test_cli_bad_config_exits_nonzero_without_loading_a_model(tmp_path: Path) -> None:
    text = default_config().read_text()
    path = _write(
        tmp_path, text.replace("  code_executor:\n", "  code_executor:\n    max_actionz: 2\n")
    )
    code = (
        "import sys\n"
        "from mappa.cli import main\n"
        f"rc = main(['train', '--config', {str(path)!r}])\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "agents.1.max_actionz: unknown key" in proc.stderr
    assert str(path) in proc.stderr
    assert "HEAVY []" in proc.stdout


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/run.yaml")


def test_preset_supplies_the_pipeline_and_a_config_overrides_only_what_differs(
    tmp_path: Path,
) -> None:
    bare = load_config(_write(tmp_path, "workflow: {preset: dsbench}\n"))
    assert [a.name for a in bare.agents] == ["data_engineer", "modeler", "analyst"]
    assert bare.coach.template == "dsbench" and bare.agents[0].produces
    assert "Fix any error" in bare.workflow.tool_turn_template
    paper = load_config(REPO / "configs" / "mathchat_paper.yaml")
    assert load_config(_write(tmp_path, "{}")).agents == paper.agents  # mathchat by default

    changed = load_config(
        _write(tmp_path, "agents: {modeler: {max_actions: 4}}\nworkflow: {preset: dsbench}\n"),
        ["agents.analyst.run_code=false", "coach.template=mathchat"],
    )
    assert [a.max_actions for a in changed.agents] == [2, 4, 2]
    assert [a.run_code for a in changed.agents] == [True, True, False]
    assert changed.agents[1].role == bare.agents[1].role and changed.coach.template == "mathchat"


def test_preset_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\['modeller'\] not in the preset's agents"):
        load_config(_write(tmp_path, "workflow: {preset: dsbench}\nagents: {modeller: {}}\n"))
    with pytest.raises(ConfigError, match=r"no such preset \['dsbench', 'mathchat'\]"):
        load_config(_write(tmp_path, "workflow: {preset: mathchatt}\n"))
    with pytest.raises(ConfigError, match=r"agents: Field required"):
        load_config(_write(tmp_path, "workflow: {preset: null}\n"))
    with pytest.raises(ConfigError, match=r"no list index or name 'nobody'"):
        load_config(default_config(), ["agents.nobody.max_actions=2"])


def test_agents_and_coach_see_separate_tool_output_budgets() -> None:
    cfg = load_config(default_config(), ["workflow.observation_chars=300"])
    assert (cfg.workflow.observation_chars, cfg.coach.observation_chars) == (300, 2000)
