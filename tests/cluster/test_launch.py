"""Where ``launch`` puts the actors on GPUs, on a private Ray with logical GPUs (CPU only):
in the paper's layout each agent's trainer and engine share one card through a placement
group; unset ``num_gpus`` are derived from the layout; and a vLLM engine inside the trainer
actor is not taken to sample from the trainer's own modules."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from mappa.cli import default_config
from mappa.config import load_config

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")


@pytest.fixture(scope="module")
def two_gpus() -> Iterator[None]:
    """A private Ray that believes it has two GPUs (there are none: nothing touches CUDA)."""
    # The stand-in actors below travel by value: Ray's workers cannot import this module.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # Set for Ray's workers only: left in this process's environment, it would pin every
    # later test's subprocesses to one thread, and their numbers off this process's.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        ray.init(
            address="local",
            num_cpus=4,
            num_gpus=2,
            object_store_memory=100 * 2**20,
            include_dashboard=False,
        )
        try:
            yield
        finally:
            ray.shutdown()


class Where:
    """A stand-in actor that reports the GPU Ray gave it (the fake of a policy worker)."""

    def gpus(self) -> list[Any]:
        return [str(g) for g in ray.get_gpu_ids()]


def _paper_layout(*overrides: str) -> Any:
    cfg = load_config(
        default_config(), ["cluster.trainers=per_agent", "cluster.engines=per_agent", *overrides]
    )
    return cfg.model_copy(update={"agents": cfg.agents[:2]})  # two agents on two cards


def test_each_agents_trainer_and_engine_share_one_gpu(two_gpus: None) -> None:
    from mappa.cluster.launch import plan_actors

    cfg = _paper_layout()
    assert cfg.cluster is not None
    group, plan = plan_actors(cfg, cfg.cluster, gpus=True)
    try:
        names = [a.name for a in cfg.agents]
        assert group is not None and group.bundle_specs == [{"CPU": 2.0, "GPU": 1.0}] * 2
        # Trainers first, as launch starts them: without the group Ray packs both
        # half-GPU trainers onto one card and both engines onto the other.
        order = [("trainer", n) for n in names] + [("engine", n) for n in names]
        for role, name in order:
            options = plan[role, name]
            assert options["num_gpus"] == 0.5
            strategy = options["scheduling_strategy"]
            assert strategy.placement_group_bundle_index == names.index(name)
        actor: Any = ray.remote(Where)
        handles = {key: actor.options(**plan[key]).remote() for key in order}
        gpus = {key: ray.get(h.gpus.remote()) for key, h in handles.items()}
        for name in names:
            assert gpus["trainer", name] == gpus["engine", name], gpus
        assert gpus["trainer", names[0]] != gpus["trainer", names[1]], gpus
        for h in handles.values():
            ray.kill(h)
    finally:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(group)


def test_unset_gpus_follow_the_layout_and_the_cluster(two_gpus: None) -> None:
    from mappa.cluster.launch import plan_actors

    cfg = load_config(default_config(), ["cluster.trainers=per_agent", "cluster.engines=one"])
    assert cfg.cluster is not None
    _, plan = plan_actors(cfg, cfg.cluster, gpus=True)
    assert plan["engine", None]["num_gpus"] == 1.0
    assert {plan["trainer", a.name]["num_gpus"] for a in cfg.agents} == {1.0}
    _, cpu = plan_actors(cfg, cfg.cluster, gpus=False)
    assert {o["num_gpus"] for o in cpu.values()} == {0.0}
    pinned = load_config(
        default_config(),
        ["cluster.trainers=one", "cluster.engines=trainer", "cluster.trainer.num_gpus=2"],
    )
    assert pinned.cluster is not None
    _, plan = plan_actors(pinned, pinned.cluster, gpus=True)
    assert plan["trainer", None]["num_gpus"] == 2.0


class FakeTrainerActor:
    """The fake of a trainer actor that also samples (``cluster.engines: trainer``)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def publish(self, step: int) -> None:
        self.calls.append(f"publish {step}")

    def load_adapter_state(self, agent: str, weights: Any) -> str:
        self.calls.append(f"load {agent}")
        return ""

    def log(self) -> list[str]:
        return self.calls


def test_a_vllm_engine_in_the_trainer_actor_samples_from_a_copy(two_gpus: None) -> None:
    from mappa.cluster.remote import RemoteEngine, RemotePolicies

    actor: Any = ray.remote(FakeTrainerActor)
    one = actor.remote()
    trainers = {"solver": one, "verifier": one}
    names = dict.fromkeys(trainers, "mappa-trainer")
    vllm = RemoteEngine(trainers, "vllm", in_trainers=True, actor_names=names)
    hf = RemoteEngine(trainers, "hf", in_trainers=True, actor_names=names)
    assert not vllm.shares_trainer and hf.shares_trainer
    vllm.sync(RemotePolicies(trainers), 3)  # the weights are in the actor: nothing sent
    assert ray.get(one.log.remote()) == ["publish 3"]
    ray.kill(one)
