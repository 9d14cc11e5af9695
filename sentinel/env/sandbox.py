"""Running model-written Python in a sandbox (the `python` tool's engine).

`run_python(code)` runs one program in a fresh interpreter and returns a `SandboxResult`: what
it printed, or why it was stopped. The sandbox is layers of ordinary process isolation, not a
VM; each layer covers what the others miss, and docs/reliability.md lists what each does NOT
promise. Layers, outermost first:

1. **Process**: a child `sys.executable -I -S` (isolated mode, no `site`: the standard library
   only, no site-packages, no PYTHON* variables) in its own session and process group, with a
   scrubbed environment (no HOME, no run-dir paths) and a fresh temporary working directory
   that is removed afterwards. The parent enforces a wall-clock timeout and an output cap, and
   kills the whole process group (before reaping the leader, so the group id cannot have been
   reused) whatever happens.
2. **Network namespace**: when `unshare -n` works here (root or CAP_SYS_ADMIN), the child runs in
   an empty network namespace: not even loopback is up.
3. **Resource limits** (`setrlimit`, set by the child's own bootstrap before any model code runs,
   not in a `preexec_fn`, which is unsafe in a multi-threaded parent such as a torch process):
   CPU seconds, address space (memory), file size, open files, no core dumps.
4. **Unprivileged uid**: when the parent is root, the bootstrap pre-imports a toolbox of pure
   standard-library modules (`TOOLBOX`), then drops to `nobody` with RLIMIT_NPROC set, so a fork
   bomb meets a process cap (root ignores RLIMIT_NPROC), root-only files (/root, 0700 run
   trees) are unreadable and root-owned places unwritable. As `nobody` the interpreter's own
   standard library (under /root here) is unreadable, so only `TOOLBOX` and modules already
   loaded can be imported.
5. **Audit hook** (`sys.addaudithook`, cannot be removed once installed): blocks sockets,
   starting or signalling processes, ctypes and native code from outside the standard
   library, importing `BLOCKED_MODULES`, reading files outside the working directory and the
   standard library, writing or listing outside the working directory, links and permission
   changes, and the introspection that could reach the hook (tracing, `gc` referrers). The
   first blocked event ends the program at once (`os._exit` with a code naming the category),
   so model code cannot catch the refusal and carry on.

Simplifications: one program per interpreter (no state across calls); the result is what the
program printed, not the value of a last expression; ~0.1 s of start-up per call.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from dataclasses import dataclass
from typing import Any, Literal

# Pure standard-library modules importable inside the sandbox (pre-imported before the uid drop).
TOOLBOX = (
    "array", "base64", "bisect", "cmath", "collections", "copy", "dataclasses", "datetime",
    "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "itertools", "json", "math",
    "operator", "random", "re", "statistics", "string", "struct", "textwrap", "time",
    "traceback", "typing", "unicodedata",
)

# Exit codes of the child: 1 is an exception in the program; the rest name why it was stopped.
EXIT_ERROR = 1
EXIT_BLOCKED = {
    91: "blocked: network access",
    92: "blocked: starting or signalling a process",
    93: "blocked: reading outside the sandbox",
    94: "blocked: writing outside the sandbox",
    95: "blocked: importing a blocked module",
    96: "blocked: native code",
    97: "blocked: introspection of the sandbox",
}
EXIT_MEMORY, EXIT_FILE_SIZE, EXIT_FILES = 81, 82, 83
_NETWORK, _PROCESS, _READ, _WRITE, _IMPORT, _NATIVE, _INTROSPECT = range(91, 98)

# Top-level modules whose import ends the program, with the exit code that says why.
BLOCKED_MODULES = {
    **dict.fromkeys(("_socket", "_ssl", "asyncio", "ftplib", "http", "smtplib", "socket",
                     "socketserver", "ssl", "telnetlib", "webbrowser", "xmlrpc"), _NETWORK),
    **dict.fromkeys(("_multiprocessing", "_posixshmem", "_posixsubprocess", "multiprocessing",
                     "pty", "subprocess"), _PROCESS),
    **dict.fromkeys(("_ctypes", "ctypes", "mmap"), _NATIVE),
    **dict.fromkeys(("fcntl", "resource"), _IMPORT),
}
_PROCESS_EVENTS = frozenset({
    "os.exec", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.posix_spawn", "os.spawn",
    "os.startfile", "os.system", "pty.spawn", "signal.pthread_kill", "subprocess.Popen",
})
_INTROSPECTION_EVENTS = frozenset({
    "gc.get_objects", "gc.get_referents", "gc.get_referrers", "sys._current_exceptions",
    "sys._current_frames", "sys.setprofile", "sys.settrace",
})
_LINK_EVENTS = frozenset({
    "os.chflags", "os.chmod", "os.chown", "os.lchflags", "os.lchmod", "os.lchown", "os.link",
    "os.removexattr", "os.setxattr", "os.symlink",
})
# Events whose first n arguments must be paths inside the working directory, with the exit code.
_WORKDIR_EVENTS = {
    "os.chdir": (1, _READ), "os.mkdir": (1, _WRITE), "os.remove": (1, _WRITE),
    "os.rmdir": (1, _WRITE), "os.rename": (2, _WRITE), "os.truncate": (1, _WRITE),
    "os.utime": (1, _WRITE),
}


Status = Literal["ok", "error", "timeout", "limit", "blocked", "crashed"]


class CodeRejected(ValueError):
    """The code cannot be run at all (not a string, too long, NUL bytes, not UTF-8)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. `max_processes` applies only under the unprivileged uid (RLIMIT_NPROC
    is per user and ignored for root); `max_files` caps files and directories created."""

    timeout_s: float = 2.0
    memory_mb: int = 256
    max_output_bytes: int = 64 * 1024
    max_code_chars: int = 20_000
    max_file_mb: int = 4
    max_files: int = 64
    max_open_files: int = 32
    max_processes: int = 16


@dataclass(frozen=True)
class SandboxResult:
    """`status` `ok`: the program ran to the end; `error`: it raised (or exited non-zero);
    `timeout`, `limit`, `blocked`, `crashed`: it was stopped, and `reason` says why in a few
    words. `stdout`/`stderr` are what it wrote (decoded, at most `max_output_bytes` together)."""

    status: Status
    stdout: str
    stderr: str
    reason: str
    returncode: int | None
    wall_s: float


# -- the parent side ---------------------------------------------------------------------------


def _unprivileged_ids() -> tuple[int, int] | None:
    """(uid, gid) of `nobody` when we are root and it exists; None otherwise."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def _unshare_net() -> list[str]:
    """`[unshare, -n, --]` when an empty network namespace can be made here, else `[]`."""
    import shutil
    import subprocess

    exe = shutil.which("unshare")
    if exe is None:
        return []
    probe = subprocess.run([exe, "-n", "--", "true"], capture_output=True, timeout=10)
    return [exe, "-n", "--"] if probe.returncode == 0 else []


