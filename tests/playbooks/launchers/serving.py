"""Serve a Starlette app with uvicorn from a thread: on a loopback port or a Unix socket."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette


@contextmanager
def serving(app: Starlette, uds: str | None = None) -> Iterator[str]:
    """Yields the base URL (http://127.0.0.1:PORT, or http://localhost for a socket)."""
    config = uvicorn.Config(app, uds=uds, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    sockets: list[socket.socket] = []
    if uds is None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets or None}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the fake server did not start")
        time.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{sockets[0].getsockname()[1]}" if sockets else "http://localhost"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        for sock in sockets:
            sock.close()
