"""A headless client of the web viewer in a process of its own, as a browser tab is: it speaks viser's websocket
protocol from Python, sends camera messages the way the page does and reads (and decodes) everything the server
sends. Its own work (waking to poll the socket, decompressing, decoding) then takes nothing from the training
process's interpreter, which a client thread inside that process would, at the expense of a step bound by the
host. Used by `benchmarks.tools.web_viewer_cost`."""
from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time

CONNECT_TIMEOUT_S = 60.0
RESULT_TIMEOUT_S = 30.0


def frames_in(raw: bytes) -> int:
    """Background images (the renders) in one message window of viser's wire format: two little-endian lengths
    (msgpack, zstd-compressed msgpack), the compressed msgpack {"messages": [...]}, then binary buffers. The empty
    background every client gets on connecting is not a frame."""
    import msgspec
    import zstandard

    size, compressed = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:16], "little")
    inner = zstandard.ZstdDecompressor().decompress(raw[16:16 + compressed], max_output_size=size)
    return sum(m.get("type") == "BackgroundImageMessage" and m.get("rgb_data") is not None
               for m in msgspec.msgpack.decode(inner)["messages"])


def camera_message(pose: dict, width: int, height: int) -> bytes:
    """The page's camera message for `pose` (wxyz, position, fov, look_at, up_direction) at a viewport size."""
    import msgspec

    return msgspec.msgpack.encode({
        "type": "ViewerCameraMessage", "wxyz": list(pose["wxyz"]), "position": list(pose["position"]),
        "fov": pose["fov"], "near": 0.01, "far": 1000.0, "image_height": height, "image_width": width,
        "look_at": list(pose["look_at"]), "up_direction": list(pose["up_direction"])})


class HeadlessClient:
    """One client process: the first of `cameras` (encoded camera messages) on connecting, then, with
    `move_every_s`, the next one that often (round again after the last); every message read. Use as a context
    manager: entering returns once the client is connected; leaving stops it, after what is still on its way has
    been read, and fills `bytes_received`, `messages` and `frames`."""

    DRAIN_S = 0.3  # on stopping: silence from the server this long ends the reading

    def __init__(self, url: str, cameras: list[bytes], move_every_s: float | None = None):
        if not cameras:
            raise ValueError("cameras must hold at least one camera message")
        context = multiprocessing.get_context("spawn")  # no copy of the training process's state (CUDA, Taichi)
        self._stop, self._ready, self._results = context.Event(), context.Event(), context.Queue()
        self.process = context.Process(target=_client_main, daemon=True,
                                       args=(url.replace("http", "ws", 1), cameras, move_every_s, self.DRAIN_S,
                                             self._stop, self._ready, self._results))
        self.bytes_received = self.messages = self.frames = 0

    def __enter__(self):
        self.process.start()
        if not self._ready.wait(CONNECT_TIMEOUT_S):
            self.process.kill()
            raise RuntimeError(f"the headless client did not connect within {CONNECT_TIMEOUT_S:.0f} s")
        return self

    def __exit__(self, *exc):
        self._stop.set()
        try:
            result = self._results.get(timeout=RESULT_TIMEOUT_S)
        except queue.Empty:
            result = {"error": "the headless client sent no result"}
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
        self.bytes_received = result.get("bytes_received", 0)
        self.messages = result.get("messages", 0)
        self.frames = result.get("frames", 0)
        if result.get("error") and exc[0] is None:
            raise RuntimeError(f"the headless client failed: {result['error']}")


def _client_main(url, cameras, move_every_s, drain_s, stop, ready, results) -> None:
    counts = {"bytes_received": 0, "messages": 0, "frames": 0}
    try:
        asyncio.run(_run(url, cameras, move_every_s, drain_s, stop, ready, counts))
    except BaseException as exc:  # reported to the measurement, which would otherwise count no frames silently
        counts["error"] = repr(exc)
    ready.set()  # a client that failed before connecting must not leave its parent waiting
    results.put(counts)


async def _run(url, cameras, move_every_s, drain_s, stop, ready, counts) -> None:
    import viser
    import websockets

    async with websockets.connect(url, subprotocols=[f"viser-v{viser.__version__}"], max_size=None) as ws:
        k = 0
        await ws.send(cameras[0])
        ready.set()
        last_move = time.perf_counter()
        while True:
            stopping = stop.is_set()
            try:
                # Once asked to stop, what is still on its way is read until the server falls silent.
                raw = await asyncio.wait_for(ws.recv(), timeout=drain_s if stopping else 0.05)
                counts["bytes_received"] += len(raw)
                counts["messages"] += 1
                counts["frames"] += frames_in(raw)
            except asyncio.TimeoutError:
                if stopping:
                    break
            if not stopping and move_every_s and time.perf_counter() - last_move >= move_every_s:
                k += 1
                await ws.send(cameras[k % len(cameras)])
                last_move = time.perf_counter()
