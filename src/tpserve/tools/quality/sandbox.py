"""Run untrusted generated Python (HumanEval completions) in a constrained subprocess.

What it stops, and how:
- network: the child runs in a fresh network namespace with no interfaces (`unshare -rn`) when
  the kernel allows unprivileged user namespaces; in any case an audit hook (sys.addaudithook,
  which Python code cannot remove) refuses every socket creation, connect, bind and DNS lookup.
- writing outside its directory: the child's cwd and TMPDIR are a fresh temporary directory;
  the audit hook refuses opening a file for writing, creating, removing, renaming or chmod-ing
  anything whose real path is outside it. RLIMIT_FSIZE caps the size of any file it writes.
- new processes and native code: the audit hook refuses subprocess, os.system/exec/spawn/fork
  and ctypes, so the child cannot start an interpreter without the hook.
- time and memory: RLIMIT_CPU (CPU seconds) and a wall-clock timeout that kills the process
  group; RLIMIT_AS caps the address space.

What it does not stop: the audit hook is a Python-level guard, not an OS security boundary.
Code that finds a way into native code without ctypes (a bug in CPython or in an imported
extension module) is not contained by it; without user namespaces the network is blocked by the
hook alone; reading files (including outside the directory) is allowed. Run it in a container
or VM if the code may be hostile rather than merely wrong.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

_PREAMBLE = r'''
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({mem}, {mem}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu} + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _install():
    root = os.path.realpath(os.getcwd())
    source = open("program.py").read()
    realpath, join, fsdecode, sep = os.path.realpath, os.path.join, os.fsdecode, os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    deny = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
            "os.forkpty", "ctypes.", "pty.", "os.kill", "os.killpg", "signal.pthread_kill", "gc.", "sys.addaudithook")
    path_events = {{"os.remove": 1, "os.rmdir": 1, "os.rename": 2, "os.replace": 2, "os.mkdir": 1,
                   "os.chmod": 1, "os.chown": 1, "os.link": 2, "os.symlink": 2, "os.truncate": 1,
                   "os.utime": 1, "shutil.rmtree": 1, "shutil.move": 2, "shutil.copyfile": 2}}

    def inside(path):
        if isinstance(path, int):
            return True
        try:
            real = realpath(join(root, fsdecode(path)))
        except TypeError:
            return False
        return real == root or real.startswith(root + sep)

    def hook(event, args):
        if event.startswith(deny):
            raise PermissionError(f"sandbox: {{event}} is not allowed")
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writing and not inside(path):
                raise PermissionError(f"sandbox: writing {{path!r}} outside the sandbox directory")
        elif event in path_events:
            for p in args[:path_events[event]]:
                if p is not None and not inside(p):
                    raise PermissionError(f"sandbox: {{event}} on {{p!r}} outside the sandbox directory")

    sys.addaudithook(hook)
    return compile(source, "program.py", "exec")


_code = _install()
del _install
sys.argv = ["program.py"]
exec(_code, {{"__name__": "__main__", "__builtins__": __builtins__}})
'''


@dataclass
class SandboxResult:
    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    reason: str  # "passed", "failed", "timeout", "memory"...


@functools.lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_sandboxed(code: str, *, timeout_s: float = 10.0, memory_mb: int = 1024, max_file_mb: int = 16,
                  python: str | None = None) -> SandboxResult:
    """Run `code` as a script in a new temporary directory; ok when it exits 0 in time."""
    with tempfile.TemporaryDirectory(prefix="tpserve-sandbox-") as tmp:
        with open(os.path.join(tmp, "program.py"), "w") as f:
            f.write(code)
        preamble = _PREAMBLE.format(mem=memory_mb << 20, cpu=max(1, int(timeout_s + 0.999)),
                                    fsize=max_file_mb << 20)
        cmd = [python or sys.executable, "-I", "-c", preamble]
        if network_namespace_available():
            cmd = ["unshare", "-rn"] + cmd
        env = {"PATH": "/usr/bin:/bin", "TMPDIR": tmp, "HOME": tmp, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return SandboxResult(False, None, out.decode(errors="replace")[-2000:],
                                 err.decode(errors="replace")[-2000:], "timeout")
    out, err = out.decode(errors="replace")[-2000:], err.decode(errors="replace")[-2000:]
    if proc.returncode == 0:
        return SandboxResult(True, 0, out, err, "passed")
    if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and "Error" not in err:
        reason = "timeout"
    elif "MemoryError" in err:
        reason = "memory"
    elif "sandbox:" in err:
        reason = "blocked: " + err[err.rfind("sandbox:"):].splitlines()[0]
    else:
        lines = [x for x in err.strip().splitlines() if x.strip()]
        reason = "failed: " + (lines[-1][:160] if lines else f"exit {proc.returncode}")
    return SandboxResult(False, proc.returncode, out, err, reason)
