"""Labelled coach-check cases: MathChat episodes on arithmetic problems no coach was tuned on.

Writes a JSONL file for ``mappa coach-check --cases FILE``: one action a line,
``{"agent", "task", "answer", "output", "observation", "good", "input", "truncated",
"error"}``. ``error`` names what is wrong with a bad action (null for a good one);
``truncated`` is true only for a reply cut off at the length limit (the coach sees that note
in training too). Usage::

    .venv/bin/python benchmarks/coach_cases.py --seed 1000 --problems 12 --out FILE.jsonl

**Problems.** ``mappa.tasks.arithmetic`` at difficulty 2, the one-step word problems
``configs/mathchat_qwen_cpu.yaml`` trains on (start with N items; gain k, give away k,
multiply by k, or buy b boxes of e), drawn from the ``--seed`` stream (use seeds >= 1000:
the configs' tasks use seed 0); a prompt that also occurs among the first 512 problems of the
seed-0 stream is skipped.

**Episodes.** Every problem gets two chains Problem Solver -> Code Executor -> Verifier whose
labels are complements, so each role has exactly one good and one bad action per problem
(``--problems 24``: 24 good and 24 bad per role, 144 lines). Problem ``i`` uses the pair
``PAIRS[i % 6]``: half the problems GGG/BBB (the pure good and bad stories), the other half
the mixed pairs BGG/GBB, GBG/BGB, GGB/BBG (letters: solver, executor, verifier; G good, B
bad). So a good Code Executor may contradict a wrong solver (its correct program prints the
right number), a good Verifier may trust that code over the solver or recompute when both
are wrong, and a bad Verifier may follow a wrong solver against right code or box a wrong
number after two right agents. Lines come three at a time, one chain each, in role order;
each agent's ``input`` is the config's ``input_template`` filled with this chain's task,
solver output and (for the Verifier) the executor's real observation.

**Bad actions**, picked per role so that each kind is used about equally often (among the
kinds that fit the problem and the chain):

- problem_solver: ``wrong_operation`` (adds what is multiplied, subtracts what is gained,
  adds every number in sight), ``arithmetic_slip`` (the right steps, a result off by 1, 2
  or 10), ``dropped_step`` (forgets the number of boxes), ``misread_question`` (answers the
  items bought, or how many more there are).
- code_executor: ``copies_solver`` (runs, computing the solver's wrong expression),
  ``own_slip`` (runs, a mistyped number: 23 -> 32, 9 -> 8), ``name_error`` and
  ``syntax_error`` (crashes: the observation is the real traceback), ``no_output`` (computes
  but never prints: a bare last expression, an uncalled function).
- verifier: ``echoes_upstream`` (boxes a wrong number the solver or the program gave),
  ``own_slip`` (a wrong number of its own), ``no_box`` (states a number, boxes none),
  ``cut_off`` (a long recheck that ends mid-equation at the 128-token limit).

Good and bad outputs share the same phrasings (terse, step by step, a little padding; the
solver sometimes boxes its result) and all sound equally sure of themselves. Every program
is run through the project's sandbox (``mappa.sandbox.execute``), so each observation is what
training would show. The labels are checked before anything is written: a good solver ends
on the answer and a bad one does not, a good program's output contains the answer and a bad
one's does not (traceback ``line N`` markers aside), a good Verifier boxes the answer and a
bad one does not; every line also passes ``mappa.coach.check.parse_case``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mappa.coach.check import parse_case
from mappa.config import load_config
from mappa.sandbox import SandboxIsolationWarning, execute
from mappa.tasks.arithmetic import generate
from mappa.tasks.math import extract_boxed, grade
from mappa.text import cut_middle

DIFFICULTY = 2
TRAIN_SEED = 0
TRAIN_STREAM = 512
"""Prompts among the first ``TRAIN_STREAM`` problems of the training seed's stream are skipped."""
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "mathchat_qwen_cpu.yaml"
ROLES = ("problem_solver", "code_executor", "verifier")
PAIRS = ("GGG/BBB", "BGG/GBB", "GGG/BBB", "GBG/BGB", "GGG/BBB", "GGB/BBG")
SOLVER_ERRORS = ("wrong_operation", "arithmetic_slip", "dropped_step", "misread_question")
EXECUTOR_ERRORS = ("copies_solver", "own_slip", "name_error", "syntax_error", "no_output")
VERIFIER_ERRORS = ("echoes_upstream", "own_slip", "no_box", "cut_off")
SLIPS = (-1, 1, -2, 2, -10, 10)

