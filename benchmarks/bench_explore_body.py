"""Memory of `headlens explore` while a client sends an oversized request body (the cap is 256 KB).

Starts `headlens explore tiny --port 0` in a child process, then POSTs a `--mb` MB body to /api/run over a
raw socket, once announced by Content-Length and once chunked (no length, so the server must count what it
reads), and prints the server's resident memory (VmRSS) and its peak (VmHWM, from /proc) before and after
each, with the status the server answered.

    .venv/bin/python benchmarks/bench_explore_body.py --mb 100
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import time

CHUNK = 1 << 20  # bytes per send


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of `pid` in MB, from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}


def send(host: str, port: int, token: str, mb: int, chunked: bool) -> str:
    """POST `mb` MB of JSON-looking bytes to /api/run; the status line the server answered (or how it ended)."""
    head = [
        "POST /api/run HTTP/1.1",
        f"Host: {host}:{port}",
        f"Authorization: token {token}",
        "Content-Type: application/json",
        "Transfer-Encoding: chunked" if chunked else f"Content-Length: {mb * CHUNK + 12}",
        "",
        "",
    ]
    block = b"a" * CHUNK
    with socket.create_connection((host, port), timeout=60) as sock:
        try:
            sock.sendall("\r\n".join(head).encode())
            for part in [b'{"text": "'] + [block] * mb + [b'"}']:
                sock.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError as exc:  # the server answered and closed before the body was all sent
            ended = f"send stopped: {type(exc).__name__}"
        else:
            ended = "body sent whole"
        try:
            reply = sock.recv(4096).decode("latin-1").split("\r\n", 1)[0]
        except OSError as exc:
            reply = f"no reply: {type(exc).__name__}"
    return f"{reply} ({ended})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    for chunked in (False, True):
        print(measure(args.mb, chunked))


def start() -> tuple[subprocess.Popen, str, int, str]:
    """A fresh `headlens explore tiny` child and its host, port and token (read from the line it prints)."""
    command = [sys.executable, "-m", "headlens.cli.main", "explore", "tiny", "--port", "0"]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    line = ""
    while "http://" not in line:
        line = server.stderr.readline()
        if not line and server.poll() is not None:
            sys.exit("the explorer exited before it served")
    match = re.search(r"http://([0-9.]+):([0-9]+)/(?:\?token=(\S+))?", line)
    return server, match.group(1), int(match.group(2)), match.group(3) or ""


def measure(mb: int, chunked: bool) -> str:
    """One body sent to a fresh server: its answer and memory before and after."""
    server, host, port, token = start()
    try:
        time.sleep(1.0)
        before = memory_mb(server.pid)
        status = send(host, port, token, mb, chunked)
        time.sleep(0.5)
        after = memory_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    how = "chunked" if chunked else "Content-Length"
    return (
        f"{mb} MB body, {how}: {status}; server RSS {before['VmRSS']:.0f} -> {after['VmRSS']:.0f} MB "
        f"(+{after['VmRSS'] - before['VmRSS']:.0f}), peak {before['VmHWM']:.0f} -> {after['VmHWM']:.0f} MB "
        f"(+{after['VmHWM'] - before['VmHWM']:.0f})"
    )


if __name__ == "__main__":
    main()
