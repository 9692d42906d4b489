"""Execution of agents' code: a subprocess per code block inside a per-episode workspace."""

from mappa.sandbox.execute import ExecutionResult, Limits, execute, extract_code_blocks

__all__ = ["ExecutionResult", "Limits", "execute", "extract_code_blocks"]
