"""`posenc` as a process of its own without a new Python: each command is a fork of one warm
interpreter (the docs tutorial's dozen commands, the shell's exit codes, interrupted runs,
torchrun's ranks through ``--no-python``; ``python-script`` runs a script the same way).

A new `python -m posenc` spends ~5 s importing torch, its compiler (which the optimiser pulls in)
and matplotlib before doing anything; over the suite's commands that run as processes that was
most of its longest tests. The server imports those third-party modules once and, per command,
forks a handler, which forks the command: the command takes the client's stdin/stdout/stderr
(passed over a Unix socket), working directory, environment, PYTHONPATH and argv, and runs
``python -m posenc`` (runpy) from there, so posenc itself is imported fresh in every command
under that command's environment. The client is what a test or a script runs as ``posenc``; it
exits with the command's exit code.

    warm_posenc.bin_dir(env)  # its `posenc` and `python-script` are the clients (the server started once)

A signal sent to the client (SIGINT, SIGTERM, SIGHUP) is sent on to the command, and a command
that dies of one takes the client with it. What differs from a new process: the preloaded modules
were imported under the server's environment (the test's cli_env()), so a test whose point is
what an interpreter reads at import (another HOME) starts a new Python.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

PRELOAD = ("torch", "torch._dynamo", "torch.optim", "matplotlib.pyplot", "hydra.compose", "omegaconf",
           "scipy.stats", "typer", "rich.console", "safetensors.torch")
READY = b"ready\n"


_started: dict[str, Path] = {}


def bin_dir(env: dict[str, str]) -> Path:
    """A directory whose `posenc` runs each command in a fork of the warm server, which this
    process starts on its first call (with env; preloading takes a few seconds) and stops at exit."""
    if "bin" not in _started:
        short = Path(tempfile.mkdtemp(prefix="posenc-"))  # a Unix socket's path must be ≤ 107 bytes
        sock, bin_path = short / "sock", short / "bin"
        bin_path.mkdir()
        write_client(bin_path, sock)
        server = subprocess.Popen([sys.executable, __file__, "serve", str(sock)], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        atexit.register(shutil.rmtree, short, ignore_errors=True)
        atexit.register(server.kill)
        if server.stdout.readline() != READY:
            raise RuntimeError("the warm posenc server did not start")
        _started["bin"] = bin_path
    return _started["bin"]


def write_client(bin_dir: Path, sock: Path) -> None:
    """bin_dir/posenc (``python -m posenc ARGV``) and bin_dir/python-script (``python SCRIPT
    ARGV``, for torchrun --no-python): each sends its argv, cwd, environment and standard
    streams to the server at sock and exits with the command's code (python -S: no site
    packages, started in ~20 ms)."""
    for name, run in (("posenc", {"module": "posenc"}), ("python-script", {"script": True})):
        client = bin_dir / name
        client.write_text(f"""#!{sys.executable} -S
import json, os, signal, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect({str(sock)!r})
request = {{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ), "run": {run!r}}}
request = json.dumps(request).encode()
socket.send_fds(s, [len(request).to_bytes(8, "big")], [0, 1, 2])
s.sendall(request)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a signal for the client is the command's
    signal.signal(sig, lambda signum, frame: s.send(bytes([signum])))
code = int(s.makefile("rb").read() or b"1")
if code < 0:  # the command died of a signal: so does the client, as a shell would see it
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
""")
        client.chmod(0o755)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(conn, 8, 3)
    size, body = int.from_bytes(header, "big"), b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return json.loads(body), list(fds)


def _run_command(request: dict, fds: list[int]) -> int:
    """In the forked child: become the client's `python -m posenc ARGV` (or `python SCRIPT
    ARGV`); its exit code."""
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    script = request["run"].get("script")
    # what Python puts first: the cwd for `-m`, the script's directory for a script; then PYTHONPATH
    first = os.path.dirname(os.path.abspath(request["argv"][0])) if script else os.getcwd()
    sys.path[:0] = [first, *extra]
    try:
        if script:
            sys.argv = list(request["argv"])
            runpy.run_path(sys.argv[0], run_name="__main__")
        else:
            sys.argv = ["posenc", *request["argv"]]
            runpy.run_module(request["run"]["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 — as Python itself: print the traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def serve(path: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    parent = os.getppid()
    server.settimeout(1.0)  # to notice a test process that died without stopping it
    while os.getppid() == parent:
        _reap()
        try:
            conn, _ = server.accept()  # a blocking socket (CPython's accept when no default timeout)
        except TimeoutError:
            continue
        if os.fork() == 0:  # a handler per command: one command may run while a test starts another
            server.close()
            _handle(conn)
            os._exit(0)
        conn.close()


def _handle(conn: socket.socket) -> None:
    """In a handler process: run one command in a child of its own, pass it the client's
    signals, and send back its exit code."""
    request, fds = _receive(conn)
    pid = os.fork()
    if pid == 0:
        conn.close()
        os._exit(_run_command(request, fds))
    for fd in fds:
        os.close(fd)
    status = _wait_forwarding_signals(pid, conn)
    conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())
    conn.close()


def _reap() -> None:
    """Collect the handlers that have finished (no zombies)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:  # none running
        pass


def _wait_forwarding_signals(pid: int, conn: socket.socket) -> int:
    """Wait for the command, sending it each signal the client forwards (a byte each); a client
    gone (killed by a test's timeout) takes its command with it. The command's wait status."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if select.select([conn], [], [], 0.05)[0]:
            forwarded = conn.recv(16)
            for signum in forwarded or [signal.SIGKILL]:
                os.kill(pid, signum)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(sys.argv[2])
