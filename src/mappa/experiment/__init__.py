"""Experiments: arms x seeds of ordinary runs compared on one held-out set
(``mappa experiment CONFIG``; docs/experiments.md).

``spec`` reads the experiment file and resolves every run's config, ``runner`` runs them in
child processes and resumes, ``results`` computes the table (pure), ``markdown`` and
``plot`` write it out.
"""

from mappa.experiment.spec import ExperimentError

__all__ = ["ExperimentError"]