_PROBLEM = re.compile(
    r"^(?P<name>\w+) has (?P<s>\d+) (?P<item>\w+)\. Then (?:"
    r"(?P=name) gets (?P<add>\d+) more (?P=item)|"
    r"(?P=name) gives away (?P<sub>\d+) (?P=item)|"
    r"the number of (?P=item) is multiplied by (?P<mul>\d+)|"
    r"(?P=name) buys (?P<boxes>\d+) boxes with (?P<e>\d+) (?P=item) in each box"
    r")\. How many (?P=item) does (?P=name) have now\?$"
)
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?![\w])")
_RESULT = re.compile(r"=\s*(-?\d+)(?![\w])")
_TRACE_LINE = re.compile(r'^\s*File ".*", line \d+')


# ------------------------------------------------------------------------------ problems
@dataclass(frozen=True)
class Problem:
    """A level-2 arithmetic problem, parsed: ``op`` is add, sub, mul or boxes; ``values``
    holds ``s`` (the start) and ``k`` (add/sub/mul) or ``b`` and ``e`` (boxes)."""

    task: str
    answer: int
    name: str
    item: str
    op: str
    values: dict[str, int]

    @property
    def s(self) -> int:
        return self.values["s"]

    def clause(self) -> str:
        """The problem's one step, as a sentence written about it."""
        v, n, item = self.values, self.name, self.item
        return {
            "add": f"{n} gets {v.get('k')} more {item}",
            "sub": f"{n} gives away {v.get('k')} {item}",
            "mul": f"The number of {item} is multiplied by {v.get('k')}",
            "boxes": f"{n} buys {v.get('b')} boxes with {v.get('e')} {item} in each",
        }[self.op]


def parse_problem(task: str, answer: str) -> Problem:
    """The problem's parts; raises if the generator's wording changed or the answer does not
    follow from them."""
    m = _PROBLEM.match(task)
    if m is None:
        raise ValueError(f"not a level-{DIFFICULTY} arithmetic problem: {task!r}")
    op = next(o for o in ("add", "sub", "mul", "boxes") if m.group(o) is not None)
    values = {"s": int(m.group("s"))}
    if op == "boxes":
        values |= {"b": int(m.group("boxes")), "e": int(m.group("e"))}
    else:
        values["k"] = int(m.group(op))
    p = Problem(task, int(answer), m.group("name"), m.group("item"), op, values)
    if evaluate(CORRECT_EXPR[op], values) != p.answer:
        raise ValueError(f"{task!r}: the parsed steps do not give the answer {answer}")
    return p


def problems(seed: int, n: int) -> list[Problem]:
    """The first ``n`` problems of the ``seed`` stream that the training stream lacks."""
    seen = {t.prompt for t in generate(TRAIN_STREAM, seed=TRAIN_SEED, difficulty=DIFFICULTY)}
    tasks = [t for t in generate(n + 64, seed=seed, difficulty=DIFFICULTY) if t.prompt not in seen]
    if len(tasks) < n:
        raise ValueError(f"seed {seed}: only {len(tasks)} problems not in the training stream")
    out = []
    for t in tasks[:n]:
        assert t.answer is not None
        out.append(parse_problem(t.prompt, t.answer))
    return out


CORRECT_EXPR = {
    "add": "{s} + {k}",
    "sub": "{s} - {k}",
    "mul": "{s} * {k}",
    "boxes": "{s} + {b} * {e}",
}


def evaluate(expr: str, values: dict[str, int]) -> int:
    """The value of one of this module's expression templates (``+ - *`` on integers)."""
    result = eval(expr.format(**values), {"__builtins__": {}})  # our own templates only
    assert isinstance(result, int)
    return result


# --------------------------------------------------------------------------------- work
@dataclass(frozen=True)
class Work:
    """A line of reasoning: ``steps`` as (clause, equation) with ``×`` for times, the number
    it ends on, the expression template a program following it computes (None: a slip no
    expression reproduces), and what is wrong with it (None: nothing)."""

    steps: tuple[tuple[str, str], ...]
    final: int
    expr: str | None
    error: str | None = None
    more: bool = False  # the closing says "N more items" (answers the increase)

    def chain(self, times: str = "×") -> str:
        return " and ".join(eq for _, eq in self.steps).replace("×", times)


