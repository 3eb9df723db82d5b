"""A TCP proxy on loopback that a test can cut and restore, to play a network outage between the
service and its database: cut closes every open connection and refuses new ones (accepted, then
closed at once, as a dead server's host would); restore lets connections through again."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from tests.isolation import free_port


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="db-proxy", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the proxy did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._started.set()
        self._loop.run_forever()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._cut:
            client_writer.close()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        self._writers.update((client_writer, server_writer))
        try:
            await asyncio.gather(
                self._pipe(client_reader, server_writer), self._pipe(server_reader, client_writer)
            )
        finally:
            for writer in (client_writer, server_writer):
                self._writers.discard(writer)
                writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    def cut(self) -> None:
        def close_all() -> None:
            self._cut = True
            for writer in list(self._writers):
                writer.transport.abort()

        self._loop.call_soon_threadsafe(close_all)

    def restore(self) -> None:
        def open_again() -> None:
            self._cut = False

        self._loop.call_soon_threadsafe(open_again)

    def close(self) -> None:
        async def shut() -> None:
            self._cut = True
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(shut()))
        self._thread.join(timeout=5)
