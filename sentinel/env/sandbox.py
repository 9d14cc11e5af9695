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
2. **Namespaces** (`unshare`): a new network, PID and IPC namespace (plus a user namespace when
   we are not root), with `--kill-child`, so killing the group kills the namespace's init and
   the kernel then kills everything inside it, even a process that left the group. Where the
   kernel refuses, the network namespace alone (root), or none.
3. **Resource limits** (`setrlimit`, set by the child's own bootstrap before any model code runs,
   not in a `preexec_fn`, which is unsafe in a multi-threaded parent such as a torch process):
   CPU seconds, address space (memory), file size, open files, no core dumps.
4. **Unprivileged uid**: when the parent is root, the bootstrap pre-imports a toolbox of pure
   standard-library modules (`TOOLBOX`), then drops to `nobody` with RLIMIT_NPROC set, so a fork
   bomb meets a process cap (root ignores RLIMIT_NPROC), root-only files (/root, 0700 run
   trees) are unreadable and root-owned places unwritable. As `nobody` the interpreter's own
   standard library (under /root here) is unreadable, so only `TOOLBOX` and modules already
   loaded can be imported.
5. **Kernel filter** (the boundary for a user who is not root; no privilege needed): a seccomp
   filter that kills the program on any system call that starts a process (fork, vfork, clone
   without CLONE_THREAD, exec), signals or inspects another process (kill/tgkill/sigqueue
   beyond itself, pidfd_*, ptrace, process_vm_*), makes a device or FIFO node, a socket, a
   session or process group, a namespace or mount, or uses io_uring, bpf, keyrings and the like;
   and a Landlock ruleset (where the kernel has Landlock) that allows reading only the working
   directory and the standard library and writing only the working directory, and (ABI >= 4,
   >= 6) no TCP and no signals out of the sandbox. `kernel_layers()` says what this machine has.
   Without seccomp, `run_python` refuses to run (`SandboxUnavailable`) unless
   `SandboxLimits.allow_without_kernel_layer` is set.
6. **Audit hook** (`sys.addaudithook`, cannot be removed once installed; defence in depth, as
   CPython documents hooks as no security boundary): blocks sockets, starting or signalling
   processes, ctypes and native code from outside the standard library, importing
   `BLOCKED_MODULES` (under any package name), reading files outside the working directory and the
   standard library, writing or listing outside the working directory, links and permission
   changes, and the introspection that could reach the hook (tracing, `gc` referrers). The
   first blocked event ends the program at once (`os._exit` with a code naming the category),
   so model code cannot catch the refusal and carry on.

Simplifications: one program per interpreter (no state across calls); the result is what the
program printed, not the value of a last expression; interpreter start-up dominates the cost
of a call (benchmarks/sandbox.py).
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
EXIT_MEMORY, EXIT_FILE_SIZE, EXIT_FILES, EXIT_SETUP = 81, 82, 83, 84
_NETWORK, _PROCESS, _READ, _WRITE, _IMPORT, _NATIVE, _INTROSPECT = range(91, 98)

# Modules whose import (as any component of a dotted name) ends the program, with the exit
# code that says why.
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


class SandboxUnavailable(RuntimeError):
    """This machine lacks the kernel filter (seccomp) and the limits do not allow running
    without it."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. `max_processes` applies only under the unprivileged uid (RLIMIT_NPROC
    is per user and ignored for root); `max_files` caps files and directories created.
    `allow_without_kernel_layer` lets `run_python` run where the seccomp filter is unavailable,
    with the audit hook as the last layer for a user who is not root (docs/reliability.md says
    what then does not hold); by default such a machine gets `SandboxUnavailable`."""

    timeout_s: float = 2.0
    memory_mb: int = 256
    max_output_bytes: int = 64 * 1024
    max_code_chars: int = 20_000
    max_file_mb: int = 4
    max_files: int = 64
    max_open_files: int = 32
    max_processes: int = 16
    allow_without_kernel_layer: bool = False


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


def _unshare(kernel_layer: bool) -> tuple[str, ...]:
    """The `unshare ... --` command prefix: with `kernel_layer`, the first of (user,) network,
    PID and IPC namespaces with `--kill-child`, else the network namespace alone (root), that
    works here; without it the network namespace alone (the layers before the kernel filter);
    `()` when none works."""
    import shutil
    import subprocess

    exe = shutil.which("unshare")
    if exe is None:
        return ()
    candidates = [[exe, "-n", "--"]] if os.geteuid() == 0 else []
    if kernel_layer:
        user = [] if os.geteuid() == 0 else ["-U"]
        candidates.insert(0, [exe, *user, "-n", "-p", "-i", "--fork", "--kill-child", "--"])
    for prefix in candidates:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        if probe.returncode == 0:
            return tuple(prefix)
    return ()


