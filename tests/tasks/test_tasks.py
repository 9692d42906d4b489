"""Built-in arithmetic tasks, task files, Hugging Face dataset dirs and split hygiene."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mappa.tasks import Task, load_tasks
from mappa.tasks.arithmetic import LEVELS, generate
from mappa.tasks.base import TaskSourceError
from mappa.tasks.splits import SplitOverlapError, check_disjoint, find_overlap, normalize_text

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "math"


def _solve(prompt: str) -> int:
    """An independent reading of the generated sentences (not the generator's own sums)."""
    if m := re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", prompt):
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        return {"+": a + b, "-": a - b, "*": a * b}[op]
    value = int(re.search(r"has (\d+) ", prompt).group(1))
    for sentence in prompt.split(". ")[1:]:
        if m := re.search(r"gets (\d+) more", sentence):
            value += int(m.group(1))
        elif m := re.search(r"gives away (\d+)", sentence):
            value -= int(m.group(1))
        elif m := re.search(r"multiplied by (\d+)", sentence):
            value *= int(m.group(1))
        elif m := re.search(r"buys (\d+) boxes with (\d+)", sentence):
            value += int(m.group(1)) * int(m.group(2))
        elif m := re.search(r"among (\d+) friends", sentence):
            assert value % int(m.group(1)) == 0, prompt
            value //= int(m.group(1))
        elif m := re.search(r"has (\d+) times as many", sentence):
            value *= 1 + int(m.group(1))
    return value


@pytest.mark.parametrize("difficulty", range(1, LEVELS + 1))
def test_arithmetic_answers_are_exact_seeded_and_unique(difficulty: int) -> None:
    tasks = generate(60, seed=3, difficulty=difficulty)
    assert tasks == generate(60, seed=3, difficulty=difficulty)
    assert tasks != generate(60, seed=4, difficulty=difficulty)
    assert generate(70, seed=3, difficulty=difficulty)[:60] == tasks  # one stream
    for t in tasks:
        assert t.answer is not None and int(t.answer) >= 0
        assert _solve(t.prompt) == int(t.answer), t.prompt
    assert len({t.task_id for t in tasks}) == len({normalize_text(t.prompt) for t in tasks}) == 60


def test_levels_grow_from_one_operation_to_multi_step() -> None:
    ops = {
        d: [t.prompt.count(". Then") for t in generate(40, seed=0, difficulty=d)]
        for d in range(1, 6)
    }
    assert all(p.startswith("What is") for p in (t.prompt for t in generate(20, difficulty=1)))
    assert set(ops[2]) == {1} and set(ops[3]) == {2} and set(ops[4]) == set(ops[5]) == {3}
    assert any("among" in t.prompt for t in generate(200, difficulty=4))
    assert all("together" in t.prompt for t in generate(20, difficulty=5))
    with pytest.raises(ValueError, match="difficulty"):
        generate(1, difficulty=6)


def test_task_files(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"prompt": "1+1?", "answer": 2.0, "id": "a"}\n{"problem": "2+2?", "answer": "4"}\n'
    )
    tasks = load_tasks(str(p), 0, 1, 0)
    assert [(t.task_id, t.prompt, t.answer) for t in tasks] == [
        ("a", "1+1?", "2"),
        ("1", "2+2?", "4"),
    ]
    (tmp_path / "bad.json").write_text(json.dumps([{"text": "x"}]))
    with pytest.raises(ValueError, match="no 'prompt'"):
        load_tasks(str(tmp_path / "bad.json"), 0, 1, 0)
    missing = tmp_path / "missing.json"
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(str(missing))}: no such task file"):
        load_tasks(str(missing), 0, 1, 0)
    with pytest.raises(FileNotFoundError, match="arithmetc: .*; did you mean arithmetic\\?$"):
        load_tasks("arithmetc", 0, 1, 0)


def test_a_task_source_under_home_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``~`` is the home directory, as in a shell: a config is not read by one."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1?", "answer": 2}\n')
    assert [t.prompt for t in load_tasks("~/t.jsonl", 0, 1, 0)] == ["1+1?"]


