"""For users who already run a SandboxFusion server: the same interface over HTTP.

The server runs each request in a fresh temporary directory, so the workspace travels with
it: every file is uploaded, and the code is wrapped so that at exit it packs the files it
created or changed into one archive that is fetched back and unpacked into the workspace.
Fine for small workspaces; a DSBench workspace is sent whole on every block. The server
enforces wall time and memory; output is cut here.
"""

from __future__ import annotations

import base64
import io
import posixpath
import tarfile
from pathlib import Path

import httpx

from mappa.sandbox.backends.base import Backend
from mappa.sandbox.capture import Capture
from mappa.sandbox.limits import LimitName, Limits, MiB
from mappa.sandbox.result import ExecutionResult, RunWatch, Status

ARCHIVE = ".mappa-changed.tar"

_WRAPPER = """\
import atexit as _atexit, os as _os, tarfile as _tarfile

def _mappa_files():
    out = {{}}
    for _dir, _subdirs, _names in _os.walk("."):
        for _name in _names:
            _path = _os.path.join(_dir, _name)
            if not _os.path.islink(_path) and _os.path.normpath(_path) != {archive!r}:
                _st = _os.stat(_path)
                out[_os.path.normpath(_path)] = (_st.st_size, _st.st_mtime_ns)
    return out

_mappa_before = _mappa_files()

@_atexit.register
def _mappa_pack():
    with _tarfile.open({archive!r}, "w") as _tar:
        for _path, _meta in _mappa_files().items():
            if _mappa_before.get(_path) != _meta:
                _tar.add(_path)

exec(compile({code!r}, "<code>", "exec"), {{"__name__": "__main__"}})
"""


class SandboxFusionBackend(Backend):
    name = "sandboxfusion"

    def __init__(self, url: str, client: httpx.Client | None = None, slack_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.client = client or httpx.Client()
        self.slack_s = slack_s
        """Seconds the HTTP call may take beyond the wall-time limit (queueing, transfer)."""

    def reachable(self) -> bool:
        try:
            self.client.get(f"{self.url}/", timeout=2.0)
        except httpx.HTTPError:
            return False
        return True

    def execute(self, code: str, workdir: Path, limits: Limits) -> ExecutionResult:
        workdir = Path(workdir).resolve()
        watch = RunWatch.begin(workdir)
        request = {
            "code": _WRAPPER.format(archive=ARCHIVE, code=code),
            "language": "python",
            "run_timeout": limits.wall_time_s,
            "memory_limit_MB": max(1, limits.memory_bytes // MiB),
            "files": {
                name: base64.b64encode((workdir / name).read_bytes()).decode()
                for name in watch.before
            },
            "fetch_files": [ARCHIVE],
        }
        try:
            response = self.client.post(
                f"{self.url}/run_code", json=request, timeout=limits.wall_time_s + self.slack_s
            )
            response.raise_for_status()
            data = response.json()
        except (httpx.HTTPError, ValueError) as e:
            return ExecutionResult(
                "error",
                None,
                "",
                "",
                watch.elapsed(),
                message=f"sandbox server failed: {e}",
            )
        archive = (data.get("files") or {}).get(ARCHIVE)
        if archive:
            _unpack(base64.b64decode(archive), workdir)
        run = data.get("run_result") or {}
        out, err = Capture(limits.max_output_chars), Capture(limits.max_output_chars)
        out.feed((run.get("stdout") or "").encode())
        err.feed((run.get("stderr") or "").encode())
        code_rc = run.get("return_code")
        status: Status
        message = ""
        limit: LimitName | None = None
        if run.get("status") == "TimeLimitExceeded":
            status, exit_code = "timeout", None
            message, limit = (
                f"execution timed out: {limits.describe('wall_time')} exceeded",
                "wall_time",
            )
        elif data.get("status") == "SandboxError" or code_rc is None:
            status, exit_code = "error", code_rc
            message = f"sandbox server error: {data.get('message') or run.get('status')}"
        elif code_rc < 0 or code_rc > 128:
            status, exit_code = "killed", code_rc
            message = f"killed (exit code {code_rc})"
        else:
            status, exit_code = ("ok" if code_rc == 0 else "error"), code_rc
        stdout, stderr = out.text(limits.max_output_chars), err.text(limits.max_output_chars)
        return watch.result(status, exit_code, stdout, stderr, message, limit)


def _unpack(data: bytes, workdir: Path) -> None:
    """Write the archive's regular files into ``workdir``; skip anything that would land
    outside it (absolute names, ``..``) or is not a plain file."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            name = posixpath.normpath(member.name)
            if not member.isfile() or name.startswith(("/", "..")):
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            target = workdir / name
            if not target.parent.resolve().is_relative_to(workdir) or target.is_symlink():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read())
