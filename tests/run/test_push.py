"""``mappa push``: a trained run's repository, built and checked up to the upload call (the
Hub itself is out of reach here: the upload goes to a fake API that records what it got)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_run_config

from mappa.cli import main
from mappa.config import load_config
from mappa.run.push import push, stage, team_card

pytestmark = pytest.mark.filterwarnings("ignore")

AGENTS = ["problem_solver", "code_executor", "verifier"]


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-step tiny run, evaluated before and after."""
    from mappa.run.loop import train

    root = tmp_path_factory.mktemp("push")
    args = ["train.steps=1", "eval.at_start=true", "eval.every=1", "eval.num_tasks=2"]
    return train(tiny_run_config(tiny_model_dir, root / "run", *args))


class FakeHubApi:
    """A fake ``HfApi``: records the calls and what the folder held at upload time."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.uploaded: dict[str, bytes] = {}

    def create_repo(self, repo_id: str, **kw: Any) -> str:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kw}))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, **kw: Any) -> None:
        self.calls.append(("upload_folder", kw))
        root = Path(kw["folder_path"])
        self.uploaded = {
            str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()
        }


@pytest.mark.integration
def test_the_staged_repository_loads_with_peft_and_its_cards_parse(
    run_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from huggingface_hub import ModelCard
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    files = stage(run_dir, "me/team", tmp_path / "out")
    assert sorted(map(str, files)) == sorted(
        ["README.md", "config.yaml"]
        + [
            f"{a}/{f}"
            for a in AGENTS
            for f in ("adapter_config.json", "adapter_model.safetensors", "README.md")
        ]
    )
    card = ModelCard.load(tmp_path / "out" / "README.md")
    assert card.data.library_name == "peft" and "mappa" in card.data.tags
    assert "Held-out accuracy: " in card.text and "untrained -> " in card.text
    assert 'subfolder="verifier"' in card.text
    assert "verifier" in ModelCard.load(tmp_path / "out" / "verifier" / "README.md").data.tags

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, tmp_path / "out", subfolder="verifier")
    want = load_file(run_dir / "adapters" / "verifier" / "adapter_model.safetensors")
    got = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(got) == len(want) > 0
    for key, value in want.items():
        (match,) = [v for k, v in got.items() if k.replace(".default", "") == key]
        assert match.equal(value)


def test_a_known_package_names_its_hub_model_in_the_cards(tmp_path: Path) -> None:
    from huggingface_hub import ModelCard

    cfg = load_config("configs/smoke.yaml", [f"run_dir={tmp_path}"])
    card = ModelCard(team_card(cfg, "me/team", tmp_path))
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "dequantized from a GGUF conversion" in card.text
    assert "No held-out evaluation was run." in card.text


@pytest.mark.integration
def test_push_creates_the_repository_and_uploads_every_file_in_one_commit(
    run_dir: Path, tmp_path: Path
) -> None:
    api = FakeHubApi()
    url = push(run_dir, "me/team", private=True, api=api)
    assert url == "https://huggingface.co/me/team"
    (create, kw0), (upload, kw1) = api.calls
    assert create == "create_repo" and kw0["private"] is True and kw0["exist_ok"] is True
    assert upload == "upload_folder" and kw1["repo_id"] == "me/team"
    staged = {str(f) for f in stage(run_dir, "me/team", tmp_path / "again")}
    assert set(api.uploaded) == staged


@pytest.mark.integration
def test_push_inputs_are_checked_in_one_line_each(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no stored login
    no_adapters = tmp_path / "half"
    shutil.copytree(run_dir, no_adapters, ignore=shutil.ignore_patterns("adapters"))
    cases = {
        (str(tmp_path / "nope"), "me/team"): "no such run directory",
        (str(tmp_path), "me/team"): "no config.yaml here",
        (str(run_dir), "team"): "not a Hub repository id",
        (str(run_dir), "me/te am"): "not a Hub repository id",
        (str(run_dir), "me/team"): "not logged in to the Hub: run `hf auth login` or set HF_TOKEN",
        (str(no_adapters), "me/team"): "push a run that has finished a step",
    }
    for (run, repo), message in cases.items():
        if "not logged in" not in message:
            monkeypatch.setenv("HF_TOKEN", "hf_fake_token_never_sent")
        else:
            monkeypatch.delenv("HF_TOKEN", raising=False)
        assert main(["push", run, "--repo", repo]) == 2, (run, repo)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err

    assert main(["push", str(run_dir), "--repo", "me/team", "--dry-run", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / "verifier" / "adapter_model.safetensors").is_file()

    monkeypatch.delenv("HF_TOKEN", raising=False)  # not a run, and not logged in: the run
    assert main(["push", str(tmp_path), "--repo", "me/team"]) == 2
    assert "no config.yaml here" in capsys.readouterr().err
    a_file = tmp_path / "d" / "README.md"
    assert main(["push", str(run_dir), "--repo", "me/team", "--dry-run", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert err == f"mappa: {a_file}: is a file; stage into a new or empty directory\n"
    staged = tmp_path / "d"  # an earlier staging's files would mix with this one's
    assert main(["push", str(run_dir), "--repo", "me/team", "--dry-run", str(staged)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"mappa: {staged}: not empty (its files would mix with the staged ones); stage into a "
        "new or empty directory\n"
    )
    under_a_file = a_file / "d"
    assert main(["push", str(run_dir), "--repo", "me/team", "--dry-run", str(under_a_file)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"mappa: {under_a_file}: cannot create it (Not a directory); stage into a new or empty "
        "directory\n"
    )


def test_a_hub_out_of_reach_or_a_failed_upload_is_one_line(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Logged in where the Hub's endpoint takes no connection (a real closed loopback
    port): one line naming the offline way (stage, then upload elsewhere), not a client
    traceback; an upload the Hub refuses is one line with its reason (exit 1)."""
    import socket

    from huggingface_hub import constants

    from mappa import hub
    from mappa.run.push import UploadFailed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token_never_sent")
    hub.hub_unreachable.cache_clear()
    try:
        assert main(["push", str(run_dir), "--repo", "me/team"]) == 2
    finally:
        hub.hub_unreachable.cache_clear()
    err = capsys.readouterr().err
    assert err.startswith("mappa: the Hub cannot be reached from here (127.0.0.1: ")
    assert err.count("\n") == 1 and "--dry-run DIR" in err

    class RefusingHubApi(FakeHubApi):
        """A fake ``HfApi`` whose upload fails as the client does, with a long message."""

        def upload_folder(self, **kw: Any) -> None:
            raise RuntimeError("403 Forbidden: you cannot write to me/team\nrequest id: x")

    with pytest.raises(UploadFailed) as failed:
        push(run_dir, "me/team", api=RefusingHubApi())
    assert str(failed.value) == "RuntimeError: 403 Forbidden: you cannot write to me/team"
