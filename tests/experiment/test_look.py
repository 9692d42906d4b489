"""The one look part way: it reads the spread of the primary's per-seed differences from the
records, never their mean, decides the seed count by the file's rule, and is kept so that a
second call shows it instead of looking again."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from mappa.experiment.look import LOOK_FILE, look_lines, read_look, take_look
from mappa.experiment.markdown import look_section
from mappa.experiment.records import Records
from mappa.experiment.spec import (
    ExperimentConfig,
    ExperimentError,
    RunSpec,
    load_experiment,
    plan_runs,
)

EXPERIMENT = """\
    base: smoke
    overrides: [eval.every=1, eval.num_tasks=4, tasks.num_tasks=16]
    seeds: [0, 1, 2, 3]
    arms:
      coach: []
      outcome_only: [rl.advantage=outcome_only]
    analysis:
      primary: [coach, outcome_only]
      look: {after_seeds: 3, seeds_if_sd_above: {0.05: 6, 0.2: 9}}
"""

FINALS = {
    "coach": [0.50, 0.30, 0.45, 0.9],
    "outcome_only": [0.25, 0.20, 0.30, 0.1],
    "other": [0.0, 0.0, 0.0, 0.0],
}
"""Per seed; the differences over seeds 0-2 are 0.25, 0.10, 0.15: mean 0.1667, SD 0.0764."""


def _plan(tmp_path: Path, text: str = EXPERIMENT) -> tuple[Path, ExperimentConfig, list[RunSpec]]:
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(text))
    spec = load_experiment(path)
    return path, spec, plan_runs(spec, path, tmp_path / "out")


def _record(records: Records, run: RunSpec) -> None:
    """A finished run's record: two held-out evaluations, the last one final."""
    final = FINALS[run.arm][run.seed]
    run_dir = run.config.run_dir
    run_dir.mkdir(parents=True)
    lines = [{"step": 0, "eval/accuracy": 0.0}, {"step": 1, "eval/accuracy": final}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    records.keep(run, 1.0)


def test_the_look_reads_the_spread_decides_and_is_kept(tmp_path: Path) -> None:
    path, spec, runs = _plan(tmp_path)
    records = Records(tmp_path / "records")
    for run in runs[:6]:  # seeds 0-2, both arms: the blocks the look needs
        _record(records, run)
    look = take_look(spec, runs, records)
    assert look.pair == ("coach", "outcome_only") and look.seeds == [0, 1, 2]
    assert look.sd == pytest.approx(0.076376, abs=1e-6)  # statistics.stdev of 0.25, 0.1, 0.15
    assert (look.planned, look.decided) == (4, 6)  # above 0.05, not above 0.2
    printed = "\n".join(look_lines(look, spec, path))
    assert "SD of the per-seed differences 0.076" in printed
    assert f"set seeds: [0, 1, 2, 3, 4, 5] in {path}" in printed
    assert "0.167" not in printed and "0.17" not in printed  # the mean is never shown
    kept = json.loads((records.root / LOOK_FILE).read_text())
    assert "mean" not in kept and kept["sd"] == look.sd
    # once: a second call shows the kept look, even when the records have moved on since
    _record(records, runs[6])
    assert take_look(spec, runs, records) == look == read_look(records.root)
    # the file raised to the seeds the look asked for: the same look, nothing left to do
    grown = EXPERIMENT.replace("seeds: [0, 1, 2, 3]", "seeds: [0, 1, 2, 3, 4, 5]")
    path, spec6, runs6 = _plan(tmp_path, grown)
    assert take_look(spec6, runs6, records) == look
    assert look_lines(look, spec6, path)[-1] == f"decision: 6 seeds; {path} runs them already"
    # a rule edited after the look does not get a second one
    _, edited, _ = _plan(tmp_path, EXPERIMENT.replace("0.05: 6", "0.06: 6"))
    with pytest.raises(ExperimentError, match=r"a look is taken once, so restore the file's"):
        take_look(edited, runs, records)
    section = "\n".join(look_section(kept))
    assert "was 0.076 (their mean was not read); it decided 6 seeds (4 planned)" in section


def test_a_look_that_keeps_the_plan_says_so(tmp_path: Path) -> None:
    path, spec, runs = _plan(tmp_path, EXPERIMENT.replace("0.05: 6", "0.1: 6"))
    records = Records(tmp_path / "records")
    for run in runs[:6]:
        _record(records, run)
    look = take_look(spec, runs, records)
    assert look.decided == 4
    assert look_lines(look, spec, path)[-1] == "decision: 4 seeds; the file's seeds stand"


def test_no_look_before_the_blocks_are_complete(tmp_path: Path) -> None:
    """Every arm of the looked-at seeds, not only the primary's two: complete blocks."""
    third = "      other: [rl.lr=3e-5]\n    analysis:"
    _, spec, runs = _plan(tmp_path, EXPERIMENT.replace("    analysis:", third))
    records = Records(tmp_path / "records")
    for run in runs[:8]:  # seeds 0-2 of coach and outcome_only, other-s2 missing
        _record(records, run)
    with pytest.raises(ExperimentError, match=r"\[0, 1, 2\] are complete; .*: other-s2$"):
        take_look(spec, runs, records)
    assert not (records.root / LOOK_FILE).exists()


def test_a_file_without_a_look_is_refused(tmp_path: Path) -> None:
    text = EXPERIMENT.replace(
        "      look: {after_seeds: 3, seeds_if_sd_above: {0.05: 6, 0.2: 9}}\n", ""
    )
    _, spec, runs = _plan(tmp_path, text)
    with pytest.raises(ExperimentError, match="states no look"):
        take_look(spec, runs, Records(tmp_path / "records"))


@pytest.mark.parametrize(
    ("look", "message"),
    [
        ("{after_seeds: 4, seeds_if_sd_above: {0.05: 6}}", "before the last of the 4 seeds"),
        ("{after_seeds: 1, seeds_if_sd_above: {0.05: 6}}", "after_seeds: Input should be"),
        ("{after_seeds: 3, seeds_if_sd_above: {0.05: 3}}", r"\[3\] seeds is not more than"),
        ("{after_seeds: 3, seeds_if_sd_above: {0: 6}}", "thresholds are SDs > 0"),
        ("{after_seeds: 3}", "seeds_if_sd_above: Field required"),
    ],
)
def test_a_look_that_cannot_work_is_refused(tmp_path: Path, look: str, message: str) -> None:
    text = EXPERIMENT.replace("{after_seeds: 3, seeds_if_sd_above: {0.05: 6, 0.2: 9}}", look)
    with pytest.raises(ExperimentError, match=message):
        _plan(tmp_path, text)


def test_a_look_needs_a_primary(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="look reads the primary comparison's spread"):
        _plan(tmp_path, EXPERIMENT.replace("      primary: [coach, outcome_only]\n", ""))


def test_the_command_looks_and_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mappa.cli import main

    path, _, runs = _plan(tmp_path)
    records = Records(tmp_path / "records")
    args = ["experiment", str(path), "--out", str(tmp_path / "out"), "--records"]
    assert main([*args, str(records.root), "--look"]) == 2
    assert capsys.readouterr().err.startswith("mappa: the look comes after seed blocks")
    for run in runs[:6]:
        _record(records, run)
    assert main([*args, str(records.root), "--look"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[2].startswith("decision: 6 seeds; set seeds")
    assert not (tmp_path / "out" / "results.md").exists()


def test_round_3s_look_is_the_one_its_preregistration_states() -> None:
    """docs/results.md, written before the first run: after the fourth complete block, SD
    above 0.08: 8 seeds, above 0.10: 10, otherwise 6; the look on file was taken with 6
    planned, and the file now runs the seeds it decided."""
    repo = Path(__file__).resolve().parents[2]
    spec = load_experiment(repo / "configs" / "experiments" / "credit_controls_cpu.yaml")
    look = spec.analysis.look
    assert look is not None and spec.analysis.primary == ("coach", "outcome_only")
    assert (look.after_seeds, look.seeds_if_sd_above) == (4, {0.08: 8, 0.1: 10})
    taken = read_look(repo / "docs" / "results" / "credit_controls_cpu")
    assert taken is not None and (taken.seeds, taken.planned) == ([0, 1, 2, 3], 6)
    assert spec.seeds == list(range(taken.decided))
