"""The training loop on Ray (``cluster:`` in a run config; docs/scaling.md).

The driver (``mappa.run.loop``) runs the same loop as in one process; only where the models
live changes. ``launch`` starts the actors a config's layout asks for and returns driver-side
objects behind the interfaces the loop already uses: a ``TrainablePolicy`` whose log-probs
are computed on each agent's trainer actor (so ``mappa.rl.experience.make_experience`` runs
unchanged in the driver, over the whole batch), a ``RolloutEngine`` over the engine
actor(s), optimizers a checkpoint can save, and a coach backend. ``remote_update`` runs
each agent's optimizer step on its trainer actor, in parallel.

Nothing here is imported unless a config has a ``cluster`` section: Ray is an optional
extra (``pip install 'mappa-rl[ray]'``). ``errors`` alone imports no Ray, so the loop can
catch ``WorkerLost`` without it.
"""

from mappa.run.models import WorkerLost

__all__ = ["WorkerLost"]
