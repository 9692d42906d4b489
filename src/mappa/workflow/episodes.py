"""What every rollout does around its agents, whatever runs them: an episode's record and
shared workspace before anyone acts, and its grading after the last action.

Both runners (the preset pipeline and a workflow function) open and grade episodes here,
so an episode means the same thing whichever wrote it.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from mappa.config import AnswerFormat
from mappa.records import Episode
from mappa.sandbox import Workspace
from mappa.tasks import Task
from mappa.workflow.interface import Phase
from mappa.workflow.oracle import action_verdict
from mappa.workflow.outcome import judge


def open_episodes(
    tasks: Sequence[Task], step: int, phase: Phase, root: Path
) -> tuple[list[Episode], dict[str, Workspace]]:
    """One empty episode per task, each with a fresh workspace under
    ``<root>/<phase>/step<N>/<episode id>`` holding the task's input files (DSBench).

    Returns:
        the episodes in task order, and episode id -> its workspace.
    """
    episodes, workspaces = [], {}
    for i, task in enumerate(tasks):
        eid = f"s{step}-e{i}"
        ws = root / phase / f"step{step}" / eid
        shutil.rmtree(ws, ignore_errors=True)
        ws.mkdir(parents=True)
        if task.dsbench is not None:  # the task's inputs, present before anyone acts
            for name, source in task.dsbench.agent_files().items():
                shutil.copyfile(source, ws / name)
        workspaces[eid] = Workspace(ws)
        episodes.append(
            Episode(
                eid,
                task.task_id,
                task.prompt,
                task.answer,
                step=step,
                task_type=task.task_type,
                workspace=str(ws),
            )
        )
    return episodes, workspaces


def grade_episode(
    episode: Episode,
    task: Task,
    final_text: str,
    final_agent: str,
    workspace: Path,
    answer_format: AnswerFormat,
    timeout_s: float,
) -> None:
    """Judge ``final_text`` (the team's answer) and the workspace into ``episode``'s outcome
    fields, and record the answer oracle's verdict on every action (``final_agent``'s are
    read as final answers)."""
    outcome = judge(task, final_text, workspace, answer_format, timeout_s)
    episode.correct, episode.final_answer = outcome.correct, outcome.final_answer
    episode.grader_timed_out = outcome.grader_timed_out
    episode.metrics, episode.coach_reference = outcome.metrics, outcome.reference
    for action in episode.actions:
        action.oracle = action_verdict(
            action,
            is_final=action.agent == final_agent,
            reference=task.answer,
            answer_format=answer_format,
            timeout_s=timeout_s,
        )
