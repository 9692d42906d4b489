"""Random states that travel: torch's (saved in a checkpoint, carried to and from Ray engine
actors) and Python's after a round trip through a file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def torch_rng_state() -> dict[str, Any]:
    """This process's torch RNG states: CPU, and every GPU's where there are any."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda}


def set_torch_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what ``torch_rng_state`` returned (GPU states only where there are GPUs)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def as_tuples(x: Any) -> Any:
    """``random.setstate`` wants tuples; a round trip through a checkpoint may give lists.

    >>> as_tuples([3, [1, 2], None])
    (3, (1, 2), None)
    """
    return tuple(as_tuples(v) for v in x) if isinstance(x, list | tuple) else x
