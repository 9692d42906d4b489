"""Command line: ``mappa train``, ``eval``, ``coach-check``, ``coach-serve``, ``report`` and
``experiment``.

The config is loaded and validated before anything heavy is imported, so a typo fails in
well under a second and no model is ever loaded for a config that cannot run.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from mappa import __version__
from mappa.config import RESUMABLE_KEYS, ConfigError, RunConfig, load_config
from mappa.paths import expand_run_dir

if TYPE_CHECKING:
    from mappa.coach.base import CoachBackend
    from mappa.coach.context import CoachContext
    from mappa.coach.servers import LocalServer
    from mappa.experiment.runner import Experiment
    from mappa.records import Score
    from mappa.tasks import Task


def default_config() -> Path:
    """The demo config shipped inside the package (``configs/`` in the repo links to it)."""
    return Path(str(resources.files("mappa") / "configs" / "demo.yaml"))


DESCRIPTION = (
    "Finetune a team of LLM agents with per-action coach rewards (MAPPA): train it, "
    "evaluate it, check or serve its coach, report on runs, and compare arms in experiments."
)
"""The help's opening sentence: plain text, as a terminal shows it (the module docstring is
RST for the docs)."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in one line (the bad argument, then where the options
    are listed) instead of the usage block; its subcommands' parsers are the same kind."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see {self.prog} --help\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """A value that is not among the choices (a subcommand, ``--server``) is refused
        naming the closest choice, if one is close: ``mappa trian`` is a typo, and the list
        of every choice does not say of which."""
        choices = action.choices
        if choices is not None and value not in choices:
            near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            if near:
                raise argparse.ArgumentError(
                    action, f"invalid choice: {value!r} (did you mean {near[0]}?)"
                )
        super()._check_value(action, value)


def _int_in(low: int, high: int | None = None, note: str = "") -> Callable[[str], int]:
    """An argparse type: an int from ``low`` to ``high`` (no bound: None), else one line
    naming the value and the range, before anything loads (``--limit 0`` would load the
    model to evaluate nothing)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < low or (high is not None and value > high):
            allowed = f"at least {low}" if high is None else f"{low}-{high}"
            raise argparse.ArgumentTypeError(f"{value}: give {allowed}{note}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mappa", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"mappa {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in [
        ("train", "rollout -> coach -> update for train.steps steps"),
        ("eval", "pipeline accuracy on a task set, graded deterministically"),
        (
            "coach-check",
            "does the coach discriminate? score labelled good and bad actions (built-in or "
            "--cases), or rescore a run's episodes against their outcomes (--episodes)",
        ),
    ]:
        s = sub.add_parser(name, help=help_text)
        config_help = "run config YAML, or a shipped config's name such as smoke (default: demo)"
        if name == "coach-check":
            config_help = (
                "run config YAML (or a shipped config's name) or experiment file (default: "
                "with --episodes the run's config.yaml, else demo)"
            )
        s.add_argument("--config", type=Path, default=None, help=config_help)
        s.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. rl.lr=1e-5")
    serve = sub.add_parser(
        "coach-serve",
        help="start a local OpenAI-compatible coach server for coach.backend: http",
    )
    serve.add_argument(
        "--server",
        choices=["llamacpp", "vllm"],
        default="llamacpp",
        help="llamacpp: llama-cpp-python over a GGUF (make install-coach-server), one request "
        "at a time; vllm: vllm serve, batches concurrent requests (make install-vllm)",
    )
    serve.add_argument(
        "--model",
        default="pypi:qwen2.5-coder-0.5b-instruct",
        help="pypi:<package> (a known GGUF package; the default is the one `make install` "
        "gives), or a GGUF file (llamacpp) or a model directory (vllm)",
    )
    serve.add_argument(
        "--port",
        type=_int_in(0, 65535, " (0: a free port)"),
        default=None,
        help="default (or 0): a free port",
    )
    serve.add_argument("--max-model-len", type=int, default=4096, help="context length")
    serve.add_argument("--threads", type=int, default=1, help="llamacpp: decoding threads")
    serve.add_argument("--kv-cache-gib", type=float, default=1.0, help="vllm: KV cache size")
    report = sub.add_parser(
        "report",
        help="write a static HTML report (curves, coach statistics, episode viewer) of one or "
        "more runs; works while a run is going",
    )
    report.add_argument(
        "runs", nargs="+", type=Path, metavar="RUN_DIR", help="run dirs; several are overlaid"
    )
    report.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output dir for index.html and its steps/ (default: RUN_DIR/report for one run; "
        "required for several)",
    )
    push = sub.add_parser(
        "push",
        help="upload a run's adapters to the Hugging Face Hub, one folder per agent, with model "
        "cards (base model, role, held-out results)",
    )
    push.add_argument("run", type=Path, metavar="RUN_DIR", help="a run dir (mappa train's)")
    push.add_argument("--repo", required=True, help="the Hub model repository, owner/name")
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument(
        "--dry-run",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the repository's files to DIR and upload nothing",
    )
    experiment = sub.add_parser(
        "experiment",
        help="compare arms x seeds of runs on one held-out set, then write the results table, "
        "plot and overlay report; rerun the same command to resume (docs/experiments.md)",
    )
    experiment.add_argument("config", type=Path, help="experiment YAML")
    experiment.add_argument(
        "overrides",
        nargs="*",
        help="key.path=value overrides for every arm's runs (after the file's own); give the "
        "same ones when rerunning to resume",
    )
    experiment.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where runs, configs and results go (default: runs/experiments/<config name>)",
    )
    experiment.add_argument(
        "--records",
        type=Path,
        default=None,
        help="where each finished run's small record goes (config, metrics, held-out answers; "
        "no adapters): commit it, and a rerun on any machine skips the runs it holds "
        "(default: <out>/records)",
    )
    once = experiment.add_mutually_exclusive_group()
    once.add_argument(
        "--reproduce",
        default=None,
        metavar="RUN",
        help="run nothing else: rerun recorded run RUN's first step on this machine (e.g. "
        "coach-s1) and compare it with its record number for number; exit 0 when identical, "
        "1 when not (a new machine's runs would not continue the recorded ones)",
    )
    once.add_argument(
        "--look",
        action="store_true",
        help="run nothing: take the one look the file's analysis.look states (the spread of "
        "the primary's per-seed differences, never their mean) from the records, keep it in "
        "<records>/look.json and print how many seeds it asks for",
    )
    check = sub.choices["coach-check"]
    given = check.add_mutually_exclusive_group()
    given.add_argument(
        "--cases",
        type=Path,
        default=None,
        metavar="FILE.jsonl",
        help="labelled actions, one JSON object a line: agent, task, answer, output, "
        "observation (the tool output, or null), good (true/false); optional: input (the "
        "agent's whole input, default 'Problem: {task}') and truncated (default: a built-in "
        "MathChat set)",
    )
    given.add_argument(
        "--episodes",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="rescore a run's recorded training episodes (RUN_DIR/episodes.jsonl; held-out "
        "ones are in another file) with this coach: per agent the AUC against the graded "
        "outcome and how the scores spread; without --config the run's own config.yaml",
    )
    check.add_argument(
        "--limit",
        type=_int_in(1),
        default=None,
        metavar="N",
        help="with --episodes: rescore N episodes spread evenly over the run (default: all)",
    )
    check.add_argument(
        "--json", type=Path, default=None, metavar="OUT", help="also write the results as JSON"
    )
    check.add_argument(
        "--serve",
        default=None,
        metavar="KIND:MODEL",
        help="start a coach server (llamacpp or vllm, over a model as for `coach-serve --model`, "
        "e.g. llamacpp:pypi:qwen2.5-coder-1.5b-instruct) on a free loopback port, score with "
        "the HTTP coach against it, and stop it at the end",
    )
    check.add_argument(
        "--threads", type=int, default=2, help="with --serve llamacpp: decoding threads"
    )
    check.add_argument(
        "--arm",
        default=None,
        help="when --config is an experiment file: score with this arm's config (default: the "
        "base config with the common overrides)",
    )
    sub.choices["train"].add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="continue a run from its newest checkpoint (records after it are cut); the "
        "config is the run's config.yaml, and overrides may change only "
        + ", ".join(sorted(RESUMABLE_KEYS)),
    )
    sub.choices["train"].add_argument(
        "--stop-after",
        type=_int_in(1),
        default=None,
        metavar="N",
        help="stop once N steps are done, checkpointed (--resume continues); the run is "
        "otherwise the same, its learning-rate schedule spanning all train.steps",
    )
    sub.choices["train"].add_argument(
        "--dry-run",
        action="store_true",
        help="check the config and print the GPU memory estimate (its two peaks against "
        "model.gpu_memory_gib or the CUDA device), then stop: nothing loads or runs",
    )
    ev = sub.choices["eval"]
    ev.add_argument(
        "--adapters",
        type=Path,
        default=None,
        help="a run dir or its adapters/ dir (default: the untrained base); without --config "
        "the run's own config.yaml is used, and the base model is the one the adapters name",
    )
    ev.add_argument(
        "--tasks",
        default=None,
        help="task file or dataset dir (default: eval.source, else held-out arithmetic)",
    )
    ev.add_argument(
        "--limit", type=_int_in(1), default=None, help="evaluate only the first N tasks"
    )
    ev.add_argument(
        "--out", type=Path, default=None, help="where eval.json and eval_episodes.jsonl go"
    )
    ev.add_argument(
        "--samples",
        type=int,
        default=None,
        help="k samples per task for avg@k / pass@k (default: eval.samples)",
    )
    ev.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature, 0 = greedy (default: eval.temperature)",
    )
    ev.add_argument(
        "--allow-overlap",
        action="store_true",
        help="evaluate even if tasks also occur in the training set (tasks.source)",
    )
    return p


