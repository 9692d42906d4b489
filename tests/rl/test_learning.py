"""The update on a real (tiny, random) model: it pushes the right way, and only where it
should. Completions are really sampled (the hf engine, ``HfEngine.generate``), so the sampling
log-probs are the sampler's own, not the trainer's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mappa.config import LoraConfig, RLConfig
from mappa.models.hf_engine import HfEngine
from mappa.models.loading import load_base
from mappa.models.policies import AgentPolicies
from mappa.records import Action, Episode, Score
from mappa.rl.kl import KLController
from mappa.rl.update import update_agents

AGENTS = ["solver", "executor", "verifier"]
QUESTIONS = [
    "Ava has 12 apples.",
    "Then they get 5 more apples.",
    "How many apples does Ava have now?",
    "Code output: 17.",
    "The answer is 17.",
    "You are the Verifier.",
]


def _policies(model_dir: Path) -> AgentPolicies:
    """Fresh adapters on the tiny base: step 0."""
    base, tok = load_base(str(model_dir), dtype="float32", device="cpu")
    return AgentPolicies(base, tok, AGENTS, LoraConfig())


def _adapters(policies: AgentPolicies) -> dict[str, list[torch.Tensor]]:
    return {n: [p.detach().clone() for p in policies.adapter_parameters(n)] for n in AGENTS}


def _identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _episodes(
    policies: AgentPolicies,
    scores: dict[str, list[float]],
    correct: bool | None = None,
    seed: int = 0,
) -> list[Episode]:
    """One episode per question; in it each agent in ``scores`` samples one completion (a
    real sample, with its sampling log-probs) scored ``scores[agent][i]``."""
    tok = policies.tokenizer
    prompts = [tok(q)["input_ids"] for q in QUESTIONS]
    episodes = [
        Episode(f"e{i}", f"t{i}", q, "17", correct=correct) for i, q in enumerate(QUESTIONS)
    ]
    torch.manual_seed(seed)
    for agent, values in scores.items():
        samples = HfEngine(policies).generate(agent, prompts, max_new_tokens=8, temperature=1.0)
        for ep, s, v in zip(episodes, samples, values, strict=True):
            ep.actions.append(
                Action(
                    ep.episode_id,
                    agent,
                    0,
                    s.prompt_ids,
                    s.completion_ids,
                    s.logprobs,
                    "",
                    "",
                    s.truncated,
                    coach=Score(v),
                )
            )
    return episodes


def _step(
    policies: AgentPolicies,
    episodes: list[Episode],
    cfg: RLConfig,
    optimizers: dict[str, torch.optim.Optimizer] | None = None,
    recompute_old: bool = True,
) -> dict[str, object]:
    params = {n: policies.adapter_parameters(n) for n in AGENTS}
    optimizers = optimizers or {n: torch.optim.Adam(params[n], lr=1e-2) for n in AGENTS}
    return update_agents(
        policies,
        episodes,
        AGENTS,
        optimizers,
        params,
        cfg,
        KLController(cfg.kl_beta),
        exclude_flagged=True,
        temperature=1.0,
        recompute_old=recompute_old,
    )


def _seq_logprobs(policies: AgentPolicies, agent: str, actions: list[Action]) -> torch.Tensor:
    """Sum of log-probs of each completion under ``agent``'s current adapter."""
    with torch.no_grad():
        lp = policies.completion_logprobs(
            agent, [a.prompt_ids for a in actions], [a.completion_ids for a in actions]
        ).logprobs
    return lp.sum(-1)


