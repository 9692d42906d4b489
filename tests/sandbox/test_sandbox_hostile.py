"""Hostile programs (issue 4): each must end within its limit, with the right status and a
message naming the limit, leave no process behind, and leave the host untouched.

Every test runs under explicit small limits. Tests that only a contained sandbox survives
(fork bombs, killing other processes, writing outside) are skipped for a backend that
cannot contain them here, rather than run unlimited on this machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mappa.sandbox import BwrapBackend, ExecutionResult, Limits, ProcessBackend
from mappa.sandbox import backends as backends_module
from mappa.sandbox.backends import ALLOW_UNISOLATED_ENV, SandboxUnavailable, make_backend
from mappa.sandbox.backends import process as process_module
from mappa.sandbox.backends.local import LocalBackend
from mappa.sandbox.identity import DEFAULT_UID_BASE, host_is_root
from mappa.sandbox.limits import MiB

pytestmark = pytest.mark.filterwarnings("ignore::mappa.sandbox.SandboxIsolationWarning")

SMALL = Limits(
    wall_time_s=3.0,
    cpu_time_s=3.0,
    memory_bytes=512 * MiB,
    max_processes=16,
    file_size_bytes=16 * MiB,
    tmp_bytes=16 * MiB,
    max_output_chars=2000,
    max_output_bytes=1 * MiB,
)


def contained(backend: LocalBackend) -> bool:
    """Whether code runs apart from the host's uid (so it cannot signal or write as us)."""
    return isinstance(backend, BwrapBackend) or backend.runs_as_sandbox_uid()


def require_contained(backend: LocalBackend) -> None:
    if not contained(backend):
        pytest.skip(
            f"the {backend.name} backend runs code as the host's own uid here "
            f"({'root' if host_is_root() else 'this user'}): it cannot contain this; use bwrap"
        )


def sandbox_processes() -> list[int]:
    """Live processes running as any sandbox uid."""
    lo, hi = DEFAULT_UID_BASE + 1, DEFAULT_UID_BASE + 1024
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if lo <= int(fields["Uid"].split()[0]) <= hi and not fields["State"].strip().startswith(
                "Z"
            ):
                found.append(int(entry))
    return found


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


@pytest.fixture(autouse=True)
def no_leftovers() -> object:
    """No sandbox process survives its run. Processes already killed may take a moment to
    finish exiting (the kernel tears a PID namespace down asynchronously): allow 2 s."""
    yield
    if host_is_root():
        give_up = time.monotonic() + 2.0
        while (left := sandbox_processes()) and time.monotonic() < give_up:
            time.sleep(0.05)
        assert left == [], "a sandbox process outlived its run"


def run(backend: LocalBackend, code: str, ws: Path, limits: Limits = SMALL) -> ExecutionResult:
    return backend.execute(code, ws, limits)


def test_infinite_loop_times_out(backend: LocalBackend, ws: Path) -> None:
    limits = Limits(wall_time_s=1.0, cpu_time_s=30)
    result = run(backend, "while True:\n    pass", ws, limits)
    assert (result.status, result.limit) == ("timeout", "wall_time")
    assert "wall time limit of 1 s" in result.observation()


def test_cpu_limit_kills(backend: LocalBackend, ws: Path) -> None:
    limits = Limits(wall_time_s=10.0, cpu_time_s=1)
    result = backend.execute("while True:\n    pass", ws, limits)
    assert (result.status, result.limit) == ("killed", "cpu_time"), result
    assert "CPU time limit of 1 s" in result.observation()


@pytest.mark.integration  # saturates both cores for its whole wall time
def test_fork_bomb_is_contained(backend: LocalBackend, ws: Path) -> None:
    require_contained(backend)
    # Every process forks forever and ignores failures: only the limits stop it.
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run(backend, code, ws, Limits(wall_time_s=1.5, max_processes=16))
    assert (result.status, result.limit) == ("timeout", "wall_time")
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


def test_while_true_fork_hits_process_limit(backend: LocalBackend, ws: Path) -> None:
    require_contained(backend)
    result = run(
        backend,
        "import os\nwhile True:\n    os.fork()",
        ws,
        Limits(wall_time_s=5, max_processes=16),
    )
    assert (result.status, result.limit) == ("error", "processes"), result
    assert "process limit of 16" in result.observation()


