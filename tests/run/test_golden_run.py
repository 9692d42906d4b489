"""A fixed-seed tiny run must write the same token ids and coach scores as the pinned one.

Refactors must not change behaviour: this run exercises task generation, prompt rendering,
sampling, the sandbox, the local coach and two REINFORCE++ updates (the second step samples
from the adapters the first step trained), so any change on that path shows up here as a
different token or score. When a change is *meant* to alter the numbers (a fix to the
update, say), regenerate the file with ``MAPPA_UPDATE_GOLDEN=1 pytest tests/run/test_golden_run.py``
and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import tiny_run_config

GOLDEN = Path(__file__).parents[1] / "data" / "golden_tiny_run.json"


def _fingerprint(episodes_path: Path) -> list[dict[str, object]]:
    """Per action: who acted, the exact completion ids, a hash of the prompt ids, the score."""
    rows = []
    for line in episodes_path.read_text().splitlines():
        ep = json.loads(line)
        for a in ep["actions"]:
            rows.append(
                {
                    "episode": ep["episode_id"],
                    "task": ep["task_id"],
                    "agent": a["agent"],
                    "turn": a["turn"],
                    "prompt_sha": hashlib.sha256(json.dumps(a["prompt_ids"]).encode()).hexdigest()[
                        :16
                    ],
                    "completion_ids": a["completion_ids"],
                    "score": round(a["coach"]["value"], 7),
                }
            )
    return rows


@pytest.mark.integration
def test_fixed_seed_tiny_run_matches_pinned_tokens_and_scores(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from mappa.run.loop import train

    run_dir = train(tiny_run_config(tiny_model_dir, tmp_path / "run"))
    got = _fingerprint(run_dir / "episodes.jsonl")
    if os.environ.get("MAPPA_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert {k: v for k, v in g.items() if k != "score"} == {
            k: v for k, v in w.items() if k != "score"
        }
        assert g["score"] == pytest.approx(w["score"], abs=1e-6), (
            g["episode"],
            g["agent"],
            g["turn"],
        )