def _child_command(config: dict[str, Any], prefix: tuple[str, ...]) -> list[str]:
    import json

    return [*prefix, sys.executable, "-I", "-S", os.path.abspath(__file__), json.dumps(config)]


@functools.cache
def kernel_layers() -> dict[str, Any]:
    """What the kernel filter can use here, found by running the child's own set-up once in a
    throw-away child: `{"seccomp": bool, "landlock_abi": int (0: none), "why": str}`."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sentinel-sandbox-probe-") as workdir:
        probe = subprocess.run(_child_command({"probe": True, "workdir": workdir}, ()),
                               capture_output=True, text=True, timeout=30, cwd=workdir,
                               env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    try:
        found = json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"seccomp": False, "landlock_abi": 0,
                "why": f"the probe failed: {probe.stderr.strip()[-300:]}"}
    return found


@functools.cache
def _probe(kernel_layer: bool) -> tuple[tuple[int, int] | None, tuple[str, ...]]:
    """(uid/gid to drop to, namespace command prefix), probed once per process."""
    return _unprivileged_ids(), _unshare(kernel_layer)


def available_layers() -> dict[str, bool]:
    """Which layers work on this machine (all but process, rlimits and audit hook may be
    missing)."""
    ids, unshare = _probe(True)
    kernel = kernel_layers()
    return {
        "process": True,
        "network_namespace": "-n" in unshare,
        "pid_namespace": "-p" in unshare,
        "user_namespace": "-U" in unshare,
        "rlimits": True,
        "unprivileged_uid": ids is not None,
        "seccomp": kernel["seccomp"],
        "landlock": kernel["landlock_abi"] > 0,
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
    if rc == EXIT_SETUP:
        return "crashed", "sandbox set-up failed" + (f" ({detail})" if detail else "")
    if rc < 0:
        sig = -rc
        if sig == signal.SIGSYS:
            return "blocked", "blocked: a system call the kernel filter forbids (SIGSYS)"
        if sig == signal.SIGXCPU:
            return "timeout", f"cpu time limit ({_cpu_seconds(limits)} s)"
        if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
            return "limit", f"memory limit ({limits.memory_mb} MB)"
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        return "crashed", f"crashed ({name})"
    return "error", f"exited with status {rc}"


def _cpu_seconds(limits: SandboxLimits) -> int:
    return int(limits.timeout_s) + 1


WORKDIR_PREFIX = "sentinel-sandbox-"


def tempfile_dir() -> str:
    """Where the sandbox's working directories are made (`tempfile.gettempdir()`)."""
    import tempfile

    return tempfile.gettempdir()