def test_a_directory_without_a_saved_dataset_says_what_a_source_is(tmp_path: Path) -> None:
    """Refused before ``datasets`` is imported (whose message names neither the directory's
    role nor the fix); a folder of saved splits names them."""
    with pytest.raises(TaskSourceError) as err:
        load_tasks(str(tmp_path), 0, 1, 0)
    assert str(err.value).startswith(
        f"{tmp_path}: a directory that holds no saved dataset; a task source is a JSON/JSONL "
        "task file, a dataset folder written by save_to_disk (one split), hf:<repo>"
    )
    split = tmp_path / "test"
    split.mkdir()
    (split / "dataset_info.json").write_text("{}")
    (split / "state.json").write_text("{}")
    with pytest.raises(TaskSourceError) as err:
        load_tasks(str(tmp_path), 0, 1, 0)
    assert (
        str(err.value)
        == f"{tmp_path}: a directory that holds no saved dataset; use one of: {split}"
    )


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (  # JSONL: the line number of the bad line (blank lines counted)
            "t.jsonl",
            '{"prompt": "a", "answer": 1}\n\n{"prompt": "b", answer: 2}\n',
            r"t\.jsonl: line 3: not valid JSON \(Expecting property name",
        ),
        (  # a JSON list: the decoder's line and column
            "t.json",
            '[\n  {"prompt": "a", "answer": 1},\n  {"prompt": "b" "answer": 2}\n]',
            r"t\.json: line 3, column 18: not valid JSON: Expecting ','",
        ),
        (
            "t.jsonl",
            '{"prompt": "a", "answer": 1}\n{"question_": "b"}\n',
            r"t\.jsonl: line 2 has no 'prompt' or 'problem' or 'question' prompt; its columns: "
            r"question_\. Name the prompt's column with tasks\.prompt_field",
        ),
        ("t.jsonl", '{"prompt": "a", "answer": 1}\n[1, 2]\n', r"t\.jsonl: line 2 is not an object"),
        ("t.json", '{"tasks": []}\n{"x": 1}', r"t\.json: line 1 has no 'prompt' or"),
        (  # answers in a column of another name: refused, not graded against nothing
            "t.jsonl",
            '{"question": "a", "solution": "4"}\n',
            r"t\.jsonl: line 1 has no 'answer' or 'final_answer' answer; its columns: question, "
            r"solution\. Name the answer's column with tasks\.answer_field",
        ),
        (  # the tasks wrapped in an object: the form, not a prompt column, is the fix
            "t.json",
            '{"tasks": [{"prompt": "a", "answer": 1}]}\n',
            r"t\.json: the top level is a JSON object \(keys: tasks\), not a list of tasks; a "
            r'task file is a JSON list of \{"prompt": \.\.\., "answer": \.\.\.\} objects, or one '
            r"such object per line \(JSONL\)$",
        ),
        ("t.json", '{\n "tasks": []\n}', r"t\.json: the top level is a JSON object \(keys: tasks"),
        ("t.json", "[]", r"t\.json: no tasks; a task file is a JSON list of"),
        ("t.jsonl", "\n", r"t\.jsonl: no tasks; a task file is a JSON list of"),
        (
            "t.json",
            '["1+1?"]',
            r't\.json: task 0 is not an object \(str\); each task is one, e\.g\. \{"prompt": '
            r'"1\+1\?", "answer": "2"\}$',
        ),
        ("t.json", "\ufeff[1", r"t\.json: line 1, column 3: not valid JSON"),
    ],
)
def test_task_file_errors_name_the_file_and_line(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(TaskSourceError, match=message):
        load_tasks(str(tmp_path / name), 0, 1, 0)


def test_duplicate_task_ids_are_refused_naming_them(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i}", "answer": i, "id": i % 3 if i < 5 else f"u{i}"} for i in range(7)]
    p = tmp_path / "dup.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        TaskSourceError,
        match=r"dup\.jsonl: duplicate task ids '0' \(line 1, line 4\), '1' \(line 2, line 5\)",
    ):
        load_tasks(str(p), 0, 1, 0)
    (tmp_path / "dup.json").write_text(
        json.dumps([{"prompt": p, "id": "x", "answer": 1} for p in "ab"])
    )
    with pytest.raises(TaskSourceError, match=r"duplicate task ids 'x'"):
        load_tasks(str(tmp_path / "dup.json"), 0, 1, 0)
    one = tmp_path / "one.jsonl"  # JSONL of a single task is still a task file
    one.write_text('{"prompt": "a", "answer": 1}\n')
    assert [t.prompt for t in load_tasks(str(one), 0, 1, 0)] == ["a"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data")
def test_shared_math_files_load() -> None:
    amc = load_tasks(str(SHARED / "amc_eval_32.json"), 0, 1, 0)
    assert len(amc) == 32 and amc[0].answer == "18" and amc[0].task_id == "72"
    aime = load_tasks(str(SHARED / "AIME_1983_2024.json"), 0, 1, 0)
    assert len(aime) == 933 and aime[0].task_id == "1983-1" and aime[0].answer == "60"
    pool = load_tasks(str(SHARED / "amc.json"), 0, 1, 0)
    assert len(find_overlap(amc, pool)) == 32 and not find_overlap(amc, aime)


def test_hugging_face_dataset_dir(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [
        {"problem": "What is 2+3?", "answer": "5", "unique_id": "p/1"},
        {"problem": "What is 3*3?", "answer": "9", "unique_id": "p/2"},
    ]
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "one"))
    tasks = load_tasks(str(tmp_path / "one"), 0, 1, 0)
    assert [(t.task_id, t.prompt, t.answer) for t in tasks] == [
        ("p/1", "What is 2+3?", "5"),
        ("p/2", "What is 3*3?", "9"),
    ]
    datasets.DatasetDict({"train": ds, "test": ds.select([1])}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match="several splits"):
        load_tasks(str(tmp_path / "dd"), 0, 1, 0)
    assert [t.task_id for t in load_tasks(str(tmp_path / "dd" / "test"), 0, 1, 0)] == ["p/2"]