def correct_work(p: Problem) -> Work:
    v = p.values
    if p.op == "boxes":
        be = v["b"] * v["e"]
        return Work(
            (
                (p.clause(), f"{v['b']} × {v['e']} = {be}"),
                (
                    f"Together with the {p.s} {p.item} {p.name} already has",
                    f"{p.s} + {be} = {p.answer}",
                ),
            ),
            p.answer,
            CORRECT_EXPR["boxes"],
        )
    sign = {"add": "+", "sub": "-", "mul": "×"}[p.op]
    return Work(
        ((p.clause(), f"{p.s} {sign} {v['k']} = {p.answer}"),), p.answer, CORRECT_EXPR[p.op]
    )


def solver_errors(p: Problem) -> list[str]:
    """The solver's error kinds that fit ``p``: a wrong operation must give a non-negative,
    different number; only boxes have a step to drop and an intermediate quantity to answer
    instead (a product's "how many more" would state the answer on the way)."""
    kinds = ["arithmetic_slip"]
    if p.op != "add" or p.s > p.values["k"]:
        kinds.append("wrong_operation")
    if p.op == "boxes":
        kinds.append("dropped_step")
    if p.op == "boxes":
        kinds.append("misread_question")
    return kinds


def slipped(value: int, rng: random.Random, avoid: Iterable[int] = ()) -> int:
    """``value`` off by a small amount (1, 2 or a carried 10), never negative or in ``avoid``."""
    bad = {value, *avoid}
    options = [value + d for d in SLIPS if value + d >= 0 and value + d not in bad]
    return rng.choice(options)


def bad_work(p: Problem, kind: str, rng: random.Random) -> Work:
    """The solver's reasoning with the error ``kind``, worded as confidently as good work."""
    v, item, n = p.values, p.item, p.name
    if kind == "wrong_operation":
        expr = {
            "add": "{s} - {k}",
            "sub": "{s} + {k}",
            "mul": "{s} + {k}",
            "boxes": "{s} + {b} + {e}",
        }[p.op]
        r = evaluate(expr, v)
        eq = expr.format(**v).replace("*", "×") + f" = {r}"
        return Work(((p.clause(), eq),), r, expr, kind)
    if kind == "dropped_step":  # boxes: forgets how many boxes
        r = v["s"] + v["e"]
        clause = f"{n} buys boxes with {v['e']} {item} in each"
        return Work(((clause, f"{v['s']} + {v['e']} = {r}"),), r, "{s} + {e}", kind)
    if kind == "misread_question":
        if p.op == "boxes":  # answers the items bought
            r = v["b"] * v["e"]
            return Work(((p.clause(), f"{v['b']} × {v['e']} = {r}"),), r, "{b} * {e}", kind)
        prod = v["s"] * v["k"]  # mul: answers how many more there are
        steps = (
            (p.clause(), f"{v['s']} × {v['k']} = {prod}"),
            ("That is an increase of", f"{prod} - {v['s']} = {prod - v['s']}"),
        )
        return Work(steps, prod - v["s"], "{s} * {k} - {s}", kind, more=True)
    if kind == "arithmetic_slip":
        good = correct_work(p)
        if p.op == "boxes" and rng.random() < 0.5:  # the product slips, the sum follows it
            be = slipped(v["b"] * v["e"], rng, [p.answer - v["s"]])
            r = v["s"] + be
            steps = (
                (good.steps[0][0], f"{v['b']} × {v['e']} = {be}"),
                (good.steps[1][0], f"{v['s']} + {be} = {r}"),
            )
            return Work(steps, r, "{s} + " + str(be), kind)
        r = slipped(p.answer, rng)
        clause, eq = good.steps[-1]
        steps = (*good.steps[:-1], (clause, eq.rsplit("=", 1)[0] + f"= {r}"))
        return Work(steps, r, None, kind)
    raise ValueError(f"unknown solver error {kind!r}")


