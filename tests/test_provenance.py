from __future__ import annotations

from pathlib import Path

import pytest

from mappa import provenance
from mappa.jsonl import append_jsonl
from mappa.provenance import CODE_LOG, note_code, run_code, source_revision


def test_source_revision_is_none_outside_a_git_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    revision = source_revision()
    assert revision is not None and len(revision.split("+")[0]) == 40  # tests run from one
    monkeypatch.setattr(provenance, "__file__", str(tmp_path / "mappa" / "provenance.py"))
    assert source_revision() is None  # e.g. mappa installed from a wheel


def test_run_code_is_what_the_run_noted_not_what_reads_it(tmp_path: Path) -> None:
    assert run_code(tmp_path) is None  # a run older than the log
    note_code(tmp_path, 0)
    assert run_code(tmp_path) == source_revision()
    note_code(tmp_path, 3)  # resumed under the same code: still one
    assert run_code(tmp_path) == source_revision()


def test_run_code_names_each_code_in_step_order_and_drops_what_a_resume_cut(
    tmp_path: Path,
) -> None:
    def noted(*rows: tuple[int, str | None]) -> str | None:
        path = tmp_path / CODE_LOG
        path.unlink(missing_ok=True)
        append_jsonl(path, [{"from_step": s, "code": c} for s, c in rows])
        return run_code(tmp_path)

    assert noted((0, "a"), (2, "b")) == "a then b"
    assert noted((0, "a"), (2, "b"), (4, "a")) == "a then b then a"
    # b ran from step 4 but crashed before a checkpoint; c resumed from step 2's
    assert noted((0, "a"), (4, "b"), (2, "c")) == "a then c"
    assert noted((0, "a"), (0, "b")) == "b"  # started over from nothing
    assert noted((0, None), (3, "b")) == "unknown then b"
    assert noted((0, None)) is None  # never run from a checkout


def test_each_start_notes_its_environment_and_a_resume_cut_drops_it(tmp_path: Path) -> None:
    from mappa.provenance import environment, run_environments

    env = environment()
    assert {"python", "machine", "cpu", "cpus", "torch", "transformers", "peft"} <= env.keys()
    assert run_environments(tmp_path) == []  # a run older than the field
    note_code(tmp_path, 0)
    note_code(tmp_path, 2)  # resumed on the same machine: one environment
    assert run_environments(tmp_path) == [env]

    def noted(*rows: tuple[int, dict[str, str] | None]) -> list[dict[str, str]]:
        path = tmp_path / CODE_LOG
        path.unlink(missing_ok=True)
        append_jsonl(path, [{"from_step": s, "code": "a", "env": e} for s, e in rows])
        return run_environments(tmp_path)

    old, new = {"torch": "2.13.0"}, {"torch": "2.14.1"}
    assert noted((0, old), (3, new)) == [old, new]
    assert noted((0, old), (4, new), (2, old)) == [old]  # new's steps were cut
    assert noted((0, None), (3, new)) == [new]  # the first start noted none


def test_environment_changes_name_each_difference_both_ways() -> None:
    from mappa.provenance import environment_changes

    assert environment_changes({"torch": "2.13.0"}, {"torch": "2.13.0"}) == []
    assert environment_changes({"vllm": "0.32.0", "cpu": "x"}, {"cpu": "y"}) == [
        "vllm 0.32.0 -> none",
        "cpu x -> y",
    ]
