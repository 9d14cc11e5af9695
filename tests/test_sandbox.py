"""The `python` tool and its sandbox against hostile programs.

Every hostile program here is bounded by the sandbox's own limits (2 s wall clock, 256 MB);
the fork tests that bypass the audit hook fork at most 50 times under RLIMIT_NPROC. The only
network address any test touches is 127.0.0.1; the only processes any program may reach are a
`sleep` each test starts for it. Each test checks both that the program was refused with a
reason and, where it can be seen from outside, that the host was unaffected.

Two modes (`MODES`): the sandbox run by the test process itself (root in CI: uid drop, network
namespace) and run by a process dropped to `nobody` with `setpriv` (a user who is not root: no
uid drop, so the kernel filter is the boundary). The second runs every program through
`_DRIVER` in a subprocess, with a world-readable copy of sandbox.py.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from sentinel.env import sandbox
from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, Episode
from sentinel.env.parser import HermesParser, format_answer, format_call
from sentinel.env.sandbox import (
    SandboxLimits,
    SandboxUnavailable,
    available_layers,
    kernel_layers,
    run_python,
)
from sentinel.env.tools import BadArguments, Calculator, Python, ToolFailure, tool_schema
from sentinel.policy import build_tokenizer
from sentinel.tasks.arith import ArithFamily

FAST = SandboxLimits(timeout_s=2.0)  # generous: the machine may be busy
LAYERS = available_layers()
needs_uid = pytest.mark.skipif(not LAYERS["unprivileged_uid"],
                               reason="not root here: no unprivileged uid to drop to")
needs_netns = pytest.mark.skipif(not LAYERS["network_namespace"],
                                 reason="`unshare -n` does not work here")
needs_pidns = pytest.mark.skipif(not LAYERS["pid_namespace"],
                                 reason="`unshare -p` does not work here")
needs_kernel = pytest.mark.skipif(not LAYERS["seccomp"],
                                  reason=f"no kernel filter here: {kernel_layers()['why']}")


@pytest.fixture(scope="module")
def python() -> Python:
    return Python(FAST)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory holding a secret, as the loop's run directory would."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "secret.txt").write_text("hunter2-run-secret")
    return run


def _alive(pid: int, uid: int) -> bool:
    """Is `pid` a live (not zombie) process of `uid`? A SIGKILLed process stays a zombie until
    it is reaped; a reused pid belongs to someone else."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return f"\nUid:\t{uid}\t" in status and state != "Z"


def _all_gone(pids: list[int], uid: int, within_s: float = 2.0) -> bool:
    """True once none of `pids` is alive (killed processes take a moment to go)."""
    deadline = time.monotonic() + within_s
    while any(_alive(pid, uid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- benign programs ---------------------------------------------------------------------------


def test_benign_code_prints_its_result(python: Python) -> None:
    assert python(code="print(sum(range(10)))") == "45"


def test_toolbox_modules_and_working_directory_files(python: Python) -> None:
    code = (
        "import json, math, fractions, os\n"
        "with open('notes.txt', 'w') as f:\n"
        "    f.write(json.dumps({'f': math.factorial(5)}))\n"
        "os.mkdir('sub')\n"
        "print(open('notes.txt').read(), fractions.Fraction(1, 3), sorted(os.listdir('.')))"
    )
    assert python(code=code) == "{\"f\": 120} 1/3 ['notes.txt', 'snippet.py', 'sub']"


def test_stderr_follows_stdout(python: Python) -> None:
    assert python(code="import sys\nprint('out')\nprint('warn', file=sys.stderr)") == "out\nwarn"


def test_environment_is_scrubbed_and_workdir_removed(python: Python) -> None:
    out = python(code="import os\nprint(sorted(os.environ))\nprint(os.getcwd())")
    names, cwd = out.splitlines()
    assert names == "['LC_ALL', 'PATH', 'TMPDIR']"  # no HOME, nothing of the parent's
    assert "sentinel-sandbox-" in cwd and not os.path.exists(cwd)


def test_unicode_output_survives(python: Python) -> None:
    assert python(code="print('héllo \\u202e ✓ \\ud800')") == "héllo \u202e ✓ \\ud800"


def test_long_output_keeps_its_tail() -> None:
    out = Python(FAST, max_result_chars=100)(code="for i in range(1000):\n    print(i)")
    assert len(out) == 100 and out.startswith("...") and out.endswith("998\n999")


# -- bad code is the policy's fault ------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"code": 7}, "must be string"),
        ({}, "missing argument(s) code"),
        ({"code": "1", "timeout": 9}, "unknown argument(s) timeout"),
        ({"code": "x" * 20_001}, "the limit is 20000"),
        ({"code": "print(1)\x00"}, "NUL"),
        ({"code": "print('\ud800')"}, "not valid Unicode"),
        ({"code": "x = 1\n1 / 0"}, "line 2: ZeroDivisionError: division by zero"),
        ({"code": "def f(:\n  pass"}, "line 1: SyntaxError"),
        ({"code": "def f(n):\n    return f(n + 1)\nf(0)"}, "RecursionError"),
        ({"code": "import sqlite3"}, "No module named 'sqlite3'"),
        ({"code": "import sys\nsys.exit(3)"}, "SystemExit: 3"),
    ],
)
def test_bad_code_is_bad_arguments(python: Python, arguments: dict, fragment: str) -> None:
    with pytest.raises(BadArguments) as info:
        python(**arguments)
    assert fragment in str(info.value)


