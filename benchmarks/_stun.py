"""A STUN Binding responder on 127.0.0.1, for servers that insist on a STUN server.

The official runtime always hands its clients (and uses) a STUN server; with none
reachable, ICE gathering waits out its timeout on both sides and every connect takes
seconds more. Answering Binding requests here keeps a same-machine comparison about
the servers, not about a missing network. Built on aioice's STUN messages.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aioice import stun

__all__ = ["stun_responder"]


class _Responder(asyncio.DatagramProtocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            request = stun.parse_message(data)
        except ValueError:
            return
        if (request.message_method, request.message_class) != (stun.Method.BINDING,
                                                                stun.Class.REQUEST):
            return
        response = stun.Message(
            message_method=stun.Method.BINDING, message_class=stun.Class.RESPONSE,
            transaction_id=request.transaction_id,
        )
        response.attributes["XOR-MAPPED-ADDRESS"] = addr
        self.transport.sendto(bytes(response), addr)


@contextlib.asynccontextmanager
async def stun_responder() -> AsyncIterator[str]:
    """A responder on a free UDP port of 127.0.0.1; yields its `stun:` URL."""
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(_Responder, local_addr=("127.0.0.1", 0))
    try:
        host, port = transport.get_extra_info("sockname")[:2]
        yield f"stun:{host}:{port}"
    finally:
        transport.close()
