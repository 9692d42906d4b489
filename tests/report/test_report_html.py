"""`mappa report` without a browser: reading runs (also while written), coach statistics,
the page's charts, escaping, regeneration and the CLI. The browser test is
``test_report_browser.py``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from report_runs import AGENTS, PAYLOAD, write_run

from mappa.cli import main
from mappa.report.charts import Series, line_chart
from mappa.report.coachstats import coach_summary, separation
from mappa.report.html import CURVES, curve_series, write_report
from mappa.report.rundata import ScoreRecord, load_run, run_labels


def _step_payload(path: Path) -> list[dict]:
    """The episodes a step file hands to ``mappaStep(run, step, [...])``."""
    text = path.read_text()
    match = re.fullmatch(r"mappaStep\((\d+),(\d+),(.*)\);\n", text, re.S)
    assert match, text[:80]
    return json.loads(match.group(3))


def test_a_run_being_written_reads_without_its_torn_lines(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "run", steps=2, torn=True))
    assert run.agents == list(AGENTS)
    assert [r["step"] for r in run.metrics] == [0, 1]
    assert sorted(run.steps) == [0, 1] and all(len(v) == 4 for v in run.steps.values())
    act = run.steps[0][0]["acts"][1]
    assert act["agent"] == "code_executor" and act["tool"].startswith("17") and act["ntok"] == 7
    assert "prompt_ids" not in act and "completion_ids" not in act  # token ids are not shown
    finals = [s for s in run.scores if s.final]
    assert len(finals) == 8 and all(s.agent == "verifier" for s in finals)


def test_missing_run_dir_is_a_clear_error(tmp_path: Path) -> None:
    """Each says what the path is instead, and what to give."""
    fix = "give a run directory `mappa train` wrote (its run_dir)"
    cases = {
        tmp_path / "nope": f"no such run directory; {fix}",
        tmp_path / "empty": f"not a run (no metrics.jsonl or episodes.jsonl); {fix}, after its "
        "first step",
        tmp_path / "a-file": f"is a file; {fix}",
    }
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("")
    for path, problem in cases.items():
        with pytest.raises(FileNotFoundError) as err:
            load_run(path)
        assert str(err.value) == f"{path}: {problem}"


def test_run_labels_disambiguate_same_names(tmp_path: Path) -> None:
    assert run_labels([tmp_path / "a" / "run", tmp_path / "b" / "run", tmp_path / "c"]) == [
        "a/run",
        "b/run",
        "c",
    ]


def _rec(value: float, correct: bool) -> ScoreRecord:
    return ScoreRecord(0, "verifier", "t", value, False, "", False, True, correct, None)


def test_separation_warns_when_scores_do_not_tell_right_from_wrong() -> None:
    good = separation([_rec(9, True), _rec(8, True), _rec(2, False), _rec(3, False)])
    assert good.warning is None and good.r is not None and good.r > 0.9
    assert good.confusion == {"right/good": 2, "right/bad": 0, "wrong/good": 0, "wrong/bad": 2}
    flat = separation([_rec(7, True), _rec(6, True), _rec(7, False), _rec(6.5, False)])
    assert flat.warning and "barely separates" in flat.warning
    one_sided = separation([_rec(7, False), _rec(2, False)])
    assert one_sided.warning and "every graded answer was wrong" in one_sided.warning


def test_coach_summary_counts_flagged_and_accounting(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "run", steps=2))
    summary = coach_summary(run.scores, run.metrics)
    assert summary.flagged_by_reason == {"unavailable": 2}
    assert summary.by_agent["verifier"].n == 6  # the flagged ones are left out
    assert summary.totals["calls"] == 24 and summary.totals["flagged"] == 1
    # ANSWER_CORRECT said "right" for a wrong answer once per step
    assert summary.separation.verdict_confusion["wrong/good"] == 2


def test_coach_health_summary_latest_mean_and_streak(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "run", steps=2))
    assert run.warn_no_signal_steps == 3  # an older config without the key: the default
    summary = coach_summary(run.scores, run.metrics, run.agents, run.warn_no_signal_steps)
    assert list(summary.health) == list(AGENTS)
    ps, v = summary.health["problem_solver"], summary.health["verifier"]
    assert (ps.signal_steps, ps.steps, ps.longest_streak) == (0, 2, 2)
    assert ps.latest["mode_share"] == 1.0 and ps.mean["tie_rate"] == 1.0
    assert ps.latest["digit_mass"] is None and ps.mean["digit_mass"] is None  # never known
    assert (v.signal_steps, v.steps, v.longest_streak) == (2, 2, 0)
    assert v.latest["digit_mass"] == pytest.approx(0.8)
    assert v.mean["digit_mass"] == pytest.approx(0.85)
    assert summary.health_warnings == []  # a streak of 2 < 3
    assert coach_summary(run.scores, run.metrics).health == {}  # no agents asked: none


def test_coach_health_warns_when_a_streak_reached_the_threshold(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "run", steps=2, warn_no_signal_steps=2))
    assert run.warn_no_signal_steps == 2
    summary = coach_summary(run.scores, run.metrics, run.agents, run.warn_no_signal_steps)
    assert [w.split(":")[0] for w in summary.health_warnings] == [
        "problem_solver",
        "code_executor",
    ]
    assert "no usable signal for 2 consecutive steps" in summary.health_warnings[0]
    assert "mappa coach-check" in summary.health_warnings[0]
    never = load_run(write_run(tmp_path / "never", steps=4, warn_no_signal_steps=0))
    assert not coach_summary(never.scores, never.metrics, never.agents, 0).health_warnings


def test_report_shows_the_coach_health_table_and_warning(tmp_path: Path) -> None:
    text = write_report([write_run(tmp_path / "run", steps=3)], tmp_path / "out").read_text()
    coach = text.split('id="view-coach"')[1].split('id="view-episodes"')[0]
    assert "coach health per agent" in coach
    for header in ("steps with signal / scored", "tie rate", "mode share", "digit mass"):
        assert header in coach, header
    assert "<td>verifier</td><td>3 / 3</td><td>7.00 / 7.00</td>" in coach
    assert "<td>problem_solver</td><td>0 / 3</td><td>0.00 / 0.00</td>" in coach
    assert "<td>0.70 / 0.80</td>" in coach  # the verifier's digit mass: latest / mean
    warnings = re.findall(r'<div class="warning">([^<]*)</div>', coach)
    assert any(w.startswith("problem_solver: its coach scores carried no") for w in warnings)
    assert any(w.startswith("code_executor:") for w in warnings)
    assert not any(w.startswith("verifier:") for w in warnings)
    curves = text.split('id="view-curves"')[1].split('id="view-coach"')[0]
    assert "coach score spread per agent" in curves
    assert "coach probability on a score per agent" in curves
    quiet = write_report([write_run(tmp_path / "ok", steps=2)], tmp_path / "ok-out").read_text()
    assert "coach health per agent" in quiet and "carried no usable signal" not in quiet


def test_line_chart_is_labelled_svg_with_ids_of_its_own() -> None:
    a = line_chart(
        "coach score", "score", [Series("x", [0, 1], [1, 2]), Series("y", [0], [3])], "c0"
    )
    b = line_chart("coach score", "score", [Series("x", [0, 1], [1, 2])], "c1")
    assert a.startswith("<svg") and "<?xml" not in a
    for text in ("coach score", "step", "score", ">x<", ">y<"):
        assert text in a, text
    ids_a, ids_b = set(re.findall(r'id="([^"]+)"', a)), set(re.findall(r'id="([^"]+)"', b))
    assert ids_a and not ids_a & ids_b
    assert all(i.startswith("c0-") for i in ids_a)


def test_overlaid_runs_share_a_chart_one_style_per_run(tmp_path: Path) -> None:
    runs = [load_run(write_run(tmp_path / n), n) for n in ("process", "outcome")]
    coach = next(c for _, cs in CURVES for c in cs if c.title.startswith("coach score"))
    series = curve_series(coach, runs, list(AGENTS))
    assert len(series) == 6
    assert {s.label for s in series} >= {"process · verifier", "outcome · problem_solver"}
    assert {s.style for s in series if s.label.startswith("outcome")} == {1}


def test_report_escapes_everything_it_shows(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run-<i>x<i>")
    page = write_report([run_dir], tmp_path / "out")
    text = page.read_text()
    assert "__pwned" not in text  # no agent text is inlined in the page at all
    assert "run-&lt;i&gt;x&lt;i&gt;" in text and "run-<i>" not in text.split("<script")[0]
    data = text.split('id="mappa-data">')[1].split("</script>")[0]
    assert "<" not in data and json.loads(data)["runs"][0]["label"] == "run-<i>x<i>"
    for step_file in sorted((tmp_path / "out" / "steps").glob("*.js")):
        raw = step_file.read_text()
        assert "<" not in raw  # written as \u003c: nothing can close a script element
        episodes = _step_payload(step_file)
        assert episodes[0]["task"].endswith(PAYLOAD)  # shown as text, unchanged
        assert episodes[0]["acts"][1]["score"]["why"].startswith("rationale for code_executor")
    js = (Path(__file__).parents[2] / "src/mappa/report/static/report.js").read_text()
    assert "innerHTML" not in js and "insertAdjacentHTML" not in js and "eval(" not in js
    assert "</script" not in js and "<!--" not in js  # it is inlined in a <script> element


def test_held_out_episodes_are_a_set_of_their_own(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", steps=2)
    held = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    (run_dir / "heldout_episodes.jsonl").write_text(
        "".join(json.dumps({**e, "episode_id": "h-" + e["episode_id"]}) + "\n" for e in held[4:6])
    )
    text = write_report([run_dir], tmp_path / "out").read_text()
    data = json.loads(text.split('id="mappa-data">')[1].split("</script>")[0])
    assert [r["label"] for r in data["runs"]] == ["run", "run (held-out)"]
    assert data["runs"][1]["steps"] == [{"step": 1, "n": 2, "file": "steps/r1-s00001.js"}]
    assert [e["id"] for e in _step_payload(tmp_path / "out/steps/r1-s00001.js")] == [
        "h-s1-e0",
        "h-s1-e1",
    ]
    assert len(load_run(run_dir).scores) == 24  # held-out episodes are no coach statistics


def test_a_run_before_its_first_metrics_line(tmp_path: Path) -> None:
    """Episodes are written before the step's metrics line: the report shows them already."""
    run_dir = write_run(tmp_path / "run", steps=1)
    (run_dir / "metrics.jsonl").unlink()
    text = write_report([run_dir], tmp_path / "out").read_text()
    assert "no step has finished yet" in text
    assert (tmp_path / "out" / "steps" / "r0-s00000.js").is_file()