def test_overlap_is_found_by_normalized_text() -> None:
    train = [Task("t1", "Find $x$ if  $x + 1 = 3$.", "2"), Task("t2", "Compute 7 * 8.", "56")]
    held = [Task("e1", "find x, if x+1=3", "2"), Task("e2", "Compute 7 * 9.", "63")]
    assert find_overlap(held, train) == [("e1", "t1")]
    with pytest.raises(SplitOverlapError, match=r"e1 \(= train t1\)"):
        check_disjoint(held, train, allow_overlap=False)
    assert check_disjoint(held, train, allow_overlap=True) == [("e1", "t1")]


def test_columns_name_the_prompt_and_answer_and_answers_may_be_optional(tmp_path: Path) -> None:
    """GSM8K-style rows (``question``/``solution``) load once their columns are named; rows
    without an answer load only where the config says they may (graded wrong in training,
    left out of a held-out set's accuracy)."""
    from mappa.tasks import Columns

    path = tmp_path / "t.jsonl"
    path.write_text('{"q": "2 + 2?", "solution": "4"}\n{"q": "3 + 3?"}\n')
    named = Columns(prompt="q", answer="solution", require_answer=False)
    tasks = load_tasks(str(path), 0, 1, 0, columns=named)
    assert [(t.prompt, t.answer) for t in tasks] == [("2 + 2?", "4"), ("3 + 3?", None)]
    with pytest.raises(TaskSourceError, match=r"line 2 has no 'solution' answer; its columns: q\."):
        load_tasks(str(path), 0, 1, 0, columns=Columns(prompt="q", answer="solution"))
    held_out = Columns(prompt="q", answer="solution", section="eval")
    with pytest.raises(
        TaskSourceError, match=r"eval\.answer_field, .* \(left out of the accuracy\)"
    ):
        load_tasks(str(path), 0, 1, 0, columns=held_out)


