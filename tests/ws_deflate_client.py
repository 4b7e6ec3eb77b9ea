"""A real WebSocket client against the group, for tests/ws_deflate.rs.

Python `websockets` offers permessage-deflate by default, as browsers do.
Prints one JSON object: what the handshakes answered, whether the echoes
came back whole, and how the server closed a deflate bomb.
"""

import asyncio
import json
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


async def main(addr):
    out = {}
    url = f"ws://{addr}"

    async with connect(f"{url}/ws/echo", max_size=4 << 20) as ws:
        out["extensions"] = ws.response.headers.get("Sec-WebSocket-Extensions")
        out["negotiated"] = [type(e).__name__ for e in ws.protocol.extensions]
        messages = [
            "hello",
            "é" * 100_000,
            bytes(range(256)) * 300,
            "",
            '{"a":' * 10 + "1" + "}" * 10,
        ]
        echoed = []
        for message in messages:
            await ws.send(message)
            echoed.append(await ws.recv() == message)
        out["echoed"] = echoed

    # A message of zeros: about 2 KiB on the wire, 2 MiB inflated, past the
    # server's message limit.
    async with connect(f"{url}/ws/echo", max_size=4 << 20) as ws:
        await ws.send(b"\0" * (2 << 20))
        try:
            await ws.recv()
            out["bomb"] = "answered"
        except ConnectionClosed as closed:
            out["bomb"] = closed.rcvd.code if closed.rcvd else None
            out["bomb_reason"] = closed.rcvd.reason if closed.rcvd else None

    # Subprotocols the server does not speak are not chosen; the one it
    # speaks is, wherever the client put it.
    async with connect(f"{url}/ws", subprotocols=["mqtt", "graphql-ws"]) as ws:
        out["foreign_protocol"] = ws.subprotocol
    async with connect(f"{url}/ws", subprotocols=["mqtt", "switchyard.v1"]) as ws:
        out["own_protocol"] = ws.subprotocol
        await ws.send(json.dumps({"id": 1, "type": "demo.Noop"}))
        out["request_status"] = json.loads(await ws.recv()).get("status")

    print(json.dumps(out))


asyncio.run(main(sys.argv[1]))
