"""VllmEngine: the rollout sampled by an in-process vLLM engine, one LoRA per agent.

``rollout.engine: vllm`` (install with ``make install-vllm``; docs/engines.md). The trainer
keeps its own model (``AgentPolicies``) for the update; this engine holds a second copy of
the base and serves each agent's adapter as a vLLM LoRA. After every update ``sync`` saves
the new adapters to a directory owned by the engine and registers them under new LoRA ids,
so a request can never be served by an adapter vLLM cached for an older step.

Sampling semantics match ``AgentPolicies.generate`` (checked against vLLM 0.32):

* The engine is built with ``logprobs_mode="processed_logprobs"``. vLLM's default,
  ``raw_logprobs``, returns ``log_softmax(logits)`` before the temperature is applied; the
  processed mode returns the log-prob of the sampled token under the distribution it was
  drawn from, ``log_softmax(logits / temperature)``. With top-k, top-p and min-p off (always
  here), penalties at their neutral values and no logit bias, that is exactly the
  distribution the trainer recomputes (``completion_logprobs(..., temperature)``).
* Greedy requests run at vLLM temperature 0 (argmax). vLLM then skips the temperature, so
  a logits processor (``_scale_greedy_logits``) divides those requests' logits by the
  training temperature first: the argmax is unchanged, and the recorded log-prob is the
  one at that temperature, as the hf engine records it.
* The stop tokens are the trainer's (``AgentPolicies.stop_ids``), passed as
  ``stop_token_ids`` with ``ignore_eos`` so vLLM adds none of its own; a stop token ends the
  completion and is kept in ``completion_ids`` (vLLM keeps stop *token ids* in the output);
  ``truncated`` is true when the completion does not end with one.
* ``batch_size`` is ignored: vLLM schedules all prompts of a call itself.

vLLM never applies the temperature to prompt log-probs, so ``logprobs_of`` (the sync probe's
proof that the engine serves the adapters just trained: ``mappa.models.sync_probe``) returns
temperature-1 log-probs, to be compared with the trainer's at temperature 1.

``VllmScoreDistribution`` lets the local coach score on this engine's base (adapters off),
as the hf coach scores on the trainer's base with adapters off (``coach.local.engine``).

On a GPU the engine shares the card with the trainer: ``rollout.vllm.gpu_memory_utilization``
is vLLM's share (weights and KV cache), the rest is the trainer's. With
``rollout.vllm.sleep_during_update`` (on by default where vLLM has a sleep mode: CUDA, ROCm,
XPU) ``release``, called by the trainer before each update, puts the engine to sleep at level
1 (weights offloaded to host memory, KV cache dropped), and the ``sync`` after the update
wakes it before loading the new adapters. The CPU build has no sleep mode, and this
project's CI has no GPU: on the CPU only the order of the calls is tested.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mappa.models.interface import AdapterSource, Sample
from mappa.models.score_tokens import ScoreTokens, score_prompt_ids, score_tokens, split_ten

if TYPE_CHECKING:
    from mappa.config import RunConfig

log = logging.getLogger(__name__)

GREEDY_TEMPERATURE_KEY = "mappa_greedy_temperature"
"""``SamplingParams.extra_args`` key: the temperature a greedy request's log-probs are at."""


def _scale_greedy_logits() -> type:
    """The vLLM logits processor that divides a greedy request's logits by the temperature
    named in its ``extra_args`` (built on demand: vLLM is an optional dependency)."""
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class ScaleGreedyLogits(AdapterLogitsProcessor):
        def is_argmax_invariant(self) -> bool:
            # It is, but only a non-invariant processor runs before greedy sampling, which is
            # where the recorded log-probs are taken.
            return False

        def new_req_logits_processor(self, params: Any) -> Any:
            extra = params.extra_args or {}
            temperature = extra.get(GREEDY_TEMPERATURE_KEY)
            if temperature is None or float(temperature) == 1.0:
                return None
            scale = 1.0 / float(temperature)
            return lambda output_ids, logits: logits * scale

    return ScaleGreedyLogits


