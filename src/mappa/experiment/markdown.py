"""``results.md``: the results of ``mappa.experiment.results.summarize`` as tables a person
reads (and pastes into a write-up); every number is in ``results.json`` too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def fmt(x: Any, digits: int = 3) -> str:
    """A number for a table cell; ``-`` for a missing one.

    >>> fmt(0.33333), fmt(None), fmt(12)
    ('0.333', '-', '12')
    """
    if x is None:
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def cell(stats: dict[str, Any], digits: int = 3) -> str:
    """``mean (min-max, sd std, n=N)``, or the bare value of a single seed.

    >>> cell({"n": 2, "mean": 0.375, "min": 0.25, "max": 0.5, "std": 0.177})
    '0.375 (0.250-0.500, sd 0.177, n=2)'
    >>> cell({"n": 1, "mean": 0.5, "min": 0.5, "max": 0.5, "std": None})
    '0.500 (n=1)'
    >>> cell({"n": 2, "mean": 2.5, "min": 2.0, "max": 3.0, "std": 0.7071}, 1)
    '2.5 (2.0-3.0, sd 0.7, n=2)'
    """
    if not stats["n"]:
        return "-"
    if stats["n"] == 1:
        return f"{fmt(stats['mean'], digits)} (n=1)"
    return (
        f"{fmt(stats['mean'], digits)} ({fmt(stats['min'], digits)}-{fmt(stats['max'], digits)}, "
        f"sd {fmt(stats['std'], digits)}, n={stats['n']})"
    )


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]


def results_markdown(results: dict[str, Any], title: str) -> str:
    """The whole ``results.md``."""
    arms: dict[str, Any] = results["arms"]
    steps = sorted({p["step"] for a in arms.values() for p in a["heldout"]})
    episodes = {p["step"]: p.get("episodes") for a in arms.values() for p in a["heldout"]}
    lines = [f"# {title}", ""]
    lines += ["## Held-out accuracy by step (mean over seeds; min-max, sd, n)", ""]
    lines += [
        "Step 0 is the base model, evaluated once; it is every arm's starting point. In "
        "brackets: the training episodes sampled by then.",
        "",
    ]
    by_step = {arm: {p["step"]: p for p in a["heldout"]} for arm, a in arms.items()}
    lines += table(
        [
            "arm",
            *(f"step {s}" + ("" if episodes[s] is None else f" ({episodes[s]})") for s in steps),
        ],
        [
            [arm, *(cell(by_step[arm][s]) if s in by_step[arm] else "-" for s in steps)]
            for arm in arms
        ],
    )
    window = results["train_window"]
    lines += ["## Per arm", ""]
    lines += table(
        [
            "arm",
            "seeds",
            "final held-out",
            f"training accuracy (last {window} steps)",
            "wall s/run",
        ],
        [
            [
                arm,
                ", ".join(map(str, a["seeds"])),
                cell(a["final"]),
                cell(a["train_accuracy"]),
                fmt(a["wall_s"]["mean"], 0),
            ]
            for arm, a in arms.items()
        ],
    )
    lines += ["## Optimizer steps each agent took (over seeds)", ""]
    lines += table(
        ["arm", "agent", "steps"],
        [
            [arm, agent, cell(s, 1)]
            for arm, a in arms.items()
            for agent, s in a["optimizer_steps"].items()
        ],
    )
    coached = {arm: a["coach"] for arm, a in arms.items() if a["coach"]}
    if coached:
        lines += [f"## Coach scores 0-10 (first {window} steps -> last {window})", ""]
        rows = [
            [arm, agent, cell(s["start"]), cell(s["end"])]
            for arm, per_agent in coached.items()
            for agent, s in per_agent.items()
        ]
        lines += table(["arm", "agent", "start", "end"], rows)
    lines += ["## Training steps whose batch held no right episode (over seeds)", ""]
    lines += ["On these an outcome reward is the same for every action: nothing to learn.", ""]
    lines += table(
        ["arm", "steps"],
        [[arm, cell(a["starved_steps"], 1)] for arm, a in arms.items() if "starved_steps" in a],
    )
    credited = {arm: a["credit"] for arm, a in arms.items() if a.get("credit")}
    if credited:
        lines += ["## Credit assignment: training scores against the oracle's verdicts", ""]
        lines += [
            "Per agent, over all seeds' training actions: the AUC of the scores against "
            "each action's oracle verdict (its result equals the reference; a right action "
            "above a wrong one, ties half), with how many were right and wrong. Then, in "
            "failed episodes, how often the lowest score fell on the first agent that went "
            "wrong (episodes with a wrong action and no tie for the lowest).",
            "",
        ]
        rows = [
            [arm, agent, fmt(v["auc"]), f"{v['right']} / {v['wrong']}"]
            for arm, c in credited.items()
            for agent, v in c["oracle_auc"].items()
        ]
        lines += table(["arm", "agent", "AUC against the oracle", "right / wrong"], rows)
        rows = [
            [arm, f"{c['first_wrong_lowest']['hits']} / {c['first_wrong_lowest']['episodes']}"]
            for arm, c in credited.items()
        ]
        lines += table(["arm", "lowest score on the first wrong agent"], rows)
    lines += tool_outcome_section(arms)
    keys = list(dict.fromkeys(k for a in arms.values() for k in a["behaviour"]))
    if keys:
        lines += ["## Behaviour on the held-out set (final evaluation; base model beside)", ""]
        rows = []
        for key in keys:
            present = [a["behaviour"][key] for a in arms.values() if key in a["behaviour"]]
            base = fmt(present[0]["base"]) if present else "-"
            values = [
                cell(a["behaviour"][key]) if key in a["behaviour"] else "-" for a in arms.values()
            ]
            rows.append([key, base, *values])
        lines += table(["metric", "base", *arms], rows)
    lines += look_section(results.get("look"))
    lines += verdict_lines(results)
    return "\n".join(lines)


def tool_outcome_section(arms: Mapping[str, Any]) -> list[str]:
    """Each arm's tool-using agents' training actions by how their code run ended."""
    rows = [
        [arm, t["agent"], t["status"], str(t["actions"]), fmt(t["mean_score"], 2),
         fmt(t["oracle_right"])]
        for arm, a in arms.items()
        for t in a.get("tool_outcomes", [])
    ]  # fmt: skip
    if not rows:
        return []
    return [
        "## Tool-using agents' training actions by how their code run ended",
        "",
        "Over all seeds: how many actions, their mean reward score (`-`: the arm has no "
        "per-action score) and the share the oracle found right. `no code`: the reply ran "
        "no program.",
        "",
        *table(["arm", "agent", "code run", "actions", "mean score", "oracle right"], rows),
    ]


def look_section(look: Mapping[str, Any] | None) -> list[str]:
    """The look taken part way (``mappa.experiment.look``), if one was."""
    if not look:
        return []
    a, b = look["pair"]
    return [
        "## The look part way (analysis.look)",
        "",
        f"Taken {look['taken']} on seeds {look['seeds']}: the SD of the per-seed differences "
        f"{a} - {b} was {look['sd']:.3f} (their mean was not read); it decided "
        f"{look['decided']} seeds ({look['planned']} planned).",
        "",
    ]


def interval(ci: Sequence[float] | None) -> str:
    """``low to high``, signed; ``-`` for none.

    >>> interval([-0.0312, 0.15]), interval(None)
    ('-0.031 to +0.150', '-')
    """
    return "-" if ci is None else f"{ci[0]:+.3f} to {ci[1]:+.3f}"


def _seeds(c: dict[str, Any]) -> str:
    if c["test"] == "Welch t":
        return f"{c['a']}: {', '.join(map(str, c['seeds_a']))}; {c['b']}: " + ", ".join(
            map(str, c["seeds_b"])
        )
    return ", ".join(map(str, c["seeds_a"])) or "-"


def verdict_lines(results: dict[str, Any]) -> list[str]:
    """The comparisons of final held-out accuracy: which were named, the rule, the table."""
    plan = results["analysis"]
    named = "none" if plan["primary"] is None else " - ".join(plan["primary"])
    second = plan["secondary"]
    if not isinstance(second, str):
        second = "; ".join(" - ".join(p) for p in second) or "none"
    lines = ["## Verdicts on final held-out accuracy", ""]
    lines += [f"Primary comparison: {named}. Secondary (Holm-corrected): {second}.", ""]
    lines += [f"Rule: {results['verdict_rule']}.", ""]
    lines += table(
        [
            "",
            "A",
            "B",
            "test",
            "seeds",
            "A - B",
            "95 % CI",
            "p",
            "Holm p",
            "bootstrap 95 % CI",
            "verdict",
        ],
        [
            [
                c["role"],
                c["a"],
                c["b"],
                c["test"] or "-",
                _seeds(c),
                fmt(c["diff"]),
                interval(c["ci"]),
                fmt(c["p"]),
                fmt(c["p_holm"]) if c["role"] == "secondary" else "",
                interval(c["bootstrap_ci"]),
                c["verdict"],
            ]
            for c in results["comparisons"]
        ],
    )
    left_out = [r for c in results["comparisons"] for r in c["left_out"]]
    if left_out:
        lines += [f"Runs left out: {', '.join(dict.fromkeys(left_out))}.", ""]
    return lines
