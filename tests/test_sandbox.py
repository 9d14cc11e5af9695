"""The `python` tool and its sandbox against hostile programs.

Every hostile program here is bounded by the sandbox's own limits (2 s wall clock, 256 MB);
the fork tests that bypass the audit hook fork at most 50 times under RLIMIT_NPROC. The only
network address any test touches is 127.0.0.1. Each test checks both that the program was
refused with a reason and, where it can be seen from outside, that the host was unaffected.
"""

from __future__ import annotations

import os
import random
import socket
import time
import uuid
from pathlib import Path

import pytest

from sentinel.env.chat import ChatFormat
from sentinel.env.environment import EnvConfig, Episode
from sentinel.env.parser import HermesParser, format_answer, format_call
from sentinel.env.sandbox import SandboxLimits, available_layers, run_python
from sentinel.env.tools import BadArguments, Calculator, Python, ToolFailure, tool_schema
from sentinel.policy import build_tokenizer
from sentinel.tasks.arith import ArithFamily

FAST = SandboxLimits(timeout_s=2.0)  # generous: the machine may be busy
LAYERS = available_layers()
needs_uid = pytest.mark.skipif(not LAYERS["unprivileged_uid"],
                               reason="not root here: no unprivileged uid to drop to")
needs_netns = pytest.mark.skipif(not LAYERS["network_namespace"],
                                 reason="`unshare -n` does not work here")


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
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_is_refused(python: Python, name: str) -> None:
    code, reason = HOSTILE[name]
    with pytest.raises(ToolFailure) as info:
        python(code=code)
    assert reason in str(info.value)


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


# -- the kernel layers hold on their own (audit hook off) --------------------------------------


@needs_uid
def test_fork_count_is_capped_and_children_are_killed() -> None:
    """A bounded fork bomb (50 forks, children sleep) without the audit hook: RLIMIT_NPROC on
    the unprivileged uid stops it, and the process-group kill leaves nothing running."""
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
    result = run_python(code, limits, audit_hook=False)
    assert result.status == "ok", result
    uid, *children = map(int, result.stdout.split())
    assert uid != 0
    assert 0 < len(children) < limits.max_processes  # the 50 forks hit RLIMIT_NPROC
    assert _all_gone(children, uid)  # and the group kill took the sleeping children down


@needs_uid
def test_unprivileged_uid_cannot_read_a_private_run_dir(run_dir: Path) -> None:
    run_dir.chmod(0o700)
    result = run_python(f"print(open({str(run_dir / 'secret.txt')!r}).read())", FAST,
                        audit_hook=False)
    assert result.status == "error" and "Permission denied" in result.reason
    assert "hunter2" not in result.stdout


@needs_netns
def test_network_namespace_has_only_a_loopback() -> None:
    result = run_python("print(open('/proc/self/net/dev').read())", FAST, audit_hook=False)
    assert result.status == "ok", result
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines()[2:] if line]
    assert interfaces == ["lo"]
    host = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    assert len(host) > 1  # the host has more: the namespace really is a different one


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
