#!/usr/bin/env python3
"""A slow link for the lab: TCP proxy that forwards LISTEN_PORT to TARGET_PORT on 127.0.0.1,
limiting server->client bytes to RATE bytes/s per connection. A STAND-IN for a WAN link, so a
test can kill a download in the middle of a file. usage: throttle_proxy.py LISTEN TARGET RATE"""
import asyncio
import sys

LISTEN, TARGET, RATE = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])


async def pipe(reader, writer, rate):
    try:
        while True:
            chunk = await reader.read(16384 if rate else 65536)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
            if rate:
                await asyncio.sleep(len(chunk) / rate)
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def handle(client_r, client_w):
    server_r, server_w = await asyncio.open_connection("127.0.0.1", TARGET)
    await asyncio.gather(pipe(client_r, server_w, 0), pipe(server_r, client_w, RATE))


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", LISTEN)
    async with server:
        await server.serve_forever()


asyncio.run(main())