def closing(p: Problem, w: Work) -> str:
    return f"{p.name} has {w.final} {'more ' if w.more else ''}{p.item}"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def solver_text(p: Problem, w: Work, rng: random.Random) -> str:
    """The Problem Solver's reply: one of five phrasings, the same for good and bad work."""
    times = rng.choice(["×", "*"])
    steps = [(_cap(c), eq.replace("×", times)) for c, eq in w.steps]
    style = rng.randrange(5)
    if style == 0:  # terse
        return " ".join(f"{eq}." for _, eq in steps) + f" {closing(p, w)}."
    if style == 1:  # prose
        body = " ".join(f"{c}: {eq}." for c, eq in steps)
        return f"{p.name} starts with {p.s} {p.item}. {body} So {closing(p, w)} now."
    if style == 2:  # numbered, with an answer line
        lines = [f"Step 1: {p.name} starts with {p.s} {p.item}."]
        lines += [f"Step {i}: {c}: {eq}." for i, (c, eq) in enumerate(steps, 2)]
        return "\n".join(lines) + f"\n\nAnswer: {w.final}"
    if style == 3:  # a list, boxed
        body = "\n".join(f"- {c}: {eq}." for c, eq in steps)
        return (
            f"Let's solve this step by step.\n\n{body}\n\n"
            f"So {closing(p, w)}. The answer is \\boxed{{{w.final}}}."
        )
    body = " ".join(f"{c}, so {eq}." for c, eq in steps)
    return (
        f"We need to find how many {p.item} {p.name} has at the end. {body} "
        f"Therefore, {closing(p, w)}."
    )


# ------------------------------------------------------------------------------ programs
_K_NAMES = {"add": "more", "sub": "given_away", "mul": "factor"}


def _names(p: Problem) -> dict[str, str]:
    return {"s": p.item, "k": _K_NAMES.get(p.op, "k"), "b": "boxes", "e": "per_box", "p": "bought"}


def _fields(expr: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r"\{(\w)\}", expr)))


def program(p: Problem, expr: str, values: dict[str, int], style: str) -> str:
    """A program computing ``expr`` (a template over ``values``) in one of the ``style``s:
    the correct ones print it; ``name_*``, ``syntax_*`` crash; ``silent_*`` print nothing."""
    names = _names(p)
    var = p.item
    numeric = expr.format(**values)
    with_var = expr.format(**{**{f: str(x) for f, x in values.items()}, "s": var})
    declared = [f for f in values if f in _fields(expr) or f == "s"]
    decls = "\n".join(f"{names[f]} = {values[f]}" for f in declared)
    named = expr.format(**{f: names[f] for f in values})
    sentence = f'print(f"{p.name} has {{total}} {p.item} now.")'
    first = names[_fields(expr)[0]]
    fn_body = f"def solve():\n    {var} = {values['s']}\n    return {with_var}"
    styles: dict[str, str] = {
        "oneliner": f"print({numeric})",
        "update": f"{var} = {values['s']}\n{var} = {with_var}\nprint({var})",
        "named": f"{decls}\ntotal = {named}\n{sentence}",
        "comment": f"# {p.item} {p.name} has at the end\nprint({numeric})",
        "function": f"{fn_body}\n\nprint(solve())",
        "name_print": f"{decls}\ntotal = {named}\nprint(total_{var})",
        "name_update": f"{var} = {values['s']}\n{var} = {with_var}\nprint({var}_now)",
        "name_case": f"{decls}\ntotal = {named.replace(first, _cap(first), 1)}\nprint(total)",
        "syntax_print": f"{var} = {values['s']}\n{var} = {with_var}\nprint {var}",
        "syntax_paren": f"{decls}\ntotal = ({named}\nprint(total)",
        "syntax_quote": f'{decls}\ntotal = {named}\nprint(f"{p.name} has {{total}} {p.item} now.)',
        "silent_bare": f"{var} = {values['s']}\n{var} = {with_var}\n{var}",
        "silent_function": fn_body,
        "silent_named": f"{decls}\ntotal = {named}\ntotal",
    }
    return styles[style]


RUNS = ("oneliner", "update", "named", "comment", "function")
CRASHES = {
    "name_error": ("name_print", "name_update", "name_case"),
    "syntax_error": ("syntax_print", "syntax_paren", "syntax_quote"),
    "no_output": ("silent_bare", "silent_function", "silent_named"),
}