def test_report_sections_and_regeneration_during_a_run(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", steps=1, torn=True)
    out = tmp_path / "report"
    text = write_report([run_dir], out).read_text()
    for needle in (
        "coach score per agent",
        "clip fraction per agent",
        "phase times",
        "score &gt;= 5",
    ):
        assert needle in text, needle
    assert "flagged (fallbacks)" in text and "unavailable: 1" in text
    assert [p.name for p in sorted((out / "steps").glob("*.js"))] == ["r0-s00000.js"]
    write_run(run_dir, steps=3)  # the run went on: two more steps
    write_report([run_dir], out)
    names = [p.name for p in sorted((out / "steps").glob("*.js"))]
    assert names == ["r0-s00000.js", "r0-s00001.js", "r0-s00002.js"]
    write_run(tmp_path / "other", steps=1)
    write_report([tmp_path / "other"], out)  # a different run into the same dir: no leftovers
    assert [p.name for p in (out / "steps").glob("*.js")] == ["r0-s00000.js"]


def test_cli_report_defaults_and_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b")
    assert main(["report", str(a)]) == 0
    assert (a / "report" / "index.html").is_file()
    assert main(["report", str(a), str(b)]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "both")]) == 0
    assert main(["report", str(tmp_path / "missing")]) == 2
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert main(["report", str(a)]) == 2
    assert "pip install 'mappa-rl[report]'" in capsys.readouterr().err


def test_report_imports_no_torch(tmp_path: Path) -> None:
    """`mappa report` runs beside a training run: it must stay light."""
    run_dir = write_run(tmp_path / "run")
    code = (
        "import sys; from mappa.cli import main; "
        f"assert main(['report', {str(run_dir)!r}]) == 0; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_held_out_curve_starts_at_the_untrained_evaluation(tmp_path: Path) -> None:
    """The demo's one evaluation after its last step is one point; with the untrained
    team's (``eval_start/accuracy`` in step 0's line) the chart shows the change, by steps
    done, on a readable axis."""
    run_dir = write_run(tmp_path / "run")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("eval/accuracy", None)
    rows[0]["eval_start/accuracy"] = 0.1875
    rows[-1]["eval/accuracy"] = 0.625
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    heldout = next(c for _, cs in CURVES for c in cs if c.title == "held-out accuracy")
    [series] = curve_series(heldout, [load_run(run_dir, "run")], list(AGENTS))
    assert series.xs == [0.0, rows[-1]["step"] + 1.0] and series.ys == [0.1875, 0.625]
    assert "steps done" in line_chart("h", "accuracy", [series], "c9", "steps done")
