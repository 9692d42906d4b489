"""How big and how fast is ``mappa report`` for a long run (issue: a 50-step run with 64
episodes per step must open in under 3 s, its page under 20 MB).

Builds a synthetic run dir of that shape with realistic sizes (a MathChat-like pipeline:
prompts of 2-6 KB with their token ids, outputs with code, tool output, coach rationales,
every metric key a real run logs), writes the report, then opens it in headless Chromium
(Debian's ``chromium`` + ``chromium-driver``, driven by selenium) and reads the browser's
own timings: DOMContentLoaded, first contentful paint, the load event, and how long the
episode viewer takes to show its first step after its tab is clicked.

    .venv/bin/python benchmarks/report.py [--steps 50] [--episodes 64] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

AGENTS = ("problem_solver", "code_executor", "verifier")
CODE = "```python\nfrom sympy import *\nx = symbols('x')\nprint(solve(x**2 - {a}*x + {b}, x))\n```"


def _text(rng: random.Random, chars: int) -> str:
    words = ("the", "answer", "so", "we", "compute", "sum", "of", "each", "term", "then", "x")
    out: list[str] = []
    size = 0
    while size < chars:
        w = rng.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


def _action(
    rng: random.Random, eid: str, agent: str, turn: int, prompt_chars: int
) -> dict[str, Any]:
    code = agent == "code_executor"
    out = _text(rng, rng.randint(300, 1500))
    if code:
        out += "\n" + CODE.format(a=rng.randint(1, 9), b=rng.randint(1, 9))
    ntok = len(out) // 4
    value = round(rng.uniform(0, 10), 2)
    return {
        "episode_id": eid,
        "agent": agent,
        "turn": turn,
        "prompt_ids": [rng.randrange(50000) for _ in range(prompt_chars // 4)],
        "completion_ids": [rng.randrange(50000) for _ in range(ntok)],
        "sample_logprobs": [round(-rng.random(), 4) for _ in range(ntok)],
        "prompt_text": _text(rng, prompt_chars),
        "completion_text": out,
        "truncated": rng.random() < 0.05,
        "tool_observation": _text(rng, rng.randint(100, 1500)) if code else None,
        "tool_status": rng.choice(["ok", "ok", "ok", "error"]) if code else None,
        "workspace_files": "(no files)" if code else None,
        "coach_reference": None,
        "coach": {
            "value": value,
            "rationale": _text(rng, rng.randint(200, 800)) + f"\nPROCESS_SCORE: {value}",
            "answer_correct": None,
            "flagged": rng.random() < 0.01,
            "backend": "http",
            "latency_s": rng.uniform(0.5, 3),
            "tokens": 900,
            "prompt_tokens": 800,
            "completion_tokens": 100,
            "retries": 0,
            "cached": False,
            "flag_reason": "",
        },
    }


def _metrics(rng: random.Random, step: int, episodes: int) -> dict[str, Any]:
    row: dict[str, Any] = {"step": step, "episodes": episodes, "accuracy": rng.uniform(0.2, 0.6)}
    for a in AGENTS:
        row[f"actions/{a}"] = episodes * (2 if a == "code_executor" else 1)
        row[f"coach/{a}"] = rng.uniform(4, 8)
        row[f"response_tokens/{a}"] = rng.uniform(100, 300)
        row[f"truncation_rate/{a}"] = rng.uniform(0, 0.1)
        row[f"format_rate/{a}"] = rng.uniform(0.5, 1)
        for k in ("loss", "mean_kl", "clip_frac", "approx_kl", "entropy", "grad_norm"):
            row[f"rl/{a}/{k}"] = rng.uniform(0, 1)
        row[f"rl/{a}/actions"] = row[f"actions/{a}"]
        row[f"rl/{a}/skipped"] = ""
    row["tool_call_rate/code_executor"] = rng.uniform(0.3, 0.9)
    row["exec_error_rate/code_executor"] = rng.uniform(0, 0.3)
    row.update(
        {
            "mean_kl": rng.uniform(0, 0.05),
            "rollout_s": rng.uniform(50, 70),
            "coach_s": rng.uniform(10, 20),
            "update_s": rng.uniform(20, 30),
            "rollout_tokens_per_s": rng.uniform(100, 150),
            "coach/calls": episodes * 4,
            "coach/flagged": rng.randint(0, 2),
            "coach/cost_usd": rng.uniform(0.01, 0.05),
            "coach/latency_p50_s": rng.uniform(1, 2),
            "coach/latency_p95_s": rng.uniform(2, 4),
            "coach_bias/final_vs_outcome_r": rng.uniform(-0.2, 0.8),
        }
    )
    if step % 5 == 0:
        row["eval/accuracy"] = rng.uniform(0.2, 0.6)
    return row


def make_run(run_dir: Path, steps: int, episodes: int, seed: int = 0) -> None:
    """A synthetic run directory of ``steps`` x ``episodes`` (3 agents, 1-3 executor turns)."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text("agents:\n" + "".join(f"- name: {a}\n" for a in AGENTS))
    with (run_dir / "episodes.jsonl").open("w") as eps, (run_dir / "metrics.jsonl").open("w") as m:
        for step in range(steps):
            for i in range(episodes):
                eid = f"s{step}-e{i}"
                acts = [_action(rng, eid, "problem_solver", 0, 2000)]
                acts += [
                    _action(rng, eid, "code_executor", t, 3000 + 1000 * t)
                    for t in range(rng.randint(1, 3))
                ]
                acts.append(_action(rng, eid, "verifier", 0, 6000))
                correct = rng.random() < 0.4
                acts[-1]["coach"]["answer_correct"] = correct if rng.random() < 0.8 else not correct
                ep = {
                    "episode_id": eid,
                    "task_id": f"task-{(step * episodes + i) // 2 % 400}",
                    "task": _text(rng, 300),
                    "answer": "42",
                    "step": step,
                    "task_type": rng.choice(["algebra", "counting"]),
                    "actions": acts,
                    "final_answer": "42" if correct else "41",
                    "correct": correct,
                }
                eps.write(json.dumps(ep) + "\n")
            m.write(json.dumps(_metrics(rng, step, episodes)) + "\n")