def _is_override(token: str) -> bool:
    return "=" in token and not token.startswith("-")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, with ``key=value`` overrides also after options
    (``mappa experiment X.yaml --out D train.steps=1``): argparse fills a subcommand's
    ``overrides`` only from the tokens before its first option and returns the rest as
    unrecognized; those that are overrides join them, anything else is still refused."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if hasattr(args, "overrides"):
        args.overrides += [t for t in rest if _is_override(t)]
        rest = [t for t in rest if not _is_override(t)]
    if rest:
        command = _subcommand(parser, args.command)
        command.error(f"unrecognized arguments: {' '.join(rest)}{_flag_hint(command, rest)}")
    return args


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``, so that its errors name it and its --help."""
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    return parser


def _flag_hint(command: argparse.ArgumentParser, rest: list[str]) -> str:
    """For the first unknown option: the closest option of the command, else, for a
    command that takes overrides, the config key it likely means as an override
    (``--steps 3`` -> ``train.steps=3``)."""
    from mappa.config.loading import closest_key

    flag = next((t for t in rest if t.startswith("-")), None)
    if flag is None:
        return ""
    name, _, value = flag.partition("=")
    bare = name.lstrip("-")
    takes_overrides = any(a.dest == "overrides" for a in command._actions)
    key = closest_key(tuple(bare.split("."))) if takes_overrides else None
    options = {o.lstrip("-"): o for a in command._actions for o in a.option_strings}
    near = difflib.get_close_matches(bare, list(options), n=1, cutoff=0.7)
    if near and not (key and key.rsplit(".", 1)[-1] == bare):  # an exact key's name wins
        return f" (did you mean {options[near[0]]}?)"
    if key is None:
        return ""
    after = rest[rest.index(flag) + 1 :]
    value = value or (after[0] if after and not after[0].startswith("-") else "...")
    return f" (config keys are key=value overrides: {key}={value}?)"


def _setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per coach request otherwise
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # PEFT 0.21 calls a transformers API that transformers 5 deprecates; not actionable.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")


def _train(cfg: RunConfig, resume: Path | None, stop_after: int | None) -> int:
    from mappa.report.summary import run_summary
    from mappa.run.loop import train

    run_dir = train(cfg, resume=resume, stop_after=stop_after)
    print(run_summary(run_dir, [a.name for a in cfg.agents]))
    return 0


def _which_config(config: Path, demo: bool) -> str:
    """The config as the plan lines name it (a bare ``mappa train`` or ``mappa eval`` runs
    the demo, which a newcomer may not expect)."""
    return f"the demo config {config} (no --config given)" if demo else f"config {config}"


def _train_plan(
    cfg: RunConfig, which: str, resume: Path | None, stop_after: int | None = None
) -> str:
    """The line ``mappa train`` prints before it loads anything: which config, how many
    steps, where the run goes."""
    where = f"continuing {resume}" if resume is not None else f"run dir {cfg.run_dir}"
    steps = f"{cfg.train.steps} steps"
    if stop_after is not None and stop_after < cfg.train.steps:
        steps = f"the first {stop_after} of {cfg.train.steps} steps"
    return f"mappa train: {which}: {steps} with {cfg.model.path}, {where}"


def _eval_flags(cfg: RunConfig, args: argparse.Namespace) -> None:
    """Set ``cfg.eval`` from the flags, validated exactly like the config keys they
    override; raises ``ValueError`` naming the flag (``--temperature -1``) in one line."""
    from pydantic import ValidationError

    from mappa.config import EvalConfig

    flags = {
        "samples": args.samples,
        "temperature": args.temperature,
        "allow_overlap": args.allow_overlap or None,
    }
    given = {k.replace("_", "-"): v for k, v in flags.items() if v is not None}
    try:
        cfg.eval = EvalConfig.model_validate(
            {**cfg.eval.model_dump(), **{k.replace("-", "_"): v for k, v in given.items()}}
        )
    except ValidationError as err:
        problems = []
        for e in err.errors():
            if e["loc"]:  # one flag's value
                named = f"--{str(e['loc'][0]).replace('_', '-')} {e['input']}"
            else:  # a rule across flags and config keys
                named = " ".join(f"--{k} {v}" for k, v in given.items())
            problems.append(f"{named}: {e['msg'].removeprefix('Value error, ')}")
        raise ValueError("; ".join(problems)) from None


@dataclass(frozen=True)
class _EvalJob:
    """What ``mappa eval`` evaluates, read and checked before any model loads: the tasks
    and where they come from, where the results go, the adapters (None: the untrained
    base) and the base model that loads (the one the adapters name, else model.path)."""

    tasks: list[Task]
    source: str
    out: Path
    adapters: Path | None
    model: str

    def plan(self, which: str) -> str:
        """The line ``mappa eval`` prints before it loads anything, as ``mappa train``
        does: the load takes a while, and a bare ``mappa eval`` evaluates the demo."""
        team = (
            "untrained (no --adapters)"
            if self.adapters is None
            else f"with the adapters in {self.adapters}"
        )
        return (
            f"mappa eval: {which}: {self.model} {team} on {len(self.tasks)} tasks from "
            f"{self.source}, output dir {self.out}"
        )


def _check_fresh_run_dir(run_dir: Path) -> None:
    """A new run's ``run_dir`` holds no other run and can be made (``ValueError``)."""
    from mappa.paths import expand_run_dir, fresh_run_dir_problem
    from mappa.run.preflight import writable_problem

    path = expand_run_dir(run_dir)
    problem = fresh_run_dir_problem(path) or writable_problem("run_dir", path, is_file=False)
    if problem:
        raise ValueError(problem)