class VllmEngine:
    """A ``RolloutEngine`` over an in-process ``vllm.LLM`` (see the module docstring).

    Args:
        cfg: the run's config: the base (``model.path``, ``model.dtype``), the LoRA rank,
            and ``rollout.vllm``.
        tokenizer: the trainer's tokenizer; its stop token ends a completion.
        stop_ids: the tokens that end a completion; default: the tokenizer's eos.
        agents: whose adapters this engine serves (``sync`` takes exactly these from its
            source); default: every agent of ``cfg``. A Ray engine actor of one agent
            (``cluster.engines: per_agent``) serves that agent only.
        scores_coach: the local coach scores on this engine too. Its prompts hold an
            agent's whole input plus the coach template, so without
            ``rollout.vllm.max_model_len`` the engine then holds the model's full context
            rather than ``max_prompt_tokens + max_new_tokens``.
    """

    name = "vllm"
    shares_trainer = False  # a copy of the weights, synced from the trainer

    def __init__(
        self,
        cfg: RunConfig,
        tokenizer: Any,
        stop_ids: Iterable[int] | None = None,
        *,
        agents: Sequence[str] | None = None,
        scores_coach: bool = False,
    ) -> None:
        # In-process: the engine core runs in this process instead of a spawned one, which
        # would re-import the caller's main module and hold a second process per run.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import torch
        from vllm import LLM

        from mappa.models.loading import resolve_device, resolve_dtype, resolve_model_path

        self.agents = [a.name for a in cfg.agents] if agents is None else list(agents)
        self.tokenizer = tokenizer
        self.stop_ids = sorted(set(stop_ids) if stop_ids is not None else {tokenizer.eos_token_id})
        v = cfg.rollout.vllm
        path = resolve_model_path(cfg.model.path)
        dtype = resolve_dtype(cfg.model.dtype, resolve_device(cfg.model.device))
        max_len = v.max_model_len or cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
        limit = _model_context(path)
        if v.max_model_len is None and limit is not None and (scores_coach or max_len > limit):
            log.info("vllm max_model_len %d set to the model's context %d", max_len, limit)
            max_len = limit
        self.max_model_len = max_len
        """The longest sequence (prompt and completion) a request may hold."""
        extra: dict[str, Any] = {}
        if v.kv_cache_gib is not None:
            extra["kv_cache_memory_bytes"] = int(v.kv_cache_gib * 2**30)
        # vLLM's CPU worker replaces torch.set_num_threads for the whole process (a no-op
        # that warns); close() puts it back. It also seeds torch's global RNG with cfg.seed.
        self._set_num_threads = torch.set_num_threads
        self._loras: dict[str, Any] = {}  # agent -> its current LoRARequest
        self._next_id = 1
        self.version: int | None = None
        """The step whose adapters are served (``sync``'s ``step``); None before the first."""
        self.sleeps = _sleep_during_update(v.sleep_during_update)
        """Whether ``release`` puts the engine to sleep (``rollout.vllm.sleep_during_update``)."""
        self.asleep = False
        self.llm: Any = LLM(
            model=path,
            dtype=str(dtype).removeprefix("torch."),
            seed=cfg.seed,
            enable_lora=True,
            max_loras=len(self.agents),
            max_cpu_loras=len(self.agents),
            max_lora_rank=_lora_rank_slot(cfg.model.lora.r),
            max_model_len=max_len,
            gpu_memory_utilization=v.gpu_memory_utilization,
            enforce_eager=v.enforce_eager,
            logprobs_mode="processed_logprobs",
            logits_processors=[_scale_greedy_logits()],
            enable_sleep_mode=self.sleeps,
            **extra,
        )
        self._root = Path(tempfile.mkdtemp(prefix="mappa-vllm-"))  # the synced adapters

    # ------------------------------------------------------------------ adapters
    def sync(self, source: AdapterSource, step: int) -> None:
        """Serve ``source``'s current adapters: saved under a fresh directory and loaded
        under new LoRA ids; the previous step's adapters and files are dropped."""
        saved = source.save(self._root / f"step-{step}-id{self._next_id}")
        self.wake()
        missing = set(self.agents) - set(saved)
        if missing:
            raise ValueError(f"adapter source saved no adapter for {sorted(missing)}")
        from vllm.lora.request import LoRARequest

        old, self._loras = self._loras, {}
        engine = self.llm.llm_engine
        for request in old.values():
            engine.remove_lora(request.lora_int_id)
        for directory in {Path(r.lora_path).parent for r in old.values()}:
            shutil.rmtree(directory, ignore_errors=True)
        for agent in self.agents:
            request = LoRARequest(f"{agent}@{step}", self._next_id, str(saved[agent]))
            self._next_id += 1
            if not engine.add_lora(request):  # loads now: a bad adapter fails here
                raise RuntimeError(f"vLLM refused the adapter of {agent!r} in {saved[agent]}")
            self._loras[agent] = request
        self.version = step

    def release(self) -> None:
        """Sleep through the update when ``sleeps`` (see the module docstring)."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        """Back from ``release``'s sleep: weights reloaded, KV cache reallocated."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def describe(self, agent: str) -> str:
        return "vllm engine"

    def _lora(self, agent: str | None) -> Any:
        self.wake()  # a request after ``release`` without a sync (none in train) still works
        if agent is None:
            return None  # the frozen base, adapters off
        if agent not in self._loras:
            raise KeyError(f"no adapter synced for agent {agent!r}; have {sorted(self._loras)}")
        return self._loras[agent]

    # ------------------------------------------------------------------ sampling
    def generate(
        self,
        agent: str | None,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        batch_size: int = 8,
        greedy: bool = False,
    ) -> list[Sample]:
        """One completion per prompt, in the order of ``prompts`` (``batch_size`` unused)."""
        if not prompts:
            return []
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            n=1,
            temperature=0.0 if greedy else temperature,
            top_p=1.0,
            top_k=0,
            min_p=0.0,
            max_tokens=max_new_tokens,
            logprobs=0,  # the sampled token's only
            stop_token_ids=self.stop_ids,
            ignore_eos=True,  # no stop but ours
            detokenize=False,
            extra_args={GREEDY_TEMPERATURE_KEY: temperature} if greedy else None,
        )
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            params,
            lora_request=self._lora(agent),
            use_tqdm=False,
        )
        stops = set(self.stop_ids)
        samples = []
        for prompt, out in zip(prompts, outputs, strict=True):
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            logps = [step[t].logprob for t, step in zip(ids, completion.logprobs, strict=True)]
            samples.append(Sample(list(prompt), ids, logps, not ids or ids[-1] not in stops))
        return samples

    def logprobs_of(
        self,
        agent: str | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
    ) -> list[list[float]]:
        """The engine's log-prob of each given completion token (vLLM prompt log-probs, at
        temperature 1: vLLM never scales those), with the agent's served adapter: what the
        sync probe compares with the trainer's after every sync."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # greedy: the one generated token is thrown away, and a greedy request draws no
        # random number from the generator the rollout samples from (the sync probe calls
        # this between rollouts). Prompt log-probs are the raw logits' at any temperature.
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        result = []
        # One request per call: with a LoRA, vLLM 0.32's CPU build computes prompt log-probs
        # of a batch of requests with one adapter index per request instead of per token.
        for p, c in zip(prompt_ids, completion_ids, strict=True):
            [out] = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p) + list(c))],
                params,
                lora_request=self._lora(agent),
                use_tqdm=False,
            )
            # prompt_logprobs[i] holds token i's log-prob given tokens < i (None for i = 0).
            rows = out.prompt_logprobs[len(p) : len(p) + len(c)]
            result.append([row[t].logprob for t, row in zip(c, rows, strict=True)])
        return result

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Shut the engine down, free its memory and delete the saved adapters."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            from vllm.distributed.parallel_state import (
                destroy_distributed_environment,
                destroy_model_parallel,
            )

            destroy_model_parallel()
            destroy_distributed_environment()
            gc.collect()
            import torch

            torch.set_num_threads = self._set_num_threads
        shutil.rmtree(self._root, ignore_errors=True)
        self._loras = {}


class VllmScoreDistribution:
    """Implements ``mappa.coach.local.ScoreDistribution`` on a ``VllmEngine``'s base model
    (no LoRA: adapters off, as the hf coach uses the trainer's base).

    The same quantities as ``mappa.models.scorer.ScoreDistributionModel`` (the tokens and the
    split of "10" come from ``mappa.models.score_tokens``): P(each spelling of 0..10) where
    the score's digit would be written, and P("0") after the likelier "1", both over the
    full vocabulary, so a model with no mass on the scores is seen as such.

    One ``generate`` call holds every action twice: the prompt, and the prompt followed by
    the guessed "1", each asking one token with ``logprob_token_ids`` (vLLM returns the
    log-prob of exactly those tokens, no top-k). vLLM batches them and its prefix cache
    computes the prompt prefix all actions share, and each prompt's own full KV blocks,
    once. Rows whose likelier "1" is the other token take one more request each, as in the
    hf scorer. The requests are greedy (temperature 0): vLLM then applies no temperature, so
    the engine's processed log-probs are ``log_softmax(logits)``, the hf scorer's; and no
    random draw is taken from the process's torch generator, which the rollout samples from.
    """

    def __init__(self, engine: VllmEngine) -> None:
        self.engine = engine
        self._tokens: dict[str, ScoreTokens] = {}

    def tokens(self, prefix: str) -> ScoreTokens:
        """The score's tokens after ``prefix`` (found once per prefix)."""
        if prefix not in self._tokens:
            self._tokens[prefix] = score_tokens(self.engine.tokenizer, prefix)
        return self._tokens[prefix]

    def _first_token_logprobs(
        self, prompts: Sequence[list[int]], token_ids: Sequence[list[int]]
    ) -> list[dict[int, float]]:
        """Per prompt, the base model's log-prob of each of its ``token_ids`` as the next
        token (one batched call, no adapter)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=ids, detokenize=False)
            for ids in token_ids
        ]
        self.engine.wake()
        outputs = self.engine.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            params,
            lora_request=None,  # the base: adapters off
            use_tqdm=False,
        )
        return [
            {t: out.outputs[0].logprobs[0][t].logprob for t in ids}
            for out, ids in zip(outputs, token_ids, strict=True)
        ]

    def __call__(
        self, conversations: Sequence[list[dict[str, str]]], prefix: str
    ) -> list[list[float]]:
        tokens = self.tokens(prefix)
        seqs = score_prompt_ids(self.engine.tokenizer, conversations, prefix, tokens)
        if not seqs:
            return []
        longest = max(map(len, seqs))
        if longest + 2 > self.engine.max_model_len:  # the prompt, a "1", the token asked
            raise ValueError(
                f"a coach prompt of {longest} tokens does not fit the vLLM engine's "
                f"max_model_len {self.engine.max_model_len}: raise rollout.vllm.max_model_len "
                "(up to the model's context), lower coach.observation_chars, or score with "
                "coach.local.engine: hf"
            )
        spellings = [t for ids in tokens.scores for t in ids]
        zeros = list(tokens.zeros)
        n = len(seqs)
        both = self._first_token_logprobs(
            [p for s in seqs for p in (s, [*s, tokens.one_guess])],
            [spellings, zeros] * n,
        )
        at_score, after_guess = both[0::2], both[1::2]
        ones = tokens.scores[1]
        best = [max(ones, key=lp.__getitem__) for lp in at_score]
        redo = [i for i in range(n) if best[i] != tokens.one_guess]
        after_one = list(after_guess)
        if redo:
            again = self._first_token_logprobs(
                [[*seqs[i], best[i]] for i in redo], [zeros] * len(redo)
            )
            for i, lp in zip(redo, again, strict=True):
                after_one[i] = lp
        return [
            split_ten(
                [sum(math.exp(lp[t]) for t in ids) for ids in tokens.scores],
                sum(math.exp(z[t]) for t in zeros),
            )
            for lp, z in zip(at_score, after_one, strict=True)
        ]


def _sleep_during_update(asked: bool | None) -> bool:
    """``rollout.vllm.sleep_during_update`` resolved on this platform."""
    from vllm.platforms import current_platform

    available = bool(current_platform.is_sleep_mode_available())
    if asked and not available:
        raise ValueError(
            "rollout.vllm.sleep_during_update: true, but vLLM has no sleep mode on this "
            f"platform ({current_platform.device_name}); set it to null or false"
        )
    return available if asked is None else asked


def _lora_rank_slot(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``r``."""
    for slot in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if r <= slot:
            return slot
    raise ValueError(f"LoRA rank {r} exceeds vLLM's largest (512)")


def _model_context(path: str) -> int | None:
    """The base's context length from its ``config.json``, if it states one."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return None
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None
