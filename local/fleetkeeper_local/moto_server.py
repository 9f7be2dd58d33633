"""moto's threaded server, bound in the caller's thread (the local stack's moto half)."""

from __future__ import annotations

import socket
import threading

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

# Connections the moto server queues before accepting them (werkzeug's own default).
LISTEN_BACKLOG = 128


class MotoServer(ThreadedMotoServer):
    """moto's threaded server, on a socket bound in the caller's thread. moto binds in its own thread,
    where werkzeug answers a taken port with sys.exit: the thread ends quietly and start() waits forever."""

    def start(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._ip_address, self._port))
            sock.listen(LISTEN_BACKLOG)
            # werkzeug serves a duplicate of this descriptor and never binds itself.
            self._server = make_server(
                self._ip_address,
                self._port,
                DomainDispatcherApplication(create_backend_app),
                threaded=True,
                request_handler=MotoRequestHandler,
                fd=sock.fileno(),
            )
        self._server_ready_event.set()
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-server", daemon=True)
        self._thread.start()
