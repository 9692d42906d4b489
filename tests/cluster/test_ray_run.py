"""Training on a real two-node Ray cluster (loopback, CPU): the same run as one process.

The cluster (``conftest.two_nodes``) is a head and a second node, each its own raylet. The
runs put one trainer actor per agent across the two nodes and one multi-LoRA engine actor
seeded like the single process, so the Ray run must sample the very same tokens and compute
the same losses as ``train`` in this process with the same seed.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tiny_run_config
from safetensors.torch import load_file

from mappa.cluster import WorkerLost
from mappa.jsonl import read_jsonl
from mappa.records import read_episodes
from mappa.run import checkpoint
from mappa.run.loop import train

pytestmark = pytest.mark.integration
# Ray's local-only switch (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER) is set in tests/conftest.py,
# before any test module imports Ray; the fixture checks it took effect.
ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")

NODE = {"num_cpus": 4, "object_store_memory": 200 * 2**20}
"""Each node: 4 logical CPUs (actors ask for 1; the machine has 2 cores, so they share
them) and a 200 MB object store (adapters and a step's experience are a few MB)."""


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[str]:
    """A head and a second node, each a separate raylet process on 127.0.0.1, labelled by the
    custom resources ``head`` and ``second`` so a config can place actors on either; yields
    the head's address. Shut down (both raylets) when the module's tests are done."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "resources": {"head": 8}})
    try:
        cluster.add_node(**NODE, resources={"second": 8})
        ray.init(address=cluster.address)  # wait_for_nodes asks through a connection
        cluster.wait_for_nodes()
        nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]
        ray.shutdown()  # each run connects (and disconnects) itself, as `mappa train` does
        assert cluster.address.startswith("127.0.0.1:") and nodes == ["127.0.0.1"] * 2
        yield cluster.address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


AGENT_NODES = {"problem_solver": "head", "code_executor": "second", "verifier": "second"}
"""Where each agent's trainer goes (custom resources of the two nodes)."""


def ray_config(model_dir: Path, run_dir: Path, address: str, *overrides: str) -> Any:
    """The tiny run with a trainer actor per agent on the nodes of ``AGENT_NODES`` and one
    engine actor (with the coach) on the head."""
    return tiny_run_config(
        model_dir,
        run_dir,
        f"cluster.address='{address}'",
        "cluster.trainers=per_agent",
        "cluster.engines=one",
        "cluster.engine.resources.head=1",
        *(f"cluster.agents.{agent}.resources.{node}=1" for agent, node in AGENT_NODES.items()),
        *overrides,
    )


def _actions(run_dir: Path) -> list[Any]:
    return [a for ep in read_episodes(run_dir / "episodes.jsonl") for a in ep.actions]


def assert_same_run(ray_dir: Path, single_dir: Path) -> None:
    """Same tokens sampled, same coach scores, same per-agent losses, same final adapters.

    Both runs compute on one thread (``train_here``), and here they agree bit for bit; the
    tolerances only allow for float32 sums taken in another order by another BLAS.
    """
    ray_actions, single_actions = _actions(ray_dir), _actions(single_dir)
    assert len(ray_actions) == len(single_actions) > 0
    for r, s in zip(ray_actions, single_actions, strict=True):
        assert (r.agent, r.turn, r.prompt_ids, r.completion_ids) == (
            s.agent,
            s.turn,
            s.prompt_ids,
            s.completion_ids,
        )
        assert r.sample_logprobs == pytest.approx(s.sample_logprobs, rel=1e-5, abs=1e-7)
        assert r.coach is not None and s.coach is not None
        assert r.coach.value == pytest.approx(s.coach.value, rel=1e-6, abs=1e-7)
    ray_m, single_m = (
        read_jsonl(ray_dir / "metrics.jsonl"),
        read_jsonl(single_dir / "metrics.jsonl"),
    )
    assert [m["step"] for m in ray_m] == [m["step"] for m in single_m]
    for rm, sm in zip(ray_m, single_m, strict=True):
        for agent in AGENT_NODES:
            assert rm[f"rl/{agent}/skipped"] == sm[f"rl/{agent}/skipped"] == ""
            for key in ("loss", "grad_norm", "mean_reward", "tokens", "entropy", "mean_kl"):
                k = f"rl/{agent}/{key}"
                assert rm[k] == pytest.approx(sm[k], rel=1e-5, abs=1e-8), (rm["step"], k)
        assert rm["mean_kl"] == pytest.approx(sm["mean_kl"], rel=1e-5, abs=1e-8)
        assert rm["lr"] == sm["lr"]
    for agent in AGENT_NODES:
        got = load_file(ray_dir / "adapters" / agent / "adapter_model.safetensors")
        want = load_file(single_dir / "adapters" / agent / "adapter_model.safetensors")
        assert got.keys() == want.keys()
        for key in want:
            torch.testing.assert_close(got[key], want[key], atol=1e-7, rtol=1e-5)


def _placements(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """Actor name -> node id, from the launcher's log of where each actor started."""
    return {
        r.args[0]: r.args[1]  # type: ignore[index]
        for r in caplog.records
        if r.name == "mappa.cluster.launch" and r.msg.startswith("actor %s on node")
    }


def train_here(cfg: Any) -> Path:
    """``train`` in this process on one thread, as each actor (``num_cpus: 1``) runs torch:
    float sums are then taken in the same order in both runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(cfg)
    finally:
        torch.set_num_threads(threads)


RECOMPUTED = "rl.recompute_old_logprobs=always"
"""A separate engine actor samples from a copy of the weights, so `auto` recomputes the old
log-probs there; the single-process run it must equal recomputes them too."""


@pytest.fixture(scope="module")
def single_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny 2-step run in this process, sampling from the trained modules (no recompute):
    what a layout whose engine is the trainer must reproduce."""
    return train_here(tiny_run_config(tiny_model_dir, tmp_path_factory.mktemp("single") / "run"))


@pytest.fixture(scope="module")
def single_recomputed(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run with the old log-probs recomputed: what a layout with separate engine
    actors must reproduce."""
    run = tmp_path_factory.mktemp("single-recomputed") / "run"
    return train_here(tiny_run_config(tiny_model_dir, run, RECOMPUTED))


def test_trainers_on_two_nodes_train_as_one_process(
    tiny_model_dir: Path,
    tmp_path: Path,
    two_nodes: str,
    single_recomputed: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="mappa.cluster.launch")
    ray_dir = train(ray_config(tiny_model_dir, tmp_path / "ray", two_nodes))

    assert not ray.is_initialized()  # the run disconnected; its actors were ended
    nodes = _placements(caplog)
    trainer = {a: nodes[f"mappa-trainer-{a}"] for a in AGENT_NODES}
    assert trainer["problem_solver"] != trainer["code_executor"] == trainer["verifier"]
    assert nodes["mappa-engine"] == trainer["problem_solver"]
    assert_same_run(ray_dir, single_recomputed)


def test_one_actor_for_everything_trains_as_one_process(
    tiny_model_dir: Path, tmp_path: Path, two_nodes: str, single_run: Path
) -> None:
    """The one-GPU layout: a single actor trains every adapter and samples from them."""
    cfg = tiny_run_config(
        tiny_model_dir,
        tmp_path / "ray",
        f"cluster.address='{two_nodes}'",
        "cluster.trainers=one",
        "cluster.engines=trainer",
    )
    assert_same_run(train(cfg), single_run)


@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_the_papers_layout_trains_with_an_engine_per_agent(
    tiny_model_dir: Path,
    tmp_path: Path,
    two_nodes: str,
    caplog: pytest.LogCaptureFixture,
    dtype: str,
) -> None:
    """``engines: per_agent``: each agent samples on its own engine, beside its trainer;
    every sync checks each engine holds its trainer's weights, so two steps finishing means
    step 1 sampled the adapters step 0 trained. Tokens differ from one process (each engine
    has its own seed); the update still trains every agent. Also in ``auto``, the shipped
    configs' dtype (bfloat16 on a CPU with bfloat16 instructions): the engines' copies
    then differ from the trainers' in rounding, and the update recomputes the old
    log-probs."""
    caplog.set_level(logging.INFO, logger="mappa.cluster.launch")
    cfg = ray_config(
        tiny_model_dir,
        tmp_path / "ray",
        two_nodes,
        "cluster.engines=per_agent",
        f"model.dtype={dtype}",
    )
    run_dir = train(cfg)
    nodes = _placements(caplog)
    for agent in AGENT_NODES:
        assert nodes[f"mappa-engine-{agent}"] == nodes[f"mappa-trainer-{agent}"]
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        for agent in AGENT_NODES:
            assert m[f"rl/{agent}/skipped"] == "" and m[f"rl/{agent}/grad_norm"] > 0
        assert 0 <= m["rl/logprob_gap_max"] < 0.05  # recomputed: engines hold copies
        for agent in AGENT_NODES:  # each engine's copy is its trainer's weights
            assert 0 <= m[f"sync/{agent}/probe_gap"] < 1e-4
    for agent in AGENT_NODES:
        saved = load_file(run_dir / "adapters" / agent / "adapter_model.safetensors")
        assert any(t.abs().sum() > 0 for k, t in saved.items() if "lora_B" in k)


def test_engine_sync_sends_the_trainers_weights(
    tiny_model_dir: Path, tmp_path: Path, two_nodes: str
) -> None:
    """Weights changed on a trainer reach the engine only through ``sync``, and then the
    engine's log-probs are the trainer's: the next rollout samples the new adapter."""
    from mappa.cluster.launch import launch

    cfg = ray_config(tiny_model_dir, tmp_path / "run", two_nodes)
    models = launch(cfg)
    try:
        engine = ray.get_actor("mappa-engine")
        trainer = ray.get_actor("mappa-trainer-verifier")
        args = ("verifier", [[5, 9, 12, 3]], [[7, 8, 11]], 1.0, False)

        def logprobs(actor: Any) -> torch.Tensor:
            return ray.get(actor.completion_logprobs.remote(*args)).logprobs

        before = logprobs(engine)
        torch.testing.assert_close(before, logprobs(trainer))
        weights = ray.get(trainer.adapter_state.remote("verifier"))
        ray.get(
            trainer.load_adapter_state.remote("verifier", {k: v + 0.05 for k, v in weights.items()})
        )
        trained = logprobs(trainer)
        assert not torch.allclose(trained, before, atol=1e-4)
        torch.testing.assert_close(logprobs(engine), before)  # not sent yet

        models.engine.sync(models.policies, 1)
        torch.testing.assert_close(logprobs(engine), trained, atol=1e-6, rtol=0)
    finally:
        models.close()
    assert not ray.is_initialized()


def test_a_skipped_sync_stops_the_run_naming_the_agent_and_engine_actor(
    tiny_model_dir: Path, tmp_path: Path, two_nodes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine actor given the adapters before the first rollout and never again: the
    probe after step 0's update finds it sampling the old weights and stops the run, naming
    the agent and the actor (every other test here is the run with the sync, passing)."""
    from mappa.cluster.remote import RemoteEngine
    from mappa.models.sync_probe import StaleAdapterError

    sync = RemoteEngine.sync

    def first_sync_only(self: RemoteEngine, source: Any, step: int) -> None:
        if step == 0:
            sync(self, source, step)

    monkeypatch.setattr(RemoteEngine, "sync", first_sync_only)
    with pytest.raises(StaleAdapterError) as err:
        train(ray_config(tiny_model_dir, tmp_path / "ray", two_nodes, "train.steps=1"))
    assert str(err.value).startswith(
        "stale adapter for agent 'problem_solver' on the hf engine on Ray actor mappa-engine: "
        "before step 1's rollout"
    )
    assert not ray.is_initialized()  # the run still ended its actors


def test_a_killed_trainer_stops_the_run_and_resume_finishes_it(
    tiny_model_dir: Path, tmp_path: Path, two_nodes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL one trainer actor's process after step 1's rollout: the run stops with
    ``WorkerLost`` naming the newest checkpoint; ``--resume`` finishes on new actors, exactly
    as an uninterrupted single-process run (coach on its own actor here)."""
    cfg = ray_config(tiny_model_dir, tmp_path / "ray", two_nodes, "train.steps=3")
    cfg.cluster.coach_actors = 1

    def kill_a_trainer(name: str, step: int) -> None:
        if (name, step) == ("rollout", 1):
            actor = ray.get_actor("mappa-trainer-verifier")
            os.kill(ray.get(actor.where.remote())["pid"], signal.SIGKILL)

    monkeypatch.setattr(checkpoint, "pause_point", kill_a_trainer)
    with pytest.raises(WorkerLost) as stopped:
        train(cfg)
    monkeypatch.undo()
    run_dir = tmp_path / "ray"
    message = "\n".join([str(stopped.value), *getattr(stopped.value, "__notes__", [])])
    assert "Ray actor" in message and "mappa-trainer-verifier" in message
    assert f"step 1 ({run_dir / 'checkpoints' / 'step-000001'})" in message
    assert f"mappa train --resume {run_dir}" in message
    assert not ray.is_initialized()
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [0]

    train(cfg, resume=run_dir)
    single = train_here(
        tiny_run_config(tiny_model_dir, tmp_path / "single", "train.steps=3", RECOMPUTED)
    )
    assert_same_run(run_dir, single)