def _out_problem(flag: str, out: Path | None) -> str | None:
    """An output directory a flag names can be made, before any work."""
    from mappa.run.preflight import writable_problem

    return None if out is None else writable_problem(flag, out, is_file=False)


def _eval_job(cfg: RunConfig, args: argparse.Namespace) -> _EvalJob:
    """``--adapters``, the sampling flags and the tasks, checked; an error of the tasks
    ``--tasks`` names (a missing or malformed file, problems also in the training set)
    names the flag."""
    from mappa.run.evaluation import adapter_base, adapters_dir, checked_heldout, default_out

    adapters = adapters_dir(args.adapters, [a.name for a in cfg.agents], "--adapters")
    _eval_flags(cfg, args)
    try:
        tasks = checked_heldout(cfg, args.tasks, args.limit)
    except (ValueError, OSError) as err:
        if args.tasks is None:
            raise
        raise ValueError(f"--tasks: {err}") from None
    base = None if adapters is None else adapter_base(adapters, cfg.agents[0].name)
    out = args.out or default_out(adapters)
    problem = _out_problem("--out", out)
    if problem:
        raise ValueError(problem)
    return _EvalJob(
        tasks,
        args.tasks or cfg.eval.source or "arithmetic (held out)",
        out,
        adapters,
        base or cfg.model.path,
    )