def test_allocating_8_gb_fails_with_memory_limit(backend: LocalBackend, ws: Path) -> None:
    result = run(backend, "x = bytearray(8 * 1024**3)\nprint('allocated')", ws)
    assert (result.status, result.limit) == ("error", "memory")
    assert "MemoryError" in result.stderr and "allocated" not in result.stdout
    assert "memory limit of 512 MiB" in result.observation()


def test_writing_1_gb_file_stops_at_file_size_limit(backend: LocalBackend, ws: Path) -> None:
    code = (
        "with open('big.bin', 'wb') as f:\n    for _ in range(1024):\n"
        "        f.write(bytes(1 << 20))"
    )
    result = run(backend, code, ws)
    assert (result.status, result.limit) == ("error", "file_size")
    assert "file size limit of 16 MiB" in result.observation()
    assert (ws / "big.bin").stat().st_size <= SMALL.file_size_bytes
    assert result.files_changed == {"big.bin": (ws / "big.bin").stat().st_size}


def test_printing_100_mb_is_stopped_and_cut(backend: LocalBackend, ws: Path) -> None:
    code = (
        "import sys\nline = 'x' * 999_999 + '\\n'\nsys.stdout.write('START\\n')\n"
        "for _ in range(100):\n    sys.stdout.write(line)"
    )
    result = run(backend, code, ws)
    assert (result.status, result.limit) == ("killed", "output")
    assert result.stdout.startswith("START") and "chars cut" in result.stdout
    assert len(result.stdout) < SMALL.max_output_chars + 100
    assert "output limit of 1 MiB" in result.observation()


def test_parent_environment_is_not_visible(
    backend: LocalBackend, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-host-secret")
    code = (
        "import os\nprint(os.environ.get('OPENAI_API_KEY'))\nprint(sorted(os.environ))\n"
        f"try:\n    print(open('/proc/{os.getpid()}/environ', 'rb').read())\n"
        "except OSError as e:\n    print('environ unreadable:', type(e).__name__)"
    )
    result = run(backend, code, ws)
    assert result.status == "ok"
    assert "sk-host-secret" not in result.stdout and result.stdout.splitlines()[0] == "None"
    if contained(backend):
        assert "environ unreadable" in result.stdout


def test_writes_outside_the_workspace_fail(backend: LocalBackend, ws: Path) -> None:
    require_contained(backend)
    outside_abs = ws.parent / "absolute_outside.txt"
    code = (
        "import os\n"
        f"for path in ['../outside.txt', {str(outside_abs)!r},"
        " '/etc/mappa-sandbox-test', '/usr/mappa-test']:\n"
        "    try:\n        open(path, 'w').write('escaped')\n        print('WROTE', path)\n"
        "    except OSError as e:\n        print('denied', path, type(e).__name__)"
    )
    result = run(backend, code, ws)
    assert "WROTE" not in result.stdout, result.stdout
    assert not (ws.parent / "outside.txt").exists() and not outside_abs.exists()
    assert not Path("/etc/mappa-sandbox-test").exists() and not Path("/usr/mappa-test").exists()


def test_socket_to_localhost_fails(backend: LocalBackend, ws: Path) -> None:
    if not isinstance(backend, BwrapBackend):
        pytest.skip("the process backend has no network namespace: code can use the network")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        code = (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')\n"
            "    print('CONNECTED')\nexcept OSError as e:\n"
            "    print('no network:', type(e).__name__)"
        )
        result = run(backend, code, ws)
        assert "no network" in result.stdout and "CONNECTED" not in result.stdout
        with pytest.raises(TimeoutError):
            server.accept()


def test_killing_its_parent_and_everyone_leaves_the_host_alive(
    backend: LocalBackend, ws: Path
) -> None:
    require_contained(backend)
    bystander = subprocess.Popen(["sleep", "30"])  # a host process the code must not reach
    try:
        code = (
            "import os, signal\nfor target in (os.getppid(), -1):\n    try:\n"
            "        os.kill(target, signal.SIGKILL)\n    except OSError as e:\n"
            "        print('refused', target, type(e).__name__)\nprint('survived')"
        )
        result = run(backend, code, ws)
        assert result.status in ("ok", "killed")  # kill(-1) may take the code down with it
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_background_child_is_killed_when_the_script_ends(backend: LocalBackend, ws: Path) -> None:
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(0.3)\n        open('late.txt', 'w').write('still alive')\n"
        "    os._exit(0)\nprint('script done')"
    )
    result = run(backend, code, ws)
    assert result.status == "ok" and "script done" in result.stdout
    time.sleep(0.6)  # had the sandbox waited for the child, late.txt would exist by now
    assert not (ws / "late.txt").exists()