@dataclass(frozen=True)
class Run:
    """A program's real observation (``ExecutionResult.observation()``) and status."""

    observation: str
    ok: bool


_RUNS: dict[str, Run] = {}


def run(code: str) -> Run:
    """Run ``code`` as training runs the Code Executor's block: a fresh script in a fresh
    workspace, through the project's sandbox."""
    if code not in _RUNS:
        with tempfile.TemporaryDirectory() as workdir, warnings.catch_warnings():
            warnings.simplefilter("ignore", SandboxIsolationWarning)
            result = execute(code, Path(workdir))
        _RUNS[code] = Run(result.observation(), result.status == "ok")
    return _RUNS[code]


def shown_numbers(observation: str) -> list[int]:
    """The numbers an observation shows, traceback ``File ..., line N`` markers aside."""
    lines = [ln for ln in observation.splitlines() if not _TRACE_LINE.match(ln)]
    return [int(x) for x in _NUMBER.findall("\n".join(lines))]


def executor_text(code: str, rng: random.Random) -> str:
    block = f"```python\n{code}\n```"
    return rng.choice(
        [
            block,
            f"Here is the program:\n\n{block}",
            f"{block}\n\nThe program prints the result.",
            f"I'll compute it directly:\n\n{block}",
        ]
    )


def typo_values(p: Problem, rng: random.Random) -> dict[str, int]:
    """The problem's numbers with one mistyped (digits swapped, or off by one), so that the
    correct expression gives a different, non-negative number."""
    for _ in range(100):
        f = rng.choice(list(p.values))
        x = p.values[f]
        digits = str(x)
        swapped = int(digits[::-1]) if len(digits) == 2 and digits[0] != digits[1] != "0" else x
        typo = rng.choice([swapped, x + 1, max(x - 1, 1)])
        values = {**p.values, f: typo}
        r = evaluate(CORRECT_EXPR[p.op], values)
        if typo != x and r >= 0 and r != p.answer:
            return values
    raise ValueError(f"{p.task!r}: no typo changes the answer")


# ----------------------------------------------------------------------------- verifier
@dataclass(frozen=True)
class Seen:
    """What the Verifier sees of the code: a printed number, a crash, or nothing."""

    printed: int | None
    crash: str | None

    def phrase(self) -> str:
        if self.printed is not None:
            return f"The program printed {self.printed}"
        if self.crash is not None:
            return f"The program failed with a {self.crash}"
        return "The program printed nothing"


def seen(r: Run) -> Seen:
    if r.ok:
        numbers = shown_numbers(r.observation)
        return Seen(numbers[-1] if numbers else None, None)
    last = r.observation.strip().splitlines()[-1]
    return Seen(None, last.split(":", 1)[0] if ":" in last else "error")


def verifier_good(p: Problem, solver: Work, code: Seen, rng: random.Random) -> str:
    a, chain, sf = p.answer, correct_work(p).chain(rng.choice(["×", "*"])), solver.final
    box = f"\\boxed{{{a}}}"
    if solver.error is None and code.printed == a:
        options = [
            box,
            f"The program printed {a}, which matches the solver's result. {box}",
            f"Checking: {chain}. The code output {a} agrees.\n\n{box}",
            f"Both the solution and the program give {a} {p.item}. Final answer: {box}",
        ]
    elif code.printed == a:
        options = [
            f"The program printed {a}. The solver's {sf} is wrong: {chain}. {box}",
            f"Recomputing: {chain}. This matches the code output, not the solver's {sf}.\n\n{box}",
            box,
        ]
    elif solver.error is None:
        options = [
            f"{code.phrase()}, so I check by hand: {chain}. This agrees with the solver. {box}",
            f"Checking: {chain}. {box}",
            f"The solver's work is correct: {chain}. {code.phrase()}, which does not change "
            f"the answer. {box}",
        ]
    else:
        options = [
            f"Recomputing from the problem: {chain}. The earlier {sf} is wrong. {box}",
            f"Checking: {chain}. {box}",
            f"{code.phrase()}, and the solver's {sf} does not fit the problem: {chain}.\n\n{box}",
        ]
    return rng.choice(options)


