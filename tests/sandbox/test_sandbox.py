"""The sandbox: results and observations, limits from config, workspaces shared by one
episode (with provenance) and by no other, the pool, persistent interpreters, backends.

Hostile programs are in test_sandbox_hostile.py.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import time
import warnings
from pathlib import Path

import httpx
import pytest
from conftest import process_backend
from fakes import FakeCharChat, FakeScriptedPolicy

from mappa.config import AgentConfig, RunConfig, SandboxConfig, load_config
from mappa.run.build import runner_for, sandbox_limits
from mappa.sandbox import (
    Author,
    BwrapBackend,
    Job,
    Limits,
    ProcessBackend,
    SandboxFusionBackend,
    SandboxIsolationWarning,
    SandboxPool,
    Workspace,
    bwrap_problem,
    execute,
    extract_code_blocks,
)
from mappa.sandbox.backends import process as process_module
from mappa.sandbox.backends.local import LocalBackend
from mappa.sandbox.capture import Capture
from mappa.sandbox.running import classify, limit_from_traceback
from mappa.sandbox.session import RESTARTED
from mappa.tasks import Task
from mappa.workflow.interface import RolloutInput

pytestmark = pytest.mark.filterwarnings("ignore::mappa.sandbox.SandboxIsolationWarning")


# --- results, observations, output ---------------------------------------------------


def test_extract_code_blocks() -> None:
    text = (
        "a\n```python\nprint(1)\n```\nb\n```py\nx = 2\n```\n"
        "```\nnot python\n```\n```python\nprint(3)"
    )
    assert extract_code_blocks(text) == ["print(1)", "x = 2", "print(3)"]
    assert extract_code_blocks("no code") == []


def test_ok_error_and_files(tmp_path: Path) -> None:
    ok = execute("open('out.txt','w').write('hi')\nprint(6*7)", tmp_path)
    assert ok.status == "ok" and ok.stdout.strip() == "42" and ok.exit_code == 0
    assert ok.files_changed == {"out.txt": 2} and ok.observation() == "42"
    again = execute("print(open('out.txt').read())", tmp_path)
    assert again.stdout.strip() == "hi" and again.files_changed == {}
    bad = execute("x = 1\nraise ValueError('boom')", tmp_path)
    assert bad.status == "error" and bad.exit_code == 1 and bad.message == ""
    # The traceback shows the agent's line, not the sandbox's own frames.
    assert 'File "<code>", line 2' in bad.stderr and "raise ValueError('boom')" in bad.stderr
    assert "guest" not in bad.stderr and "ValueError: boom" in bad.observation()
    assert execute("import sys; sys.exit(3)", tmp_path).exit_code == 3
    assert execute("pass", tmp_path).observation() == "[no output]"


def test_code_may_import_its_own_modules_and_pickle_its_classes(tmp_path: Path) -> None:
    execute("open('helpers.py', 'w').write('def double(x):\\n    return 2 * x\\n')", tmp_path)
    result = execute(
        "import pickle, helpers\nclass Box:\n    pass\nb = Box(); b.v = helpers.double(21)\n"
        "pickle.dump(b, open('box.pkl', 'wb'))\nprint(pickle.load(open('box.pkl', 'rb')).v)",
        tmp_path,
    )
    assert result.stdout.strip() == "42", result.stderr


def test_output_is_cut_head_and_tail(tmp_path: Path) -> None:
    res = execute("print('A' * 5000 + 'Z' * 5000)", tmp_path, Limits(max_output_chars=1000))
    assert res.status == "ok"
    assert (
        len(res.stdout) < 1100 and res.stdout.startswith("A") and res.stdout.rstrip().endswith("Z")
    )
    assert "chars cut" in res.stdout


def test_capture_keeps_head_and_tail_of_huge_streams() -> None:
    cap = Capture(keep=10)
    cap.feed(b"HEAD-")
    for _ in range(1000):
        cap.feed(b"." * 100)
    cap.feed(b"-TAIL")
    text = cap.text(10)
    assert text.startswith("HEAD-") and text.endswith("-TAIL") and "chars cut" in text
    assert cap.total == 100_010 and len(cap.head) + len(cap.tail) <= 30


def test_classify_signals_and_limit_tracebacks() -> None:
    limits = Limits()
    assert classify("eof", 128 + signal.SIGSEGV, "", limits)[:2] == ("killed", -11)
    assert classify("eof", -signal.SIGXCPU, "", limits)[3] == "cpu_time"
    assert classify("deadline", -9, "", limits)[0] == "timeout"
    assert classify("output_limit", 0, "", limits)[3] == "output"
    assert classify("eof", 0, "", limits) == ("ok", 0, "", None)
    tb = "Traceback (most recent call last):\n  ...\nnumpy.core._exceptions._ArrayMemoryError: x"
    assert limit_from_traceback(tb) == "memory"
    assert limit_from_traceback("OSError: [Errno 27] File too large") == "file_size"
    assert limit_from_traceback("RuntimeError: can't start new thread") == "processes"
    assert limit_from_traceback("ValueError: MemoryError in text") is None
    assert classify("eof", 1, "ValueError: no", limits) == ("error", 1, "", None)


def test_limits_are_checked_and_described() -> None:
    with pytest.raises(ValueError):
        Limits(wall_time_s=0)
    with pytest.raises(ValueError):
        Limits(max_output_chars=100, max_output_bytes=10)
    limits = Limits(memory_bytes=3 << 30, wall_time_s=2.5)
    assert limits.describe("memory") == "memory limit of 3 GiB per process"
    assert limits.describe("wall_time") == "wall time limit of 2.5 s"


# --- configuration -------------------------------------------------------------------


def test_config_builds_limits_and_rejects_bad_combinations() -> None:
    cfg = SandboxConfig(timeout_s=5, memory_mb=1024, max_output_mb=1, file_size_mb=8)
    limits = sandbox_limits(cfg)
    assert limits.wall_time_s == 5 and limits.cpu_time_s == 10
    assert limits.memory_bytes == 1 << 30 and limits.max_output_bytes == 1 << 20
    assert limits.file_size_bytes == 8 << 20 and limits.max_output_chars == 8000
    assert sandbox_limits(SandboxConfig(cpu_time_s=3)).cpu_time_s == 3
    with pytest.raises(ValueError, match="persistent"):
        SandboxConfig(backend="sandboxfusion", mode="persistent")
    with pytest.raises(ValueError):
        SandboxConfig(backend="docker")
    for name, field in SandboxConfig.model_fields.items():
        assert field.description, f"sandbox.{name} is undocumented"


@pytest.mark.parametrize("name", ["demo.yaml", "mathchat_paper.yaml"])
def test_shipped_configs_have_valid_sandbox_sections(name: str) -> None:
    import mappa

    cfg = load_config(Path(mappa.__file__).parent / "configs" / name, [])
    assert cfg.sandbox.backend == "auto" and cfg.sandbox.mode == "stateless"


def test_process_backend_warns_loudly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_module, "_warned", False)
    with pytest.warns(SandboxIsolationWarning, match="NOT isolated"):
        ProcessBackend()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ProcessBackend()
    assert not [w for w in record if issubclass(w.category, SandboxIsolationWarning)]


# --- workspaces: handoff, provenance, isolation ----------------------------------------


def test_file_handoff_between_agents_with_provenance(backend: LocalBackend, tmp_path: Path) -> None:
    (tmp_path / "episode").mkdir()
    (tmp_path / "episode" / "train.csv").write_text("x,y\n1,2\n")
    ws = Workspace(tmp_path / "episode")
    with SandboxPool(backend, Limits(wall_time_s=10)) as pool:
        [[a]] = pool.run(
            [
                Job(
                    ws,
                    "data_engineer",
                    0,
                    [
                        "import pickle\nrows = open('train.csv').read().split()[1:]\n"
                        "pickle.dump([int(v) for r in rows for v in r.split(',')],"
                        " open('X_train.pkl', 'wb'))\n"
                        "print('saved')"
                    ],
                )
            ]
        )
        [[b]] = pool.run(
            [
                Job(
                    ws,
                    "modeler",
                    1,
                    [
                        "import pickle\nX = pickle.load(open('X_train.pkl', 'rb'))\nprint(sum(X))\n"
                        "pickle.dump({'coef': sum(X)}, open('model.pkl', 'wb'))"
                    ],
                )
            ]
        )
    assert a.status == "ok" and a.files_changed == {
        "X_train.pkl": (ws.path / "X_train.pkl").stat().st_size
    }
    assert b.status == "ok" and b.stdout.strip() == "3", b.stderr
    assert set(b.files_changed) == {"model.pkl"}
    assert pickle.loads(ws.read_bytes("model.pkl")) == {"coef": 3}
    assert ws.files["train.csv"].created_by == Author("task")
    assert ws.files["X_train.pkl"].created_by == Author("data_engineer", 0)
    assert ws.files["model.pkl"].created_by == Author("modeler", 1)
    described = ws.describe()
    assert "X_train.pkl" in described and "created by data_engineer (action 1)" in described
    assert "model.pkl" in described and "created by modeler (action 2)" in described


def test_provenance_tracks_modification_and_deletion(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ep")
    with SandboxPool(
        BwrapBackend() if bwrap_problem() is None else process_backend(), Limits()
    ) as pool:
        pool.run(
            [Job(ws, "a", 0, ["open('f.txt', 'w').write('1')", "open('g.txt', 'w').write('1')"])]
        )
        pool.run(
            [Job(ws, "b", 0, ["open('f.txt', 'a').write('22')\nimport os\nos.remove('g.txt')"])]
        )
    assert list(ws.files) == ["f.txt"]
    rec = ws.files["f.txt"]
    assert (rec.size, rec.created_by, rec.modified_by) == (3, Author("a", 0), Author("b", 0))
    assert "last modified by b (action 1)" in ws.describe()


def test_two_episodes_never_see_each_others_files(backend: LocalBackend, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)  # the hard case: the directory holding the workspaces is open
    one, two = Workspace(tmp_path / "s0-e0"), Workspace(tmp_path / "s0-e1")
    backend.execute("open('secret.txt', 'w').write('episode one')", one.path, Limits())
    probe = (
        "import os\nseen = []\n"
        f"for path in ['../s0-e0/secret.txt', {str(one.path / 'secret.txt')!r}]:\n"
        "    try:\n        seen.append(open(path).read())\n    except OSError as e:\n"
        "        seen.append(type(e).__name__)\n"
        "try:\n    seen.append(sorted(os.listdir('..')))\nexcept OSError as e:\n"
        "    seen.append(type(e).__name__)\nprint(seen)"
    )
    result = backend.execute(probe, two.path, Limits())
    assert result.status == "ok", result.stderr
    assert "episode one" not in result.stdout, result.stdout
    if isinstance(backend, BwrapBackend):  # not even the other workspace's name
        assert "s0-e0" not in result.stdout


def test_workspace_read_bytes_refuses_planted_symlinks(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("host secret")
    ws = Workspace(tmp_path / "ep")
    (ws.path / "submission.csv").symlink_to(tmp_path / "secret")
    with pytest.raises(PermissionError):
        ws.read_bytes("submission.csv")
    with pytest.raises(PermissionError):
        ws.read_bytes("../secret")
    assert ws.files == {}  # a symlink is not a file the workspace vouches for


# --- pool and persistent mode -----------------------------------------------------------


def test_pool_runs_episodes_in_parallel_and_returns_in_order(tmp_path: Path) -> None:
    """Each job prints when its first block started and ended (one clock: one kernel); in
    a pool of 4 the four runs overlap, and the results come back in job order."""
    backend = BwrapBackend() if bwrap_problem() is None else process_backend()
    jobs = [
        Job(
            Workspace(tmp_path / f"e{i}"),
            "agent",
            0,
            [
                "import time\nt0 = time.time()\ntime.sleep(1.5)\nprint(t0, time.time())",
                f"print({i} * 10)",
            ],
        )
        for i in range(4)
    ]
    with SandboxPool(backend, Limits(), size=4) as pool:
        results = pool.run(jobs)
    assert [rs[1].stdout.strip() for rs in results] == [str(i * 10) for i in range(4)]
    spans = [tuple(map(float, rs[0].stdout.split())) for rs in results]
    assert max(start for start, _ in spans) < min(end for _, end in spans)  # all at once


def test_persistent_interpreter_keeps_state_with_same_isolation(
    backend: LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")
    ws = Workspace(tmp_path / "ep")
    limits = Limits(wall_time_s=1, max_output_chars=500)
    with SandboxPool(backend, limits, mode="persistent") as pool:
        [[r1, r2]] = pool.run(
            [
                Job(
                    ws,
                    "analyst",
                    0,
                    [
                        "import os\ncounter = 1\nopen('notes.txt', 'w').write('a')\n"
                        "print(os.environ.get('OPENAI_API_KEY'))",
                        "counter += 1\nprint(counter)",
                    ],
                )
            ]
        )
        [[r3, r4, r5]] = pool.run(
            [
                Job(
                    ws,
                    "analyst",
                    1,
                    ["raise KeyError('oops')", "print(counter + 40)", "print('x' * 2000)"],
                )
            ]
        )
        [[other]] = pool.run([Job(ws, "verifier", 0, ["print('counter' in dir())"])])
        [[r6, r7]] = pool.run([Job(ws, "analyst", 2, ["while True:\n    pass", "print(counter)"])])
    assert (r1.status, r1.stdout.strip(), r1.files_changed) == ("ok", "None", {"notes.txt": 1})
    assert r2.stdout.strip() == "2" and r2.files_changed == {}
    assert (
        r3.status == "error" and "KeyError: 'oops'" in r3.stderr and 'File "<cell 3>"' in r3.stderr
    )
    assert r4.stdout.strip() == "42"  # an exception does not lose the state
    assert "chars cut" in r5.stdout and len(r5.stdout) < 600
    assert other.stdout.strip() == "False"  # one interpreter per agent
    assert (r6.status, r6.limit) == ("timeout", "wall_time")
    assert r7.status == "error" and "NameError" in r7.stderr and RESTARTED in r7.observation()
    assert ws.files["notes.txt"].created_by == Author("analyst", 0)


def test_closing_a_session_kills_what_it_started(backend: LocalBackend, tmp_path: Path) -> None:
    session = backend.open_session(tmp_path, Limits(wall_time_s=5))
    started = session.run(
        "import subprocess\n"
        "p = subprocess.Popen(['sh', '-c', 'sleep 0.3; echo late > late.txt'])\n"
        "print('started')"
    )
    assert started.stdout.strip() == "started"
    session.close()
    time.sleep(0.6)
    assert not (tmp_path / "late.txt").exists()


# --- the runner wires it together -------------------------------------------------------


def test_runner_shares_the_episode_workspace_and_records_who_made_what(tmp_path: Path) -> None:
    agents = [
        AgentConfig(
            name="engineer", role="E", input_template="{task}", max_actions=2, run_code=True
        ),
        AgentConfig(
            name="modeler", role="M", input_template="{task}", max_actions=2, run_code=True
        ),
    ]
    chat = FakeCharChat()
    policy = FakeScriptedPolicy(
        chat.encode,
        {
            "engineer": [
                "```python\nimport pickle\npickle.dump([1, 2], open('X.pkl', 'wb'))\n"
                "print('ok')\n```",
                "done",
            ],
            "modeler": [
                "```python\nimport pickle\nprint(sum(pickle.load(open('X.pkl', 'rb'))))\n```",
                "done",
            ],
        },
    )
    cfg = RunConfig(agents=agents, sandbox=SandboxConfig(pool_size=2))
    runner = runner_for(cfg, policy, chat, tmp_path / "workspaces")  # type: ignore[arg-type]  # a fake chat format
    tasks = [Task("t0", "task", None), Task("t1", "task", None)]
    episodes = runner.run(RolloutInput(tasks)).episodes
    for ep in episodes:
        assert ep.agent_actions("engineer")[0].tool_observation == "ok"
        assert ep.agent_actions("modeler")[0].tool_observation == "3"
        assert [a.tool_status for a in ep.actions] == ["ok", None, "ok", None]
        ws = runner.workspaces[ep.episode_id]
        assert ws.path == Path(ep.workspace or "").resolve()
        assert ws.files["X.pkl"].created_by == Author("engineer", 0)
    runner.close()


# --- SandboxFusion -----------------------------------------------------------------------


def _fake_sandboxfusion(request: httpx.Request) -> httpx.Response:
    """Acts like a SandboxFusion server: runs the code in a fresh temp dir with the uploaded
    files and returns the requested files (the code here is the test's own, trusted)."""
    body = json.loads(request.content)
    assert request.url.path == "/run_code" and body["language"] == "python"
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for name, data in body["files"].items():
            Path(d, name).parent.mkdir(parents=True, exist_ok=True)
            Path(d, name).write_bytes(base64.b64decode(data))
        proc = subprocess.run(
            [sys.executable, "-c", body["code"]],
            cwd=d,
            capture_output=True,
            text=True,
            timeout=body["run_timeout"],
        )
        files = {
            n: base64.b64encode(Path(d, n).read_bytes()).decode()
            for n in body["fetch_files"]
            if Path(d, n).exists()
        }
    return httpx.Response(
        200,
        json={
            "status": "Success" if proc.returncode == 0 else "Failed",
            "run_result": {
                "status": "Finished",
                "return_code": proc.returncode,
                "stdout": proc.stdout,
                "stderr": proc.stderr,
                "execution_time": 0.1,
            },
            "files": files,
        },
    )


def test_sandboxfusion_backend_protocol_and_file_sync(tmp_path: Path) -> None:
    backend = SandboxFusionBackend(
        "http://sandbox.test", httpx.Client(transport=httpx.MockTransport(_fake_sandboxfusion))
    )
    (tmp_path / "train.csv").write_text("1\n2\n")
    code = (
        "import os\nrows = open('train.csv').read().split()\nos.makedirs('out')\n"
        "open('out/sum.txt', 'w').write(str(sum(map(int, rows))))\nprint('ok')"
    )
    result = backend.execute(code, tmp_path, Limits())
    assert result.status == "ok" and result.stdout.strip() == "ok", result
    assert (
        result.files_changed == {"out/sum.txt": 1}
        and (tmp_path / "out" / "sum.txt").read_text() == "3"
    )
    failed = backend.execute("raise SystemExit(2)", tmp_path, Limits())
    assert (failed.status, failed.exit_code) == ("error", 2)


def test_sandboxfusion_unpack_refuses_paths_outside(tmp_path: Path) -> None:
    from mappa.sandbox.backends.sandboxfusion import _unpack

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("../escape.txt", "/abs.txt", "fine.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    (tmp_path / "ws").mkdir()
    _unpack(buf.getvalue(), tmp_path / "ws")
    assert (
        sorted(os.listdir(tmp_path / "ws")) == ["fine.txt"]
        and not (tmp_path / "escape.txt").exists()
    )


@pytest.mark.integration
def test_sandboxfusion_real_server(tmp_path: Path) -> None:
    url = os.environ.get("MAPPA_SANDBOXFUSION_URL", "http://localhost:8080")
    backend = SandboxFusionBackend(url)
    if not backend.reachable():
        pytest.skip(f"no SandboxFusion server at {url} (set MAPPA_SANDBOXFUSION_URL)")
    result = backend.execute("open('a.txt', 'w').write('x')\nprint(6 * 7)", tmp_path, Limits())
    assert result.status == "ok" and result.stdout.strip() == "42"
    assert result.files_changed == {"a.txt": 1}