# -- hostile programs: refused, with the reason ------------------------------------------------

HOSTILE = {
    "infinite loop": ("while True:\n    pass", "timed out after 2.0 s"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "blocked: starting or signalling"),
    "huge allocation": ("x = bytearray(8 * 1024 ** 3)", "memory limit (256 MB)"),
    "growing allocation": ("xs = []\nwhile True:\n    xs.append(bytearray(5 * 10 ** 7))",
                           "memory limit (256 MB)"),
    "/etc/passwd": ("print(open('/etc/passwd').read())", "blocked: reading outside the sandbox"),
    "relative escape": ("print(open('../../etc/passwd').read())", "blocked: reading outside"),
    "list /": ("import os\nprint(os.listdir('/'))", "blocked: reading outside the sandbox"),
    "chdir out": ("import os\nos.chdir('/etc')\nprint(open('passwd').read())",
                  "blocked: reading outside"),
    "os.open a directory": ("import os\nfd = os.open('/etc', os.O_RDONLY)\n"
                            "os.open('passwd', os.O_RDONLY, dir_fd=fd)", "blocked: reading"),
    "socket": ("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
               "blocked: network access"),
    "_socket": ("import _socket\n_socket.socket()", "blocked: network access"),
    "huge output": ("print('x' * 10 ** 7)", "output limit (more than 65536 bytes)"),
    "ctypes": ("import ctypes\nctypes.CDLL(None).system(b'true')", "blocked: native code"),
    "hand-made extension module": (
        "open('evil.so', 'wb').write(b'\\x7fELF' + bytes(64))\n"
        "import _frozen_importlib_external as ext, _frozen_importlib as boot\n"
        "loader = ext.ExtensionFileLoader('evil', 'evil.so')\n"
        "boot._load(ext.spec_from_file_location('evil', 'evil.so', loader=loader))",
        "blocked: native code"),
    "os.system": ("import os\nos.system('true')", "blocked: starting or signalling a process"),
    "subprocess.run": ("import subprocess\nsubprocess.run(['true'])", "blocked: starting"),
    "execv": ("__import__('os').execv('/bin/true', ['true'])", "blocked: starting"),
    "kill": ("import os\nos.kill(1, 0)", "blocked: starting or signalling a process"),
    "deep recursion past the limit": (  # through C frames, so the C stack overflows
        "import sys\nsys.setrecursionlimit(10 ** 6)\n"
        "def f(n):\n    return sorted([n], key=lambda x: f(x + 1))\nf(0)",
        "crashed (SIGSEGV)"),
    "symlink out": ("import os\nos.symlink('/etc/passwd', 'p')\nprint(open('p').read())",
                    "blocked: writing outside the sandbox"),
    "trace the hook": ("import sys\nsys.settrace(lambda *a: None)", "blocked: introspection"),
    "find the hook": ("import gc\ngc.get_objects()", "blocked: introspection"),
    "patch the hook's globals": (
        "import __main__, builtins\n__main__.BLOCKED_MODULES = {}\nbuiltins.any = lambda x: True\n"
        "print(open('/etc/passwd').read())", "blocked: reading outside the sandbox"),
    "catch the refusal": ("try:\n    import socket\nexcept BaseException:\n    pass\nprint('on')",
                          "blocked: network access"),
    "too many files": ("for i in range(100):\n    open(f'f{i}', 'w').close()", "file limit"),
    "huge file": ("with open('big', 'wb') as f:\n    for _ in range(10):\n"
                  "        f.write(bytes(10 ** 6))", "file size limit (4 MB)"),
    "blocked module under a package name": (  # `_imp.create_dynamic` names it anything
        "import _imp, _frozen_importlib_external as ext\n"
        "so = '/nonexistent/_posixsubprocess.so'\n"
        "loader = ext.ExtensionFileLoader('x._posixsubprocess', so)\n"
        "_imp.create_dynamic(ext.spec_from_file_location('x._posixsubprocess', so, "
        "loader=loader))", "blocked: starting or signalling a process (import x._posixsubprocess)"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_is_refused(python: Python, name: str) -> None:
    code, reason = HOSTILE[name]
    with pytest.raises(ToolFailure) as info:
        python(code=code)
    assert reason in str(info.value)


# -- the same list, and escapes past the audit hook, in both modes -----------------------------

# How each mode runs a batch of programs: a driver script (standard library only) that loads a
# copy of sandbox.py, runs each case, and reports the result with what could be seen from
# outside: whether the case's `sleep` target survived and whether its target path appeared.
_DRIVER = r"""
import dataclasses, importlib.util, json, os, subprocess, sys, time
spec = importlib.util.spec_from_file_location("sandbox_copy", sys.argv[1])
sandbox = sys.modules["sandbox_copy"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
sleeper_prefix = json.loads(sys.argv[2])
results = {}
for key, case in json.load(sys.stdin).items():
    sleeper = subprocess.Popen([*sleeper_prefix, "sleep", "30"]) if case["sleeper"] else None
    code = case["code"].replace("SLEEPER", str(sleeper.pid) if sleeper else "0")
    try:
        result = sandbox.run_python(code, sandbox.SandboxLimits(**case["limits"]),
                                    audit_hook=case["audit_hook"])
        found = dataclasses.asdict(result)
    except Exception as exc:  # the host raised: what a loop would die of
        found = {"status": "host raised", "reason": f"{type(exc).__name__}: {exc}",
                 "stdout": ""}
    time.sleep(case["wait_s"])  # for anything the program left behind to act
    found["leftovers"] = [n for n in os.listdir(sandbox.tempfile_dir())
                          if n.startswith(f"{sandbox.WORKDIR_PREFIX}{os.getpid()}-")]
    found["sleeper_alive"] = sleeper is not None and sleeper.poll() is None
    found["target_exists"] = bool(case["target"]) and os.path.lexists(case["target"])
    if found["target_exists"]:
        os.remove(case["target"])
    if sleeper is not None:
        sleeper.kill()
        sleeper.wait()
    results[key] = found
print(json.dumps(results))
"""
_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _nobody_python() -> str | None:
    """An interpreter `nobody` can run: ours, unless it lives under a private directory (as
    under /root here), else the system's."""
    # The sandbox starts `sys.executable` again: check that too (here `nobody` gets an
    # interpreter through the venv's link to /root, yet cannot start that link itself).
    check = "import subprocess, sys; subprocess.run([sys.executable, '-c', ''], check=True)"
    for exe in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run([*_NOBODY, exe, "-I", "-c", check], capture_output=True, cwd="/")
        if probe.returncode == 0:
            return exe
    return None


def _mode_skip_reason(mode: str) -> str | None:
    if mode == "user":
        return None
    if os.geteuid() != 0:
        return "not root: cannot drop to nobody for the second mode"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is absent"
    if _nobody_python() is None:
        return "no Python interpreter here that nobody may run"
    return None


MODES = ["user", "nobody"]
_SECRET = Path(tempfile.gettempdir()) / f"sentinel-secret-{uuid.uuid4().hex}"


def _target() -> str:
    return str(Path(tempfile.gettempdir()) / f"sentinel-pwned-{uuid.uuid4().hex}")


def _posixsubprocess_file() -> str:
    """Where this interpreter keeps `_posixsubprocess` when it is not built in."""
    import _posixsubprocess

    return getattr(_posixsubprocess, "__file__", "/nonexistent/_posixsubprocess.so")


_FORK_EXEC = (  # the escape: no import event, then a detached child that writes later
    "import _imp, os\n"
    "import _frozen_importlib as boot, _frozen_importlib_external as ext\n"
    "ps = _imp.create_builtin(boot.ModuleSpec('_posixsubprocess', boot.BuiltinImporter))\n"
    "if ps is None:  # an extension module in this build\n"
    "    so = SO\n"
    "    loader = ext.ExtensionFileLoader('x._posixsubprocess', so)\n"
    "    ps = _imp.create_dynamic(ext.spec_from_file_location('x._posixsubprocess', so,\n"
    "                                                         loader=loader))\n"
    "r, w = os.pipe()\n"
    "ps.fork_exec([b'/bin/sh', b'-c', b'sleep 0.5; echo pwned > TARGET'], [b'/bin/sh'], True,\n"
    "             (w,), None, None, -1, -1, -1, -1, -1, -1, r, w, True, True, -1, None, None,\n"
    "             -1, -1, None, False)\n"
    "print('started')\n"
)

# Escapes past the audit hook (the three classes, then ours): (code, what the host
# must not see: 'target' appears, 'sleeper' killed, 'stdout' with SECRET or 'reached').
ESCAPES = {
    "fork_exec with setsid": (_FORK_EXEC, "target"),
    "pidfd_send_signal to a process": (
        "import os, _signal\n_signal.pidfd_send_signal(os.pidfd_open(SLEEPER), 9)\n"
        "print('reached')", "sleeper"),
    "pidfd to the parent": (
        "import os, _signal\n_signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 0)\n"
        "print('reached')", "stdout"),
    "mkfifo outside": ("import os\nos.mkfifo('TARGET')", "target"),
    "mknod outside": ("import os\nos.mknod('TARGET')", "target"),
    "mknod past the file cap": (
        "import os\nfor i in range(200):\n    os.mknod(f'n{i}')\nprint('reached')", "stdout"),
    "kill a process": ("import os\nos.kill(SLEEPER, 9)\nprint('reached')", "sleeper"),
    "kill through ctypes": ("import ctypes\nctypes.CDLL(None).kill(SLEEPER, 9)\nprint('reached')",
                            "sleeper"),
    "fork, setsid and write later": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(0.5)\n"
        "    open('TARGET', 'w').write('pwned')\n    os._exit(0)\nprint('reached')", "target"),
    "write outside": ("open('TARGET', 'w').write('pwned')", "target"),
    "read a world-readable file": ("print(open('SECRET').read())", "stdout"),
    "socket": ("import socket\nsocket.socket().connect(('127.0.0.1', 9))\nprint('reached')",
               "stdout"),
}


# Working directories that `shutil.rmtree` cannot remove (RecursionError, PermissionError): the
# host must remove them all the same, and never raise.
MESSES = {
    "a 3,000-deep tree": "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"
                         "print('deep')",
    "60,000 files": "for i in range(60000):\n    open(f'f{i}', 'w').close()\nprint('wide')",
    "a directory made with mode 0": "import os\nos.mkdir('d', 0)\nprint('made')",
    "a full directory made mode 0": (
        "import os\nos.mkdir('d')\nos.mkdir('d/e')\nopen('d/e/f', 'w').write('x')\n"
        "os.chmod('d/e', 0)\nos.chmod('d', 0)\nprint('made')"),
}


def _escape_case(name: str, audit_hook: bool) -> dict:
    code, watch = ESCAPES[name]
    target = _target() if watch == "target" else ""
    code = code.replace("TARGET", target).replace("SECRET", str(_SECRET))
    code = code.replace("SO", repr(_posixsubprocess_file()))
    return {"code": code, "audit_hook": audit_hook, "sleeper": watch == "sleeper",
            "target": target, "wait_s": 1.5 if watch == "target" else 0.0,
            "limits": {"timeout_s": FAST.timeout_s}}


@functools.cache
def _mode_results(mode: str) -> dict[str, dict]:
    """Every HOSTILE program (audit hook on) and every ESCAPE (hook on and off) run once in
    `mode`, keyed `hostile:NAME` / `escape:NAME:hook` / `escape:NAME:nohook`."""
    cases = {f"hostile:{name}": {"code": code, "audit_hook": True, "sleeper": False,
                                 "target": "", "wait_s": 0.0,
                                 "limits": {"timeout_s": FAST.timeout_s}}
             for name, (code, _) in HOSTILE.items()}
    for name, code in MESSES.items():
        # Without the audit hook (its file cap would stop the deep tree): the kernel layers
        # are the boundary, and the host's clean-up must hold behind them alone.
        cases[f"mess:{name}"] = {"code": code, "audit_hook": False, "sleeper": False,
                                 "target": "", "wait_s": 0.0, "limits": {"timeout_s": 10.0}}
    for name in ESCAPES:
        cases[f"escape:{name}:hook"] = _escape_case(name, True)
        cases[f"escape:{name}:nohook"] = _escape_case(name, False)
    _SECRET.write_text("hunter2-world-readable")
    _SECRET.chmod(0o644)
    folder = Path(tempfile.mkdtemp(prefix="sentinel-sandbox-test-"))
    try:
        folder.chmod(0o755)  # readable by nobody, unlike pytest's tmp_path
        copy = folder / "sandbox.py"
        shutil.copy(sandbox.__file__, copy)
        copy.chmod(0o644)
        drop = _NOBODY if mode == "nobody" else []
        # The sleeper has the sandboxed program's uid, so only the sandbox can keep it alive.
        sleeper_prefix = _NOBODY if mode == "user" and os.geteuid() == 0 else []
        exe = _nobody_python() if mode == "nobody" else sys.executable
        done = subprocess.run([*drop, exe, "-I", "-c", _DRIVER, str(copy),
                               json.dumps(sleeper_prefix)],
                              input=json.dumps(cases), capture_output=True, text=True,
                              cwd="/", timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)
    finally:
        shutil.rmtree(folder)
        _SECRET.unlink()


def _results(mode: str) -> dict[str, dict]:
    reason = _mode_skip_reason(mode)
    if reason is not None:
        pytest.skip(reason)
    return _mode_results(mode)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_is_refused_as_nobody(name: str) -> None:
    """The whole hostile list, run by a user who is not root (no uid drop)."""
    found = _results("nobody")[f"hostile:{name}"]
    assert HOSTILE[name][1] in found["reason"], found


@pytest.mark.parametrize("audit_hook", [True, False], ids=["hook", "nohook"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ESCAPES))
def test_escape_is_contained(name: str, mode: str, audit_hook: bool) -> None:
    """Each escape is refused and leaves no trace on the host, with the audit hook and (the
    kernel layers alone) without it."""
    found = _results(mode)[f"escape:{name}:{'hook' if audit_hook else 'nohook'}"]
    watch = ESCAPES[name][1]
    assert not found["target_exists"], found
    assert watch != "sleeper" or found["sleeper_alive"], found
    assert "reached" not in found["stdout"] and "hunter2" not in found["stdout"], found
    assert found["status"] != "ok", found
    if audit_hook:
        assert found["status"] == "blocked", found


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(MESSES))
def test_any_working_directory_is_removed(name: str, mode: str) -> None:
    """What a program leaves in its working directory, at any depth and with any permission
    bits, is removed by the host, which never raises for it."""
    found = _results(mode)[f"mess:{name}"]
    assert found["status"] != "host raised", found
    assert found["leftovers"] == [], found