def _eval(cfg: RunConfig, job: _EvalJob) -> int:
    from mappa.run.evaluation import evaluate_model

    result = evaluate_model(cfg, job.tasks, job.out, job.source, job.adapters)
    shown = {k: v for k, v in result.items() if k != "per_task"}
    width = max(len(k) for k in shown)
    for key, value in shown.items():
        print(f"{key:<{width}}  {_fmt(value)}")
    print(f"{'written':<{width}}  {job.out / 'eval.json'}")
    return 0


def _stopped(message: object, err: BaseException) -> str:
    """The message of a run that stopped on purpose, with ``err``'s notes (where to
    resume)."""
    return "\n".join([f"mappa: {message}", *getattr(err, "__notes__", [])])


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class _ServerStartError(RuntimeError):
    """A coach server this command started did not come up."""


@contextmanager
def _serving(server: LocalServer | None) -> Iterator[None]:
    """Run the body with ``server`` started (nothing to do for None) and stop it after, also
    on an error, Ctrl-C or SIGTERM (which stops it like Ctrl-C)."""
    if server is None:
        yield
        return
    import signal

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(
            f"coach server ({server.name}): starting at {server.base_url}; log {server.log}",
            flush=True,
        )
        try:
            server.start()
        except (RuntimeError, TimeoutError) as err:
            raise _ServerStartError(f"coach server ({server.name}) did not start: {err}") from None
        yield
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