def test_updates_raise_high_advantage_completions_and_touch_no_other_agent(
    tiny_model_dir: Path,
) -> None:
    policies = _policies(tiny_model_dir)
    high, low = [9.0, 9.0, 9.0], [1.0, 1.0, 1.0]
    # the solver's scores differ (signal); the executor's all tie (none); the verifier is idle
    episodes = _episodes(policies, {"solver": high + low, "executor": [5.0] * 6})
    solver = [a for ep in episodes for a in ep.agent_actions("solver")]
    before = _seq_logprobs(policies, "solver", solver)
    adapters = _adapters(policies)
    cfg = RLConfig(mask_truncated=False)
    params = {n: policies.adapter_parameters(n) for n in AGENTS}
    optimizers: dict[str, torch.optim.Optimizer] = {
        n: torch.optim.Adam(params[n], lr=1e-2) for n in AGENTS
    }
    for _ in range(3):  # the same batch again: off-policy after the first step (TIS at work)
        out = _step(policies, episodes, cfg, optimizers)
        assert out["rl/solver/skipped"] == ""
        assert str(out["rl/executor/skipped"]).startswith("no reward signal")
        assert out["rl/verifier/skipped"] == "no actions"
    after = _seq_logprobs(policies, "solver", solver)
    change = (after - before).tolist()
    print(f"solver log-prob change per completion (3 high, 3 low): {change}")
    assert all(c > 0 for c in change[:3]), change  # high advantage: more likely
    assert all(c < 0 for c in change[3:]), change  # low advantage: less likely
    assert not _identical(policies.adapter_parameters("solver"), adapters["solver"])
    for other in ("executor", "verifier"):
        assert _identical(policies.adapter_parameters(other), adapters[other]), other


@pytest.mark.parametrize(
    "advantage, scores, trained",
    [
        ("outcome_only", [7.0, 3.0, 9.0, 1.0, 4.0, 6.0], False),
        ("reinforce_pp", [5.0] * 6, False),
        ("reinforce_pp", [5.0] * 6, True),
    ],
    ids=["every_outcome_0", "tied_coach_scores", "tied_after_a_step"],
)
def test_a_batch_without_reward_signal_changes_no_adapter(
    tiny_model_dir: Path, advantage: str, scores: list[float], trained: bool
) -> None:
    policies = _policies(tiny_model_dir)
    if trained:  # adapters away from the base: the KL term is no longer ~0
        warm = _episodes(policies, dict.fromkeys(AGENTS, [9.0, 1.0] * 3), seed=2)
        _step(policies, warm, RLConfig(mask_truncated=False))
    episodes = _episodes(policies, dict.fromkeys(AGENTS, scores), correct=False)
    adapters = _adapters(policies)
    cfg = RLConfig.model_validate({"advantage": advantage, "mask_truncated": False})
    out = _step(policies, episodes, cfg)
    assert out["rl/unwhitened_scopes"] == 3  # one scope per agent, none whitened
    if trained:
        kl = out["mean_kl"]
        print(f"flat batch after a step: mean_kl {kl}")
        assert isinstance(kl, float) and abs(kl) > 1e-6
    for n in AGENTS:
        assert str(out[f"rl/{n}/skipped"]).startswith("no reward signal"), n
        assert _identical(policies.adapter_parameters(n), adapters[n]), n  # bit-identical


def test_old_logprobs_from_the_updates_own_forward_give_the_recomputed_update(
    tiny_model_dir: Path,
) -> None:
    """Without a KL and with one step per agent nothing needs the old log-probs before the
    step, so no pass is made (``rl.recompute_old_logprobs: auto``) and the update takes them
    from its own forward: after a step has moved the adapters, its step must be the
    recomputed update's (``always``), importance weights included. Plain SGD, so the
    parameter change is proportional to the gradient (Adam's first step would amplify float
    noise in near-zero gradients into full-size steps)."""
    policies = _policies(tiny_model_dir)
    warm = _episodes(policies, dict.fromkeys(AGENTS, [9.0, 1.0] * 3), seed=2)
    _step(policies, warm, RLConfig(mask_truncated=False))
    episodes = _episodes(policies, {n: [float(v) for v in range(6)] for n in AGENTS}, seed=3)
    start = _adapters(policies)
    cfg = RLConfig(mask_truncated=False, kl_beta=0.0)
    moved: dict[bool, dict[str, torch.Tensor]] = {}
    metrics: dict[bool, dict[str, object]] = {}
    for recompute in (True, False):
        with torch.no_grad():
            for n in AGENTS:
                for p, p0 in zip(policies.adapter_parameters(n), start[n], strict=True):
                    p.copy_(p0)
        sgd = {n: torch.optim.SGD(policies.adapter_parameters(n), lr=1.0) for n in AGENTS}
        metrics[recompute] = _step(policies, episodes, cfg, sgd, recompute_old=recompute)
        moved[recompute] = {
            n: torch.cat(
                [
                    (p.detach() - p0).flatten()
                    for p, p0 in zip(policies.adapter_parameters(n), start[n], strict=True)
                ]
            )
            for n in AGENTS
        }
    gaps = {r: (metrics[r]["rl/logprob_gap_max"], metrics[r]["rl/logprob_gap_mean"]) for r in moved}
    print(f"sampler gap (max, mean) recomputed {gaps[True]}, in the update {gaps[False]}")
    assert gaps[True] == pytest.approx(gaps[False], rel=1e-3, abs=1e-6)  # all rows trained
    for n in AGENTS:
        full, own = moved[True][n], moved[False][n]
        rel = float((full - own).norm() / full.norm())
        print(f"{n}: |step| {float(full.norm()):.3g}, relative difference {rel:.2g}")
        assert float(full.norm()) > 0
        assert rel < 1e-5, n


