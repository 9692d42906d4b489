"""Where the run's actors go: each role's GPUs (derived when the config leaves them unset)
and the placement group that puts each agent's trainer beside its engine.

Ray places fractional-GPU actors wherever a fraction is free, so two trainers at
``num_gpus: 0.5`` may pack onto one card while their engines pack onto another; the update
and the rollout then fight over the wrong card. A placement group with one bundle per
trainer-and-engine pair (``trainers`` and ``engines`` both ``per_agent``, or both ``one``)
reserves a card's worth of resources for the pair, and both actors are scheduled into that
bundle, so they share the card the bundle holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mappa.config import ActorResources, ClusterConfig


def default_gpus(cluster: ClusterConfig, role: str, *, gpus: bool, local_coach: bool) -> float:
    """The GPUs an actor of ``role`` (``trainer``, ``engine``, ``coach``) asks for when its
    ``num_gpus`` is unset: none without GPUs; a whole card for a trainer or engine alone on
    one; half a card each where a trainer and its engine share one (``co_located``); a card
    for a coach actor that runs a local model, none for an HTTP client.

    >>> from mappa.config import ClusterConfig
    >>> paper = ClusterConfig(trainers="per_agent", engines="per_agent")
    >>> [default_gpus(paper, r, gpus=True, local_coach=False) for r in ("trainer", "engine")]
    [0.5, 0.5]
    >>> default_gpus(paper, "trainer", gpus=False, local_coach=False)
    0.0
    """
    if not gpus:
        return 0.0
    if role == "coach":
        return 1.0 if local_coach else 0.0
    return 0.5 if co_located(cluster) else 1.0


def co_located(cluster: ClusterConfig) -> bool:
    """Whether each trainer shares its card with an engine actor of its own."""
    return (cluster.trainers, cluster.engines) in {("per_agent", "per_agent"), ("one", "one")}


def resolved(res: ActorResources, gpus: float) -> ActorResources:
    """``res`` with an unset ``num_gpus`` set to ``gpus``."""
    return res if res.num_gpus is not None else res.model_copy(update={"num_gpus": gpus})


def bundle(pair: Sequence[ActorResources]) -> dict[str, float]:
    """The placement-group bundle that holds every actor of ``pair`` at once."""
    out: dict[str, float] = {}
    for res in pair:
        asked = {"CPU": res.num_cpus, "GPU": res.num_gpus or 0.0, **res.resources}
        for key, value in asked.items():
            out[key] = out.get(key, 0.0) + value
    return {k: v for k, v in out.items() if v > 0}


def actor_options(
    name: str, res: ActorResources, group: Any = None, index: int = 0
) -> dict[str, Any]:
    """Ray ``.options`` for one actor; inside bundle ``index`` of ``group`` when given."""
    # max_restarts=0: a restarted actor would come back with fresh weights, not the run's.
    options: dict[str, Any] = {
        "name": name,
        "num_cpus": res.num_cpus,
        "num_gpus": res.num_gpus or 0.0,
        "resources": dict(res.resources),
        "max_restarts": 0,
    }
    if group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index
        )
    return options


def pair_group(pairs: Mapping[str | None, Sequence[ActorResources]], timeout_s: float) -> Any:
    """A placement group with one bundle per trainer-and-engine pair (in ``pairs``' order),
    ready; a group the cluster cannot hold within ``timeout_s`` is removed and refused with
    the bundles it asked for."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [bundle(pair) for pair in pairs.values()]
    group = placement_group(bundles, strategy="PACK", name="mappa-pairs")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        from mappa.run.models import WorkerLost

        raise WorkerLost(
            f"the cluster could not reserve a trainer beside its engine for {list(pairs)} "
            f"within {timeout_s:g} s (cluster.start_timeout_s): bundles {bundles}; the "
            f"cluster has {ray.cluster_resources()}; lower cluster.trainer/engine.num_gpus "
            "or add GPUs"
        )
    return group