def test_hugging_face_dataset_by_name_with_columns(tmp_path: Path) -> None:
    """``hf:<repo>[:<config>]:<split>[@<revision>]`` through ``datasets.load_dataset``:
    tested on a local dataset folder (the Hub is out of reach here), GSM8K-like columns
    named by ``Columns``; what cannot load is one line naming the source."""
    pytest.importorskip("datasets")
    from mappa.tasks import Columns
    from mappa.tasks.hf import READ

    folder = tmp_path / "arith"
    folder.mkdir()
    rows = [{"question": "What is 2+3?", "final": "5"}, {"question": "What is 3*3?", "final": "9"}]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_tasks(f"hf:{folder}:test", 0, 1, 0, columns=Columns(answer="final"))
    assert [(t.task_id, t.prompt, t.answer) for t in tasks] == [
        ("0", "What is 2+3?", "5"),
        ("1", "What is 3*3?", "9"),
    ]
    read = READ[f"hf:{folder}:test"]  # what a run records in data.json
    assert read["rows"] == 2 and read["revision"] is None and read["fingerprint"]
    with pytest.raises(TaskSourceError, match=r"task 0 has no 'answer' or 'final_answer' answer"):
        load_tasks(f"hf:{folder}:test", 0, 1, 0)
    with pytest.raises(ValueError, match=rf"hf:{folder}:nosplit: cannot load it \("):
        load_tasks(f"hf:{folder}:nosplit", 0, 1, 0)
    with pytest.raises(ValueError, match=r"a Hub dataset is hf:<repo>\[:<config>\]:<split>"):
        load_tasks("hf:only-a-repo", 0, 1, 0)


def test_a_worked_solution_column_gives_the_answer_after_its_marker(tmp_path: Path) -> None:
    """GSM8K's ``answer`` column is a worked solution ending ``#### 72``:
    ``tasks.answer_after: '####'`` keeps the 72, and a row without the marker is refused."""
    from mappa.tasks import Columns

    rows = [
        {
            "question": "Natalia sold 48 clips, then half as many. How many?",
            "answer": "48/2 = 24\n48+24 = 72\n#### 72",
        },
        {"question": "What is 1,000 + 1?", "answer": "#### 1,001"},
    ]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gsm8k = Columns(answer_after="####")
    assert [t.answer for t in load_tasks(str(path), 0, 1, 0, columns=gsm8k)] == ["72", "1,001"]
    path.write_text(json.dumps({"question": "2 + 2?", "answer": "4"}) + "\n")
    with pytest.raises(
        TaskSourceError, match=r"line 1's answer has no '####' \(tasks.answer_after\)"
    ):
        load_tasks(str(path), 0, 1, 0, columns=gsm8k)


def test_a_hub_out_of_reach_is_refused_in_one_line_before_datasets_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the Hub's endpoint takes no connection (a real closed loopback port here),
    a Hub id is refused at once, naming the fix, instead of after ~25 s of the client's
    retries; in offline mode an id missing from the cache is one line saying so."""
    import socket
    import time

    datasets = pytest.importorskip("datasets")
    from huggingface_hub import constants

    from mappa import hub

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    hub.hub_unreachable.cache_clear()
    source = "hf:MathArena/aime_2025:train@c94da77eb22bbd6439e62a323bec18493a421302"
    start = time.monotonic()
    with pytest.raises(ValueError) as err:
        load_tasks(source, 0, 1, 0)
    assert time.monotonic() - start < hub.HUB_PROBE_S + 2
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{source}: the Hub cannot be reached")
    assert "HF_DATASETS_OFFLINE=1" in message
    hub.hub_unreachable.cache_clear()

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"offline mode reads only the datasets cache") as err:
        load_tasks("hf:no-such-org/no-such-set:train@" + "0" * 40, 0, 1, 0)
    assert "\n" not in str(err.value)
