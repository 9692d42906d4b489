"""From scored episodes to experience: the padded batch the update trains on.

The shape of OpenRLHF's experience maker, for MAPPA's REINFORCE++ (docs/design.md §1):

1. ``scored_actions``: the (episode, action) pairs that carry a coach score.
2. ``build_batch`` -> ``RolloutBatch``: completions padded to one width ``T``, the sampling
   log-probs, the masks, each action's scalar reward and its group ids.
3. ``step_layout``: each agent's rows as its update will take them: mini-batches (one
   optimizer step each, ``rl.mini_batch_size``), each cut into micro-batches.
4. ``behaviour_logprobs``: the old log-probs recomputed in the training layout, under
   ``no_grad``, before any optimizer step, each agent with its own adapter and in the very
   micro-batches its update will use (as verl and OpenRLHF recompute them). The PPO ratio
   and every KL are taken against these (docs/algorithm.md §2); the sampling log-probs stay
   in the record, their gap is logged, and truncated importance sampling (``rl.tis_cap``)
   corrects for it. ``needs_old_pass`` says when the pass is made: whenever the old
   log-probs are needed before the first step (any KL, several mini-batches). Otherwise
   the update's own forward supplies them: a single optimizer step per agent starts from
   the old policy, so its log-probs, detached, are exactly what a recompute would give
   (TRL's GRPO takes them the same way).
5. ``reference_logprobs``: the same tokens under the frozen reference (adapters off);
   skipped when the run applies no KL (beta = 0).
6. ``compute_advantages``: the per-token KL estimate log pi_old - log pi_ref (computed
   once, here), KL-shaped token rewards, then the configured estimator over the whole batch
   at once, so the whitening scope can span one agent, all agents, or (agent, task type).

``make_experience`` runs 2-6 and returns an ``Experience``; ``mappa.rl.update`` then takes
each agent's optimizer steps on its rows. Training tokens are exactly ``prompt_ids +
completion_ids`` of each action as sampled.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from mappa.config import RLConfig
from mappa.models.batching import token_batches
from mappa.models.interface import LogprobRequest, TokenLogprobs, TrainablePolicy
from mappa.records import Action, Episode
from mappa.rl.advantages import Estimate, EstimatorConfig, Groups, get_estimator
from mappa.rl.core import masked_mean, token_rewards
from mappa.rl.kl import LOG_RATIO_CLAMP, kl_estimate
from mappa.rl.rewards import mix_reward

GROUP_ESTIMATORS = ("grpo", "rloo")
"""Estimators whose baseline compares samples of the same task."""

Layout = list[list[list[int]]]
"""One agent's rows as its update takes them: mini-batches (one optimizer step each), each
a list of micro-batches (one forward/backward each), each a list of row indices."""


class StaleOldLogprobsError(RuntimeError):
    """An optimizer step would take its old log-probs from its own forward after the policy
    already stepped on this experience: its ratio would be 1 against a policy that is no
    longer the old one, an unclipped update."""


@dataclass
class RolloutBatch:
    """Every trainable action of a step, padded to one width ``T``."""

    actions: list[Action]
    agents: list[str]
    sample: torch.Tensor  # (B, T) sampling log-probs, as recorded with each action
    valid: torch.Tensor  # (B, T) 1 on real completion tokens
    loss_mask: torch.Tensor  # (B, T) valid minus masked-out truncated completions
    groups: Groups

    def rows(self, agent: str) -> list[int]:
        return [i for i, a in enumerate(self.agents) if a == agent]


@dataclass
class Experience(RolloutBatch):
    """A ``RolloutBatch`` with what the update needs; tensors ``(B, T)``, 0 on padding.

    Attributes:
        old: log-probs of the completion tokens under each agent's policy before its first
            optimizer step (the PPO ratio's denominator), recomputed in the training layout;
            ``None``: the update's single step per agent takes them from its own forward,
            micro-batch by micro-batch (``make_experience``).
        ref: log-probs under the frozen reference (``None`` when no KL is applied).
        kl: the per-token KL estimate ``rl.kl_estimator`` of old vs reference (``None``
            when no KL is applied; ``old`` is never ``None`` then).
        returns: returns-to-go of the KL-shaped token rewards.
        advantages: the estimator's advantages.
        signal: ``(B,)`` bool, rows whose reward differs from one they are compared with.
        is_weights: truncated importance weights min(exp(old - sample), rl.tis_cap) on valid
            tokens (``None`` when ``rl.tis_cap`` is null or ``old`` is ``None``: the update
            then weighs each micro-batch from its own forward).
        counts: the estimator's degenerate-case counts (``rl/<key>`` in the log).
        layout: each agent's ``Layout`` (``step_layout``): every pass over its rows (old,
            reference and trained log-probs) follows it.
        stepped: the agents that have taken an optimizer step on this experience; where
            ``old`` is ``None`` no step may follow one (``check_own_forward``).
    """

    old: torch.Tensor | None
    ref: torch.Tensor | None
    kl: torch.Tensor | None
    returns: torch.Tensor
    advantages: torch.Tensor
    signal: torch.Tensor
    is_weights: torch.Tensor | None
    counts: dict[str, int]
    layout: dict[str, Layout]
    stepped: set[str] = field(default_factory=set)

    def check_own_forward(self, agent: str) -> None:
        """Refuse an optimizer step for ``agent`` that would take its old log-probs from its
        own forward after ``agent`` already stepped on this experience.

        Raises ``StaleOldLogprobsError``: only the first step may read the old policy off
        its own forward; a later one needs ``old`` from the pass before the first step.
        """
        if self.old is None and agent in self.stepped:
            raise StaleOldLogprobsError(
                f"agent {agent!r} already took an optimizer step on this experience and it "
                "has no old log-probs from before that step: build the experience with the "
                "pre-step pass (make_experience(..., recompute_old=True)) to step again"
            )

    def mean_kl(self, rows: Sequence[int] | None = None) -> float | None:
        """Mean KL estimate over the real completion tokens of ``rows`` (default: all);
        ``None`` when the run applies no KL (it was not measured)."""
        if self.kl is None:
            return None
        if rows is None:
            return float(masked_mean(self.kl, self.valid))
        idx = list(rows)
        return float(masked_mean(self.kl[idx], self.valid[idx]))

    def sampler_gap(self, cap: float | None) -> SamplerGap:
        """The recomputed old log-probs against the sampling ones over every real completion
        token (empty when ``old`` is ``None``: the update measures it then)."""
        gap = SamplerGap()
        if self.old is not None:
            gap.add(self.old, self.sample, self.valid, cap)
        return gap


@dataclass
class SamplerGap:
    """How far the trainer's log-probs of the sampled tokens are from the sampler's, summed
    over the tokens measured (``add`` once per micro-batch, ``merge`` across agents): logged
    as ``rl/logprob_gap_max``, ``rl/logprob_gap_mean`` and, with ``rl.tis_cap``,
    ``rl/tis_capped_frac`` (the share of tokens whose importance weight hit the cap)."""

    max: float = 0.0
    total: float = 0.0
    tokens: int = 0
    capped: int = 0

    def add(
        self, trainer: torch.Tensor, sample: torch.Tensor, mask: torch.Tensor, cap: float | None
    ) -> None:
        diff = (trainer - sample) * mask
        self.max = max(self.max, float(diff.abs().max()))
        self.total += float(diff.abs().sum())
        self.tokens += int(mask.sum())
        if cap is not None:
            over = torch.clamp(diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) > math.log(cap)
            self.capped += int((over * mask.bool()).sum())

    def merge(self, other: SamplerGap) -> SamplerGap:
        return SamplerGap(
            max(self.max, other.max),
            self.total + other.total,
            self.tokens + other.tokens,
            self.capped + other.capped,
        )

    def metrics(self, cap: float | None) -> dict[str, float]:
        """The ``rl/`` keys; none when no token was measured."""
        if not self.tokens:
            return {}
        out = {"rl/logprob_gap_max": self.max, "rl/logprob_gap_mean": self.total / self.tokens}
        if cap is not None:
            out["rl/tis_capped_frac"] = self.capped / self.tokens
        return out


def scored_actions(
    episodes: Sequence[Episode], exclude_flagged: bool, needs_score: bool = True
) -> list[tuple[Episode, Action]]:
    """(episode, action) pairs to train on: those with a coach score, minus flagged scores if
    excluded; every action when the reward needs no score (``RLConfig.needs_coach`` false:
    ``outcome_only``, or ``w_process`` 0; no coach is asked, so none can drop an action)."""
    if not needs_score:
        return [(e, a) for e in episodes for a in e.actions]
    return [
        (e, a)
        for e in episodes
        for a in e.actions
        if a.coach is not None and not (exclude_flagged and a.coach.flagged)
    ]


def task_key(ep: Episode) -> Hashable:
    """What makes two episodes samples of the same task: its id *and* its content, so two
    different tasks that happen to share an id (two data sets) never share a group."""
    return (ep.task_id, ep.task, ep.answer, ep.task_type)


def check_group_sizes(episodes: Sequence[Episode], advantage: str) -> None:
    """A group baseline (``grpo``, ``rloo``) needs every task sampled at least twice.

    Raises ``ValueError`` naming the fix when a task of the step has a single episode: its
    group baseline would be itself, and its actions would silently carry no signal.
    """
    if advantage not in GROUP_ESTIMATORS:
        return
    counts = Counter(task_key(ep) for ep in episodes)
    single = [key for key, n in counts.items() if n < 2]
    if single:
        first = next(ep.task_id for ep in episodes if task_key(ep) == single[0])
        raise ValueError(
            f"rl.advantage={advantage} compares samples of the same task, but {len(single)} "
            f"of {len(counts)} tasks in this step were sampled once (e.g. task {first!r}): "
            "set train.samples_per_prompt >= 2"
        )


def _pad(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.float32)
    return out


def _ids(keys: Sequence[Hashable]) -> torch.Tensor:
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)


def build_batch(items: Sequence[tuple[Episode, Action]], cfg: RLConfig) -> RolloutBatch:
    """Tensors and group ids for scored actions (``items``: (episode, action) pairs)."""
    if not items:
        raise ValueError("no scored actions to train on")
    actions = [a for _, a in items]
    width = max(len(a.completion_ids) for a in actions)
    lengths = torch.tensor([len(a.completion_ids) for a in actions])
    valid = (torch.arange(width)[None, :] < lengths[:, None]).float()
    keep = torch.tensor([0.0 if (cfg.mask_truncated and a.truncated) else 1.0 for a in actions])
    outcomes = [None if ep.correct is None else float(ep.correct) for ep, _ in items]
    if cfg.advantage == "outcome_only":  # the reward used, and logged, is the outcome itself
        rewards = [o or 0.0 for o in outcomes]
    else:
        rewards = [
            mix_reward(
                a.coach.value if a.coach else 0.0, o, cfg.w_process, cfg.w_outcome, cfg.reward_clip
            )
            for (_, a), o in zip(items, outcomes, strict=True)
        ]
    scope_keys: dict[str, Callable[[Episode, Action], Hashable]] = {
        "agent": lambda ep, a: a.agent,
        "global": lambda ep, a: 0,
        "agent_tasktype": lambda ep, a: (a.agent, ep.task_type),
    }
    scope_key = scope_keys[cfg.norm_scope]
    groups = Groups(
        prompt=_ids([(task_key(ep), a.agent, a.turn) for ep, a in items]),
        scope=_ids([scope_key(ep, a) for ep, a in items]),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        outcomes=torch.tensor([o or 0.0 for o in outcomes], dtype=torch.float32),
    )
    return RolloutBatch(
        actions=actions,
        agents=[a.agent for a in actions],
        sample=_pad([a.sample_logprobs for a in actions], width),
        valid=valid,
        loss_mask=valid * keep[:, None],
        groups=groups,
    )


def fit_width(x: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad a (B, T') tensor with zeros to (B, width)."""
    return x if x.shape[1] == width else torch.nn.functional.pad(x, (0, width - x.shape[1]))


