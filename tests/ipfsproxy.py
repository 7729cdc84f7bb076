"""A loopback TCP proxy in front of a real IPFS daemon's API, for fault tests.

Once ``armed``, the first ``dag/import`` request that starts to pass through it calls
``on_import()`` (on a worker thread) before the request goes on: a test stops, kills or
holds the daemon exactly while a write ships its blocks. Everything else passes as is.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class ImportProxy:
    """Proxy to ``127.0.0.1:target_port``; ``port`` is where it listens."""

    def __init__(self, target_port: int, on_import: Callable[[], None]) -> None:
        self.target_port = target_port
        self.on_import = on_import
        self.armed = False
        #: Set once ``on_import`` has returned for an armed ``dag/import``.
        self.met = threading.Event()
        ready = threading.Event()

        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            self.stop = asyncio.Event()
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            await self.stop.wait()
            server.close()

        self.thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
        self.thread.start()
        ready.wait(30)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pipe(src, dst, upstream: bool) -> None:
            try:
                while data := await src.read(1 << 16):
                    if upstream and self.armed and b"/dag/import" in data:
                        self.armed = False
                        await asyncio.to_thread(self.on_import)
                        self.met.set()
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                return  # either side went away: the other is closed below
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_w, True), pipe(up_r, writer, False))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)