def browser_timings(page: Path) -> dict[str, float]:
    """Open ``page`` in headless Chromium: the browser's navigation timings (ms), and the ms
    from clicking the Episodes tab to the first step's episodes on screen."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
    ):
        options.add_argument(arg)
    service = Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.get(page.as_uri())
        nav = driver.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            "const p = performance.getEntriesByName('first-contentful-paint')[0];"
            "return {dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd,"
            "        fcp: p ? p.startTime : -1};"
        )
        t0 = time.perf_counter()
        driver.find_element(By.CSS_SELECTOR, "nav button[data-view=episodes]").click()
        WebDriverWait(driver, 30).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#ep-list details.episode")
        )
        nav["viewer"] = (time.perf_counter() - t0) * 1000
        return {k: float(v) for k, v in nav.items()}
    finally:
        driver.quit()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--keep", type=Path, default=None, help="build the run and report here")
    args = p.parse_args()
    from mappa.report.html import write_report

    root = args.keep or Path(tempfile.mkdtemp(prefix="mappa-report-bench-"))
    run_dir = root / "run"
    t0 = time.perf_counter()
    make_run(run_dir, args.steps, args.episodes)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    page = write_report([run_dir], root / "report")
    generated = time.perf_counter() - t0
    steps = sorted((root / "report" / "steps").glob("*.js"))
    result = {
        "run": f"{args.steps} steps x {args.episodes} episodes",
        "episodes.jsonl MB": round((run_dir / "episodes.jsonl").stat().st_size / 1e6, 1),
        "synthetic run built s": round(built, 1),
        "report generated s": round(generated, 1),
        "index.html MB": round(page.stat().st_size / 1e6, 2),
        "largest step file MB": round(max(f.stat().st_size for f in steps) / 1e6, 2),
        "all step files MB": round(sum(f.stat().st_size for f in steps) / 1e6, 1),
    }
    timings = browser_timings(page)
    result.update(
        {
            "DOMContentLoaded ms": round(timings["dcl"]),
            "first contentful paint ms": round(timings["fcp"]),
            "load event ms": round(timings["load"]),
            "episodes tab to first step shown ms": round(timings["viewer"]),
        }
    )
    width = max(map(len, result))
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    if args.keep is None:
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