def step_layout(rows: Sequence[int], cfg: RLConfig, actions: Sequence[Action], seed: str) -> Layout:
    """An agent's rows cut into mini-batches of ``rl.mini_batch_size`` rows (one optimizer
    step each; shuffled first with a generator seeded by ``seed``, so a run is
    reproducible and a step's mini-batches mix tasks), each cut into micro-batches. All rows
    in one mini-batch, in their own order, when ``mini_batch_size`` is null or not smaller.

    >>> from types import SimpleNamespace as A
    >>> acts = [A(prompt_ids=[0], completion_ids=[0])] * 5
    >>> [len(m) for m in step_layout(range(5), RLConfig(micro_batch_size=4), acts, "s")]
    [2]
    >>> cfg = RLConfig(micro_batch_size=4, mini_batch_size=2)
    >>> [sum(map(len, m)) for m in step_layout(range(5), cfg, acts, "s")]
    [2, 2, 1]
    """
    size = cfg.mini_batch_size
    if size is None or len(rows) <= size:
        return [micro_batches(rows, cfg.micro_batch_size, actions, cfg.micro_batch_tokens)]
    order = list(rows)
    random.Random(seed).shuffle(order)
    return [
        micro_batches(order[i : i + size], cfg.micro_batch_size, actions, cfg.micro_batch_tokens)
        for i in range(0, len(order), size)
    ]


