"""The HumanEval sandbox stops a socket, a write outside its directory, a subprocess, an endless
loop and a memory hog; ordinary code (including writing inside its directory) runs."""

from tpserve.tools.quality.sandbox import run_sandboxed


def test_ordinary_code_runs():
    r = run_sandboxed("import json, math\nopen('x.txt', 'w').write('ok')\nprint(json.dumps(math.factorial(5)))",
                      timeout_s=20)
    assert r.ok and r.stdout.strip() == "120", r


def test_socket_is_stopped():
    r = run_sandboxed("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 80))\nprint('connected')",
                      timeout_s=20)
    assert not r.ok and "connected" not in r.stdout and "socket" in r.reason, r


def test_write_outside_is_stopped(tmp_path):
    target = tmp_path / "escaped.txt"
    code = f"open({str(target)!r}, 'w').write('x')\n"
    r = run_sandboxed(code, timeout_s=20)
    assert not r.ok and "outside the sandbox" in r.reason and not target.exists(), r
    r = run_sandboxed(f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)\n", timeout_s=20)
    assert not r.ok and not target.exists(), r
    r = run_sandboxed(f"import os\nos.symlink('/', 'root')\nopen('root' + {str(target)!r}, 'w')\n", timeout_s=20)
    assert not r.ok and not target.exists(), r


def test_subprocess_and_ctypes_are_stopped(tmp_path):
    target = tmp_path / "via_shell.txt"
    r = run_sandboxed(f"import os\nos.system('touch {target}')\n", timeout_s=20)
    assert not r.ok and not target.exists() and "os.system" in r.reason, r
    r = run_sandboxed("import ctypes\nctypes.CDLL(None)\n", timeout_s=20)
    assert not r.ok and "ctypes" in r.reason, r


def test_endless_loop_is_stopped():
    r = run_sandboxed("while True:\n    pass\n", timeout_s=2)
    assert not r.ok and r.reason == "timeout", r


def test_memory_limit():
    r = run_sandboxed("x = bytearray(2 << 30)\n", timeout_s=20, memory_mb=512)
    assert not r.ok and r.reason == "memory", r