def remove_tree(path: str) -> None:
    """Remove the directory `path` and whatever a program left in it: any depth and any
    permission bits. Iterative and by directory fd: every subdirectory is first made 0o700 and
    moved up into `path` itself, so neither Python's recursion limit, nor PATH_MAX, nor the
    number of open files bounds the depth (`shutil.rmtree` raises `RecursionError` on a
    ~3,000-deep tree and `PermissionError` on a directory made with mode 0). A `path` that is
    already gone is no error."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    try:
        root = os.open(path, flags)
    except FileNotFoundError:
        return
    try:
        pending = [None]  # None: the root itself; else a directory's name inside the root
        moved = 0
        while pending:
            name = pending.pop()
            if name is None:
                fd = root
            else:
                with contextlib.suppress(OSError):
                    os.chmod(name, 0o700, dir_fd=root)  # a directory (moved here as one)
                fd = os.open(name, flags, dir_fd=root)
            try:
                with os.scandir(fd) as entries:
                    listed = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
                for entry, is_dir in listed:
                    if not is_dir:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry, dir_fd=fd)
                    elif fd == root:
                        pending.append(entry)
                    else:
                        while True:  # a name not yet taken in the root
                            moved += 1
                            target = f".sentinel-rm-{moved}"
                            try:
                                os.stat(target, dir_fd=root, follow_symlinks=False)
                            except FileNotFoundError:
                                break
                        with contextlib.suppress(OSError):  # moving it rewrites its `..`
                            os.chmod(entry, 0o700, dir_fd=fd)
                        os.rename(entry, target, src_dir_fd=fd, dst_dir_fd=root)
                        pending.append(target)
            finally:
                if fd != root:
                    os.close(fd)
            if name is not None:
                os.rmdir(name, dir_fd=root)
    finally:
        os.close(root)
    os.rmdir(path)


@functools.cache
def _sweep_stale_workdirs() -> int:
    """Once per process: remove the sandbox folders of runs that are gone (killed before their
    clean-up), i.e. `sentinel-sandbox-<pid>-*` whose pid is not alive. Returns how many."""
    removed = 0
    base = tempfile_dir()
    with contextlib.suppress(OSError), os.scandir(base) as entries:
        names = [e.name for e in entries if e.name.startswith(WORKDIR_PREFIX)]
    for name in names:
        pid = name[len(WORKDIR_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its run is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, another user's
        with contextlib.suppress(OSError):
            remove_tree(os.path.join(base, name))
            removed += 1
    return removed


def run_python(code: str, limits: SandboxLimits | None = None, *,
               audit_hook: bool = True, kernel_layer: bool = True) -> SandboxResult:
    """Run `code` in the sandbox and report what happened; never raises for anything the code
    does (only `CodeRejected` for code that cannot be run at all, and `SandboxUnavailable` on a
    machine without seccomp unless `limits.allow_without_kernel_layer`). `audit_hook=False`
    turns off layer 6 and `kernel_layer=False` layer 5 with the PID, IPC and user namespaces,
    only so tests can show what each holds on its own and the benchmark can time them."""
    import subprocess
    import tempfile
    import time

    limits = limits or SandboxLimits()
    check_code(code, limits)
    kernel = kernel_layers() if kernel_layer else {"seccomp": False, "landlock_abi": 0}
    if kernel_layer and not kernel["seccomp"] and not limits.allow_without_kernel_layer:
        raise SandboxUnavailable(
            f"the python tool's sandbox needs the kernel filter (seccomp), unavailable here: "
            f"{kernel['why']}; SandboxLimits(allow_without_kernel_layer=True) runs it with the "
            "audit hook as the last layer (docs/reliability.md says what then does not hold)")
    ids, unshare = _probe(kernel_layer)
    _sweep_stale_workdirs()
    workdir = os.path.realpath(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))
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
            "seccomp": kernel["seccomp"], "landlock_abi": kernel["landlock_abi"],
        }
        command = _child_command(config, unshare)
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
        remove_tree(workdir)


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
            if typeof(name) is not exact_str:
                deny(native, "import under a name that is not a plain str")
            # Every component: `_imp.create_dynamic` loads an extension under any package
            # name (`x._posixsubprocess`), and its init function is named by the last one.
            parts = split(name, ".")
            for blocked, code in blocked_modules:
                if blocked in parts:
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


# The seccomp filter (x86_64 system call numbers). Denied outright: starting a process, reaching
# another process, device/FIFO nodes, sockets, leaving the session or process group, namespaces
# and mounts, and kernel interfaces a program never needs (io_uring would run its own opens and
# sockets past the filter).
_DENIED_SYSCALLS = (
    57, 58, 59, 322,  # fork, vfork, execve, execveat
    200, 434, 424, 438, 310, 311, 440, 101, 312,  # tkill, pidfd_open/send_signal/getfd,
    # process_vm_readv/writev, process_madvise, ptrace, kcmp
    133, 259, 41, 53, 112, 109,  # mknod, mknodat, socket, socketpair, setsid, setpgid
    165, 166, 155, 161, 272, 308, 428, 429, 430, 431, 432, 433, 442,  # mount, umount2,
    # pivot_root, chroot, unshare, setns, open_tree, move_mount, fsopen/config/mount/pick,
    # mount_setattr
    321, 298, 250, 248, 249, 323, 425, 426, 427,  # bpf, perf_event_open, keyctl, add_key,
    # request_key, userfaultfd, io_uring_setup/enter/register
    246, 320, 175, 313, 176, 169, 167, 168, 163, 179, 103,  # kexec_load/file_load,
    # init/finit/delete_module, reboot, swapon/off, acct, quotactl, syslog
    304, 303, 300, 29, 30, 68, 64, 240,  # open_by_handle_at, name_to_handle_at, fanotify_init,
    # shmget, shmat, msgget, semget, mq_open
)
# Allowed only on the program itself: (number, argument holding the pid, (argument, value)
# that must hold first or None). A pid of 0 means the caller (its own group, for kill).
_SELF_ONLY_SYSCALLS = (
    (62, 0, None), (234, 0, None), (129, 0, None), (297, 0, None),  # kill, tgkill,
    # rt_sigqueueinfo, rt_tgsigqueueinfo
    (302, 0, None), (203, 0, None), (144, 0, None), (142, 0, None), (314, 0, None),  # prlimit64,
    # sched_setaffinity/setscheduler/setparam/setattr
    (256, 0, None), (279, 0, None), (274, 0, None),  # migrate_pages, move_pages, get_robust_list
    (141, 1, (0, 0)), (251, 1, (0, 1)),  # setpriority(PRIO_PROCESS, ..), ioprio_set(WHO_PROCESS)
)
_SYS_CLONE, _SYS_CLONE3, _SYS_IOCTL = 56, 435, 16
_CLONE_THREAD = 0x10000
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C  # push input into / control a terminal
_AUDIT_ARCH_X86_64 = 0xC000003E


def _seccomp_program(self_pid: int) -> bytes:
    """The classic-BPF seccomp program: kill the whole process on a denied call, ENOSYS for
    clone3 (whose flags a filter cannot read; the C library then falls back to clone, whose
    flags it can: threads stay allowed), allow the rest. Raises OSError off x86_64."""
    import errno
    import struct

    if os.uname().machine != "x86_64":
        raise OSError(f"the seccomp filter is written for x86_64, not {os.uname().machine}")
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    kill, allow, enosys = 0x80000000, 0x7FFF0000, 0x00050000 | errno.ENOSYS

    def arg(n: int) -> int:  # offset of the low 32 bits of argument n in seccomp_data
        return 16 + 8 * n

    prog: list[tuple[int, int | str, int | str, int]] = []
    labels: dict[str, int] = {}

    def emit(code: int, k: int, jt: int | str = 0, jf: int | str = 0) -> None:
        prog.append((code, jt, jf, k))

    emit(ld, 4)  # arch: a call through another ABI (i386, x32) is killed
    emit(jeq, _AUDIT_ARCH_X86_64, 0, "kill")
    emit(ld, 0)  # the system call number
    emit(jge, 0x40000000, "kill", 0)
    for nr in _DENIED_SYSCALLS:
        emit(jeq, nr, "kill", 0)
    emit(jeq, _SYS_CLONE3, "enosys", 0)
    emit(jeq, _SYS_CLONE, 0, "after_clone")
    emit(ld, arg(0))
    emit(jset, _CLONE_THREAD, "allow", "kill")
    labels["after_clone"] = len(prog)
    emit(jeq, _SYS_IOCTL, 0, "after_ioctl")
    emit(ld, arg(1))
    emit(jeq, _TIOCSTI, "kill", 0)
    emit(jeq, _TIOCLINUX, "kill", "allow")
    labels["after_ioctl"] = len(prog)
    for i, (nr, pid_arg, first) in enumerate(_SELF_ONLY_SYSCALLS):
        emit(jeq, nr, 0, f"after_{i}")
        if first is not None:
            emit(ld, arg(first[0]))
            emit(jeq, first[1], 0, "kill")
        emit(ld, arg(pid_arg))
        emit(jeq, 0, "allow", 0)
        emit(jeq, self_pid, "allow", "kill")
        labels[f"after_{i}"] = len(prog)
        if i + 1 < len(_SELF_ONLY_SYSCALLS):
            emit(ld, 0)  # the number again, for the next test
    emit(ret, allow)
    labels["allow"] = len(prog)
    emit(ret, allow)
    labels["kill"] = len(prog)
    emit(ret, kill)
    labels["enosys"] = len(prog)
    emit(ret, enosys)

    def offset(at: int, target: int | str) -> int:
        jump = target if isinstance(target, int) else labels[target] - at - 1
        assert 0 <= jump < 256, "a BPF jump reaches at most 255 instructions ahead"
        return jump

    return b"".join(struct.pack("=HBBI", code, offset(i, jt), offset(i, jf), k)
                    for i, (code, jt, jf, k) in enumerate(prog))


# Landlock access rights (linux/landlock.h): file system bits by ABI version, TCP, scopes.
_LL_READ_FILE, _LL_READ_DIR = 1 << 2, 1 << 3
_LL_FS_BITS_BY_ABI = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}


def _landlock_ruleset(syscall: Any, workdir: str, read_roots: tuple[str, ...],
                      abi: int) -> int:
    """A Landlock ruleset fd: everything in `workdir`, reading `read_roots`, nothing else on
    the file system; no TCP (ABI >= 4); no signals or abstract sockets out (ABI >= 6). Made
    before the uid drop, while the roots can still be opened."""
    import ctypes
    import struct

    fs = (1 << _LL_FS_BITS_BY_ABI.get(abi, 16)) - 1
    attr = struct.pack("=QQQ", fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = syscall(444, ctypes.c_char_p(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    for root, access in ((workdir, fs), *((r, _LL_READ_FILE | _LL_READ_DIR) for r in read_roots)):
        try:
            fd = os.open(root, os.O_PATH | os.O_CLOEXEC)
        except OSError:  # a sys.path entry that does not exist (python311.zip)
            continue
        try:
            if not os.path.isdir(root):
                access &= _LL_READ_FILE  # a file takes file rights only
            rule = struct.pack("=Qi", access, fd)
            if syscall(445, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.c_char_p(rule),
                       ctypes.c_uint32(0)) < 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule {root!r} failed")
        finally:
            os.close(fd)
    return ruleset


def _prepare_kernel_layer(workdir: str, read_roots: tuple[str, ...],
                          landlock_abi: int) -> Any:
    """Load what the kernel filter needs while the standard library is still readable (before
    the uid drop) and return `lock()`, which sets no_new_privs, enters the Landlock ruleset and
    installs the seccomp filter; both raise OSError on failure."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ruleset = _landlock_ruleset(libc.syscall, workdir, read_roots, landlock_abi) \
        if landlock_abi > 0 else None

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    ulong = ctypes.c_ulong

    def lock() -> None:
        if libc.prctl(38, ulong(1), ulong(0), ulong(0), ulong(0)) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if ruleset is not None:
            if libc.syscall(446, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
                raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
            os.close(ruleset)
        program = _seccomp_program(os.getpid())
        buffer = ctypes.create_string_buffer(program, len(program))
        fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
        # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        if libc.prctl(22, ulong(2), ctypes.byref(fprog), ulong(0), ulong(0)) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")

    return lock


def _probe_kernel_layer(workdir: str) -> dict[str, Any]:
    """Install the kernel filter in this (throw-away) process and say what worked."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = max(int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))), 0)
    found: dict[str, Any] = {"seccomp": False, "landlock_abi": abi, "why": ""}
    try:
        _seccomp_program(os.getpid())  # off x86_64 there is no filter to try
    except OSError as exc:
        found["why"] = str(exc)
        return found
    read_roots = tuple(os.path.realpath(p) for p in sys.path if p)
    try:
        _prepare_kernel_layer(workdir, read_roots, abi)()
    except OSError as exc:
        if abi == 0:
            found["why"] = str(exc)
            return found
        found["landlock_abi"], found["why"] = 0, f"Landlock ABI {abi} failed: {exc}"
        try:  # the seccomp filter alone, then
            _prepare_kernel_layer(workdir, read_roots, 0)()
        except OSError as exc2:
            found["why"] += f"; {exc2}"
            return found
    if abi == 0:
        found["why"] = "no Landlock in this kernel"
    found["seccomp"] = True
    return found


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
    if config.get("probe"):
        print(json.dumps(_probe_kernel_layer(config["workdir"])))
        return
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
    read_roots = tuple(os.path.realpath(p) for p in sys.path if p)
    lock = None
    if config["seccomp"]:
        try:
            lock = _prepare_kernel_layer(config["workdir"], read_roots, config["landlock_abi"])
        except OSError as exc:
            os.write(2, f"\nsandbox: {exc}\n".encode())
            os._exit(EXIT_SETUP)
    if config["ids"] is not None:
        uid, gid = config["ids"]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    if lock is not None:
        try:
            lock()
        except OSError as exc:
            os.write(2, f"\nsandbox: {exc}\n".encode())
            os._exit(EXIT_SETUP)
        del lock
        for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes")]:
            del sys.modules[name]  # model code imports them afresh, past the audit hook's check
    del sys.modules["resource"]
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8", errors="backslashreplace")
    exit_now, write = os._exit, os.write
    stdout, stderr = sys.stdout, sys.stderr
    if config["audit_hook"]:
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