def shuffle_seed(run_seed: int, step: int) -> str:
    """The mini-batch shuffle's seed at training step ``step`` of a run seeded ``run_seed``:
    a resumed run cuts the same mini-batches, and no two steps share an order."""
    return f"{run_seed}/{step}"


def needs_old_pass(cfg: RLConfig, beta: float, several_steps: bool) -> bool:
    """Whether the old log-probs must come from a no-grad pass before any optimizer step:
    when asked (``rl.recompute_old_logprobs: always``), when a KL is applied (the KL rule,
    docs/algorithm.md §2: its policy side is the trainer's old log-probs, which the reward
    and the adaptive beta read before any step), or when an agent takes several steps
    (``several_steps``: every step after the first needs the policy from before the first).

    >>> needs_old_pass(RLConfig(kl_beta=0.0), 0.0, several_steps=False)
    False
    >>> needs_old_pass(RLConfig(kl_beta=0.0), 0.0, several_steps=True)
    True
    """
    return cfg.recompute_old_logprobs == "always" or beta > 0 or several_steps


def micro_batches(
    rows: Sequence[int],
    size: int,
    actions: Sequence[Action],
    max_tokens: int | None = None,
) -> list[list[int]]:
    """An agent's rows in the chunks every pass over them uses (old, reference and trained
    log-probs), so each token's old and reference log-probs come from the very forward-pass
    layout it is trained in. Rows are bucketed by length, longest first, so a chunk pads
    little; a chunk holds at most ``size`` rows and (with ``max_tokens``,
    ``rl.micro_batch_tokens``) at most ``max_tokens`` positions counted as rows x its
    longest row, a longer row alone. The loss sums over chunks, so the grouping does not
    change the update.

    >>> from types import SimpleNamespace as A
    >>> acts = [A(prompt_ids=[0] * n, completion_ids=[0]) for n in (1, 9, 4, 7, 2)]
    >>> micro_batches([0, 1, 2, 3, 4], 2, acts)
    [[1, 3], [2, 4], [0]]
    >>> micro_batches([0, 1, 2, 3, 4], 4, acts, max_tokens=10)
    [[1], [3], [2, 4], [0]]
    """
    lengths = [len(actions[r].prompt_ids) + len(actions[r].completion_ids) for r in rows]
    return [[rows[j] for j in batch] for batch in token_batches(lengths, size, max_tokens)]


