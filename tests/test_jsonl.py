"""Durable JSONL: a torn last line (a kill mid-append) is skipped by readers and cut off
before the next append; truncation back to an offset (resume)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mappa.jsonl import append_jsonl, read_jsonl, repair_jsonl, truncate_jsonl


def test_torn_last_line_is_skipped_with_a_warning_then_repaired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "m.jsonl"
    append_jsonl(path, [{"step": 0}, {"step": 1}])
    with path.open("a") as fh:
        fh.write('{"step": 2, "lo')  # killed mid-append
    with caplog.at_level(logging.WARNING, "mappa.jsonl"):
        assert read_jsonl(path) == [{"step": 0}, {"step": 1}]
    assert "torn" in caplog.text

    append_jsonl(path, [{"step": 2}])
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n{"step": 2}\n'
    assert read_jsonl(path) == [{"step": 0}, {"step": 1}, {"step": 2}]


def test_a_last_record_without_newline_counts_as_torn(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    assert read_jsonl(path) == [{"a": 1}]
    assert repair_jsonl(path) == len('{"a": 2}')
    assert path.read_text() == '{"a": 1}\n'
    assert repair_jsonl(path) == 0


def test_repair_of_a_file_that_is_one_torn_line_empties_it(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": ' + "x" * 100_000)  # longer than one backwards-search block
    assert repair_jsonl(path) > 100_000
    assert path.read_text() == ""
    assert repair_jsonl(tmp_path / "missing.jsonl") == 0


def test_a_bad_line_in_the_middle_is_corruption_and_raises(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2"):
        read_jsonl(path)


def test_truncate_cuts_back_to_an_offset(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    append_jsonl(path, [{"step": 0}])
    offset = path.stat().st_size
    append_jsonl(path, [{"step": 1}])
    truncate_jsonl(path, offset)
    assert read_jsonl(path) == [{"step": 0}]
    truncate_jsonl(path, offset + 100)  # past the end: unchanged
    truncate_jsonl(tmp_path / "missing.jsonl", 0)
    assert not (tmp_path / "missing.jsonl").exists()
