"""Checkpoints of a training run, and resuming one (``mappa train --resume RUN_DIR``).

A checkpoint is everything the loop needs to continue as if it had never stopped:

- each agent's adapter (``adapters/<agent>``, standard PEFT) and its Adam state;
- the KL controller's beta, the non-finite counters (``rl.update.NonFiniteGuard``) and the
  coach's run of all-fallback steps (``coach.FallbackGuard``);
- the RNG states (Python ``random``, torch CPU and CUDA; in a Ray run also the engine
  actors' torch states, ``TrainState.samplers``) and the task order's position
  (``tasks.batches.TaskBatches``: its ``random.Random`` state and the tasks still pending
  this epoch);
- the step (steps done) and the byte size of each JSONL record file at that moment.

No scheduler state: the lr is a pure function of the step (``mappa.rl.schedule``), set
before every update. It depends on ``train.steps``, so extending a run with a larger
``train.steps`` continues on the longer schedule.

Layout: ``checkpoints/step-<N>/`` (``state.pt``, ``checkpoint.json``, ``adapters/``), written
into a temporary directory, fsynced, and made visible by one ``rename``; only the newest is
kept. ``<run_dir>/adapters`` is a relative symlink to the newest checkpoint's adapters,
switched by one atomic ``rename`` too, so it always holds one consistent step, recorded
beside the adapters in ``adapters/step.json``.

Resume restores the newest checkpoint, cuts every record file back to its recorded size
(records of the lost steps and a torn last line go), and removes the lost steps'
workspaces. It refuses a config that differs from the run's ``config.yaml`` in anything
but ``config.RESUMABLE_KEYS``, naming the keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import yaml

from mappa.config import RESUMABLE_KEYS, RunConfig
from mappa.jsonl import truncate_jsonl
from mappa.paths import CHECKPOINTS, run_config_file
from mappa.rng import as_tuples, set_torch_rng_state, torch_rng_state
from mappa.run.models import AdapterStore, Stateful

log = logging.getLogger(__name__)

RECORD_FILES = ("episodes.jsonl", "metrics.jsonl", "heldout_episodes.jsonl")


class KLState(Protocol):
    """The KL controller's state (``rl.kl.KLController``): its current beta."""

    beta: float


class CountGuard(Protocol):
    """A guard that counts events per key (``rl.update.NonFiniteGuard``: non-finite steps
    per agent)."""

    counts: dict[str, int]


class StreakGuard(Protocol):
    """A guard that counts a run of steps (``coach.FallbackGuard``: all-fallback steps)."""

    streak: int


@dataclass
class TrainState:
    """The live objects a checkpoint saves and restores. Typed by what is saved of them,
    so this module depends on no package's loop machinery.

    ``samplers``: the random state of a sampler outside this process (Ray engine actors);
    ``None`` when the rollout samples here, from torch's RNG, which is always saved.
    """

    policies: AdapterStore
    optimizers: Mapping[str, Stateful]
    kl_ctl: KLState
    batches: Stateful
    guard: CountGuard
    coach_guard: StreakGuard
    samplers: Stateful | None = None


# ------------------------------------------------------------------------ test hook
def pause_point(name: str, step: int) -> None:
    """Test-only hook: with ``MAPPA_TEST_PAUSE=<name>@<step>`` the process stops here (it
    touches ``$MAPPA_TEST_PAUSE_FILE`` and sleeps) so a test can SIGKILL it at a known point.
    Points: ``rollout`` (sampled, nothing recorded), ``update`` (episodes recorded, metrics
    not), ``checkpoint`` (``step`` = steps done; adapters half written, not yet renamed)."""
    if os.environ.get("MAPPA_TEST_PAUSE") != f"{name}@{step}":
        return
    marker = os.environ.get("MAPPA_TEST_PAUSE_FILE")
    if marker:
        Path(marker).write_text(f"{name}@{step}\n")
    time.sleep(3600)


