"""The NIXL agents our connectors build do not spin (pipeline.engine.nixl_agent).

Real NIXL with its UCX backend, in this process. The control agent is built as vLLM builds its
own (progress-thread delay 0): its progress thread busy-polls, which the process's CPU time
shows; ours, with the 1 ms delay, must cost next to nothing while idle. CPU time comes from the
kernel (``time.process_time``), not from anything NIXL reports.
"""
import time

import pytest

from pipeline.engine.nixl_agent import DEFAULT_PTHR_DELAY_US, with_progress_delay


def _idle_cores(delay_us: int, name: str, seconds: float = 1.5) -> float:
    from nixl._api import nixl_agent, nixl_agent_config

    with with_progress_delay(delay_us):
        agent = nixl_agent(name, nixl_agent_config(num_threads=4, capture_telemetry=True))
    try:
        time.sleep(0.3)  # let the progress thread start
        c0, w0 = time.process_time(), time.monotonic()
        time.sleep(seconds)
        return (time.process_time() - c0) / (time.monotonic() - w0)
    finally:
        del agent


def test_progress_thread_sleeps_instead_of_spinning():
    # Ours first: a control agent's spinning progress thread may outlive ``del agent`` for a
    # moment and would be counted against ours.
    ours = _idle_cores(DEFAULT_PTHR_DELAY_US, "with-delay")
    spinning = _idle_cores(0, "spin-control")
    # The control shows the measurement sees a spinning thread (a whole core on an idle machine;
    # at least a fifth of one on a busy one); ours stays below 5 % of a core.
    assert spinning > 0.2, f"control agent used only {spinning:.2f} cores: measurement not sensitive"
    assert ours < 0.05, f"agent with a {DEFAULT_PTHR_DELAY_US} us progress delay used {ours:.2f} cores idle"


def test_negative_delay_is_refused():
    with pytest.raises(ValueError, match="progress-thread delay"):
        with with_progress_delay(-1):
            pass
