"""The NIXL agents our connectors build do not spin (pipeline.engine.nixl_agent).

Real NIXL with its UCX backend, in this process. The control agent is built as vLLM builds its
own (progress-thread delay 0): its progress thread busy-polls, which the CPU time of the
agent's threads shows; ours, with the 1 ms delay, must cost next to nothing while idle. CPU time
comes from the kernel (``/proc/self/task/TID/stat``: the threads the agent started, found as
the threads that appeared while it was built), not from anything NIXL reports.
"""
import os
import time

import pytest

from pipeline.engine.nixl_agent import DEFAULT_PTHR_DELAY_US, with_progress_delay


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _cpu_s(tids: set[str]) -> float:
    """CPU seconds (user + system) the threads ``tids`` of this process have used; a thread gone
    counts 0."""
    total = 0
    for tid in tids:
        try:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def _idle_cores(delay_us: int, name: str, seconds: float = 1.5) -> float:
    """Cores the threads of a new, idle agent use over ``seconds``."""
    from nixl._api import nixl_agent, nixl_agent_config

    before = _threads()
    with with_progress_delay(delay_us):
        agent = nixl_agent(name, nixl_agent_config(num_threads=4, capture_telemetry=True))
    try:
        # The agent's threads, its progress thread among them, exist once it is built: measured
        # from then on, and there must be some (an agent without one would cost nothing).
        deadline = time.monotonic() + 10
        while not (started := _threads() - before):
            assert time.monotonic() < deadline, "the agent started no thread"
            time.sleep(0.01)
        c0, w0 = _cpu_s(started), time.monotonic()
        time.sleep(seconds)  # the measurement window
        return (_cpu_s(started) - c0) / (time.monotonic() - w0)
    finally:
        del agent


def test_progress_thread_sleeps_instead_of_spinning():
    # Ours first (each measurement counts only its own agent's threads, and a control agent's
    # spinning thread may outlive ``del agent`` for a moment).
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