def action_logprobs(
    policy: TrainablePolicy,
    agent: str | None,
    actions: Sequence[Action],
    temperature: float,
    with_entropy: bool = False,
) -> TokenLogprobs:
    """Log-probs of the actions' completions exactly as sampled (their own token ids)."""
    return policy.completion_logprobs(
        agent,
        [a.prompt_ids for a in actions],
        [a.completion_ids for a in actions],
        temperature,
        with_entropy=with_entropy,
    )


def _recomputed_logprobs(
    policy: TrainablePolicy,
    batch: RolloutBatch,
    layout: Mapping[str, Layout],
    temperature: float,
    reference: bool,
) -> torch.Tensor:
    """Each agent's rows, in the micro-batches of its ``layout``, under its own adapter or
    (``reference``) under the frozen base; no grad, 0 on padding."""
    out = torch.zeros_like(batch.sample)
    width = out.shape[1]
    chunks = [
        (agent, idx)
        for agent in dict.fromkeys(batch.agents)
        for idx in (micro for mini in layout[agent] for micro in mini)
    ]
    requests = [
        LogprobRequest(
            None if reference else agent,
            agent,
            [list(batch.actions[i].prompt_ids) for i in idx],
            [list(batch.actions[i].completion_ids) for i in idx],
        )
        for agent, idx in chunks
    ]
    with torch.no_grad():
        many = getattr(policy, "completion_logprobs_many", None)
        if many is not None:  # a ConcurrentLogprobs: every pass at once
            results = many(requests, temperature)
        else:
            results = [
                policy.completion_logprobs(r.agent, r.prompt_ids, r.completion_ids, temperature)
                for r in requests
            ]
        for (_, idx), lp in zip(chunks, results, strict=True):
            out[idx] = fit_width(lp.logprobs.detach().float().cpu(), width)
    return out * batch.valid


def behaviour_logprobs(
    policy: TrainablePolicy,
    batch: RolloutBatch,
    layout: Mapping[str, Layout],
    temperature: float,
) -> torch.Tensor:
    """Old log-probs recomputed under ``no_grad``: each agent's rows with its own adapter."""
    return _recomputed_logprobs(policy, batch, layout, temperature, reference=False)


