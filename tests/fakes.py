"""Fakes shared by unit tests of logic that sits above an interface (named as fakes).

``FakeScriptedPolicy`` implements ``mappa.models.interface.SamplingPolicy`` by answering
each agent's n-th call with a scripted message, so the pipeline runner, sandbox handoff and
token bookkeeping can be tested without a model deciding what to write. ``FakeCharChat``
is a chat format whose token ids are character codes. ``FakeTablePolicy`` implements
``TrainablePolicy`` with one trainable logit table per agent, so the update can be checked
without a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from mappa.models.interface import Sample, TokenLogprobs


class FakeScriptedPolicy:
    """Fake policy: answers each agent's n-th call with ``scripts[agent][n]``, encoded by
    ``encode`` (plus ``stop`` ids), every token with log-prob ``logprob``; records its inputs."""

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        scripts: dict[str, list[str]],
        stop: Sequence[int] = (),
        logprob: float = -0.5,
    ) -> None:
        self.encode, self.scripts, self.stop, self.logprob = encode, scripts, list(stop), logprob
        self.calls: dict[str, int] = {}
        self.seen: list[tuple[str, list[list[int]]]] = []

    def generate(
        self,
        agent: str | None,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        batch_size: int = 8,
        greedy: bool = False,
    ) -> list[Sample]:
        assert agent is not None
        n = self.calls.get(agent, 0)
        self.calls[agent] = n + 1
        self.seen.append((agent, [list(p) for p in prompts]))
        ids = self.encode(self.scripts[agent][n]) + self.stop
        return [Sample(list(p), list(ids), [self.logprob] * len(ids), False) for p in prompts]


class FakeCharChat:
    """Fake chat format: one token per character (id = code point), no template."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def prompt(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """A conversation: each message's content on a line of its own."""
        return self.encode("".join(f"{m['content']}\n" for m in messages))

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return "".join(map(chr, ids))

    def tool_turn(self, text: str, *, last_token: int | None = None) -> list[int]:
        return self.encode(f"\n{text}\n")


class FakeTablePolicy:
    """A ``TrainablePolicy`` fake: log pi(token) = log_softmax(table)[token], one trainable
    table per agent, all starting at the reference's (``agent=None``) fixed table."""

    def __init__(self, agents: Sequence[str], vocab: int = 8) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ref = torch.randn(vocab, generator=gen)
        self.tables = {a: torch.nn.Parameter(self.ref.clone()) for a in agents}
        self.calls: list[str | None] = []

    def completion_logprobs(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> TokenLogprobs:
        self.calls.append(agent)
        lp = torch.log_softmax(
            (self.ref if agent is None else self.tables[agent]) / temperature, -1
        )
        width = max(len(c) for c in completion_ids)
        out = torch.stack(
            [torch.cat([lp[list(c)], torch.zeros(width - len(c))]) for c in completion_ids]
        )
        entropy = -(lp.exp() * lp).sum().detach().expand_as(out) if with_entropy else None
        return TokenLogprobs(out, entropy)