@functools.cache
def _probe() -> tuple[tuple[int, int] | None, tuple[str, ...]]:
    """(uid/gid to drop to, command prefix for a network namespace), probed once per process."""
    return _unprivileged_ids(), tuple(_unshare_net())


def available_layers() -> dict[str, bool]:
    """Which layers work on this machine (layers 2 and 4 are optional)."""
    ids, unshare = _probe()
    return {
        "process": True,
        "network_namespace": bool(unshare),
        "rlimits": True,
        "unprivileged_uid": ids is not None,
        "audit_hook": True,
    }


def check_code(code: Any, limits: SandboxLimits) -> str:
    """Return `code` if it can be run, else raise `CodeRejected` saying why."""
    if not isinstance(code, str):
        raise CodeRejected(f"code must be a string, got {type(code).__name__}")
    if len(code) > limits.max_code_chars:
        raise CodeRejected(f"code is {len(code)} characters; the limit is {limits.max_code_chars}")
    if "\x00" in code:
        raise CodeRejected("code contains a NUL character")
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CodeRejected(f"code is not valid Unicode text ({exc.reason})") from None
    return code


def _collect(proc: Any, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr until both close, the deadline passes or more than `cap` bytes came;
    then wait (without reaping) for the child to exit. Returns (out, err, 'timeout' |
    'output' | None)."""
    import selectors
    import time

    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total = 0
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"", b"", "timeout"
            for key, _ in sel.select(remaining):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                chunks[key.fd].append(data)
                total += len(data)
                if total > cap:
                    return b"", b"", "output"
    out, err = b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])
    # Both pipes closed; the program may still run (it can close its own stdout). Poll with
    # WNOWAIT so the leader stays unreaped and its process group id stays ours to kill.
    while True:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return out, err, None
        if time.monotonic() >= deadline:
            return out, err, "timeout"
        time.sleep(0.005)


def _kill_group(pid: int) -> None:
    import signal

    with contextlib.suppress(ProcessLookupError):  # the whole group is already gone
        os.killpg(pid, signal.SIGKILL)


def _last_line(text: str, prefix: str = "") -> str:
    """The last non-empty line of `text` that starts with `prefix` ('' if none), clipped."""
    lines = [ln.strip() for ln in text.splitlines()]
    found = [ln for ln in lines if ln and ln.startswith(prefix)]
    return found[-1][:300] if found else ""


def _classify(rc: int, stderr: str, limits: SandboxLimits) -> tuple[Status, str]:
    import signal

    detail = _last_line(stderr, "sandbox: ").removeprefix("sandbox: ")
    if rc == 0:
        return "ok", ""
    if rc in EXIT_BLOCKED:
        return "blocked", EXIT_BLOCKED[rc] + (f" ({detail})" if detail else "")
    if rc == EXIT_MEMORY:
        return "limit", f"memory limit ({limits.memory_mb} MB)"
    if rc == EXIT_FILE_SIZE:
        return "limit", f"file size limit ({limits.max_file_mb} MB)"
    if rc == EXIT_FILES:
        return "limit", f"file limit ({limits.max_files} files, {limits.max_open_files} open)"
    if rc == EXIT_ERROR:
        return "error", _last_line(stderr) or "the program failed"
    if rc < 0:
        sig = -rc
        if sig == signal.SIGXCPU:
            return "timeout", f"cpu time limit ({_cpu_seconds(limits)} s)"
        if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
            return "limit", f"memory limit ({limits.memory_mb} MB)"
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        return "crashed", f"crashed ({name})"
    return "error", f"exited with status {rc}"


def _cpu_seconds(limits: SandboxLimits) -> int:
    return int(limits.timeout_s) + 1


def run_python(code: str, limits: SandboxLimits | None = None, *,
               audit_hook: bool = True) -> SandboxResult:
    """Run `code` in the sandbox and report what happened; never raises for anything the code
    does (only `CodeRejected` for code that cannot be run at all). `audit_hook=False` turns off
    layer 5, only so tests can show that the layers beneath it hold on their own."""
    import json
    import shutil
    import subprocess
    import tempfile
    import time

    limits = limits or SandboxLimits()
    check_code(code, limits)
    ids, unshare = _probe()
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="sentinel-sandbox-"))
    try:
        code_path = os.path.join(workdir, "snippet.py")
        with open(code_path, "w", encoding="utf-8") as f:
            f.write(code)
        if ids is not None:
            os.chown(workdir, *ids)
        config = {
            "code_path": code_path, "workdir": workdir, "ids": ids, "audit_hook": audit_hook,
            "cpu_s": _cpu_seconds(limits), "memory_mb": limits.memory_mb,
            "max_file_mb": limits.max_file_mb, "max_files": limits.max_files,
            "max_open_files": limits.max_open_files, "max_processes": limits.max_processes,
        }
        command = [*unshare, sys.executable, "-I", "-S", os.path.abspath(__file__),
                   json.dumps(config)]
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "TMPDIR": workdir}
        start = time.monotonic()
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=workdir, env=env,
                                start_new_session=True, close_fds=True)
        try:
            out, err, stopped = _collect(proc, start + limits.timeout_s, limits.max_output_bytes)
        finally:
            _kill_group(proc.pid)  # stray children too; the leader is not reaped yet
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        wall = time.monotonic() - start
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        if stopped == "timeout":
            status, reason = "timeout", f"timed out after {limits.timeout_s:.1f} s"
        elif stopped == "output":
            status, reason = "limit", f"output limit (more than {limits.max_output_bytes} bytes)"
        else:
            status, reason = _classify(proc.returncode, stderr, limits)
        return SandboxResult(status, stdout, stderr, reason, proc.returncode, wall)
    finally:
        shutil.rmtree(workdir)


# -- the child side: runs as `python -I -S sandbox.py CONFIG`; standard library only -----------


def _make_hook(workdir: str, read_roots: tuple[str, ...], max_files: int) -> Any:
    """The audit hook. Everything it uses is bound here, from C-implemented callables and
    immutable values, so model code cannot patch what it calls; it never raises (it ends the
    process), so no traceback ever holds its frame."""
    exit_now, write, getcwd = os._exit, os.write, os.getcwd
    is_prefix, split, join, decode = str.startswith, str.split, str.join, bytes.decode
    encode, any_of = str.encode, any
    exact_str, exact_bytes, exact_int, typeof = str, bytes, int, type
    blocked_modules, process_events = tuple(BLOCKED_MODULES.items()), _PROCESS_EVENTS
    introspection_events, link_events = _INTROSPECTION_EVENTS, _LINK_EVENTS
    workdir_events = tuple(_WORKDIR_EVENTS.items())
    network, process, read, written, native, introspect = (
        _NETWORK, _PROCESS, _READ, _WRITE, _NATIVE, _INTROSPECT)
    too_many_files = EXIT_FILES
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    create_flag = os.O_CREAT
    created = [0]

    def deny(code: int, detail: str) -> None:
        try:
            write(2, encode("\nsandbox: " + detail + "\n", "utf-8", "backslashreplace"))
        finally:
            exit_now(code)

    def resolve(path: Any) -> str | None:
        """Absolute normalised path of an exact str/bytes; None for anything else (a PathLike
        could answer this check and the real open differently) or a path with `..`."""
        if typeof(path) is exact_bytes:
            path = decode(path, "utf-8", "surrogateescape")
        elif typeof(path) is not exact_str:
            return None
        if not is_prefix(path, "/"):
            path = getcwd() + "/" + path
        parts = [p for p in split(path, "/") if p and p != "."]
        if ".." in parts:
            return None
        return "/" + join("/", parts)

    def shown(path: Any) -> str:
        where = resolve(path)
        if where is not None:
            return f"{where!r}"
        return f"{path!r}" if typeof(path) is exact_str else "a non-str path"

    def inside(path: str | None, roots: tuple[str, ...]) -> bool:
        if path is None:
            return False
        return any_of(path == r or is_prefix(path, r + "/") for r in roots)

    here = (workdir,)
    readable = (workdir, *read_roots)

    def count_created() -> None:
        created[0] += 1
        if created[0] > max_files:
            deny(too_many_files, "too many files")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            if typeof(path) is exact_int:
                return  # an already open descriptor
            where = resolve(path)
            if inside(where, here):
                if flags & create_flag:
                    count_created()
                return
            if flags & write_flags:
                deny(written, f"open {shown(path)} for writing")
            # `mode` is None for os.open, whose directory descriptors could anchor dir_fd paths.
            if mode is None or not inside(where, read_roots):
                deny(read, f"open {shown(path)}")
        elif is_prefix(event, "socket."):
            deny(network, event)
        elif event in process_events:
            deny(process, event)
        elif event == "import":
            name, filename = args[0], args[1]
            top = split(name, ".")[0] if typeof(name) is exact_str else None
            for blocked, code in blocked_modules:
                if top == blocked:
                    deny(code, f"import {name}")
            if filename is not None and not inside(resolve(filename), read_roots):
                deny(native, "extension module from outside the standard library")
        elif is_prefix(event, "ctypes."):
            deny(native, event)
        elif event in introspection_events:
            deny(introspect, event)
        elif event in link_events:
            deny(written, event)
        elif event == "os.listdir" or event == "os.scandir":
            path = args[0]
            if path is not None and typeof(path) is not exact_int and \
                    not inside(resolve(path), readable):
                deny(read, f"{event} {shown(path)}")
        else:
            for name, (n_paths, code) in workdir_events:
                if event != name:
                    continue
                for path in args[:n_paths]:
                    # A descriptor (ftruncate, futime, fchdir) can only be one opened here.
                    if typeof(path) is not exact_int and not inside(resolve(path), here):
                        deny(code, f"{event} {shown(path)}")
                if event == "os.mkdir":
                    count_created()

    return hook


def _summary(exc: BaseException, code_path: str) -> str:
    """`line N: Type: message` for an exception raised by the program."""
    line = None
    if isinstance(exc, SyntaxError) and exc.filename == code_path:
        line, text = exc.lineno, f"{type(exc).__name__}: {exc.msg}"
    else:
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == code_path:
                line = tb.tb_lineno
            tb = tb.tb_next
        try:
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        except Exception:  # a program-defined __str__ may itself fail
            text = type(exc).__name__
    return f"line {line}: {text}" if line is not None else text


def _child_main(config_json: str) -> None:
    import builtins
    import errno
    import json
    import resource

    config = json.loads(config_json)
    mb = 1024 * 1024
    limits = {
        resource.RLIMIT_CPU: (config["cpu_s"], config["cpu_s"] + 1),
        resource.RLIMIT_AS: (config["memory_mb"] * mb,) * 2,
        resource.RLIMIT_FSIZE: (config["max_file_mb"] * mb,) * 2,
        resource.RLIMIT_NOFILE: (config["max_open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    if config["ids"] is not None:
        limits[resource.RLIMIT_NPROC] = (config["max_processes"],) * 2
    for which, value in limits.items():
        resource.setrlimit(which, value)
    for name in TOOLBOX:
        __import__(name)
    with open(config["code_path"], encoding="utf-8") as f:
        source = f.read()
    if config["ids"] is not None:
        uid, gid = config["ids"]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    del sys.modules["resource"]
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8", errors="backslashreplace")
    exit_now, write = os._exit, os.write
    stdout, stderr = sys.stdout, sys.stderr
    if config["audit_hook"]:
        read_roots = tuple(os.path.realpath(p) for p in sys.path if p)
        sys.addaudithook(_make_hook(config["workdir"], read_roots, config["max_files"]))
    code_path = config["code_path"]
    status = 0
    try:
        exec(compile(source, code_path, "exec"),
             {"__name__": "__main__", "__builtins__": builtins})
    except MemoryError:
        exit_now(EXIT_MEMORY)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            status = EXIT_ERROR
            write(2, f"\nSystemExit: {exc.code!r}\n".encode())
    except BaseException as exc:
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
            exit_now(EXIT_FILE_SIZE)
        if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
            exit_now(EXIT_FILES)
        status = EXIT_ERROR
        write(2, ("\n" + _summary(exc, code_path) + "\n").encode("utf-8", "backslashreplace"))
    for stream in (stdout, stderr):
        try:
            stream.flush()
        except (OSError, ValueError) as exc:  # the program closed its own stream
            status = status or EXIT_ERROR
            write(2, f"\noutput lost: {exc}\n".encode("utf-8", "backslashreplace"))
    exit_now(status)


if __name__ == "__main__":
    _child_main(sys.argv[1])
