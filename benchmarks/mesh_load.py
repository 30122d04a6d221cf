"""Load generation for ``llmesh bench mesh``: a lean HTTP/1.1 client and the child processes.

The client is a keep-alive HTTP/1.1 connection over asyncio streams (no pool, no
middleware), so that on a two-core machine the load generator costs as little CPU
as possible and the same for every system measured. It reads ``Content-Length``
and chunked bodies and parses server-sent events for time to first token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class StreamResult:
    ttft_s: float
    total_s: float
    completion_tokens: int
    status: int
    prompt_tokens: int = 0
    # Prompt tokens the engine found in its prefix cache (usage.prompt_tokens_details).
    cached_tokens: int = 0


class HttpConnection:
    """One keep-alive connection; requests on it run one at a time."""

    def __init__(self, base: str, headers: dict[str, str] | None = None) -> None:
        hostport = base.removeprefix("http://").rstrip("/")
        host, _, port = hostport.partition(":")
        self._host, self._port = host, int(port or 80)
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        return self._reader, self._writer

    async def reconnect(self) -> None:
        """A fresh connection, opened now (a server closes one left idle past its keep-alive)."""
        await self.close()
        await self._connect()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()
            self._writer = None

    async def _send(self, path: str, body: bytes, headers: dict[str, str] | None) -> asyncio.StreamReader:
        reader, writer = await self._connect()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self._host}:{self._port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n{self._extra}{extra}\r\n"
        )
        writer.write(head.encode() + body)
        return reader

    @staticmethod
    async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
        return status, headers

    async def post(
        self, path: str, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        reader = await self._send(path, json.dumps(payload).encode(), headers)
        status, head = await self._head(reader)
        if "content-length" in head:
            body = await reader.readexactly(int(head["content-length"]))
        else:
            body = b"".join([chunk async for chunk in self._chunks(reader)])
        if head.get("connection", "").lower() == "close":
            await self.close()
        return status, head, body

    @staticmethod
    async def _chunks(reader: asyncio.StreamReader) -> Any:
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]

    async def stream_chat(self, path: str, payload: dict[str, Any]) -> StreamResult:
        """A streamed completion: time to the first content delta, total time, tokens from usage."""
        started = time.perf_counter()
        reader = await self._send(path, json.dumps(payload).encode(), None)
        status, head = await self._head(reader)
        if status != 200:
            body = await reader.readexactly(int(head.get("content-length", "0")))
            raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
        ttft = 0.0
        tokens = prompt = cached = 0
        buffer = b""
        async for chunk in self._chunks(reader):
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                data = json.loads(event[6:])
                if not ttft:
                    for choice in data.get("choices") or []:
                        delta = choice.get("delta") or {}
                        if delta.get("content") or delta.get("tool_calls") or choice.get("text"):
                            ttft = time.perf_counter() - started
                usage = data.get("usage")
                if usage:
                    tokens = int(usage.get("completion_tokens") or 0)
                    prompt = int(usage.get("prompt_tokens") or 0)
                    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return StreamResult(ttft, time.perf_counter() - started, tokens, status, prompt, cached)


class Child:
    """A child process; ``address`` is learned from its ``LLMESH_READY`` line (llmesh services)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            args,
            cwd=cwd,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
            start_new_session=True,
        )
        self.address = ""

    @classmethod
    def llmesh(cls, module: str, env: dict[str, str], log: Path, cwd: Path | None = None) -> Child:
        """``python -m module`` (from ``cwd``: another build's tree, see benchmarks/baseline.py)."""
        child = cls([sys.executable, "-m", module], env, log, cwd)
        assert child.proc.stdout is not None
        for line in child.proc.stdout:
            if line.startswith("LLMESH_READY"):
                port = dict(p.split("=", 1) for p in line.split()[1:])["port"]
                child.address = f"127.0.0.1:{port}"
                return child
        raise RuntimeError(f"{module} exited before serving (log: {log})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
