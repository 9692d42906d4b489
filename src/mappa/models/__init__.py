"""Base-model loading and the per-agent LoRA policies built on one shared base."""