def reference_logprobs(
    policy: TrainablePolicy,
    batch: RolloutBatch,
    layout: Mapping[str, Layout],
    temperature: float,
) -> torch.Tensor:
    """Log-probs of every completion under the frozen reference (adapters off), in the same
    micro-batches as the old log-probs."""
    return _recomputed_logprobs(policy, batch, layout, temperature, reference=True)


def tis_weights(
    old: torch.Tensor, sample: torch.Tensor, valid: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance weights min(exp(old - sample), cap), 0 on padding.

    The log-ratio is clamped to [-20, 20] first (as verl does), so an infinite sampling
    log-prob cannot make a weight inf or nan.

    >>> tis_weights(torch.tensor([[0.0, 1.0, -1.0]]), torch.zeros(1, 3), torch.ones(1, 3), 2.0)
    tensor([[1.0000, 2.0000, 0.3679]])
    """
    ratio = torch.exp(torch.clamp(old - sample, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return torch.clamp(ratio, max=cap) * valid


def compute_advantages(
    batch: RolloutBatch,
    old: torch.Tensor | None,
    ref: torch.Tensor | None,
    cfg: RLConfig,
    beta: float,
) -> tuple[Estimate, torch.Tensor | None]:
    """(estimate, kl): KL-shaped token rewards, then the configured estimator.

    ``kl`` is the per-token estimate of log pi_old - log pi_ref, both the trainer's in the
    training layout (the KL rule, docs/algorithm.md §2), 0 on padding (``None`` without a
    reference). It goes into the token rewards with weight ``beta`` unless
    ``cfg.kl_in_loss`` puts it in the loss.

    Raises ``ValueError`` when ``ref`` is given without ``old``: the sampling log-probs
    never stand in for the trainer's.
    """
    if ref is None:
        kl = None
        r = token_rewards(batch.groups.rewards, torch.zeros_like(batch.valid), batch.valid, 0.0)
    else:
        if old is None:
            raise ValueError(
                "a KL needs the trainer's old log-probs (docs/algorithm.md §2): make them "
                "with behaviour_logprobs before the first optimizer step"
            )
        kl = kl_estimate(old, ref, cfg.kl_estimator) * batch.valid
        reward_beta = 0.0 if cfg.kl_in_loss else beta
        r = token_rewards(batch.groups.rewards, kl, batch.valid, reward_beta)
    est = get_estimator(cfg.advantage)(
        r,
        batch.loss_mask,
        batch.groups,
        EstimatorConfig(cfg.gamma, cfg.whiten_eps, cfg.min_reward_spread),
    )
    return est, kl


def make_experience(
    policy: TrainablePolicy,
    items: Sequence[tuple[Episode, Action]],
    cfg: RLConfig,
    beta: float,
    temperature: float,
    recompute_old: bool = False,
    seed: str = "",
) -> Experience:
    """Scored actions -> padded batch, step layout, old and reference log-probs, KL,
    returns, advantages and importance weights.

    The old log-probs are recomputed before any step where ``needs_old_pass`` says so, or
    with ``recompute_old``; otherwise ``old`` is ``None`` (no KL, one step per agent) and
    the update's own forward supplies them and the importance weights. ``seed`` seeds the
    mini-batch shuffle (``step_layout``; each agent's with its name appended).
    """
    batch = build_batch(items, cfg)
    layout = {
        agent: step_layout(batch.rows(agent), cfg, batch.actions, f"{seed}/{agent}")
        for agent in dict.fromkeys(batch.agents)
    }
    old = (
        behaviour_logprobs(policy, batch, layout, temperature)
        if recompute_old
        or needs_old_pass(cfg, beta, any(len(mini) > 1 for mini in layout.values()))
        else None
    )
    ref = None
    if beta > 0:
        ref = reference_logprobs(policy, batch, layout, temperature)
    est, kl = compute_advantages(batch, old, ref, cfg, beta)
    weights = (
        None
        if cfg.tis_cap is None or old is None
        else tis_weights(old, batch.sample, batch.valid, cfg.tis_cap)
    )
    return Experience(
        actions=batch.actions,
        agents=batch.agents,
        sample=batch.sample,
        valid=batch.valid,
        loss_mask=batch.loss_mask,
        groups=batch.groups,
        old=old,
        ref=ref,
        kl=kl,
        returns=est.returns,
        advantages=est.advantages,
        signal=est.signal,
        is_weights=weights,
        counts=est.counts,
        layout=layout,
    )