def test_remove_tree_and_the_stale_sweep(tmp_path: Path) -> None:
    deep = tmp_path / "deep"
    here = deep
    here.mkdir()
    fd = os.open(here, os.O_RDONLY)
    try:  # deeper than PATH_MAX allows a path to name and than the recursion limit allows
        for _ in range(3000):
            os.mkdir("dd", dir_fd=fd)
            child = os.open("dd", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as f:
            f.write("x")
    finally:
        os.close(fd)
    (deep / "locked").mkdir()
    (deep / "locked" / "f").write_text("x")
    os.symlink("/etc", deep / "link")
    (deep / "locked").chmod(0)
    sandbox.remove_tree(str(deep))
    assert not deep.exists() and Path("/etc").is_dir()
    sandbox.remove_tree(str(deep))  # already gone: no error
    # A folder left by a run that is gone (its pid is free) is swept; a live run's is not.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    base = Path(tempfile.gettempdir())
    stale = base / f"{sandbox.WORKDIR_PREFIX}{dead}-test{uuid.uuid4().hex[:6]}"
    live = base / f"{sandbox.WORKDIR_PREFIX}{os.getppid()}-test{uuid.uuid4().hex[:6]}"
    for folder in (stale, live):
        (folder / "sub").mkdir(parents=True)
    try:
        sandbox._sweep_stale_workdirs.cache_clear()
        assert sandbox._sweep_stale_workdirs() >= 1
        assert not stale.exists() and live.is_dir()
    finally:
        shutil.rmtree(live, ignore_errors=True)


def test_timeout_is_flagged_as_a_timeout(python: Python) -> None:
    start = time.monotonic()
    with pytest.raises(ToolFailure) as info:
        python(code="while True:\n    pass")
    assert info.value.timeout and time.monotonic() - start < 5.0
    with pytest.raises(ToolFailure) as info:
        python(code="import os\nos.fork()")
    assert not info.value.timeout


def test_write_outside_leaves_no_file(python: Python) -> None:
    target = Path(f"/tmp/sentinel-pwned-{uuid.uuid4().hex}")
    with pytest.raises(ToolFailure, match="blocked: writing outside the sandbox"):
        python(code=f"open({str(target)!r}, 'w').write('pwned')")
    assert not target.exists()


def test_run_directory_is_unreadable(python: Python, run_dir: Path) -> None:
    secret = run_dir / "secret.txt"
    for code in (f"print(open({str(secret)!r}).read())",
                 f"import os\nprint(os.listdir({str(run_dir)!r}))"):
        with pytest.raises(ToolFailure, match="blocked: reading outside the sandbox") as info:
            python(code=code)
        assert "hunter2" not in str(info.value)


def test_no_connection_reaches_localhost(python: Python) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        with pytest.raises(ToolFailure, match="blocked: network access"):
            python(code=f"import socket\nsocket.create_connection(('127.0.0.1', {port}))")
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected


# -- each layer holds on its own (audit hook off) ----------------------------------------------


@needs_uid
def test_fork_count_is_capped_and_children_are_killed() -> None:
    """A bounded fork bomb (50 forks, children sleep) without the audit hook and the kernel
    filter: RLIMIT_NPROC on the unprivileged uid stops it, and the process-group kill leaves
    nothing running."""
    code = (
        "import os, time\n"
        "children = []\n"
        "for _ in range(50):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        os.close(1)\n"
        "        os.close(2)\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "print(os.getuid(), *children)\n"
    )
    limits = SandboxLimits(timeout_s=5.0, max_processes=8)
    result = run_python(code, limits, audit_hook=False, kernel_layer=False)
    assert result.status == "ok", result
    uid, *children = map(int, result.stdout.split())
    assert uid != 0
    assert 0 < len(children) < limits.max_processes  # the 50 forks hit RLIMIT_NPROC
    assert _all_gone(children, uid)  # and the group kill took the sleeping children down


@needs_uid
def test_unprivileged_uid_cannot_read_a_private_run_dir(run_dir: Path) -> None:
    run_dir.chmod(0o700)
    result = run_python(f"print(open({str(run_dir / 'secret.txt')!r}).read())", FAST,
                        audit_hook=False, kernel_layer=False)
    assert result.status == "error" and "Permission denied" in result.reason
    assert "hunter2" not in result.stdout


@needs_netns
def test_network_namespace_has_only_a_loopback() -> None:
    # Without the kernel filter, whose Landlock rules keep /proc unreadable.
    result = run_python("print(open('/proc/self/net/dev').read())", FAST, audit_hook=False,
                        kernel_layer=False)
    assert result.status == "ok", result
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines()[2:] if line]
    assert interfaces == ["lo"]
    host = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    assert len(host) > 1  # the host has more: the namespace really is a different one


