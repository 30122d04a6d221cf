"""A TCP proxy in front of the test Redis that a test can cut, to make Redis unreachable."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlparse


class CuttableProxy:
    """Forwards connections to Redis until :meth:`cut`; then drops them and refuses new ones."""

    def __init__(self, redis_url: str) -> None:
        parsed = urlparse(redis_url)
        self._target = (parsed.hostname or "127.0.0.1", parsed.port or 6379)
        self._db = parsed.path or "/0"
        # Keep the credentials of the real URL (the proxy forwards bytes, AUTH included).
        self._auth = parsed.netloc.rsplit("@", 1)[0] + "@" if "@" in parsed.netloc else ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://{self._auth}127.0.0.1:{self.port}{self._db}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        self._writers.update({writer, upstream_writer})

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        self._writers.difference_update({writer, upstream_writer})
