"""Start a run's actors as ``cluster:`` lays them out, and hand the loop its ``RunModels``.

Layouts (``cluster.trainers`` x ``cluster.engines``; docs/scaling.md):

- ``one`` x ``trainer``: one actor holds the base and every adapter, trains and samples
  (the one-GPU layout, as a single process but in an actor);
- ``per_agent`` x ``one``: a trainer actor per agent (own devices, updates in parallel) and
  one multi-LoRA engine actor seeded like a single process, which therefore samples the
  very tokens a single process samples;
- ``per_agent`` x ``per_agent``: the paper's layout, an engine per agent too.

The coach runs on the first engine actor (``coach_actors: 0``) or on its own actors.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.actor import ActorHandle

from mappa.cluster.placement import (
    actor_options,
    co_located,
    default_gpus,
    pair_group,
    resolved,
)
from mappa.cluster.remote import (
    EngineRng,
    RemoteCoach,
    RemoteEngine,
    RemoteOptimizer,
    RemotePolicies,
    wait,
)
from mappa.cluster.update import remote_update
from mappa.cluster.worker import CoachWorker, PolicyWorker
from mappa.config import ActorResources, ClusterConfig, ConfigError, RunConfig
from mappa.records import Episode
from mappa.rl.kl import KLController
from mappa.run import build
from mappa.run.models import RunModels, WorkerLost
from mappa.text import first_line

log = logging.getLogger(__name__)


def engine_seed(seed: int, agent: str) -> int:
    """The sampling seed of ``agent``'s own engine (``engines: per_agent``): engines that
    share the run's seed would draw the same random numbers for different agents.

    >>> engine_seed(0, "verifier") == engine_seed(0, "verifier") != engine_seed(0, "solver")
    True
    """
    return int.from_bytes(hashlib.sha256(f"{seed}/engine/{agent}".encode()).digest()[:8]) >> 1


def connect(cluster: ClusterConfig) -> bool:
    """Join the configured Ray cluster (or start a private one); returns whether this call
    started Ray here, and so must shut it down. A driver already connected is reused."""
    if ray.is_initialized():
        return False
    if cluster.address is not None:
        try:
            ray.init(address=cluster.address)
        except ConnectionError as err:  # Ray's: no cluster where the address says
            raise ConfigError(
                f"cluster.address={cluster.address}: no Ray cluster answers ({first_line(err)}); "
                "start one (`ray start --head`), or set cluster.address: null for a private "
                "one"
            ) from None
    else:
        store = None if cluster.object_store_mb is None else cluster.object_store_mb * 2**20
        ray.init(
            num_cpus=cluster.num_cpus,
            num_gpus=cluster.num_gpus,
            object_store_memory=store,
            include_dashboard=False,
        )
    return True


class _Actors:
    """The run's actors, started in order and all ended by ``close``."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.started: list[tuple[str, ActorHandle, dict[str, Any]]] = []
        self.group: Any = None
        """The placement group of trainer-and-engine pairs, if the layout has pairs."""

    def policy(self, options: dict[str, Any], agents: Sequence[str], **role: Any) -> ActorHandle:
        name = options["name"]
        worker: Any = ray.remote(PolicyWorker)  # Ray's stubs type actor classes loosely
        handle: ActorHandle = worker.options(**options).remote(self.cfg, list(agents), **role)
        self.started.append((name, handle, options))
        return handle

    def coach(self, options: dict[str, Any]) -> ActorHandle:
        name = options["name"]
        worker: Any = ray.remote(CoachWorker)
        handle: ActorHandle = worker.options(**options).remote(self.cfg)
        self.started.append((name, handle, options))
        return handle

    def ready(self, timeout_s: float) -> None:
        """Wait until every actor is placed and built; log where each one runs."""
        refs: list[Any] = [handle.where.remote() for _, handle, _ in self.started]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(done) < len(refs):
            late = [r not in done for r in refs]
            waiting = {n: o for (n, _, o), x in zip(self.started, late, strict=True) if x}
            raise WorkerLost(
                f"{len(waiting)} of the run's actors were not placed and built within "
                f"{timeout_s:g} s (cluster.start_timeout_s): {waiting}; the cluster has "
                f"{ray.cluster_resources()}"
            )
        places = wait(refs, "starting the actors")
        for (name, _, _), place in zip(self.started, places, strict=True):
            log.info("actor %s on node %s (pid %d)", name, place["node_id"][:12], place["pid"])

    def close(self) -> None:
        """End every actor; a policy actor first closes its engine (a vLLM process)."""
        for _, handle, _ in self.started:
            if hasattr(handle, "publish"):  # a PolicyWorker
                try:
                    ray.get(handle.close.remote(), timeout=60)
                except Exception:  # noqa: BLE001 - a dead actor has nothing left to close
                    log.debug("actor gone before close", exc_info=True)
            ray.kill(handle, no_restart=True)
        self.started.clear()
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            self.group = None


def launch(cfg: RunConfig) -> RunModels:
    """Start the actors ``cfg.cluster`` asks for and return the loop's ``RunModels`` over
    them; their ``close`` ends every actor (and Ray, when this started it)."""
    cluster = cfg.cluster
    if cluster is None:
        raise ValueError("launch needs a config with a cluster section")
    owns_ray = connect(cluster)
    actors = _Actors(cfg)

    def close() -> None:
        actors.close()
        if owns_ray:
            ray.shutdown()

    try:
        return _start(cfg, cluster, actors, close)
    except BaseException:
        close()
        raise


