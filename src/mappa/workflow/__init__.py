"""Agents, prompt rendering and the workflow runner (the records they write: mappa.records)."""
