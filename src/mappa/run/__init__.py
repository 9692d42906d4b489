"""The application layer: how a run is assembled, run, saved and resumed.

``preflight`` checks a config before anything loads; ``build`` turns it into live objects
and the ``RunModels`` the loop uses (``models``: the ports ``mappa.cluster`` implements with
Ray actors); ``loop`` is the training loop; ``checkpoint`` saves and resumes it;
``metrics`` computes a step's metrics and ``tensorboard`` writes them as scalars;
``evaluation`` runs held-out sets. Nothing here imports ``mappa.report``, which only reads
the run directories this layer writes. Submodules are imported by name: this package
imports none of them, so a check does not pull in torch.
"""