def _experiment_keys(path: Path) -> list[str]:
    """The top-level keys of ``path`` that only an experiment file has (``arms``, ``seeds``,
    ``base``): none for a run config, or for a file load_config will say is broken."""
    import yaml

    from mappa.experiment.spec import experiment_keys

    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return []  # load_config says what is wrong with it
    return experiment_keys(raw)


def _check_config(args: argparse.Namespace) -> tuple[RunConfig, LocalServer | None]:
    """The config coach-check scores with, and the coach server to start for it (not
    started yet). ``--config`` may be a run config or an experiment file (its base config
    with its common overrides, ``--arm``'s, then the command line's; its ``coach_server:``);
    without it, the run's own config (``--episodes``), else the demo's. ``--serve`` (or
    the experiment's server) points the HTTP coach at the server."""
    from mappa.run import preflight

    path = None if args.config is None else _config_file(args.config)
    if path is None and args.episodes is not None:
        run_dir = args.episodes if args.episodes.is_dir() else args.episodes.parent
        if (run_dir / "config.yaml").is_file():
            path = run_dir / "config.yaml"
    path = path or default_config()
    overrides = list(args.overrides)
    server = None
    if _experiment_keys(path):
        from mappa.experiment.spec import base_config_path, load_experiment

        spec = load_experiment(path)
        arm: list[str] = []
        if args.arm is not None:
            if args.arm not in spec.arms:
                raise ValueError(f"{path}: no arm {args.arm!r} (arms: {', '.join(spec.arms)})")
            arm = spec.arms[args.arm]
        overrides = [*spec.overrides, *arm, *overrides]
        if spec.coach_server is not None and args.serve is None:
            try:
                server = spec.coach_server.build()
            except (ValueError, OSError) as err:
                raise ValueError(f"{path}: coach_server: {err}") from None
        path = base_config_path(spec.base, path)
    elif args.arm is not None:
        raise ValueError(f"--arm: {path} is not an experiment file (it has no arms:)")
    if args.serve is not None:
        from mappa.coach.servers import make_server

        kind, _, model = args.serve.partition(":")
        if not model:
            raise ValueError(
                f"--serve {args.serve!r}: give KIND:MODEL, e.g. "
                "llamacpp:pypi:qwen2.5-coder-1.5b-instruct"
            )
        try:
            server = make_server(kind, model, threads=args.threads)
        except (ValueError, OSError) as err:
            raise ValueError(f"--serve: {err}") from None
    if server is not None:
        from mappa.experiment.spec import http_coach_overrides

        overrides += http_coach_overrides(server.base_url)
    cfg = load_config(path, overrides)
    preflight.check(cfg)
    return cfg, server


