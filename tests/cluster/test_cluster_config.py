"""The ``cluster:`` section: validation, the Ray check before anything loads, resume rules.
No Ray needed (nothing here starts it)."""

from __future__ import annotations

import importlib.util

import pytest

from mappa.cli import default_config
from mappa.config import ConfigError, load_config
from mappa.run import checkpoint, preflight


def test_no_cluster_section_is_one_process() -> None:
    assert load_config(default_config()).cluster is None


def test_layout_and_agent_names_are_checked() -> None:
    cfg = load_config(default_config(), ["cluster.trainer.num_gpus=0.5"])
    assert cfg.cluster is not None
    assert (cfg.cluster.trainers, cfg.cluster.engines) == ("per_agent", "one")
    with pytest.raises(ConfigError, match="needs cluster.trainers: one"):
        load_config(default_config(), ["cluster.engines=trainer"])
    with pytest.raises(ConfigError, match=r"cluster.agents: \['solver'\] are not agents"):
        load_config(default_config(), ["cluster.agents.solver.num_gpus=1"])
    with pytest.raises(ConfigError, match="cluster.trainer.num_gpus"):
        load_config(default_config(), ["cluster.trainer.num_gpus=-1"])


def test_a_cluster_section_without_ray_fails_the_check_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"cluster: .*\[ray\]"):
        preflight.check(load_config(default_config(), ["cluster.trainers=one"]))


def test_resume_may_move_the_cluster_but_not_change_its_layout() -> None:
    saved = load_config(default_config(), ["cluster.address=auto"]).model_dump(mode="json")
    moved = load_config(default_config(), ["cluster.address=10.0.0.2:6379"])
    assert checkpoint.config_differences(saved, moved) == []
    relaid = load_config(default_config(), ["cluster.address=auto", "cluster.trainers=one"])
    assert checkpoint.config_differences(saved, relaid) == ["cluster.trainers"]
