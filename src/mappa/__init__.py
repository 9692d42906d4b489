"""mappa: finetune multi-agent LLM systems with per-action process rewards from an AI coach.

The method is MAPPA (arXiv 2601.23228); see docs/design.md and docs/architecture.md for
how the parts fit. Heavy dependencies (torch, transformers) are imported lazily by the
modules that need them, so that ``mappa.config`` and the CLI's argument checking stay fast
and model-free.
"""

__version__ = "0.1.0"
