"""Small hand-written run directories for the report's tests: every field the viewer shows,
agent output that tries to run HTML and script, and a run still being written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

AGENTS = ("problem_solver", "code_executor", "verifier")
PAYLOAD = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold</b>'
"""Agent text that would run script if the report inserted it as HTML."""


def action(agent: str, turn: int, text: str, score: float | None, **extra: Any) -> dict[str, Any]:
    coach = None
    if score is not None:
        coach = {
            "value": score,
            "rationale": f"rationale for {agent}: {PAYLOAD}\nPROCESS_SCORE: {score}",
            "answer_correct": extra.pop("answer_correct", None),
            "flagged": extra.pop("flagged", False),
            "flag_reason": extra.pop("flag_reason", ""),
            "cached": False,
        }
    return {
        "episode_id": "e",
        "agent": agent,
        "turn": turn,
        "prompt_ids": list(range(50)),
        "completion_ids": list(range(7)),
        "sample_logprobs": [-0.5] * 7,
        "prompt_text": f"<|im_start|>system\nYou are the {agent}. {PAYLOAD}",
        "completion_text": text,
        "truncated": False,
        "tool_observation": None,
        "tool_status": None,
        "workspace_files": None,
        "coach_reference": None,
        "coach": coach,
        **extra,
    }


def episode(
    step: int, i: int, correct: bool | None, final_score: float, **kw: Any
) -> dict[str, Any]:
    code = "I will compute it.\n```python\nx = 12 + 5  # add\nprint(f'{x}')\n```\n" + PAYLOAD
    acts = [
        action("problem_solver", 0, f"Add the numbers. {PAYLOAD}", 6.0),
        action(
            "code_executor",
            0,
            code,
            7.0,
            tool_observation=f"17\n{PAYLOAD}",
            tool_status="ok",
            workspace_files="(no files)",
        ),
        action("verifier", 0, "The answer is \\boxed{17}.", final_score, **kw),
    ]
    return {
        "episode_id": f"s{step}-e{i}",
        "task_id": f"task-{i % 2}",
        "task": f"What is 12 + 5? {PAYLOAD}",
        "answer": "17",
        "step": step,
        "task_type": "arithmetic",
        "actions": acts,
        "final_answer": "17" if correct else "3",
        "correct": correct,
    }


def metrics_row(step: int) -> dict[str, Any]:
    row: dict[str, Any] = {"step": step, "episodes": 4, "accuracy": 0.25 * step}
    for n, a in enumerate(AGENTS):
        row[f"coach/{a}"] = 5.0 + n + step
        row[f"response_tokens/{a}"] = 7.0
        row[f"rl/{a}/clip_frac"] = 0.1 * step
        row[f"rl/{a}/entropy"] = 2.0 - 0.1 * step
        row[f"rl/{a}/actions"] = 4
        row[f"rl/{a}/skipped"] = ""
    row["tool_call_rate/code_executor"] = 1.0
    row.update({"mean_kl": 0.01 * step, "rollout_s": 3.0, "coach_s": 1.0, "update_s": 2.0})
    row.update({"coach/calls": 12, "coach/cache_hits": 0, "coach/flagged": 1 if step else 0})
    # coach health as the episodes below give it: problem_solver (always 6) and code_executor
    # (always 7) never have signal; the verifier's 9, 8.5, 2 (and a flagged 5) always do
    for a in AGENTS[:2]:
        row.update(
            {
                f"coach_health/{a}/spread": 0.0,
                f"coach_health/{a}/std": 0.0,
                f"coach_health/{a}/tie_rate": 1.0,
                f"coach_health/{a}/mode_share": 1.0,
                f"coach_health/{a}/digit_mass": None,
                f"coach_health/{a}/signal": 0,
                f"coach_health/{a}/no_signal_streak": step + 1,
            }
        )
    row.update(
        {
            "coach_health/verifier/spread": 7.0,
            "coach_health/verifier/std": 3.1,
            "coach_health/verifier/tie_rate": 0.0,
            "coach_health/verifier/mode_share": 1 / 3,
            "coach_health/verifier/digit_mass": 0.9 - 0.1 * step,
            "coach_health/verifier/signal": 1,
            "coach_health/verifier/no_signal_streak": 0,
            "coach_health/signal_agents": 1,
            "coach_health/agents": 3,
            "coach_health/digit_mass": 0.9 - 0.1 * step,
        }
    )
    return row


def write_run(
    run_dir: Path, steps: int = 2, torn: bool = False, warn_no_signal_steps: int | None = None
) -> Path:
    """A 3-agent run of ``steps`` steps x 4 episodes; ``torn`` leaves both files with a half
    written last line, as a run being written (or killed) does. ``warn_no_signal_steps``:
    the config's ``coach.warn_no_signal_steps`` (left out, as in an older run, when None)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = "agents:\n" + "".join(f"- name: {a}\n" for a in AGENTS)
    if warn_no_signal_steps is not None:
        config += f"coach:\n  warn_no_signal_steps: {warn_no_signal_steps}\n"
    (run_dir / "config.yaml").write_text(config)
    eps, rows = [], []
    for step in range(steps):
        eps += [
            episode(step, 0, True, 9.0, answer_correct=True),
            episode(step, 1, False, 8.5, answer_correct=True),
            episode(step, 2, False, 2.0, answer_correct=False),
            episode(step, 3, None, 5.0, flagged=True, flag_reason="unavailable"),
        ]
        rows.append(metrics_row(step))
    tail = '{"episode_id": "half' if torn else ""
    (run_dir / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps) + tail)
    tail = '{"step": 99, "accur' if torn else ""
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return run_dir
