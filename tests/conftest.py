"""Shared fixtures. The tiny model is real (a Llama built from a config, random weights,
with a real BPE tokenizer trained here), so tests exercise the same loading, sampling and
training code as a run, in seconds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# Ray's switch for a local-only cluster: every node, the driver and the workers use 127.0.0.1
# (else Ray rewrites a loopback address to the machine's network address). Ray reads it when
# first imported, so it is set here, before any test module imports Ray (the cluster tests;
# tests/cluster/test_ray_run.py's two-node fixture checks it took effect).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

SMOKE_CONFIG = Path(__file__).resolve().parents[1] / "src" / "mappa" / "configs" / "smoke.yaml"
"""The tests' base run config: SmolLM2-135M MathChat, the golden run's source."""

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_CORPUS = [
    "Ava has 12 apples. Then they get 5 more apples. How many apples does Ava have now?",
    "```python\nprint(12 + 5)\n```",
    "The answer is \\boxed{17}.",
    "You are the Problem Solver. You are the Code Executor. You are the Verifier.",
    "Code output: 17. PROCESS_SCORE: 7 ANSWER_CORRECT: 1 0 1 2 3 4 5 6 7 8 9 10",
]


def build_tiny_model(directory: Path) -> Path:
    """Write a tiny random Llama and a trained byte-level BPE tokenizer to ``directory``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHATML
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def tiny_run_config(model_dir: Path, run_dir: Path, *overrides: str):  # -> RunConfig
    """The smoke config (configs/smoke.yaml), shrunk to the tiny model in float32: fast, and
    every completion trained on. Its random weights put little mass on the scores and spread
    them by thousandths of a point, so the coach's low-mass flag and the minimum reward spread
    are off: these runs test the machinery, not the coach."""
    from mappa.config import load_config

    return load_config(
        SMOKE_CONFIG,
        [
            f"model.path={model_dir}",
            "model.dtype=float32",  # the same numbers on every CPU (auto picks by instructions)
            f"run_dir={run_dir}",
            "rollout.max_new_tokens=12",
            "rollout.max_prompt_tokens=4096",
            "rl.mask_truncated=false",
            "rl.lr=0.01",
            "train.steps=2",
            "train.prompts_per_step=2",
            "train.samples_per_prompt=2",
            "tasks.num_tasks=8",
            "coach.cache.mode=off",
            "coach.local.min_digit_mass=0",
            "rl.min_reward_spread=0",
            *overrides,
        ],
    )


def process_backend():  # -> ProcessBackend
    """As root, a process backend that contains code needs an interpreter an unprivileged uid
    can read; this venv's may live under /root, so stdlib-only tests may use the system one."""
    import shutil
    import sys

    from mappa.sandbox import ProcessBackend
    from mappa.sandbox.identity import host_is_root

    for python in (sys.executable, shutil.which("python3", path="/usr/bin:/bin")):
        if python:
            backend = ProcessBackend(python)
            if not host_is_root() or backend.runs_as_sandbox_uid():
                return backend
    return ProcessBackend()


@pytest.fixture(params=["bwrap", "process"], scope="module")
def backend(request: pytest.FixtureRequest):  # -> LocalBackend
    """Each sandbox backend that can run here (bwrap is skipped with the reason if not)."""
    from mappa.sandbox import BwrapBackend, bwrap_problem

    if request.param == "bwrap":
        problem = bwrap_problem()
        if problem is not None:
            pytest.skip(f"bwrap backend unavailable here: {problem}")
        return BwrapBackend()
    return process_backend()


def write_yaml(tmp_path: Path, text: str) -> Path:
    """``text`` (dedented) as ``tmp_path/bad.yaml``: a config file a test feeds the loader."""
    import textwrap

    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def lora_policies(model_dir: Path):  # -> AgentPolicies
    """The tiny model with adapters ``solver`` and ``checker`` whose LoRA B is random (it
    starts at zero), so the adapters and their gradients matter. Seed 1: the three prompts of
    ``prompts_and_completions`` continue differently under greedy decoding (with seed 0 all
    repeat one token, and a test needs a stop token that only one row samples)."""
    from mappa.config import LoraConfig
    from mappa.models.loading import load_base
    from mappa.models.policies import AgentPolicies

    base, tok = load_base(str(model_dir), "float32", "cpu")
    return randomize_lora_b(AgentPolicies(base, tok, ["solver", "checker"], LoraConfig(), seed=1))


def randomize_lora_b(pol):  # (AgentPolicies) -> AgentPolicies
    """Every LoRA B matrix of ``pol`` drawn at random (seeded), in place."""
    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in pol.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return pol


def prompts_and_completions(vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """Three random prompts of different lengths and a completion for each (seeded)."""
    import torch

    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=gen).tolist()

    return [ids(9), ids(4), ids(12)], [ids(7), ids(1), ids(11)]


PAPER_TRAIN_ROWS = [
    # AIME 1983-2024 as its Hub repo ships it: one CSV, these columns, integer answers
    {"ID": "1983-1", "Year": 1983, "Problem Number": 1, "Answer": 60, "Part": None,
     "Question": "Let $x$, $y$ and $z$ all exceed $1$. Find $\\log_zw$."},
    {"ID": "2024-II-15", "Year": 2024, "Problem Number": 15, "Answer": 315, "Part": "II",
     "Question": "Find the number of rectangles."},
]  # fmt: skip
PAPER_EVAL_ROWS = [
    # AIME 2025 as its Hub repo ships it: one parquet file, an int64 answer, a list column
    {"problem_idx": 1, "problem": "Find the sum of all bases $b>9$.", "answer": 70,
     "problem_type": ["Number Theory"]},
]  # fmt: skip


def paper_data(folder: Path, eval_rows: list[dict] | None = None) -> list[str]:
    """Local copies of the paper configs' Hub datasets, in the files and columns those
    repos ship (the Hub is out of reach in tests), as the overrides that point a paper
    config at them; ``eval_rows`` replace the held-out rows."""
    import datasets

    aime, aime_2025 = folder / "AIME_1983_2024", folder / "aime_2025"
    aime.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(PAPER_TRAIN_ROWS).to_csv(aime / "AIME_Dataset_1983_2024.csv")
    parquet = aime_2025 / "data" / "train-00000-of-00001.parquet"
    datasets.Dataset.from_list(eval_rows or PAPER_EVAL_ROWS).to_parquet(parquet)
    return [f"tasks.source=hf:{aime}:train", f"eval.source=hf:{aime_2025}:train"]


def hub_cache_with(monkeypatch: pytest.MonkeyPatch, root: Path, repo: str, config: dict) -> None:
    """A Hugging Face cache at ``root`` holding ``repo``'s config.json, laid out as
    ``huggingface_hub`` writes it (refs/main naming a snapshot), made the cache this process
    reads: a Hub id that loads offline, where the Hub is out of reach (tests)."""
    from huggingface_hub import constants

    folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