class _Report(Protocol):
    """A coach-check report (``mappa.coach.check``)."""

    def table(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


def _check_plan(
    cfg: RunConfig, args: argparse.Namespace
) -> tuple[str, list[CoachContext], Callable[[list[Score], float], _Report]]:
    """What coach-check scores (the labelled cases, or the run's episodes), as contexts built
    as training builds them, and how the scores become its report. Reads and validates
    every input before anything starts."""
    from mappa.coach import check
    from mappa.coach.base import CoachView, episode_contexts
    from mappa.tasks.math import grade_answer

    names = [a.name for a in cfg.agents]
    roles = {a.name: a.role for a in cfg.agents}
    view = CoachView.of(cfg)
    if args.episodes is None:
        grade = partial(
            grade_answer,
            answer_format=cfg.tasks.answer_format,
            timeout_s=cfg.tasks.grade_timeout_s,
        )
        if args.limit is not None:
            raise ValueError("--limit: only with --episodes")
        final = names[-1]
        if args.cases is None:
            cases = list(check.CASES)
            roles, final = check.builtin_team(roles, final)
            source = "built-in cases"
        else:
            if not args.cases.is_file():
                raise FileNotFoundError(f"{args.cases}: no such cases file")
            cases = check.parse_cases(args.cases.read_text().splitlines(), names, str(args.cases))
            source = str(args.cases)
        contexts = check.case_contexts(cases, roles, final, view, grade)
        return source, contexts, lambda scores, s: check.check_report(scores, cases, s)
    from mappa.records import read_episodes

    path = args.episodes / "episodes.jsonl" if args.episodes.is_dir() else args.episodes
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (a run dir holds episodes.jsonl)")
    try:
        episodes = check.spaced(read_episodes(path), args.limit)
    except (TypeError, KeyError, ValueError) as err:
        raise ValueError(f"{path}: not a file of recorded episodes ({err})") from None
    if not episodes:
        raise ValueError(f"{path}: no episodes")
    unknown = check.unknown_agents(episodes, names)
    if unknown:
        raise ValueError(
            f"{path}: agents {unknown} act in these episodes but are not among the config's "
            f"agents {names}; use the run's own config (omit --config) or one with its agents"
        )
    contexts = episode_contexts(episodes, roles, names[-1], view)
    return (
        str(path),
        contexts,
        lambda scores, s: check.rescore_report(episodes, scores, s, names),
    )


def _check_coach(cfg: RunConfig) -> CoachBackend:
    """The configured coach; the policy base is loaded only for a local coach that reuses
    it (and not in replay mode, which loads nothing)."""
    from mappa.run import build

    needs_policy = cfg.coach.backend == "local" and cfg.coach.local.model_path is None
    load = needs_policy and cfg.coach.cache.mode != "replay"
    policies = build.load_policies(cfg) if load else None
    return build.make_coach(cfg, policies)


def _coach_label(cfg: RunConfig) -> dict[str, str]:
    c = cfg.coach
    if c.backend == "http":
        return {"backend": "http", "model": c.http.model, "base_url": c.http.base_url}
    if c.backend == "rules":
        return {"backend": "rules", "function": c.rules.function}
    return {"backend": "local", "model": c.local.model_path or cfg.model.path}


def _coach_check(args: argparse.Namespace) -> int:
    """``mappa coach-check``: inputs and config checked first (exit 2), then the server (if
    any) started, the coach built, every context scored in one call, the server stopped."""
    from mappa.coach import CoachFatalError
    from mappa.coach.check import timed_score, view_line, view_summary

    try:
        cfg, server = _check_config(args)
        source, contexts, report_of = _check_plan(cfg, args)
    except (ConfigError, ValueError, OSError) as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 2
    _setup_logging()
    try:
        with _serving(server):
            scores, seconds = timed_score(_check_coach(cfg), contexts)
    except CoachFatalError as err:
        print(_stopped(err, err), file=sys.stderr)
        return 1
    except _ServerStartError as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 1
    except ValueError as err:  # a coach this command cannot build (e.g. on a vLLM engine)
        print(f"mappa: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mappa: interrupted", file=sys.stderr)
        return 130
    report = report_of(scores, seconds)
    view = view_summary(contexts, cfg.coach.self_solve, cfg.coach.agreement_weight)
    print(f"coach-check: {source}, coach {' '.join(_coach_label(cfg).values())}")
    print(view_line(view))
    print(report.table())
    if args.json is not None:
        result = {**report.to_json(), "source": source, "coach": _coach_label(cfg), "view": view}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written: {args.json}")
    return 0


def _config_file(given: Path) -> Path:
    """``--config``: a file, else the name of a config shipped with mappa (``demo``, which
    ``--help`` names the default; an experiment's ``base:`` takes the same names).
    ``ConfigError`` says what ``given`` is instead, and which names there are."""
    from mappa.experiment.spec import shipped_config, shipped_config_names

    if given.is_file():
        return given
    shipped = None if given.is_dir() else shipped_config(str(given))
    if shipped is not None:
        return shipped
    what = "is a directory" if given.is_dir() else "no such file, nor a shipped config"
    raise ConfigError(
        f"--config {given}: {what}; give a config YAML file or one of "
        f"{', '.join(shipped_config_names())}"
    )


def _config_path(given: Path | None, resume: Path | None, adapters: Path | None) -> Path:
    """The run config train or eval reads: ``--config``, else the resumed run's, else that
    of the run ``--adapters`` points into, else the demo's."""
    from mappa.paths import run_config_file

    if given is not None:
        return _config_file(given)
    if resume is not None:
        return run_config_file(resume)
    return _run_config(adapters) or default_config()


def _run_config(adapters: Path | None) -> Path | None:
    """The training run's own config, when ``--adapters`` points into a run directory (its
    adapters, or one of its checkpoints)."""
    from mappa.paths import checkpoint_of

    if adapters is None:
        return None
    ckpt = checkpoint_of(adapters)
    for run_dir in (adapters, adapters.parent, *([] if ckpt is None else [ckpt.parent.parent])):
        if (run_dir / "config.yaml").is_file() and (run_dir / "adapters").is_dir():
            return run_dir / "config.yaml"
    return None


def _coach_serve(args: argparse.Namespace) -> int:
    """Start the server, print how to point the HTTP coach at it, serve until interrupted."""
    from mappa.coach.servers import make_server

    try:
        server = make_server(
            args.server, args.model, args.max_model_len, args.threads, args.kv_cache_gib, args.port
        )
    except (ValueError, OSError) as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 2
    import signal

    # SIGTERM (a process manager, `kill`) stops it like Ctrl-C: the server process it started
    # is stopped too instead of being left running.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.start()
        print(f"coach server ({server.name}) ready at {server.base_url}", flush=True)
        print(f"  use: coach.backend=http coach.http.base_url={server.base_url}", flush=True)
        print(f"  log: {server.log}; stop with Ctrl-C", flush=True)
        assert server.proc is not None
        code = server.proc.wait()
        print(f"mappa: the server exited ({code}); see {server.log}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, TimeoutError) as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 1
    finally:
        server.stop()


def _report(args: argparse.Namespace) -> int:
    """Write the report; it imports no torch, so it runs beside a training run cheaply."""
    from mappa.report.charts import MissingReportDependency
    from mappa.report.html import write_report

    if args.out is None and len(args.runs) > 1:
        print("mappa: several runs need --out DIR for their common report", file=sys.stderr)
        return 2
    out = args.out or args.runs[0] / "report"
    problem = _out_problem("--out", args.out)
    if problem:
        print(f"mappa: {problem}", file=sys.stderr)
        return 2
    try:
        page = write_report(args.runs, out)
    except (MissingReportDependency, FileNotFoundError, ValueError) as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 2
    print(f"report written: {page}")
    return 0


def _experiment(args: argparse.Namespace) -> int:
    """Check the whole experiment (every arm's config), then run what is left of it."""
    from mappa.experiment import ExperimentError
    from mappa.experiment.runner import Experiment
    from mappa.report.charts import MissingReportDependency

    problem = _out_problem("--out", args.out) or _out_problem("--records", args.records)
    if problem:
        print(f"mappa: {problem}", file=sys.stderr)
        return 2
    _setup_logging()
    if args.look:
        return _look(args)
    try:
        experiment = Experiment(args.config, args.out, args.overrides, args.records)
    except (ExperimentError, MissingReportDependency) as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 2
    if args.reproduce is not None:
        return _reproduce(experiment, args.reproduce)
    try:
        experiment.run()
    except (ExperimentError, RuntimeError, TimeoutError) as err:  # a run or the server failed
        print(f"mappa: {err}\nrerun the same command to resume", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mappa: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


def _reproduce(experiment: Experiment, name: str) -> int:
    """``mappa experiment --reproduce RUN``: one run's first step again, against its record."""
    from mappa.experiment import ExperimentError
    from mappa.experiment.reproduce import verdict_lines

    try:
        run = experiment.recorded_run(name)
    except ExperimentError as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 2
    try:
        comparison, changes = experiment.reproduce(run)
    except (ExperimentError, RuntimeError, TimeoutError) as err:  # the rerun or server failed
        print(f"mappa: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mappa: interrupted", file=sys.stderr)
        return 130
    print("\n".join(verdict_lines(name, comparison, changes)))
    if not comparison.reproduced:
        print(f"the rerun is kept for a look: {experiment.reproduce_dir(name)}")
    return 0 if comparison.reproduced else 1


def _look(args: argparse.Namespace) -> int:
    """``mappa experiment --look``: read the records, run nothing."""
    from mappa.experiment import ExperimentError
    from mappa.experiment.look import look_lines, take_look
    from mappa.experiment.records import Records
    from mappa.experiment.runner import default_out
    from mappa.experiment.spec import load_experiment, plan_runs

    out = args.out or default_out(args.config)
    try:
        spec = load_experiment(args.config, args.overrides)
        runs = plan_runs(spec, args.config, out)
        look = take_look(spec, runs, Records(args.records or out / "records"))
    except ExperimentError as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 2
    print("\n".join(look_lines(look, spec, args.config)))
    return 0


def _push(args: argparse.Namespace) -> int:
    """Everything checked before the network: the run, its adapters, the repository id."""
    from mappa.run.push import PushError, check_repo_id, push, stage

    if not args.run.is_dir():
        print(f"mappa: {args.run}: no such run directory", file=sys.stderr)
        return 2
    try:
        if args.dry_run is not None:
            check_repo_id(args.repo)
            files = stage(args.run, args.repo, args.dry_run)
            print("\n".join(str(args.dry_run / f) for f in files))
            print(f"mappa: --dry-run: the files {args.repo} would get are above; nothing sent")
            return 0
        url = push(args.run, args.repo, private=args.private)
    except PushError as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the Hub's HTTP errors are OSErrors (requests' and httpx')
        print(f"mappa: the upload to {args.repo} failed: {err}", file=sys.stderr)
        return 1
    print(f"pushed: {url}")
    return 0


NO_ESTIMATE = (
    "none (a CPU run, a Ray cluster, or a model whose config.json is not here without a "
    "download; set model.gpu_memory_gib and a local model.path for one)"
)


def main(argv: list[str] | None = None) -> int:
    """``mappa``: every command; Ctrl-C is one line (with where a run can go on), exit 130
    as a shell reports an interrupted program, not a traceback."""
    try:
        return _command(argv)
    except KeyboardInterrupt as err:
        print(_stopped("interrupted", err), file=sys.stderr)
        return 130


def _command(argv: list[str] | None) -> int:
    args = _parse(argv)
    if args.command == "coach-serve":  # needs no run config
        return _coach_serve(args)
    if args.command == "report":
        return _report(args)
    if args.command == "experiment":
        return _experiment(args)
    if args.command == "push":
        return _push(args)
    if args.command == "coach-check":  # its config may be an experiment's, or the run's
        return _coach_check(args)
    resume = getattr(args, "resume", None)
    stop_after = getattr(args, "stop_after", None)
    dry_run = getattr(args, "dry_run", False)
    eval_job = None
    try:
        config_path = _config_path(args.config, resume, getattr(args, "adapters", None))
        if keys := _experiment_keys(config_path):
            raise ConfigError(
                f"{config_path} is an experiment file (it has {', '.join(keys)}); run it "
                f"with: mappa experiment {config_path}"
            )
        cfg = load_config(config_path, args.overrides)
        from mappa.run import preflight  # checks that need more than the schema, model-free

        estimate = preflight.footprint(cfg) if dry_run else None
        if estimate is not None:  # first: a run refused for memory shows what it would need
            print(estimate.table())
        preflight.check(cfg)
        if args.command == "train":
            preflight.check_coach_reachable(cfg)
        if resume is not None:
            from mappa.run.checkpoint import check_resumable

            check_resumable(resume, cfg)
        elif args.command == "train":
            _check_fresh_run_dir(cfg.run_dir)
        if args.command == "eval":
            eval_job = _eval_job(cfg, args)
    except (ConfigError, ValueError, OSError) as err:
        print(f"mappa: {err}", file=sys.stderr)
        return 2
    if dry_run:
        if estimate is None:
            print("memory estimate: " + NO_ESTIMATE)
        print("mappa: the config passed every check (--dry-run: nothing was run)")
        return 0
    which = _which_config(config_path, args.config is None and config_path == default_config())
    if eval_job is not None:
        print(eval_job.plan(which), flush=True)
    else:
        if resume is None:  # the run dir announced is the one the run writes to
            cfg.run_dir = expand_run_dir(cfg.run_dir)
        print(_train_plan(cfg, which, resume, stop_after), flush=True)
    _setup_logging()
    from mappa.coach import CoachFatalError
    from mappa.models.sync_probe import StaleAdapterError
    from mappa.rl.update import NonFiniteError
    from mappa.run.trackers import TrackerError
    from mappa.workflow.function import WorkflowFailed

    try:
        return _train(cfg, resume, stop_after) if eval_job is None else _eval(cfg, eval_job)
    except (CoachFatalError, NonFiniteError, StaleAdapterError, WorkflowFailed) as err:
        print(_stopped(err, err), file=sys.stderr)
        return 1
    except (TrackerError, ConfigError) as err:  # ConfigError: found once the model loaded
        print(f"mappa: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