def verifier_errors(solver: Work, code: Seen, answer: int) -> list[str]:
    wrong_upstream = solver.error is not None or (code.printed not in (None, answer))
    return [k for k in VERIFIER_ERRORS if k != "echoes_upstream" or wrong_upstream]


def verifier_bad(
    p: Problem, solver: Work, code: Seen, kind: str, rng: random.Random
) -> tuple[str, bool]:
    """A bad Verifier reply of ``kind`` and whether it is cut off at the length limit."""
    a, times = p.answer, rng.choice(["×", "*"])
    right = correct_work(p)
    if kind == "echoes_upstream":
        sources = []
        if solver.error is not None:
            sources.append("solver")
        if code.printed not in (None, a):
            sources.append("program")
        source = rng.choice(sources)
        w = solver.final if source == "solver" else code.printed
        assert w is not None
        box = f"\\boxed{{{w}}}"
        if solver.final == code.printed:  # both say w: word it as agreement
            options = [
                box,
                f"The program printed {w}, which matches the solver's result. {box}",
                f"Checking: {solver.chain(times)}. The code output {w} agrees.\n\n{box}",
                f"Both the solution and the program give {w} {p.item}. Final answer: {box}",
            ]
        elif source == "solver":
            options = [
                f"Checking: {solver.chain(times)}. {box}",
                f"The solver's work is correct: {solver.chain(times)}. {code.phrase()}, which "
                f"does not change the answer. {box}",
                f"{p.name} has {w} {p.item}, as the solver found. {box}",
            ]
        else:
            options = [
                f"The program printed {w}, so the solver's {solver.final} is wrong. {box}",
                f"The code is more reliable than the hand calculation: {p.name} has {w} "
                f"{p.item}. {box}",
                box,
            ]
        return rng.choice(options), False
    if kind == "own_slip":
        w = slipped(a, rng, [solver.final, *([code.printed] if code.printed is not None else [])])
        eqs = [eq.replace("×", times) for _, eq in right.steps]
        eqs[-1] = eqs[-1].rsplit("=", 1)[0] + f"= {w}"
        box = f"\\boxed{{{w}}}"
        options = [f"Checking: {' and '.join(eqs)}. {box}", box]
        if solver.error is None and code.printed == a:
            options.append(f"Both the solution and the program agree. Final answer: {box}")
        return rng.choice(options), False
    if kind == "no_box":
        trusted = right if (solver.error is None or code.printed == a) else solver
        x = trusted.final
        options = [
            f"Checking: {trusted.chain(times)}. So {p.name} has {x} {p.item}.",
            f"{code.phrase()}. Final answer: {x}",
            f"{p.name} has {x} {p.item} at the end.",
        ]
        return rng.choice(options), False
    if kind == "cut_off":  # a long recheck stopped at the 128-token limit, mid-equation
        v = p.values
        if p.op == "boxes":
            calc = (
                f"First, the {p.item} in the boxes: {v['b']} {times} {v['e']} = {v['b'] * v['e']}. "
                f"Then we add the {p.s} {p.item} {p.name} had at the start: {p.s} + "
                f"{v['b'] * v['e']} ="
            )
        else:
            sign = {"add": "+", "sub": "-", "mul": times}[p.op]
            calc = (
                f"Starting from the {p.s} {p.item} {p.name} had at the beginning and applying "
                f"the change described in the problem, we get {p.s} {sign} {v['k']} ="
            )
        text = (
            "Let's verify the solution step by step.\n\n"
            f"1. **Starting amount**: {p.name} starts with {p.s} {p.item}.\n"
            f"2. **The change**: {p.clause()}.\n"
            f"3. **The Problem Solver's result**: the solver found {solver.final} {p.item}.\n"
            f"4. **The code output**: {code.phrase()}.\n"
            "5. **Recalculation**: To be sure, let's redo the calculation carefully, one "
            f"operation at a time. {calc}"
        )
        return text, True
    raise ValueError(f"unknown verifier error {kind!r}")


# -------------------------------------------------------------------------------- chains
class Picker:
    """Picks each role's next error kind among those that fit: the least used so far, ties
    broken at random, so that the kinds come out about equally often."""

    def __init__(self) -> None:
        self.used: dict[str, Counter[str]] = {r: Counter() for r in ROLES}

    def pick(self, role: str, kinds: Sequence[str], rng: random.Random) -> str:
        least = min(self.used[role][k] for k in kinds)
        kind = rng.choice([k for k in kinds if self.used[role][k] == least])
        self.used[role][kind] += 1
        return kind