def test_at_step_0_recomputed_old_logprobs_match_the_sampling_ones(tiny_model_dir: Path) -> None:
    policies = _policies(tiny_model_dir)
    scores = {n: [float(v) for v in range(6)] for n in AGENTS}
    episodes = _episodes(policies, scores, seed=1)
    out = _step(policies, episodes, RLConfig(mask_truncated=False, micro_batch_size=4))
    gap_max, gap_mean = out["rl/logprob_gap_max"], out["rl/logprob_gap_mean"]
    print(
        f"step 0: logprob gap max {gap_max:.3g} mean {gap_mean:.3g}; "
        f"tis capped {out['rl/tis_capped_frac']}; mean_kl {out['mean_kl']}; "
        + "; ".join(f"{n} approx_kl {out[f'rl/{n}/approx_kl']:.3g}" for n in AGENTS)
    )
    assert isinstance(gap_max, float) and isinstance(gap_mean, float)
    assert gap_max < 1e-4 and gap_mean < 1e-5  # sampler (KV cache) vs one training forward
    assert out["rl/tis_capped_frac"] == 0.0
    assert out["mean_kl"] == pytest.approx(0.0, abs=1e-6)  # fresh LoRA (B = 0) is the base
    for n in AGENTS:
        assert out[f"rl/{n}/skipped"] == ""
        # the KL made the pass before the step; it runs in the very micro-batches the
        # update trains in, so the ratio is exactly 1 (a different layout would not be)
        assert out[f"rl/{n}/approx_kl"] == 0.0


class _LossSpy:
    """Wraps ``policy_loss`` in ``mappa.rl.update``: records each micro-batch's trained
    log-probs (detached) and the old log-probs it was given, in call order."""

    def __init__(self) -> None:
        from mappa.rl import update

        self.inner = update.policy_loss
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(
        self, logp: torch.Tensor, old: torch.Tensor, *args: object, **kw: object
    ) -> object:
        self.calls.append((logp.detach().clone(), old.detach().clone()))
        return self.inner(logp, old, *args, **kw)  # type: ignore[arg-type]


def _row_logprobs(policies: AgentPolicies, agent: str, actions: list[Action]) -> list[torch.Tensor]:
    """Each action's completion log-probs under ``agent``'s adapter now, one row a pass
    (a layout of its own: no padding, no neighbours)."""
    with torch.no_grad():
        return [
            policies.completion_logprobs(agent, [a.prompt_ids], [a.completion_ids]).logprobs[0]
            for a in actions
        ]


