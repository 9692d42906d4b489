"""Agents, prompt rendering and the pipeline runner (the records they write: mappa.records)."""