def test_ctypes_segfault_is_reported(backend: LocalBackend, ws: Path) -> None:
    result = run(backend, "import ctypes\nctypes.string_at(0)", ws)
    assert result.status == "killed" and result.exit_code == -11
    assert "SIGSEGV (segmentation fault)" in result.observation()


# --- secrets: the trainer's environment (issue 13, item 6) ---------------------------------

_TRAINER = """
import json, sys, warnings
from pathlib import Path
from mappa.sandbox import BwrapBackend, Limits, ProcessBackend
warnings.simplefilter("ignore")
name, python, ws, code = json.loads(sys.argv[1])
backend = BwrapBackend() if name == "bwrap" else ProcessBackend(python)
r = backend.execute(code, Path(ws), Limits(wall_time_s=20, cpu_time_s=20))
print(json.dumps([r.status, r.stdout, r.stderr]))
"""

_STEAL = """
import os
marker = "hunter2" + "-trainer-secret"
print("own env:", os.environ.get("MAPPA_TEST_SECRET"))
found = set()
def look(pid):
    try:
        if marker.encode() in open(f"/proc/{pid}/environ", "rb").read():
            found.add(pid)
    except OSError:
        pass
pid = os.getppid()
while pid > 1:  # every ancestor: the supervisor, bwrap, the trainer, its shell...
    look(pid)
    try:
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
for entry in os.listdir("/proc"):  # and every other process it can see
    if entry.isdigit():
        look(int(entry))
print("FOUND" if found else "CLEAN", sorted(found))
"""


def steal_trainer_secret(name: str, python: str, ws: Path) -> str:
    """Start a 'trainer' holding a secret in its environment; its sandboxed code hunts for it."""
    env = {**os.environ, "MAPPA_TEST_SECRET": "hunter2-trainer-secret"}
    args = json.dumps([name, python, str(ws), _STEAL])
    proc = subprocess.run(
        [sys.executable, "-c", _TRAINER, args], env=env, capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    status, stdout, stderr = json.loads(proc.stdout.splitlines()[-1])
    assert status == "ok", stderr
    assert stdout.splitlines()[0] == "own env: None"  # the code's own environment is cleared
    return str(stdout)


def test_code_cannot_read_the_trainers_environment_through_proc(
    backend: LocalBackend, ws: Path
) -> None:
    """A hostile program reads /proc/<pid>/environ of its parent, every ancestor and every
    visible process for a secret the trainer holds: a contained backend must hide it."""
    require_contained(backend)
    out = steal_trainer_secret(backend.name, backend.python, ws)
    assert "CLEAN" in out and "FOUND" not in out, out


def test_the_hostile_program_finds_the_secret_when_code_runs_as_the_trainers_uid(
    ws: Path,
) -> None:
    """The check above is not vacuous: run as the trainer's own uid, the same program finds
    the secret (the mode ``make_backend`` refuses without MAPPA_ALLOW_UNISOLATED=1)."""
    if ProcessBackend(sys.executable).runs_as_sandbox_uid():
        pytest.skip("this interpreter runs code as a sandbox uid here: no unisolated mode")
    out = steal_trainer_secret("process", sys.executable, ws)
    assert "FOUND" in out, out


def test_make_backend_refuses_the_unisolated_process_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_module, "host_is_root", lambda: False)  # code as our own uid
    monkeypatch.delenv(ALLOW_UNISOLATED_ENV, raising=False)
    with pytest.raises(SandboxUnavailable, match=r"/proc/<pid>/environ.*MAPPA_ALLOW_UNISOLATED=1"):
        make_backend("process")
    monkeypatch.setattr(backends_module, "bwrap_problem", lambda *a: "bwrap is not installed")
    with pytest.raises(SandboxUnavailable, match=r"bwrap cannot run here .*not installed.*environ"):
        make_backend("auto")
    monkeypatch.setenv(ALLOW_UNISOLATED_ENV, "1")  # the user's explicit opt-in
    backend = make_backend("auto")
    assert isinstance(backend, ProcessBackend) and not backend.runs_as_sandbox_uid()
    assert any("/proc/<pid>/environ" in w for w in backend.weaknesses())
