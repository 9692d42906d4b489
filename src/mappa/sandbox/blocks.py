"""Finding the code an agent asked to run in its message."""

from __future__ import annotations

import re

_CODE_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code_blocks(text: str) -> list[str]:
    """The ```python blocks of a message, in order (an unclosed last block counts, since
    generation often stops at the length limit inside one)."""
    return [m.group(1).strip("\n") for m in _CODE_BLOCK.finditer(text) if m.group(1).strip()]
