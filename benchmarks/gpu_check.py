"""GPU readiness check: the paper's policy architecture trained end to end on one CUDA GPU.

Builds a randomly initialised model with Qwen3-4B's architecture (its config.json fields as
``mappa.models.footprint`` ships them: no weights are needed or fetched) and a byte-level
tokenizer padded to its vocabulary, then trains three MathChat agents (one LoRA adapter
each) on the built-in arithmetic tasks with the hf engine: bf16 on CUDA, the coach the
policy base itself (in process: no server). It runs ``--steps`` steps with a checkpoint
after each, then resumes from the last checkpoint for one more step and checks that every
agent's Adam state came back (its step count continues instead of restarting). It prints
and writes to ``--out`` (JSON): peak GPU memory, rollout and update tokens/s, and the
update's model FLOP utilisation.

Without CUDA it runs the same path on the CPU with a tiny model of the same family, in
float32 (``make gpu-check`` in CI), so it cannot rot.

The rollout engine (``--engine``) is the paper's, vLLM, wherever vLLM is importable (the
CUDA build on a GPU: ``pip install 'mappa-rl[vllm]'``; the CPU build in ``.venv-vllm``),
and the hf engine otherwise: the check then also starts vLLM, syncs every adapter into it
after each update and passes the sync probe. vLLM and its dependencies are not on the bare
PyTorch image's list, so with vLLM the import audit reports but does not fail.

On a GPU machine with no package index, the packages mappa needs beyond PyTorch's usual
image travel as wheels (``CARRIED``; ``make gpu-wheels`` downloads them into ``.whl``)::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:src python3 benchmarks/gpu_check.py --out gpu_check.json

Every run ends by checking that each distribution it imported is on the image's list
(``benchmarks/data/gpu_image_packages.txt``) or in ``CARRIED``: an import that is in
neither fails the check here, not on the GPU.

Model FLOPs of the update: ``params x trained tokens x (4 + 2 per extra forward pass)``:
the policy's forward and backward (the base weights are frozen, so the backward computes
activation gradients only: 2 x params per token beside the forward's 2), plus one forward
each for the recomputed old log-probs and the KL reference when the run makes them.
Attention's quadratic term is left out (a few per cent at these lengths). Peak: the GPU's
dense bf16 figure from ``PEAK_TFLOPS``, or ``--peak-tflops``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
import tomllib
from collections import defaultdict
from importlib import metadata
from pathlib import Path
from typing import Any

from mappa.models.footprint import PUBLISHED_CONFIGS

QWEN3_4B: dict[str, Any] = PUBLISHED_CONFIGS["Qwen/Qwen3-4B"]
"""Qwen3-4B's architecture (its published config.json), the paper's policy."""

TINY: dict[str, Any] = {
    **QWEN3_4B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1024,
}
"""The same family at toy size, for the CPU run."""

TINY_VLLM: dict[str, Any] = {**TINY, "head_dim": 32}
"""The toy model for the CPU build of vLLM, whose attention has no kernel for 16-wide heads."""

PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "H800": 989.4, "A100": 312.0, "L40S": 362.0}
"""Dense bf16 tensor-core peak by GPU name (the vendors' data sheets, SXM parts)."""

CARRIED = {
    "pydantic": "2.14.4",
    "pydantic-core": "2.50.5",
    "annotated-types": "0.8.0",
    "typing-inspection": "0.4.5",
    "typing-extensions": "4.16.0",
    "math-verify": "0.9.0",
    "latex2sympy2-extended": "1.11.0",
    "antlr4-python3-runtime": "4.13.2",
}
"""What the check needs beyond the GPU image, carried as wheels: mappa's dependencies the
image lacks (pydantic and its own; math-verify, which the grader imports for any answer
that is not a plain number) and typing-extensions, newer than pydantic may find there.
pydantic-core is the one compiled wheel (cp312, manylinux). ``make gpu-wheels`` downloads
exactly these into ``.whl``."""

IMAGE_LIST = Path(__file__).parent / "data" / "gpu_image_packages.txt"


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _requirements(requires: list[str]) -> set[str]:
    """Distribution names of requirement strings, extras' ones left out."""
    return {_norm(re.split(r"[ ;<>=!~\[(]", r.strip())[0]) for r in requires if "extra ==" not in r}


def import_audit() -> dict[str, list[str]]:
    """``unlisted``: distributions this process imported that mappa needs (its dependencies,
    and theirs through carried wheels: the image's own packages bring their own) but that
    are neither on the GPU image's list nor carried. Imports a package makes only because
    something happens to be installed here are not needs and are not counted.
    ``carried_unused``: carried wheels this run did not import."""
    image = {_norm(n) for line in IMAGE_LIST.read_text().splitlines() if not line.startswith("#")
             for n in line.split()}  # fmt: skip
    carried = {_norm(n) for n in CARRIED}
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    todo, needed = _requirements(pyproject["project"]["dependencies"]), set()
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            if name in carried:
                todo |= _requirements(metadata.requires(name) or [])
    owners = metadata.packages_distributions()
    top = {m.split(".")[0] for m in list(sys.modules)} - set(sys.stdlib_module_names)
    imported = {_norm(d) for m in top for d in owners.get(m, [])}
    return {
        "unlisted": sorted((needed & imported) - image - carried),
        "carried_unused": sorted(carried - imported),
    }


def build_model(directory: Path, arch: dict[str, Any], device: str, dtype: str) -> int:
    """Write a random model with ``arch`` and a byte-level BPE tokenizer padded to its
    vocabulary to ``directory``; returns the parameter count (tied embeddings once)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    # Digits one by one, as Qwen's tokenizer splits them (the coach reads a single digit).
    split = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False)]
    )
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = split
    corpus = [
        "Ava has 12 apples and buys 3 boxes of 4 apples. How many apples does she have?",
        "The Problem Solver wrote: 12 + 3 * 4 = 24. The code printed 24. \\boxed{24}",
        "```python\nprint(12 + 3 * 4)\n```",
    ]
    trained.train_from_iterator(
        corpus * 20,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    vocab = trained.get_vocab()
    merges = json.loads(trained.to_str())["model"]["merges"]
    # Ids up to the model's vocabulary decode to filler text: the random model samples all.
    vocab |= {f"<x{i}>": i for i in range(len(vocab), arch["vocab_size"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in merges]))
    tok.pre_tokenizer = split
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    config = Qwen3Config(
        **arch,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(directory)
    fast.save_pretrained(directory)
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


def _step_tokens(run_dir: Path) -> dict[int, int]:
    """Per step, the prompt and completion tokens of every action (what the update trains)."""
    from mappa.records import read_episodes

    out: dict[int, int] = defaultdict(int)
    for ep in read_episodes(run_dir / "episodes.jsonl"):
        out[ep.step] += sum(len(a.prompt_ids) + len(a.completion_ids) for a in ep.actions)
    return dict(out)


def _adam_steps(run_dir: Path) -> dict[str, float]:
    """Per agent, the Adam step count in the newest checkpoint (the first param's)."""
    import torch

    from mappa.run.checkpoint import latest_checkpoint

    newest = latest_checkpoint(run_dir)
    assert newest is not None, f"{run_dir}: no checkpoint"
    saved = torch.load(newest / "state.pt", weights_only=True)
    return {
        agent: float(next(iter(opt["state"].values()))["step"])
        for agent, opt in saved["optimizers"].items()
    }


def rollout_engine(asked: str) -> str:
    """``--engine``: ``auto`` is vLLM (the paper's engine) where it is importable, else hf."""
    if asked != "auto":
        return asked
    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_check.json"))
    ap.add_argument("--steps", type=int, default=2, help="steps before the resume")
    ap.add_argument("--prompts", type=int, default=None, help="prompts a step")
    ap.add_argument("--samples", type=int, default=4, help="samples a prompt")
    ap.add_argument("--new-tokens", type=int, default=None, help="rollout.max_new_tokens")
    ap.add_argument("--tiny", action="store_true", help="the toy model even on a GPU")
    ap.add_argument("--peak-tflops", type=float, default=None, help="for the MFU")
    ap.add_argument("--keep", type=Path, default=None, help="keep the model and run here")
    ap.add_argument("--wheels", action="store_true", help="print the carried pins and exit")
    ap.add_argument(
        "--engine", choices=["auto", "hf", "vllm"], default="auto", help="rollout.engine"
    )
    args = ap.parse_args(argv)
    if args.wheels:
        print(" ".join(f"{name}=={version}" for name, version in CARRIED.items()))
        return 0

    import torch

    t_start = time.monotonic()
    cuda = torch.cuda.is_available()
    gpu = cuda and not args.tiny
    engine = rollout_engine(args.engine)
    arch, dtype = (QWEN3_4B, "bfloat16") if gpu else (TINY, "float32")
    if engine == "vllm" and not gpu:
        arch = TINY_VLLM
    prompts = args.prompts or (4 if gpu else 2)
    new_tokens = args.new_tokens or (256 if gpu else 12)
    # The agents here are random weights that write no code; the image has no bubblewrap.
    os.environ.setdefault("MAPPA_ALLOW_UNISOLATED", "1")

    from mappa.cli import default_config
    from mappa.config import load_config
    from mappa.rl.experience import needs_old_pass
    from mappa.run.loop import train

    work = args.keep or Path(tempfile.mkdtemp(prefix="mappa-gpu-check-"))
    model_dir, run_dir = work / "model", work / "run"
    t0 = time.monotonic()
    params = build_model(model_dir, arch, "cuda" if gpu else "cpu", dtype)
    build_s = time.monotonic() - t0
    print(f"model: Qwen3 {params / 1e9:.3f}B params, random, {dtype}; built in {build_s:.0f} s")

    def config(steps: int) -> Any:
        return load_config(
            default_config(),
            [
                f"model.path={model_dir}",
                f"model.dtype={dtype}",
                f"run_dir={run_dir}",
                f"rollout.max_new_tokens={new_tokens}",
                "rollout.max_prompt_tokens=4096",
                f"rollout.batch_size={prompts * args.samples}",
                f"train.steps={steps}",
                f"train.prompts_per_step={prompts}",
                f"train.samples_per_prompt={args.samples}",
                "train.save_every=1",
                "train.tensorboard=false",
                "tasks.num_tasks=64",
                "eval.every=0",
                "coach.cache.mode=off",
                "coach.local.min_digit_mass=0",  # a random coach puts no mass on digits
                "rl.min_reward_spread=0",
                "rl.mask_truncated=false",  # random replies all run to the limit
                f"rollout.engine={engine}",
                *([] if gpu or engine == "hf" else ["rollout.vllm.kv_cache_gib=0.25"]),
            ],
        )

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    train(config(args.steps))
    before = _adam_steps(run_dir)
    train(config(args.steps + 1), resume=run_dir)
    after = _adam_steps(run_dir)
    train_s = time.monotonic() - t0
    resumed = all(after[a] == before[a] * (args.steps + 1) / args.steps for a in before)

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    tokens = _step_tokens(run_dir)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    cfg = config(args.steps + 1)
    several = cfg.rl.mini_batch_size is not None  # at most: the pass when an agent steps twice
    recomputed = needs_old_pass(cfg.rl, cfg.rl.kl_beta, several)
    passes = 4 + 2 * recomputed + 2 * (cfg.rl.kl_beta > 0)
    steps = []
    for row in rows:
        trained = tokens.get(row["step"], 0)
        flops = params * trained * passes
        steps.append(
            {
                "step": row["step"],
                "rollout_s": row["rollout_s"],
                "rollout_tokens_per_s": row["rollout_tokens_per_s"],
                "coach_s": row["coach_s"],
                "update_s": row["update_s"],
                "update_tokens": trained,
                "update_tokens_per_s": trained / row["update_s"],
                "update_tflops_per_s": flops / row["update_s"] / 1e12,
                "update_mfu": flops / row["update_s"] / (peak * 1e12) if peak else None,
            }
        )
    last = steps[1:] or steps  # step 0 pays for warm-up

    def mean(key: str) -> float | None:
        values = [s[key] for s in last if s[key] is not None]
        return sum(values) / len(values) if values else None

    audit = import_audit()
    unlisted = audit["unlisted"]
    result = {
        "device": name,
        "torch": torch.__version__,
        "transformers": metadata.version("transformers"),
        "peft": metadata.version("peft"),
        "model": f"Qwen3 {'4B architecture' if arch is QWEN3_4B else 'tiny'}, random init",
        "engine": engine,
        "params": params,
        "dtype": dtype,
        "episodes_per_step": prompts * args.samples,
        "max_new_tokens": new_tokens,
        "steps": steps,
        "peak_gpu_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "rollout_tokens_per_s": mean("rollout_tokens_per_s"),
        "update_tokens_per_s": mean("update_tokens_per_s"),
        "update_mfu": mean("update_mfu"),
        "peak_tflops": peak,
        "update_flops_per_param_token": passes,
        "adam_steps_before_resume": before,
        "adam_steps_after_resume": after,
        "resume_ok": resumed,
        "unlisted_imports": unlisted,
        "carried_unused": audit["carried_unused"],
        "build_s": build_s,
        "train_s": train_s,
        "wall_s": time.monotonic() - t_start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"\n{name}, torch {torch.__version__}, {result['model']} ({params / 1e9:.2f}B), "
        f"{dtype}, {engine} engine"
    )
    print(f"{'step':>4}{'rollout s':>11}{'gen tok/s':>11}{'coach s':>9}{'update s':>10}"
          f"{'upd tok/s':>11}{'TFLOP/s':>9}{'MFU':>7}")  # fmt: skip
    for s in steps:
        mfu = "-" if s["update_mfu"] is None else f"{s['update_mfu']:.1%}"
        print(
            f"{s['step']:>4}{s['rollout_s']:>11.1f}{s['rollout_tokens_per_s']:>11.1f}"
            f"{s['coach_s']:>9.1f}{s['update_s']:>10.1f}{s['update_tokens_per_s']:>11.0f}"
            f"{s['update_tflops_per_s']:>9.2f}{mfu:>7}"
        )
    if cuda:
        print(f"peak GPU memory {result['peak_gpu_mem_gib']:.1f} GiB")
    print(f"resume: Adam steps {before} -> {after}: {'ok' if resumed else 'NOT restored'}")
    print(f"wall {result['wall_s']:.0f} s; written: {args.out}")
    if unlisted:
        print(f"imports neither on the GPU image's list nor carried: {unlisted}")
    return 0 if resumed and (engine == "vllm" or not unlisted) else 1


if __name__ == "__main__":
    raise SystemExit(main())