@needs_pidns
def test_pid_namespace_hides_the_host() -> None:
    result = run_python("import os\nprint(os.getpid(), os.getppid())", FAST, audit_hook=False)
    assert result.status == "ok", result
    assert result.stdout.split() == ["1", "0"]  # init of its own namespace; no parent visible


@needs_kernel
def test_kernel_filter_lets_threads_and_the_toolbox_run() -> None:
    """The filter kills a clone that starts a process, not one that starts a thread; the
    Landlock rules still let the standard library load lazily (hashlib, decimal)."""
    code = (
        "import _thread, hashlib, decimal\n"
        "done = _thread.allocate_lock()\n"
        "done.acquire()\n"
        "_thread.start_new_thread(lambda: (print('thread'), done.release()), ())\n"
        "done.acquire()\n"
        "print(hashlib.sha256(b'x').hexdigest()[:8], decimal.Decimal(1) / 8)"
    )
    result = run_python(code, FAST, audit_hook=False)
    assert result.status == "ok", result
    assert result.stdout.split() == ["thread", "2d711642", "0.125"]


@needs_kernel
def test_kernel_filter_kills_a_fork_without_the_hook() -> None:
    result = run_python("import os\nos.fork()\nprint('forked')", FAST, audit_hook=False)
    assert (result.status, result.reason) == (
        "blocked", "blocked: a system call the kernel filter forbids (SIGSYS)")
    assert "forked" not in result.stdout


