"""`biodistil serve MODEL`: the app on uvicorn, on a socket bound before anything loads, until SIGTERM or Ctrl-C.

The socket is bound first (`--port 0`: a free port, printed), so that a wrong address fails at once and a load
balancer's liveness probe answers while the model loads; readiness (`GET /health`) turns 200 once it is loaded and
warmed up. SIGTERM and Ctrl-C stop accepting connections, let the requests in flight — queued ones too — be
answered (for up to `--request-timeout` + 5 s), then exit; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from biodistil.errors import BiodistilError
from biodistil.serving.settings import ServeSettings

LOG = logging.getLogger("biodistil.serve")


def run_serve(settings: ServeSettings) -> str:
    """Serve `settings.model` until stopped; the closing line (requests answered, how it stopped)."""
    import uvicorn

    from biodistil.export.predict import choose_variant
    from biodistil.serving.app import create_app
    from biodistil.serving.service import Service

    settings.check()
    choose_variant(settings.model, settings.runtime)  # a wrong path or runtime fails before anything listens
    _log_to_stderr()
    listening = bind(settings.host, settings.port)
    server: uvicorn.Server | None = None

    def failed() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(settings, lambda: Service(settings), on_failure=failed)
    config = uvicorn.Config(app, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=int(settings.limits.request_timeout) + 5)
    server = uvicorn.Server(config)
    host, port = listening.getsockname()[:2]
    LOG.info("%s on http://%s:%d (ready when GET /health answers 200; API docs: /docs%s)", settings.model,
                host, port, "; API key required" if settings.api_key else "")
    with _signals_heard() as heard:
        server.run(sockets=[listening])
    state = app.state.serving
    if state.failure:
        raise BiodistilError(f"{settings.model} could not be served: {state.failure}")
    metrics = app.state.metrics
    accepted, answered = metrics.predict_counts()
    documents = int(metrics.registry.get_sample_value("biodistil_documents_total") or 0)
    why = f" on {signal.Signals(heard[-1]).name}" if heard else ""  # uvicorn raises them again last one first
    return (f"Stopped{why}: {accepted:,} prediction requests accepted, {answered:,} answered ({documents:,} documents "
            "predicted)")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one. An address in use is an error naming it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say they are TCP (a plain SOCK_STREAM says
    # protocol 0), and without it every response waited ~40 ms (Nagle's algorithm against the client's delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise BiodistilError(f"--host {host} --port {port}: cannot listen there ({err.strerror or err}); choose "
                             "another port (--port 0: any free one)") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


@contextmanager
def _signals_heard() -> Iterator[list[int]]:
    """While uvicorn serves, it handles SIGINT and SIGTERM itself (a graceful stop) and raises the signal again once
    it has stopped: heard here instead of by the CLI's handler (which would call it an interruption)."""
    heard: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield heard
        return
    previous = {number: signal.signal(number, lambda received, frame: heard.append(received))
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield heard
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _log_to_stderr() -> None:
    if not LOG.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("biodistil serve: %(message)s"))
        LOG.addHandler(handler)
        LOG.setLevel(logging.INFO)
        LOG.propagate = False
