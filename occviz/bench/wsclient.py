"""A minimal websocket client (RFC 6455) on asyncio, for the benchmarks and tests that need hundreds at once.

It speaks to a real server over TCP as a browser or a program would: the handshake with a
session cookie and an Origin, whole messages (fragments joined), and the two ways a client
leaves: a close frame, or a dropped connection (`abort`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
from typing import Any


class Refused(Exception):
    """The server answered the handshake with something other than 101."""


class Closed(Exception):
    """The server closed the socket: its close code and reason."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"closed with {code}: {reason}")
        self.code = code
        self.reason = reason


class WsClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(
        cls, port: int, path: str, cookie: str = "", origin: str | None = None, *, receive_buffer: int | None = None
    ) -> WsClient:
        """`receive_buffer`: the socket's receive buffer in bytes (a small one makes a slow reader's server wait)."""
        if receive_buffer is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        else:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=sock)
        key = base64.b64encode(os.urandom(16)).decode()
        origin = f"http://127.0.0.1:{port}" if origin is None else origin
        writer.write(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Origin: {origin}\r\n" + (f"Cookie: {cookie}\r\n" if cookie else "") + "\r\n"
            ).encode()
        )
        try:
            status = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            writer.close()
            raise Refused(f"connection closed during the handshake: {error}") from error
        if b" 101 " not in status.split(b"\r\n", 1)[0]:
            writer.close()
            raise Refused(status.split(b"\r\n", 1)[0].decode(errors="replace"))
        return cls(reader, writer)

    async def receive_text(self) -> str:
        """The next whole text message; Closed when the server closes instead."""
        return (await self.receive_bytes()).decode()

    async def receive_bytes(self) -> bytes:
        """The next whole message, as it came (UTF-8 for a text message)."""
        message = b""
        while True:
            head = await self.reader.readexactly(2)
            length = head[1] & 0x7F
            if length == 126:
                length = int.from_bytes(await self.reader.readexactly(2), "big")
            elif length == 127:
                length = int.from_bytes(await self.reader.readexactly(8), "big")
            payload = await self.reader.readexactly(length)
            opcode = head[0] & 0x0F
            if opcode == 0x8:
                code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
                raise Closed(code, payload[2:].decode(errors="replace"))
            if opcode == 0x9:  # ping: answer, go on
                self._send_frame(0xA, payload)
                continue
            if opcode in (0x0, 0x1):
                message += payload
                if head[0] & 0x80:
                    return message

    async def receive_json(self) -> Any:
        return json.loads(await self.receive_text())

    def send_text(self, text: str) -> None:
        self._send_frame(0x1, text.encode())

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        # Client frames are masked (RFC 6455 5.3).
        mask = os.urandom(4)
        length = len(payload)
        if length < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
        elif length < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
        masked = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
        self.writer.write(head + mask + masked)

    async def close(self, code: int = 1000) -> None:
        """Leave as a browser does when a page closes: a close frame, then the connection."""
        with contextlib.suppress(ConnectionError):
            self._send_frame(0x8, code.to_bytes(2, "big"))
            await self.writer.drain()
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()

    def abort(self) -> None:
        """Leave without a word: the connection reset, as a killed browser or a lost network leaves."""
        self.writer.transport.abort()
