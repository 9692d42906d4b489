"""The factory: checks before anything loads, optimizers and their schedule, and runs that
need no coach build none."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_run_config

from mappa.cli import default_config
from mappa.config import load_config
from mappa.jsonl import read_jsonl
from mappa.records import read_episodes
from mappa.rl.schedule import set_step_lr
from mappa.run import build, preflight


def test_a_full_finetuning_lr_warns_for_lora() -> None:
    with pytest.warns(UserWarning, match=r"rl.lr=1e-06 is a full-finetuning rate"):
        preflight.check(load_config(default_config(), ["rl.lr=1e-6"]))


def test_optimizers_follow_the_configured_betas_and_schedule(tiny_model_dir: Path) -> None:
    cfg = tiny_run_config(tiny_model_dir, Path("unused"), "train.steps=5", "rl.lr=0.01")
    params, optimizers = build.make_optimizers(cfg, build.load_policies(cfg))
    assert set(params) == set(optimizers) == {a.name for a in cfg.agents}
    adam = optimizers["verifier"]
    assert adam.defaults["betas"] == (0.9, 0.95) and adam.defaults["eps"] == 1e-8
    lrs = [set_step_lr(optimizers.values(), cfg.rl, step, 5) for step in range(5)]
    assert all(o.param_groups[0]["lr"] == lrs[-1] for o in optimizers.values())
    # cosine from 0.01 to 0.1 x 0.01 over 5 steps (3% warmup of 5 steps rounds to none)
    assert [round(lr, 5) for lr in lrs] == [0.01, 0.00868, 0.0055, 0.00232, 0.001]


def test_outcome_only_asks_no_coach(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Replay mode over an empty cache fails on the first coach call: none may be made."""
    from mappa.run.loop import train

    cfg = tiny_run_config(
        tiny_model_dir,
        tmp_path / "run",
        "train.steps=1",
        "rl.advantage=outcome_only",
        "coach.cache.mode=replay",
        f"coach.cache.path={tmp_path / 'empty.sqlite'}",
    )
    run_dir = train(cfg)
    episodes = read_episodes(run_dir / "episodes.jsonl")
    actions = [a for e in episodes for a in e.actions]
    assert actions and all(a.coach is None for a in actions)
    [m] = read_jsonl(run_dir / "metrics.jsonl")
    assert m["trained_actions"] == len(actions) and m["coach/calls"] == 0
    for agent in ("problem_solver", "code_executor", "verifier"):  # the reward used: outcome 0
        assert m[f"rl/{agent}/mean_reward"] == 0.0


def _coach_key(tmp_path: Path, *overrides: str) -> str:
    """The score cache namespace ``make_coach`` gives a replaying coach (nothing is built)."""
    cache = f"coach.cache.path={tmp_path / 'cache.sqlite'}"
    cfg = load_config(default_config(), ["coach.cache.mode=replay", cache, *overrides])
    return build.make_coach(cfg, policies=None).namespace


@pytest.mark.parametrize(
    "change",
    [
        "coach.local.min_digit_mass=0.3",  # decides which scores are flagged
        "model.dtype=bfloat16",  # the coach reads the policy base in the model's dtype
        "model.path=other/model",
        "coach.local.model_path=other/coach",
        "coach.template=mathchat",
        "coach.local.engine=llamacpp",
        "coach.backend=http",
    ],
)
def test_the_score_cache_key_changes_with_what_changes_a_score(tmp_path: Path, change: str) -> None:
    base = "model.dtype=float32"
    assert _coach_key(tmp_path, base, change) != _coach_key(tmp_path, base)
    # a coach with a model of its own loads it in model.dtype too
    own = "coach.local.model_path=coach/model"
    if not change.startswith(("model.path", "coach.local.model_path")):
        assert _coach_key(tmp_path, base, own, change) != _coach_key(tmp_path, base, own)


@pytest.mark.parametrize(
    "same",
    [
        "run_dir=elsewhere",
        "seed=7",
        "coach.local.batch_size=3",
        "coach.local.batch_tokens=512",
        "coach.local.engine=auto",
        "coach.max_fallback_steps=9",
    ],
)
def test_the_score_cache_key_ignores_what_cannot_change_a_score(tmp_path: Path, same: str) -> None:
    assert _coach_key(tmp_path, "model.dtype=float32", same) == _coach_key(
        tmp_path, "model.dtype=float32"
    )


def test_an_auto_dtype_is_keyed_by_what_it_resolves_to(tmp_path: Path) -> None:
    resolved = {_coach_key(tmp_path, f"model.dtype={d}") for d in ("float32", "bfloat16")}
    assert _coach_key(tmp_path, "model.dtype=auto") in resolved


def test_the_sync_probe_follows_rollout_sync_check_and_tolerance(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    models = build.local_models(tiny_run_config(tiny_model_dir, tmp_path / "run"))
    by_dtype = build.sync_probe(tiny_run_config(tiny_model_dir, tmp_path / "a"), models)
    assert by_dtype is not None and (by_dtype.tolerance, by_dtype.dtype) == (1e-3, "float32")
    assert by_dtype.agents == ["problem_solver", "code_executor", "verifier"]
    cfg = tiny_run_config(tiny_model_dir, tmp_path / "b", "rollout.sync_tolerance=0.02")
    set_by_hand = build.sync_probe(cfg, models)
    assert set_by_hand is not None and set_by_hand.tolerance == 0.02
    off = tiny_run_config(tiny_model_dir, tmp_path / "c", "rollout.sync_check=off")
    assert build.sync_probe(off, models) is None
