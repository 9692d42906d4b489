"""The program that runs inside the sandbox, around the agent's code.

It is passed to the interpreter as ``python -I -B -c <this file> <json config>``, so it needs
no file inside the sandbox and must use the standard library only. It never imports mappa.

In order it: optionally becomes a *supervisor* (process backend: a child subreaper that
reaps every orphan and, when the code's main process ends, kills whatever it left behind —
without it, orphans of a sandbox become zombies of the host's init, which here never reaps
them); drops to the sandbox uid (when the host is root); applies the rlimits; then runs the
code read from ``code_fd`` once (stateless), or serves code cells from ``code_fd`` and
answers each on ``reply_fd`` (persistent: one interpreter per agent per episode).

Exit status: the code's own, or ``128 + N`` when it died from signal N (as bwrap reports).
"""

import contextlib
import json
import linecache
import os
import resource
import signal
import sys
import traceback
import types

PR_SET_CHILD_SUBREAPER = 36


def main(cfg):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash must not write a core dump
    if cfg["supervise"]:
        _supervise(cfg)  # returns only in the child that runs the code
    _become(cfg)
    sys.argv = [""]
    sys.path.insert(0, "")  # like a script in the workspace: agents import their own modules
    if cfg["persistent"]:
        _serve(cfg)
    else:
        _run_once(cfg)


def _supervise(cfg):
    """Fork; the parent stays (as root when the host is root, so the code cannot kill it),
    reaps everything, and exits with the code's status once nothing is left."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: orphans go to init, as they would without a sandbox
    stopping = []

    def stop(signum, frame):  # the host's wall-time limit: end everything now
        stopping.append(signum)
        _kill_children()

    signal.signal(signal.SIGUSR1, stop)
    main_pid = os.fork()
    if main_pid == 0:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        return
    for fd in (cfg["code_fd"], cfg.get("reply_fd")):
        if fd is not None:
            os.close(fd)  # the host must see EOF on replies when the code's process dies
    status = None
    while True:
        try:
            pid, wstatus = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == main_pid:
            status = wstatus
        if status is not None or stopping:
            _kill_children()  # orphans were reparented to us before their parent was reaped
    if status is None:
        os._exit(128 + signal.SIGKILL)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def _kill_children():
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(b")") + 2 :].split()[:2]
        if int(ppid) == me and state != b"Z":
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)


def _become(cfg):
    """Drop to the sandbox identity, then limit ourselves (children inherit both)."""
    os.umask(cfg["umask"])
    if cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["gid"])
        os.setuid(cfg["uid"])
    for name, (soft, hard) in cfg["rlimits"].items():
        if name == "NPROC" and cfg["nproc_relative"]:
            # Same uid as the host user: the kernel counts all their tasks, so allow ours on top.
            soft = hard = soft + _tasks_of(os.getuid())
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (soft, hard))


def _tasks_of(uid):
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if int(fields.get("Uid", "-1 ").split()[0]) == uid:
                n += int(fields.get("Threads", "1"))
    return n


def _fresh_main():
    """A clean ``__main__`` for the code, so pickles of classes it defines load elsewhere."""
    module = types.ModuleType("__main__")
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    return module.__dict__


def _run_cell(code, namespace, filename):
    """Run ``code`` like a script: traceback on error (without our frame), exit status back."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        exec(compile(code, filename, "exec"), namespace)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        return 1
    return 0


def _run_once(cfg):
    with os.fdopen(cfg["code_fd"], "rb") as f:
        code = f.read().decode("utf-8", "replace")
    sys.exit(_run_cell(code, _fresh_main(), "<code>"))


def _serve(cfg):
    """Notebook-like: one namespace; each cell is ``<length>\\n<utf-8 code>`` on code_fd and
    is answered with one JSON line on reply_fd after its output has been flushed."""
    commands = os.fdopen(cfg["code_fd"], "rb")
    replies = os.fdopen(cfg["reply_fd"], "wb", buffering=0)
    namespace = _fresh_main()
    cell = 0
    while True:
        header = commands.readline()
        if not header:
            return  # the host closed the session
        code = commands.read(int(header)).decode("utf-8", "replace")
        cell += 1
        # RLIMIT_CPU counts the process's whole life: give each cell its own allowance.
        usage = resource.getrusage(resource.RUSAGE_SELF)
        used = int(usage.ru_utime + usage.ru_stime) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (used + cfg["cell_cpu_s"], resource.RLIM_INFINITY))
        status = _run_cell(code, namespace, f"<cell {cell}>")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        replies.write(json.dumps({"exit_code": status}).encode() + b"\n")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
