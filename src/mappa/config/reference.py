"""``docs/config.md``, generated from the schema's field descriptions."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from mappa.config.schema import AgentConfig, RunConfig


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(annotation))
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return (
        str(annotation)
        .replace("typing.", "")
        .replace("pathlib.", "")
        .replace("mappa.config.schema.", "")
    )


def reference_markdown() -> str:
    """``docs/config.md``: every key of a run config with its type, default and description,
    generated from the schema's fields (``make docs`` writes it; a test fails when it is stale)."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from src/mappa/config/schema.py by `make docs`; do not edit by hand. -->",
        "",
        "A run is one YAML file (`mappa train --config F key.path=value ...`). Unknown keys "
        "and wrong types are errors naming the file and the key (or the override that set it); "
        "an unknown key comes with the closest valid one. Sections below are the "
        "top-level keys; nested sections are written `a.b`.",
        "",
    ]

    def section(model: type[BaseModel], prefix: str) -> None:
        doc = " ".join((model.__doc__ or "").split())
        lines.extend([f"## `{prefix or 'top level'}`", "", doc, ""])
        lines.extend(["| key | type | default | description |", "|---|---|---|---|"])
        nested: list[tuple[type[BaseModel], str]] = []
        for name, field in model.model_fields.items():
            annotation = field.annotation
            path = f"{prefix}.{name}" if prefix else name
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                nested.append((annotation, path))
                continue
            if annotation == list[AgentConfig]:
                nested.append((AgentConfig, f"{path}[]"))
            if isinstance(annotation, types.UnionType):  # an optional section: a row, then its keys
                nested.extend(
                    (a, path)
                    for a in typing.get_args(annotation)
                    if isinstance(a, type) and issubclass(a, BaseModel)
                )
            if field.is_required():
                default = "required"
            elif field.default_factory is not None:
                default = f"`{field.default_factory()!r}`"  # type: ignore[call-arg]  # no-arg factories only
            else:
                default = (
                    f"`{field.default!r}`"
                    if not isinstance(field.default, Path)
                    else (f"`'{field.default}'`")
                )
            cells = [f"`{name}`", _type_name(annotation), default, field.description or ""]
            lines.append(
                "| " + " | ".join(" ".join(c.split()).replace("|", "\\|") for c in cells) + " |"
            )
        lines.append("")
        for model_type, path in nested:
            section(model_type, path)

    section(RunConfig, "")
    return "\n".join(lines)
