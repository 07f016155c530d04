"""Serving the explorer: a socket bound before the server starts (so port 0 gets a free port that can be
printed), uvicorn on it, and a clean stop on Ctrl-C (uvicorn's own signal handling); or the same from a
worker thread (BackgroundServer)."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import uvicorn

LOOPBACK_NAMES = ("localhost",)
BACKLOG = 128  # connections waiting to be accepted
STARTUP_S = 30.0  # seconds a background server may take to start (or stop)


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, ::1) or `localhost`."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening, port 0 meaning a free one; OSError when it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)  # from here connections wait in the queue until the server accepts them
    except OSError:
        sock.close()
        raise
    return sock


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(app, sock: socket.socket) -> None:
    """Serve `app` on the bound socket until interrupted (Ctrl-C, SIGTERM)."""
    uvicorn.Server(_config(app)).run(sockets=[sock])


def _config(app) -> uvicorn.Config:
    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")


class BackgroundServer:
    """The app served from a worker thread on (host, a free port), for tests, benchmarks and screenshots:
    `with BackgroundServer(app) as url: ...`; leaving the block stops the server and joins the thread."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        self.sock = bind(host, port)
        self.url = address(self.sock)
        self.server = uvicorn.Server(_config(app))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + STARTUP_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the explorer did not start on {self.url}")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=STARTUP_S)
        self.sock.close()
