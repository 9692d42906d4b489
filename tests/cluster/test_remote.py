"""The driver-side stand-ins over fake actor handles (no Ray started): which trainer each
of the experience's log-prob passes goes to, and that they are all in flight at once."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")

from mappa.cluster import remote  # noqa: E402
from mappa.models.interface import LogprobRequest, TokenLogprobs  # noqa: E402


class FakeMethod:
    """The fake of an actor method: ``.remote`` runs it at once and records the call."""

    def __init__(self, owner: FakeTrainerHandle) -> None:
        self.owner = owner

    def remote(self, agent: str | None, prompts: Any, completions: Any, *rest: Any) -> Any:
        self.owner.calls.append(agent)
        return TokenLogprobs(torch.full((len(prompts), 1), float(len(self.owner.calls))), None)


class FakeTrainerHandle:
    """The fake of one agent's trainer actor handle."""

    def __init__(self) -> None:
        self.calls: list[str | None] = []
        self.completion_logprobs = FakeMethod(self)


def test_reference_passes_go_to_each_rows_trainer_all_in_one_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[int] = []

    def fake_wait(refs: Any, what: str) -> Any:
        waits.append(len(refs))
        return refs

    monkeypatch.setattr(remote, "wait", fake_wait)
    trainers = {"solver": FakeTrainerHandle(), "verifier": FakeTrainerHandle()}
    policies = remote.RemotePolicies(trainers)
    requests = [
        LogprobRequest(agent, owner, [[1, 2]], [[3]])
        for owner in ("solver", "verifier")
        for agent in (owner, None, None)
    ]
    out = policies.completion_logprobs_many(requests, 1.0)
    assert len(out) == len(requests)
    assert trainers["solver"].calls == ["solver", None, None]
    assert trainers["verifier"].calls == ["verifier", None, None]  # not agent 0's trainer
    assert waits == [len(requests)]  # one wait: every pass submitted before any is awaited