@dataclass(frozen=True)
class Templates:
    """The agents' ``input_template``s and the workflow settings that fill them."""

    inputs: dict[str, str]
    no_code: str
    observation_chars: int

    @staticmethod
    def from_config(path: Path) -> Templates:
        cfg = load_config(path)
        inputs = {a.name: a.input_template for a in cfg.agents}
        missing = [r for r in ROLES if r not in inputs]
        if missing:
            raise ValueError(f"{path}: no agent {', '.join(missing)}")
        return Templates(inputs, cfg.workflow.no_code_observation, cfg.workflow.observation_chars)

    def fill(self, role: str, fields: dict[str, str]) -> str:
        return self.inputs[role].format_map(fields)


def chain(
    p: Problem, pattern: str, rng: random.Random, picker: Picker, templates: Templates
) -> list[dict[str, Any]]:
    """One episode, labelled by ``pattern`` (solver, executor, verifier: G good, B bad)."""
    s_good, e_good, v_good = (c == "G" for c in pattern)
    solver = (
        correct_work(p)
        if s_good
        else bad_work(p, picker.pick(ROLES[0], solver_errors(p), rng), rng)
    )
    solver_out = solver_text(p, solver, rng)

    if e_good:
        e_error = None
        candidates = [(CORRECT_EXPR[p.op], p.values, st) for st in RUNS]
    else:
        kinds = [
            k
            for k in EXECUTOR_ERRORS
            if k != "copies_solver" or solver.expr is not None and solver.error
        ]
        e_error = picker.pick(ROLES[1], kinds, rng)
        base = solver.expr if solver.expr is not None else CORRECT_EXPR[p.op]
        if e_error == "copies_solver":
            candidates = [(base, p.values, st) for st in RUNS]
        elif e_error == "own_slip":
            candidates = [(CORRECT_EXPR[p.op], typo_values(p, rng), st) for st in RUNS]
        else:
            candidates = [(base, p.values, st) for st in CRASHES[e_error]]
    rng.shuffle(candidates)
    for expr, values, style in candidates:
        code = program(p, expr, values, style)
        result = run(code)
        shows = p.answer in shown_numbers(result.observation)
        if e_good and result.ok and shows:
            break
        if (
            not e_good
            and not shows
            and result.ok == (e_error in ("copies_solver", "own_slip", "no_output"))
            and (e_error != "no_output" or result.observation == "[no output]")
        ):
            break
    else:
        raise AssertionError(f"{p.task!r}: no program fits label {pattern[1]} ({e_error})")
    executor_out = executor_text(code, rng)
    code_seen = seen(result)

    truncated = False
    if v_good:
        v_error = None
        verifier_out = verifier_good(p, solver, code_seen, rng)
    else:
        v_error = picker.pick(ROLES[2], verifier_errors(solver, code_seen, p.answer), rng)
        verifier_out, truncated = verifier_bad(p, solver, code_seen, v_error, rng)

    fields = {
        "task": p.task,
        "problem_solver_output": solver_out,
        "problem_solver_observation": templates.no_code,
        "code_executor_output": executor_out,
        "code_executor_observation": cut_middle(result.observation, templates.observation_chars),
        "verifier_output": verifier_out,
        "verifier_observation": templates.no_code,
    }
    rows = [
        (ROLES[0], solver_out, None, s_good, solver.error, False),
        (ROLES[1], executor_out, result.observation, e_good, e_error, False),
        (ROLES[2], verifier_out, None, v_good, v_error, truncated),
    ]
    return [
        {
            "agent": role,
            "task": p.task,
            "answer": str(p.answer),
            "output": out,
            "observation": obs,
            "good": good,
            "input": templates.fill(role, fields),
            "truncated": cut,
            "error": error,
        }
        for role, out, obs, good, error, cut in rows
    ]


# --------------------------------------------------------------------------------- checks
def _require(ok: bool, case: dict[str, Any], why: str) -> None:
    if not ok:
        raise AssertionError(
            f"{case['agent']} ({'good' if case['good'] else 'bad'}): {why}\n{case}"
        )