def test_no_kernel_filter_is_refused_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without seccomp (simulated: the probe's answer replaced, as no such kernel is
    at hand) gets a clear refusal, or with the opt-in the layers without the kernel filter."""
    absent = {"seccomp": False, "landlock_abi": 0, "why": "no seccomp in this kernel"}
    monkeypatch.setattr(sandbox, "kernel_layers", lambda: absent)
    with pytest.raises(SandboxUnavailable, match="no seccomp in this kernel"):
        run_python("print(1)", FAST)
    allowed = SandboxLimits(timeout_s=FAST.timeout_s, allow_without_kernel_layer=True)
    code = ("import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
            "print('forked')")
    result = run_python(code, allowed, audit_hook=False)
    assert (result.status, result.stdout) == ("ok", "forked\n")  # no seccomp filter was installed


# -- through the environment -------------------------------------------------------------------


class PythonArith(ArithFamily):
    """Arithmetic with the python tool as well as the calculator."""

    name = "python_arith"

    def tools(self) -> list:
        return [Calculator(), Python(FAST)]


def test_hostile_call_in_an_episode_is_an_error_observation() -> None:
    chat = ChatFormat(build_tokenizer())  # the tiny policy's tokenizer; no model needed
    family = PythonArith()
    task = family.make_task({"expr": "(3+4)*5"})
    tools = family.tool_map()
    assert "python" in [tool_schema(t)["function"]["name"] for t in tools.values()]
    episode = Episode(task, tools, chat, HermesParser(), EnvConfig(max_tokens=4096),
                      random.Random(0))

    def turn(text: str) -> None:
        ids = chat.assistant_ids(text)
        episode.add_policy_turn(ids, [0.0] * len(ids))

    turn(format_call("python", {"code": "import socket\nsocket.socket()"}))
    step = episode.steps[-1]
    assert step.error_kind == "tool_error"
    assert step.observation is not None
    assert step.observation.startswith("Error: blocked: network access")
    assert not episode.done
    turn(format_call("python", {"code": "print((3 + 4) * 5)"}))
    assert episode.steps[-1].observation == "35" and episode.steps[-1].error is None
    turn(format_answer("35"))
    assert episode.done and episode.finish_reason == "answer" and episode.answer == "35"
    assert family.verify(task, episode.answer)


class _Broken:
    """A tool whose own code fails the way a host call can (rmtree's RecursionError, a
    PermissionError, any bug)."""

    name = "broken"
    description = "fails"
    parameters: dict = {"type": "object", "properties": {}, "required": []}  # noqa: RUF012

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __call__(self, **arguments) -> str:
        raise self.exc


@pytest.mark.parametrize("exc", [RecursionError("maximum recursion depth exceeded"),
                                 PermissionError(13, "Permission denied"),
                                 KeyError("bug"), OSError(28, "No space left on device")])
def test_any_exception_of_a_tool_is_that_steps_error(exc: BaseException) -> None:
    """The rollout survives any exception a tool raises: it is the step's recorded tool error
    and the episode goes on."""
    chat = ChatFormat(build_tokenizer())
    family = ArithFamily()
    task = family.make_task({"expr": "3+4"})
    tools = {**family.tool_map(), "broken": _Broken(exc)}
    episode = Episode(task, tools, chat, HermesParser(), EnvConfig(max_tokens=4096),
                      random.Random(0))
    ids = chat.assistant_ids(format_call("broken", {}))
    episode.add_policy_turn(ids, [0.0] * len(ids))
    step = episode.steps[-1]
    assert step.error_kind == "tool_error" and type(exc).__name__ in step.error
    assert step.observation.startswith("Error: broken failed") and not episode.done
    ids = chat.assistant_ids(format_answer("7"))
    episode.add_policy_turn(ids, [0.0] * len(ids))
    assert episode.done and family.verify(task, episode.answer)
