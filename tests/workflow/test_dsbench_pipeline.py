"""The DSBench team end to end through the real sandbox, with scripted (hand-written) agents.

``FakeScriptedPolicy`` stands in for the model above the sampling interface: it returns
fixed code per agent, so the test exercises the real runner, workspace sharing, sandbox,
submission scoring and failure blame without depending on what a small model writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes import FakeScriptedPolicy

from mappa.config import AgentConfig, load_config
from mappa.run.build import runner_for
from mappa.tasks import Task
from mappa.tasks.dsbench.report import dsbench_report
from mappa.tasks.dsbench.synthetic import generate
from mappa.workflow.chat import ChatFormat
from mappa.workflow.function import FunctionRunner
from mappa.workflow.interface import RolloutInput

REPO = Path(__file__).resolve().parents[2]

DATA_ENGINEER = """```python
import pandas as pd
train = pd.read_csv("train.csv"); test = pd.read_csv("test.csv")
y = train.pop("target")
X = pd.get_dummies(train.drop(columns=["id"]), dummy_na=True).astype(float)
Xt = pd.get_dummies(test.drop(columns=["id"]), dummy_na=True).astype(float)
Xt = Xt.reindex(columns=X.columns, fill_value=0.0)
X, Xt = X.fillna(X.median()), Xt.fillna(X.median())
X.to_pickle("X_train.pkl"); y.to_pickle("y_train.pkl"){save_test}
print("rows", len(X), "features", X.shape[1])
```"""
MODELER = """```python
import pickle, pandas as pd
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
from sklearn.model_selection import cross_val_score
X, y = pd.read_pickle("X_train.pkl"), pd.read_pickle("y_train.pkl")
is_clf = y.dtype == object or y.nunique() <= 10
Forest = RandomForestClassifier if is_clf else RandomForestRegressor
model = Forest(n_estimators=40, random_state=0)
print("cv", round(cross_val_score(model, X, y, cv=3).mean(), 3))
pickle.dump(model.fit(X, y), open("model.pkl", "wb"))
```"""
ANALYST = """```python
import pickle, pandas as pd
model = pickle.load(open("model.pkl", "rb"))
test = pd.read_csv("test.csv")
pred = model.predict(pd.read_pickle("X_test.pkl"))
pd.DataFrame({"id": test["id"], "target": pred}).to_csv("submission.csv", index=False)
print("wrote", len(test))
```"""


def _team(saves_test: bool, analyst: list[str] | None = None) -> dict[str, list[str]]:
    """The scripted team; a Data Engineer that does not save X_test.pkl breaks the run."""
    save_test = '; Xt.to_pickle("X_test.pkl")' if saves_test else ""
    return {
        "data_engineer": [DATA_ENGINEER.format(save_test=save_test), "Done."],
        "modeler": [MODELER, "Done."],
        "analyst": analyst or [ANALYST, "Done."],
    }


def _runner(
    tmp_path: Path, tokenizer: Any, saves_test: bool, analyst: list[str] | None = None
) -> tuple[FunctionRunner, list[AgentConfig]]:
    cfg = load_config(
        REPO / "configs" / "dsbench_cpu.yaml",
        ["sandbox.timeout_s=60", "rollout.max_prompt_tokens=100000"],
    )
    chat = ChatFormat(tokenizer)
    policy = FakeScriptedPolicy(
        chat.encode, _team(saves_test, analyst), [tokenizer.eos_token_id], logprob=-0.1
    )
    return runner_for(cfg, policy, chat, tmp_path / "ws"), cfg.agents


def _tasks(tmp_path: Path) -> list[Task]:
    return [Task.from_dsbench(t) for t in generate(tmp_path / "tasks", per_kind=3, seed=2)]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_scripted_good_team_solves_every_generated_task(tmp_path: Path, tokenizer: Any) -> None:
    runner, agents = _runner(tmp_path, tokenizer, saves_test=True)
    tasks = _tasks(tmp_path)
    episodes = runner.run(RolloutInput(tasks)).episodes
    for ep in episodes:
        assert ep.correct, (
            ep.task_id,
            ep.coach_reference,
            [a.tool_observation for a in ep.actions],
        )
        assert ep.metrics["success"] == 1.0 and not any(ep.missing_artifacts.values())
        modeler = ep.agent_actions("modeler")[0]
        assert "X_train.pkl" in modeler.prompt_text and "data_engineer" in modeler.prompt_text
    report = dsbench_report(episodes, agents)
    assert report["success_rate"] == 1.0 and report["failed_runs_broken_by"] == {}
    assert report["classification/runs"] == 6 and report["regression/runs"] == 3
    assert report["classification/successful/accuracy"] > 0.6
    assert report["regression/successful/rmse_pct_range"] < 30


def test_forgetful_data_engineer_is_blamed(tmp_path: Path, tokenizer: Any) -> None:
    runner, agents = _runner(tmp_path, tokenizer, saves_test=False)
    episodes = runner.run(RolloutInput(_tasks(tmp_path)[:2])).episodes
    for ep in episodes:
        assert not ep.correct and ep.missing_artifacts["data_engineer"] == ["X_test.pkl"]
        analyst = ep.agent_actions("analyst")[0]
        assert "X_test.pkl" in analyst.prompt_text and "missing" in analyst.prompt_text.lower()
        assert "FileNotFoundError" in (analyst.tool_observation or "")
        assert analyst.tool_status == "error"  # from the sandbox's result, not the text
    report = dsbench_report(episodes, agents)
    assert report["success_rate"] == 0.0
    assert report["failed_runs_broken_by"] == {"data_engineer": 2}
    assert report["classification/fair_accuracy"] == 0.5


def test_heldout_eval_reports_dsbench_metrics(tmp_path: Path, tokenizer: Any) -> None:
    from mappa.run.evaluation import run_heldout

    cfg = load_config(REPO / "configs" / "dsbench_cpu.yaml", ["sandbox.timeout_s=60"])
    runner, _ = _runner(tmp_path, tokenizer, saves_test=False)
    metrics, _, _ = run_heldout(cfg, runner, _tasks(tmp_path)[:1])
    assert metrics["dsbench"]["success_rate"] == 0.0
    assert metrics["dsbench"]["failed_runs_broken_by"] == {"data_engineer": 1}


def test_each_analyst_turn_is_judged_on_the_submission_as_it_stood(
    tmp_path: Path, tokenizer: Any
) -> None:
    """An early turn that wrote nothing is not credited with a later turn's submission."""
    from mappa.coach import build_context

    look = "```python\nimport os\nprint(sorted(os.listdir('.')))\n```"
    runner, agents = _runner(tmp_path, tokenizer, saves_test=True, analyst=[look, ANALYST])
    [episode] = runner.run(RolloutInput(_tasks(tmp_path)[:1])).episodes
    first, second = episode.agent_actions("analyst")
    roles = {a.name: a.role for a in agents}
    early = build_context(episode, first, roles, "analyst").ground_truth or ""
    late = build_context(episode, second, roles, "analyst").ground_truth or ""
    assert episode.correct and "no valid submission" in early, early
    assert late == episode.coach_reference and "no valid submission" not in late, late
