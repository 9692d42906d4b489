"""``mappa.train``: the Python API runs what ``mappa train --config`` runs."""

from __future__ import annotations

from pathlib import Path

import pytest

import mappa
from mappa.cli import default_config
from mappa.config import RunConfig, load_config


def test_train_reads_a_config_file_with_overrides_and_runs_the_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[RunConfig, Path | None]] = []

    def fake_loop(cfg: RunConfig, resume: Path | None = None) -> Path:  # the loop, faked
        seen.append((cfg, resume))
        return tmp_path

    monkeypatch.setattr("mappa.run.loop.train", fake_loop)
    assert mappa.train(str(default_config()), ["seed=7"], resume=str(tmp_path)) == tmp_path
    [(cfg, resume)] = seen
    assert cfg.seed == 7 and cfg == load_config(default_config(), ["seed=7"])
    assert resume == tmp_path
    assert mappa.train(cfg) == tmp_path and seen[-1] == (cfg, None)
    with pytest.raises(ValueError, match="overrides apply to a config file"):
        mappa.train(cfg, ["seed=8"])
