"""Agents, prompt rendering and the pipeline runner; Episode/Action records."""

from mappa.workflow.records import Action, Episode, Score

__all__ = ["Action", "Episode", "Score"]
