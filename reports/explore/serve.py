"""Serving the explorer: a socket bound before the server starts (so port 0 gets a free port that can be
printed), uvicorn on it, and a clean stop on Ctrl-C (uvicorn's own signal handling, then no
KeyboardInterrupt); or the same from a worker thread (BackgroundServer)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from headlens.reports.explore.guard import is_loopback

__all__ = ["BackgroundServer", "address", "bind", "entry", "is_loopback", "serve"]

BACKLOG = 128  # connections waiting to be accepted
STARTUP_S = 30.0  # seconds a background server may take to start (or stop)


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


def entry(sock: socket.socket, token: str) -> str:
    """The address to open: the server's with its token, which the first visit trades for a cookie."""
    return f"{address(sock)}?token={token}"


def serve(app, sock: socket.socket) -> None:
    """Serve `app` on the bound socket until interrupted (Ctrl-C, SIGTERM); Ctrl-C returns normally."""
    try:
        uvicorn.Server(_config(app)).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn stops cleanly, then re-raises the captured SIGINT
        pass


def _config(app) -> uvicorn.Config:
    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")


class BackgroundServer:
    """The app served from a worker thread on (host, a free port), for tests, benchmarks and screenshots:
    `with BackgroundServer(app) as url: ...` (`url` without the token; `.entry` with it, for a browser's first
    visit); leaving the block stops the server and joins the thread."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        self.sock = bind(host, port)
        self.url = address(self.sock)
        self.entry = entry(self.sock, app.token) if hasattr(app, "token") else self.url
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
