"""The command line's seams: version, help, and one-line errors that name the input and the
fix, all raised before any model loads."""

from __future__ import annotations

import pytest

import mappa
from mappa.cli import main


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"mappa {mappa.__version__}"


def test_help_opens_with_a_whole_plain_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    description = " ".join(out.split("\n\n")[1].split())  # the paragraph after the usage
    assert "``" not in out
    assert description[0].isupper() and description.endswith(".")
    assert "train" in description and "experiment" in description
