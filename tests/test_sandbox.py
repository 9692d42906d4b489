"""The subprocess sandbox: runs code in the workspace, scrubbed, limited, and reports files."""

from __future__ import annotations

import os
from pathlib import Path

from mappa.sandbox import Limits, execute, extract_code_blocks
from mappa.sandbox.execute import cut_middle


def test_extract_code_blocks() -> None:
    text = "a\n```python\nprint(1)\n```\nb\n```py\nx = 2\n```\n```\nnot python\n```\n```python\nprint(3)"
    assert extract_code_blocks(text) == ["print(1)", "x = 2", "print(3)"]
    assert extract_code_blocks("no code") == []


def test_ok_error_and_files(tmp_path: Path) -> None:
    ok = execute("open('out.txt','w').write('hi')\nprint(6*7)", tmp_path)
    assert ok.status == "ok" and ok.stdout.strip() == "42" and ok.exit_code == 0
    assert ok.files_changed == {"out.txt": 2}
    again = execute("print(open('out.txt').read())", tmp_path)
    assert again.stdout.strip() == "hi" and again.files_changed == {}
    bad = execute("raise ValueError('boom')", tmp_path)
    assert bad.status == "error" and "ValueError: boom" in bad.stderr
    assert "ValueError: boom" in bad.observation()


def test_timeout_and_scrubbed_env(tmp_path: Path) -> None:
    res = execute("while True: pass", tmp_path, Limits(wall_time_s=1.0))
    assert res.status == "timeout" and "timed out" in res.observation()
    os.environ["OPENAI_API_KEY"] = "sk-secret"
    try:
        res = execute("import os; print(os.environ.get('OPENAI_API_KEY'))", tmp_path)
    finally:
        del os.environ["OPENAI_API_KEY"]
    assert res.stdout.strip() == "None"


def test_output_is_cut_head_and_tail(tmp_path: Path) -> None:
    res = execute("print('A' * 5000 + 'Z' * 5000)", tmp_path, Limits(max_output_chars=1000))
    assert len(res.stdout) < 1100 and res.stdout.startswith("A") and res.stdout.rstrip().endswith("Z")
    assert "chars cut" in res.stdout
    assert cut_middle("short", 10) == "short"