def plan_actors(
    cfg: RunConfig, cluster: ClusterConfig, *, gpus: bool
) -> tuple[Any, dict[tuple[str, str | None], dict[str, Any]]]:
    """Each actor's Ray options, by role (``trainer``, ``engine``, ``coach``) and agent (None
    for the one actor of a role; the index for coach actors), and the placement group that
    pairs each trainer with its engine (None when the layout has no pairs: ``co_located``),
    already reserved. ``gpus``: the cluster has GPUs for the model (unset ``num_gpus`` are
    derived from the layout: ``default_gpus``)."""
    names = [a.name for a in cfg.agents]
    local = cfg.coach.backend == "local"

    def res(role: str, agent: str | None, default: ActorResources) -> ActorResources:
        asked = cluster.agents.get(agent, default) if agent is not None else default
        return resolved(asked, default_gpus(cluster, role, gpus=gpus, local_coach=local))

    keys: list[str | None] = list(names) if cluster.trainers == "per_agent" else [None]
    engine_keys: list[str | None] = list(names) if cluster.engines == "per_agent" else [None]
    trainer = {k: res("trainer", k, cluster.trainer) for k in keys}
    engine = {k: res("engine", k, cluster.engine) for k in engine_keys}
    group = None
    if co_located(cluster):
        group = pair_group({k: (trainer[k], engine[k]) for k in keys}, cluster.start_timeout_s)

    def named(role: str, key: str | None) -> str:
        return f"mappa-{role}" if key is None else f"mappa-{role}-{key}"

    plan: dict[tuple[str, str | None], dict[str, Any]] = {}
    for role, by_key in (("trainer", trainer), ("engine", engine)):
        if role == "engine" and cluster.engines == "trainer":
            continue
        for k, r in by_key.items():
            at = (group, keys.index(k)) if group is not None else (None, 0)
            plan[role, k] = actor_options(named(role, k), r, *at)
    coach = res("coach", None, cluster.coach)
    for i in range(cluster.coach_actors):
        plan["coach", str(i)] = actor_options(named("coach", str(i)), coach)
    return group, plan


def _start(
    cfg: RunConfig, cluster: ClusterConfig, actors: _Actors, close: Callable[[], None]
) -> RunModels:
    names = [a.name for a in cfg.agents]
    coach_here = cfg.rl.needs_coach and cluster.coach_actors == 0
    gpus = cfg.model.device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0
    actors.group, plan = plan_actors(cfg, cluster, gpus=gpus)

    if cluster.trainers == "one":
        shared = cluster.engines == "trainer"
        one = actors.policy(
            plan["trainer", None],
            names,
            trainer=True,
            sampler_seed=cfg.seed if shared else None,
            coach=shared and coach_here,
        )
        trainers = dict.fromkeys(names, one)
    else:
        trainers = {
            n: actors.policy(
                plan["trainer", n],
                [n],
                trainer=True,
                sampler_seed=None,
                coach=False,
            )
            for n in names
        }
    if cluster.engines == "trainer":
        engines = trainers
    elif cluster.engines == "one":
        multi = actors.policy(
            plan["engine", None],
            names,
            trainer=False,
            sampler_seed=cfg.seed,
            coach=coach_here,
        )
        engines = dict.fromkeys(names, multi)
    else:
        engines = {
            n: actors.policy(
                plan["engine", n],
                [n],
                trainer=False,
                sampler_seed=engine_seed(cfg.seed, n),
                coach=coach_here and i == 0,
            )
            for i, n in enumerate(names)
        }
    coaches = [actors.coach(plan["coach", str(i)]) for i in range(cluster.coach_actors)]
    actors.ready(cluster.start_timeout_s)

    first_engine = engines[names[0]]
    policies = RemotePolicies(trainers)
    actor_names = {id(handle): name for name, handle, _ in actors.started}
    engine = RemoteEngine(
        engines,
        cfg.rollout.engine,
        in_trainers=engines is trainers,
        actor_names={a: actor_names[id(h)] for a, h in engines.items()},
    )
    engine.sync(policies, 0)
    coach = None
    if cfg.rl.needs_coach:
        backends = coaches or [first_engine]
        name = wait(backends[0].coach_name.remote(), "starting the coach")
        coach = build.make_coach(cfg, None, backend=lambda: RemoteCoach(backends, name))
    tokenizer = wait(first_engine.tokenizer.remote(), "starting the engines")

    def update(
        episodes: Sequence[Episode], step: int, kl_ctl: KLController, recompute_old: bool
    ) -> dict[str, Any]:
        return remote_update(policies, cfg, episodes, step, kl_ctl, recompute_old)

    distinct_engines = list({id(e): e for e in engines.values()}.values())
    return RunModels(
        policies=policies,
        optimizers={n: RemoteOptimizer(trainers[n], n) for n in names},
        engine=engine,
        coach=coach,
        tokenizer=tokenizer,
        update=update,
        close=close,
        samplers=EngineRng(distinct_engines),
    )
