"""Reading a config: typed key=value overrides, presets merged in, a bad file refused
without importing torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMOKE_CONFIG, write_yaml

from mappa.cli import default_config
from mappa.config import ConfigError, load_config
from mappa.config.loading import read_yaml

REPO = Path(__file__).resolve().parents[2]


def test_overrides_are_typed_and_validated() -> None:
    cfg = load_config(default_config(), ["rl.lr=3e-5", "agents.1.max_actions=3", "seed=7"])
    assert cfg.rl.lr == 3e-5 and cfg.agents[1].max_actions == 3 and cfg.seed == 7
    with pytest.raises(ConfigError, match=r"^override rl\.nope=1: unknown key"):
        load_config(default_config(), ["rl.nope=1"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(default_config(), ["rl.lr"])


@pytest.mark.parametrize(
    ("override", "near"),
    [
        ("rl.kl_betta=0.1", "rl.kl_beta"),  # a close name in its own section
        ("lr=1e-4", "rl.lr"),  # a key of another section, by its last name
        ("agents.verifier.max_actionz=2", "agents.verifier.max_actions"),  # an agent by name
    ],
)
def test_an_override_typo_names_the_override_and_the_closest_key(override: str, near: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(default_config(), [override])
    assert str(err.value) == f"override {override}: unknown key; did you mean {near}?"


@pytest.mark.parametrize(
    ("override", "near"),
    [
        ("trian.steps=1", "; did you mean train.steps?"),
        ("RL.lr=1", "; did you mean rl.lr?"),
        ("foo.bar=1", "; docs/config.md lists the keys"),
        # nothing close in the agent's own section: not the section's name, `agents`
        ("agents.verifier.foo=1", "; docs/config.md lists the keys"),
    ],
)
def test_an_unknown_section_an_override_made_names_the_override(override: str, near: str) -> None:
    """The unknown top-level key is the override's (it made ``trian``), not the file's; the
    key it likely means is the override's whole key."""
    with pytest.raises(ConfigError) as err:
        load_config(default_config(), [override])
    assert str(err.value) == f"override {override}: unknown key{near}"


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        (
            "workflow.preset=mathchatt",
            "'mathchatt' is no shipped preset ['dsbench', 'mathchat'] nor a file; did you mean "
            "'mathchat'?",
        ),
        ("workflow.preset=3", "must be a preset name or a file path, not 3"),
        ("workflow=3", "must be a mapping"),
    ],
)
def test_a_bad_preset_an_override_set_names_the_override(override: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(default_config(), [override])
    assert str(err.value) == f"override {override}: {problem}"


def test_an_override_of_a_section_another_override_replaced_is_still_refused() -> None:
    with pytest.raises(ConfigError, match=r"^override rl=5: a section, not a value; set its"):
        load_config(default_config(), ["rl.lr=1", "rl=5"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "train.report_to=[wandb,mlflw]",
            "override train.report_to=[wandb,mlflw]: train.report_to.1: 'mlflw' is not one of "
            "'wandb', 'mlflow', 'trackio'; did you mean 'mlflow'?",
        ),
        (
            "coach.backend=htp",
            "override coach.backend=htp: 'htp' is not one of 'local', 'http', 'rules'; did you "
            "mean 'http'?",
        ),
        (
            "tasks.source=hf:",
            "override tasks.source=hf:: YAML read {'hf': None} as a mapping, not text; quote "
            "the value, e.g. tasks.source='...'",
        ),
    ],
)
def test_a_bad_value_is_named_in_a_config_s_words(override: str, message: str) -> None:
    """A value outside a fixed set gets the closest one; a value YAML read as a mapping
    (an unquoted trailing colon) says to quote it; no pydantic wording."""
    with pytest.raises(ConfigError) as err:
        load_config(default_config(), [override])
    assert str(err.value) == message


def test_one_tracker_name_is_the_one_tracker_list() -> None:
    assert load_config(default_config(), ["train.report_to=wandb"]).train.report_to == ["wandb"]


