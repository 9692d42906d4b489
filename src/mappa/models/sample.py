"""The result of sampling, kept free of torch so the workflow can import it cheaply."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Sample:
    """One sampled completion: token-in, token-out.

    ``prompt_ids + completion_ids`` is exactly the sequence the policy saw and produced;
    ``logprobs[k]`` is the log-probability of ``completion_ids[k]`` under the distribution it
    was sampled from. A completion that hit the length limit has ``truncated=True``.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    truncated: bool