def check_case(case: dict[str, Any]) -> None:
    """Raise unless the label fits the action: a good solver ends on the answer and a bad one
    neither ends on it nor derives it; a good program's output shows the answer and a bad
    one's does not; a good Verifier boxes the answer and a bad one does not."""
    answer, out, good = int(case["answer"]), case["output"], case["good"]
    if case["agent"] == "problem_solver":
        numbers = [int(x) for x in _NUMBER.findall(out)]
        _require(bool(numbers), case, "states no number")
        if good:
            _require(numbers[-1] == answer, case, "does not end on the answer")
        else:
            results = [int(x) for x in _RESULT.findall(out)]
            _require(numbers[-1] != answer and answer not in results, case, "states the answer")
        boxed = extract_boxed(out)
        _require(boxed is None or (boxed == str(answer)) == good, case, "boxes the wrong label")
        _require(case["observation"] is None, case, "the solver runs no code")
    elif case["agent"] == "code_executor":
        obs = case["observation"]
        _require(isinstance(obs, str), case, "no observation")
        _require((answer in shown_numbers(obs)) == good, case, "observation contradicts the label")
        _require("```python\n" in out, case, "no python block")
    else:
        _require(grade(out, answer) == good, case, "boxed answer contradicts the label")
        _require(case["observation"] is None, case, "the verifier runs no code")


def check_chain(rows: Sequence[dict[str, Any]]) -> None:
    """Each input holds the task and what the agents before it wrote and saw."""
    solver, executor, verifier = rows
    _require(solver["input"].endswith(solver["task"]), solver, "input lacks the task")
    _require(solver["output"] in executor["input"], executor, "input lacks the solver's text")
    for part in (solver["output"], executor["observation"]):
        _require(part in verifier["input"], verifier, "input lacks the upstream text")


# ----------------------------------------------------------------------------------- main
def build(seed: int, n: int, config: Path = CONFIG) -> tuple[list[dict[str, Any]], Counter[str]]:
    """All cases for the first ``n`` unseen problems of the ``seed`` stream, checked, and
    how often each chain pattern was used."""
    templates = Templates.from_config(config)
    picker, patterns = Picker(), Counter[str]()
    rows: list[dict[str, Any]] = []
    for i, p in enumerate(problems(seed, n)):
        rng = random.Random(f"coach-cases-{seed}-{i}")
        for pattern in PAIRS[i % len(PAIRS)].split("/"):
            episode = chain(p, pattern, rng, picker, templates)
            for case in episode:
                check_case(case)
            check_chain(episode)
            rows.extend(episode)
            patterns[pattern] += 1
    return rows, patterns


def summary(rows: Sequence[dict[str, Any]], patterns: Counter[str]) -> str:
    lines = [f"{'role':<16}{'good':>6}{'bad':>6}  bad kinds"]
    for role in ROLES:
        mine = [r for r in rows if r["agent"] == role]
        kinds = Counter(r.get("error", "?") for r in mine if not r["good"])
        shown = ", ".join(f"{k} {c}" for k, c in sorted(kinds.items()))
        good = sum(r["good"] for r in mine)
        lines.append(f"{role:<16}{good:>6}{len(mine) - good:>6}  {shown}")
    lines.append("chains: " + ", ".join(f"{p} {c}" for p, c in sorted(patterns.items())))
    cut = sum(r["truncated"] for r in rows)
    lines.append(f"cut off (truncated: true): {cut}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--seed", type=int, default=1000, help="problem stream (>= 1000: unseen)")
    ap.add_argument("--problems", type=int, default=12, help="problems (6 cases each)")
    ap.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    ap.add_argument("--config", type=Path, default=CONFIG, help="input templates from here")
    args = ap.parse_args(argv)
    if args.problems < 1:
        ap.error("--problems must be at least 1")
    if args.seed == TRAIN_SEED:
        print(f"warning: seed {TRAIN_SEED} is the training stream", file=sys.stderr)
    rows, patterns = build(args.seed, args.problems, args.config)
    for i, row in enumerate(rows, 1):
        parse_case(row, ROLES, f"line {i}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"{args.out}: {len(rows)} cases, {args.problems} problems (seed {args.seed})")
    print(summary(rows, patterns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