# ------------------------------------------------------------------------ saving
def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            _fsync(Path(dirpath) / name)
        _fsync(Path(dirpath))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, step: int, state: TrainState) -> Path:
    """Write the checkpoint of ``step`` steps done; returns its directory.

    Atomic: a temporary directory, fsynced, one ``rename``; then ``adapters`` is switched to
    it (one more atomic ``rename``) and the older checkpoints are removed.
    """
    root = run_dir / CHECKPOINTS
    root.mkdir(exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    state.policies.save(tmp / "adapters")
    (tmp / "adapters" / "step.json").write_text(json.dumps({"step": step}) + "\n")
    pause_point("checkpoint", step)
    torch.save(
        {
            "optimizers": {a: opt.state_dict() for a, opt in state.optimizers.items()},
            "kl_beta": state.kl_ctl.beta,
            "nonfinite": dict(state.guard.counts),
            "coach_fallback_streak": state.coach_guard.streak,
            "batches": state.batches.state_dict(),
            "python_rng": random.getstate(),
            **{f"{k}_rng": v for k, v in torch_rng_state().items()},  # torch_rng, cuda_rng
            "sampler_rng": None if state.samplers is None else state.samplers.state_dict(),
        },
        tmp / "state.pt",
    )
    offsets = {f: (run_dir / f).stat().st_size for f in RECORD_FILES if (run_dir / f).exists()}
    meta = {"step": step, "offsets": offsets, "sha256": _digests(tmp)}
    (tmp / "checkpoint.json").write_text(json.dumps(meta, indent=1) + "\n")
    _fsync_tree(tmp)
    if final.exists():  # the same step again (a resumed run that had nothing left to do)
        shutil.rmtree(final)
    tmp.rename(final)
    _fsync(root)
    _link_adapters(run_dir, final)
    for old in root.iterdir():
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _link_adapters(run_dir: Path, ckpt: Path) -> None:
    """Point ``run_dir/adapters`` at ``ckpt``'s adapters: a new link, one atomic rename."""
    link = run_dir / ".adapters.tmp"
    link.unlink(missing_ok=True)
    link.symlink_to(Path(CHECKPOINTS) / ckpt.name / "adapters", target_is_directory=True)
    link.replace(run_dir / "adapters")
    _fsync(run_dir)


def resume_hint(run_dir: Path, then: str = "after fixing this, ") -> str:
    """What a user whose run stopped can do next (``then``: what comes first): where its
    newest checkpoint is."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return f"No checkpoint was written in {run_dir}; {then}start a new run."
    try:
        step = checkpoint_step(ckpt)
    except ValueError as err:
        return f"The newest checkpoint is damaged ({err}); {then}{restart(run_dir)}."
    return (
        f"The newest checkpoint is step {step} ({ckpt}); {then}continue with "
        f"`mappa train --resume {run_dir}`."
    )


def _complete(run_dir: Path) -> list[Path]:
    """The complete checkpoints (renamed ``step-<N>`` directories), oldest first."""
    root = run_dir / CHECKPOINTS
    done = sorted(root.glob("step-*")) if root.is_dir() else []
    return [d for d in done if (d / "checkpoint.json").is_file()]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (a renamed ``step-<N>`` directory), if any."""
    done = _complete(run_dir)
    return done[-1] if done else None


def restart(run_dir: Path) -> str:
    """How to start a run that cannot be resumed again, under the same config."""
    config = run_dir / "config.yaml"
    return f"start the run again (`mappa train --config {config} run_dir=<a new dir>`)"


def _meta(ckpt: Path) -> dict[str, Any]:
    """A complete checkpoint's ``checkpoint.json``; ``ValueError`` naming the file where it
    is not what ``save_checkpoint`` wrote (a copy cut short, a file overwritten)."""
    path = ckpt / "checkpoint.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:  # not JSON, or not UTF-8
        meta = None
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        raise ValueError(f"{path} is not the record that was written (no JSON with a step)")
    return meta


def checkpoint_step(ckpt: Path) -> int:
    """The steps done at a complete checkpoint; ``ValueError`` where its record is damaged."""
    return int(_meta(ckpt)["step"])


def _digests(ckpt: Path) -> dict[str, str]:
    """sha256 of every file of a checkpoint directory, by its path inside it."""
    out = {}
    for path in sorted(p for p in ckpt.rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        out[path.relative_to(ckpt).as_posix()] = h.hexdigest()
    return out


def damage(ckpt: Path) -> str | None:
    """What is wrong with a complete checkpoint's files (one missing, or not what was
    written: a disk filled up, a copy cut short), or None. A checkpoint written before
    checksums were recorded is taken as it is."""
    try:
        recorded = _meta(ckpt).get("sha256")
    except ValueError as err:
        return str(err)
    if not recorded:
        return None
    found = _digests(ckpt)
    for name, digest in recorded.items():
        if name not in found:
            return f"{ckpt / name} is missing"
        if found[name] != digest:
            return f"{ckpt / name} is not the file that was written (its sha256 differs)"
    return None


def resumable_checkpoint(run_dir: Path) -> Path:
    """The newest complete checkpoint whose files are intact; an older one is used (with a
    warning) where the newest is damaged and an older one is kept. ``FileNotFoundError``
    without a checkpoint, ``ValueError`` naming the damaged file when none is intact."""
    done = _complete(run_dir)
    if not done:
        raise FileNotFoundError(
            f"{run_dir}: no complete checkpoint to resume from; {restart(run_dir)}"
        )
    problems: list[str] = []
    for ckpt in reversed(done):
        problem = damage(ckpt)
        if problem is None:
            for skipped in problems:
                log.warning("%s; resuming from the older %s instead", skipped, ckpt.name)
            return ckpt
        problems.append(problem)
    older = "no older one is kept" if len(problems) == 1 else "the older ones are damaged too"
    raise ValueError(f"{problems[0]}: the checkpoint is damaged and {older}; {restart(run_dir)}")


# ------------------------------------------------------------------------ resuming
def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _with_defaults(saved: Mapping[str, Any]) -> Mapping[str, Any]:
    """A saved config as this version reads it: a key added since the run started takes its
    default, which is what the run did before the key existed. A config this version
    cannot read (a key renamed or removed) is compared as written."""
    try:
        return RunConfig.model_validate(saved).model_dump(mode="json")
    except ValueError:
        return saved


def config_changes(
    saved: Mapping[str, Any], cfg: RunConfig, ignore: Collection[str] = RESUMABLE_KEYS
) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved value, value in cfg)}`` for every dotted key whose value differs between
    a run's saved config and ``cfg``, in key order, the ``ignore`` keys left out."""
    a, b = _flat(_with_defaults(saved)), _flat(cfg.model_dump(mode="json"))
    keys = sorted(k for k in a.keys() | b.keys() if k not in ignore and a.get(k) != b.get(k))
    return {k: (a.get(k), b.get(k)) for k in keys}