@pytest.mark.parametrize(
    ("override", "error"),
    [
        (
            "agents.verfier.max_actions=2",
            "override 'agents.verfier.max_actions': no list index or name 'verfier'; did you "
            "mean 'verifier'?",
        ),
        (
            "agents.7.max_actions=2",
            "override 'agents.7.max_actions': no list index or name '7'; give an index below 3 "
            "or ['problem_solver', 'code_executor', 'verifier']",
        ),
        ("rl.lr.x=1", "override 'rl.lr.x': rl.lr is not a section"),
        ("rl.lr", "override 'rl.lr' is not of the form key=value"),
    ],
)
def test_an_override_that_cannot_apply_names_the_override_not_the_file(
    override: str, error: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(default_config(), [override])
    assert str(err.value) == error


def test_a_typo_in_the_file_names_the_file_and_the_closest_key(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "rl: {kl_betta: 0.1}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: rl.kl_betta: unknown key; did you mean rl.kl_beta?"


def test_a_bad_override_and_a_bad_file_key_are_each_named(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "rl: {kl_betta: 0.1}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["rl.lr=abc"])
    lines = str(err.value).splitlines()
    assert lines[0] == f"{path}: invalid configuration"
    assert sorted(line.split(":")[0].strip() for line in lines[1:]) == [
        "override rl.lr=abc",
        "rl.kl_betta",
    ]


def test_cli_bad_config_exits_nonzero_without_loading_a_model(tmp_path: Path) -> None:
    text = SMOKE_CONFIG.read_text()
    path = write_yaml(
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
    assert "agents.code_executor.max_actionz: unknown key" in proc.stderr  # by its name
    assert str(path) in proc.stderr
    assert "HEAVY []" in proc.stdout


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "agents:\n  - {nme: solver, role: Solves., input_template: 'Problem: {task}'}\n",
            "agents.0.nme: unknown key; did you mean agents.0.name?",  # not also name: missing
        ),
        (
            "eval: {samples: 4, temperature: 0}\n",
            "eval: samples > 1 needs temperature > 0 (greedy samples are identical)",
        ),
    ],
)
def test_one_problem_is_one_line_in_its_own_words(tmp_path: Path, text: str, problem: str) -> None:
    """A misspelt key is one problem, not also the key it meant missing; a validator's
    message comes without pydantic's "Value error, " before it."""
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {problem}"


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/run.yaml")


def test_a_yaml_syntax_error_is_one_line_with_line_and_column(tmp_path: Path) -> None:
    """PyYAML's own message spans lines (the source quoted under a caret)."""
    path = write_yaml(tmp_path, "rl:\n  lr: [1, 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: not valid YAML: line 3, column 1: expected ',' or ']', but got "
        "'<stream end>' (while parsing a flow sequence at line 2, column 7); fix the YAML syntax"
    )


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    """PyYAML keeps the last of two equal keys silently: the first setting would vanish."""
    path = write_yaml(tmp_path, "rl:\n  lr: 1.0e-5\n  kl_beta: 0.1\n  lr: 3.0e-5\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: line 4, column 3: 'lr' is given twice in one section (first at line 2, "
        "column 3); keep one (YAML would take the last without a word)"
    )
    # the same key in two sections, and a key a merge brought in, are not duplicates
    merged = "base: &b {lr: 1.0e-5, kl_beta: 0.1}\nrl:\n  <<: *b\n  lr: 3.0e-5\n"
    assert read_yaml(write_yaml(tmp_path, merged))["rl"] == {"lr": 3.0e-5, "kl_beta": 0.1}
    two = "rollout: {temperature: 0.6}\neval: {temperature: 0.6}\n"
    assert load_config(write_yaml(tmp_path, two)).eval.temperature == 0.6


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_an_empty_config_is_refused_not_run_as_the_defaults(tmp_path: Path, text: str) -> None:
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: the file is empty; write the keys that differ from the defaults "
        "(docs/config.md), or omit --config for the demo config"
    )


def test_preset_supplies_the_pipeline_and_a_config_overrides_only_what_differs(
    tmp_path: Path,
) -> None:
    bare = load_config(write_yaml(tmp_path, "workflow: {preset: dsbench}\n"))
    assert [a.name for a in bare.agents] == ["data_engineer", "modeler", "analyst"]
    assert bare.coach.template == "dsbench" and bare.agents[0].produces
    assert "Fix any error" in bare.workflow.tool_turn_template
    paper = load_config(REPO / "configs" / "mathchat_paper.yaml")
    assert load_config(write_yaml(tmp_path, "{}")).agents == paper.agents  # mathchat by default

    changed = load_config(
        write_yaml(tmp_path, "agents: {modeler: {max_actions: 4}}\nworkflow: {preset: dsbench}\n"),
        ["agents.analyst.run_code=false", "coach.template=mathchat"],
    )
    assert [a.max_actions for a in changed.agents] == [2, 4, 2]
    assert [a.run_code for a in changed.agents] == [True, True, False]
    assert changed.agents[1].role == bare.agents[1].role and changed.coach.template == "mathchat"


def test_preset_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\['modeller'\] not in the preset's agents"):
        load_config(write_yaml(tmp_path, "workflow: {preset: dsbench}\nagents: {modeller: {}}\n"))
    path = write_yaml(tmp_path, "workflow: {preset: mathchatt}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path}: workflow.preset: 'mathchatt' is no shipped preset ['dsbench', 'mathchat'] "
        "nor a file; did you mean 'mathchat'?"
    )
    with pytest.raises(ConfigError, match=r"agents: Field required"):
        load_config(write_yaml(tmp_path, "workflow: {preset: null}\n"))
    with pytest.raises(ConfigError, match=r"no list index or name 'nobody'"):
        load_config(default_config(), ["agents.nobody.max_actions=2"])


def test_a_workflow_module_and_coach_template_are_found_beside_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = tmp_path / "teams"
    team.mkdir()
    (team / "duo.py").write_text("async def solve(task, team):\n    return None\n")
    (tmp_path / "judge.yaml").write_text("system: s\nuser: u\n")
    config = write_yaml(
        tmp_path,
        """
        workflow: {function: teams/duo.py:solve}
        agents: [{name: solver, role: You solve.}]
        coach: {template: judge.yaml}
        """,
    )
    monkeypatch.chdir(REPO)  # another directory than the config's
    cfg = load_config(config)
    assert cfg.workflow.function == f"{team / 'duo.py'}:solve"
    assert cfg.coach.template == str(tmp_path / "judge.yaml")
    assert cfg.workflow.preset is None and [a.name for a in cfg.agents] == ["solver"]
    # a shipped template's name, a module on sys.path: left as they are
    cfg = load_config(config, ["workflow.function=json:loads", "coach.template=mathchat"])
    assert (cfg.workflow.function, cfg.coach.template) == ("json:loads", "mathchat")
