"""A decode rank's heartbeat (pipeline.runtime.heartbeat) goes on while its event loop is held up,
and stops for good before its last, "stopped" publish. Real run-directory files, no engine."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from pipeline.runtime.heartbeat import Heartbeat
from pipeline.runtime.rundir import RunDir


def test_the_heartbeat_goes_on_while_the_event_loop_is_held_up_and_stops_before_the_last_publish(tmp_path):
    run = RunDir(tmp_path)
    path = tmp_path / "decode" / "rank-0.json"

    def publish(stopped: bool = False) -> None:
        run.publish_decode(0, "tcp://127.0.0.1:1", "decode-0@h", 1024, stopped=stopped)

    seen: list[float] = []  # the heartbeat values another process's reader finds, while the loop is held
    holding = threading.Event()

    def read() -> None:
        while holding.is_set():
            try:
                seen.append(json.loads(path.read_text())["heartbeat"])
            except (OSError, ValueError):
                pass
            time.sleep(0.02)

    async def main() -> Heartbeat:
        publish()
        beat = Heartbeat(publish, 0.1, "decode-heartbeat-0").start()
        holding.set()
        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(1.5)  # a callback that holds the loop 1.5 s (vLLM's output handler on a starved core)
        holding.clear()
        reader.join()
        return beat

    beat = asyncio.run(main())
    # Every 0.1 s over 1.5 s: about 15 values; 5 or more leaves room for a loaded machine.
    assert len(set(seen)) >= 5, sorted(set(seen))
    beat.stop()
    publish(stopped=True)
    time.sleep(0.4)  # four beat periods: a beat still running would have overwritten it
    assert json.loads(path.read_text())["stopped"] is True