@pytest.mark.parametrize(("mini", "steps"), [(4, 2), (2, 3)])
def test_several_steps_per_rollout_take_old_logprobs_from_before_the_first(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, mini: int, steps: int
) -> None:
    """``rl.mini_batch_size`` below an agent's rows: ceil(rows / size) optimizer steps per
    agent, every one against the old log-probs of the policy before the first step (a
    per-row recompute made beforehand), so the first step's ratio is exactly 1 and the later
    ones, off-policy after a large Adam step, are clipped. No KL: nothing else asks for the
    pass, the mini-batches alone must."""
    from mappa.rl import update
    from mappa.rl.experience import make_experience, scored_actions
    from mappa.rl.update import policy_step

    policies = _policies(tiny_model_dir)
    episodes = _episodes(policies, {"solver": [float(v) for v in range(6)]}, seed=4)
    cfg = RLConfig(
        mask_truncated=False, kl_beta=0.0, mini_batch_size=mini, micro_batch_size=2, tis_cap=None
    )
    exp = make_experience(policies, scored_actions(episodes, True), cfg, 0.0, 1.0, seed="0/0")
    assert exp.old is not None  # the pass before the first step
    layout = exp.layout["solver"]
    assert len(layout) == steps and sorted(i for m in layout for b in m for i in b) == list(
        range(6)
    )
    before = _row_logprobs(policies, "solver", exp.actions)
    spy = _LossSpy()
    monkeypatch.setattr(update, "policy_loss", spy)
    params = policies.adapter_parameters("solver")
    adam = torch.optim.Adam(params, lr=1.0)  # moves later rows' ratios past 1 +- clip_eps
    stats = policy_step(policies, "solver", exp, adam, params, cfg, 0.0)
    assert stats.skipped == "" and stats.steps == steps == len(stats.per_step)
    micro = [b for m in layout for b in m]
    assert len(spy.calls) == len(micro)
    first = len(layout[0])
    for k, (idx, (logp, old)) in enumerate(zip(micro, spy.calls, strict=True)):
        for j, row in enumerate(idx):  # the old policy's, whatever step reads them
            n = len(exp.actions[row].completion_ids)
            assert torch.allclose(old[j, :n], before[row], atol=1e-5), (k, row)
        if k < first:  # the first step: the weights are the old policy's, ratio exactly 1
            assert torch.equal(logp * exp.loss_mask[idx], old * exp.loss_mask[idx])
        else:  # moved by the first step: own-forward old log-probs would be wrong here
            assert float(((logp - old) * exp.loss_mask[idx]).abs().max()) > 1e-3
    print("per step clip_frac", [s.clip_frac for s in stats.per_step])
    assert stats.per_step[0].clip_frac == 0.0 and stats.per_step[0].approx_kl == 0.0
    assert all(s.clip_frac > 0 for s in stats.per_step[1:])  # the clip acts


def test_a_bfloat16_update_moves_the_adapters_like_the_float32_one(tiny_model_dir: Path) -> None:
    """``model.dtype: bfloat16`` (what ``auto`` picks on a CPU with bfloat16 instructions):
    the base runs in bfloat16 while the LoRA matrices, their gradients and the optimizer
    state stay float32 (PEFT keeps adapters in float32). From the same adapters, on the same
    episodes, one plain SGD step (proportional to the gradient, unlike Adam's first step)
    must point where the float32 step points and be as long, up to bfloat16 rounding of the
    base's activations: cosine >= 0.999 and length within 1 % per agent (measured: cosine
    0.9999, length within 0.1 %)."""
    from conftest import randomize_lora_b

    def policies(dtype: str) -> AgentPolicies:
        base, tok = load_base(str(tiny_model_dir), dtype=dtype, device="cpu")
        pol = AgentPolicies(base, tok, AGENTS, LoraConfig())
        return randomize_lora_b(pol)  # type: ignore[no-any-return]

    f32, b16 = policies("float32"), policies("bfloat16")
    assert next(b16.model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():  # the very same start (LoRA A is drawn before the cast)
        for n in AGENTS:
            for p, q in zip(b16.adapter_parameters(n), f32.adapter_parameters(n), strict=True):
                assert p.dtype == torch.float32
                p.copy_(q)
    start = _adapters(f32)
    episodes = _episodes(f32, {n: [float(v) for v in range(6)] for n in AGENTS}, seed=3)
    cfg = RLConfig(mask_truncated=False)
    moved = {}
    for name, pol in (("float32", f32), ("bfloat16", b16)):
        sgd = {n: torch.optim.SGD(pol.adapter_parameters(n), lr=1.0) for n in AGENTS}
        out = _step(pol, episodes, cfg, sgd, recompute_old=True)
        assert all(out[f"rl/{n}/skipped"] == "" for n in AGENTS)
        moved[name] = {
            n: torch.cat(
                [
                    (p.detach() - p0).flatten()
                    for p, p0 in zip(pol.adapter_parameters(n), start[n], strict=True)
                ]
            )
            for n in AGENTS
        }
        if name == "bfloat16":  # sampled in float32: the bf16 trainer's recompute differs
            gap = out["rl/logprob_gap_max"]
            print(f"bf16 old log-probs vs the float32 sampler's: max gap {gap:.3g}")
    for n in AGENTS:
        a, b = moved["float32"][n], moved["bfloat16"][n]
        cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
        length = float(b.norm() / a.norm())
        print(f"{n}: |step| {float(a.norm()):.3g}, cosine {cos:.5f}, length ratio {length:.4f}")
        assert cos >= 0.999, n
        assert abs(length - 1) <= 0.01, n