def config_differences(saved: Mapping[str, Any], cfg: RunConfig) -> list[str]:
    """Keys whose values differ between a run's saved config and ``cfg`` (but the resumable)."""
    return list(config_changes(saved, cfg))


def _changes(diff: Mapping[str, tuple[Any, Any]], most: int = 5) -> str:
    """The first ``most`` differing keys, each with its two values where they are short (a
    config's agents are a screenful), and how many more there are."""
    shown = []
    for key, (old, new) in list(diff.items())[:most]:
        values = f"{old!r} -> {new!r}"
        shown.append(f"{key} ({values})" if len(values) <= 40 else key)
    more = f" and {len(diff) - most} more" if len(diff) > most else ""
    return ", ".join(shown) + more


def check_resumable(run_dir: Path, cfg: RunConfig) -> dict[str, Any]:
    """The run's saved config, if ``run_dir`` can be resumed with ``cfg``.

    Raises ``ValueError`` for a config that differs in anything but the resumable keys
    (naming the keys) or a run that already did ``cfg.train.steps`` (nothing to resume:
    the models would load to do nothing), and ``FileNotFoundError`` for a directory
    without a run or a checkpoint.
    """
    config = run_config_file(run_dir)
    ckpt = resumable_checkpoint(run_dir)
    saved = yaml.safe_load(config.read_text()) or {}
    diff = config_changes(saved, cfg)
    if diff:
        raise ValueError(
            f"{run_dir}: the config differs from the run's config.yaml in {_changes(diff)}; "
            "resume with the run's own config, changing only keys `mappa train --help` "
            "lists under --resume"
        )
    done = checkpoint_step(ckpt)
    if done >= cfg.train.steps:
        raise ValueError(
            f"{run_dir}: the run already did {done} steps (train.steps={cfg.train.steps}); "
            f"to extend it, resume with train.steps=M, M > {done}"
        )
    return dict(saved)


def open_run(run_dir: Path, cfg: RunConfig) -> Path:
    """``check_resumable``, then record the (possibly new) ``train.steps`` in config.yaml."""
    saved = check_resumable(run_dir, cfg)
    saved.setdefault("train", {})["steps"] = cfg.train.steps
    write_atomic(run_dir / "config.yaml", yaml.safe_dump(saved, sort_keys=False))
    return run_dir


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def restore(run_dir: Path, state: TrainState, ckpt: Path | None = None) -> int:
    """Load the checkpoint ``ckpt`` (default: ``resumable_checkpoint``, which reads every
    file of each one it tries) into ``state``; cut the records back to it; returns the
    steps done. RNG states are restored last, after everything that draws from them."""
    ckpt = ckpt or resumable_checkpoint(run_dir)
    meta = _meta(ckpt)
    step = int(meta["step"])
    saved = torch.load(ckpt / "state.pt", weights_only=True)
    state.policies.load(ckpt / "adapters")
    for agent, opt in state.optimizers.items():
        opt.load_state_dict(saved["optimizers"][agent])
    state.kl_ctl.beta = float(saved["kl_beta"])
    state.guard.counts.update({k: int(v) for k, v in saved["nonfinite"].items()})
    state.coach_guard.streak = int(saved.get("coach_fallback_streak", 0))
    state.batches.load_state_dict(saved["batches"])
    _link_adapters(run_dir, ckpt)  # a kill between a checkpoint's two renames
    for name in RECORD_FILES:
        path = run_dir / name
        offset = int(meta["offsets"].get(name, 0))
        if path.exists() and path.stat().st_size > offset:
            log.warning("%s: cutting records written after step %d", path, step)
            truncate_jsonl(path, offset)
    for phase in (run_dir / "workspaces").glob("*"):  # the lost steps' workspaces
        for ws in phase.glob("step*"):
            if ws.name[4:].isdigit() and int(ws.name[4:]) >= step:
                shutil.rmtree(ws, ignore_errors=True)
    random.setstate(as_tuples(saved["python_rng"]))
    set_torch_rng_state({"torch": saved["torch_rng"], "cuda": saved["cuda_rng"]})
    if state.samplers is not None and saved.get("sampler_rng") is not None:
        state.samplers.load_state_dict(saved["sampler_rng"])
    log.info("resumed %s from checkpoint %s (%d steps done)", run_dir, ckpt.name, step)
    return step
