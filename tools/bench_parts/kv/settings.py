"""The UCX / NIXL settings ``tools/bench_kv.py`` compares: environment variables for both
processes and options for their agents and buffers."""

from __future__ import annotations

from dataclasses import dataclass, field

_SHM_ERRH = {"UCX_POSIX_ERROR_HANDLING": "y", "UCX_SYSV_ERROR_HANDLING": "y"}
_OPTION_PREFIXES = ("nixl.", "buf.", "wait.")

# name -> (environment and options, description)
SETTINGS: dict[str, tuple[dict[str, str], str]] = {
    "default": ({}, "nothing set: UCX chooses (the pipeline today, transport.ucx_tls unset)"),
    "tcp": ({"UCX_TLS": "tcp,self"}, "TCP only (loopback and eth0)"),
    "sm": ({"UCX_TLS": "sm,self"}, "shared-memory transports only (here: posix, sysv, cma)"),
    "sm-eh": ({"UCX_TLS": "sm,self", **_SHM_ERRH},
              "shared memory only, posix/sysv declared able to detect a dead peer"),
    "default-eh": (dict(_SHM_ERRH), "UCX chooses, posix/sysv declared able to detect a dead peer"),
    "cma-tcp": ({"UCX_TLS": "cma,tcp,self"}, "what default picks here, named explicitly"),
    "threads0": ({"nixl.num_threads": "0"}, "default, NIXL UCX backend without its 4 extra threads"),
    "noprog": ({"nixl.prog_thread": "0"}, "default, no NIXL progress thread (the caller progresses UCX)"),
    "delay1ms": ({"nixl.pthr_delay_us": "1000"},
                 "default, progress thread waits up to 1 ms per poll (pipeline.engine.nixl_agent)"),
    "noprog-eh": ({"nixl.prog_thread": "0", "UCX_TLS": "sm,self", **_SHM_ERRH}, "sm-eh without the progress thread"),
    "thp": ({"buf.thp": "1"}, "default, KV buffers on transparent huge pages"),
    "errnone": ({"UCX_TLS": "sm,self", "nixl.ucx_error_handling_mode": "none"},
                "shared memory, NIXL's UCX peer-error handling off (backend parameter)"),
}
DEFAULT_TLS = "default,sm,tcp"


@dataclass
class Setting:
    """``env``: variables for both processes (``UCX_*`` ...) plus options ``nixl.*``/``buf.*``."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    about: str = ""

    @property
    def opts(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if k.startswith(_OPTION_PREFIXES)}

    @property
    def environ(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if not k.startswith(_OPTION_PREFIXES)}


def parse_setting(spec: str) -> Setting:
    """A name from ``SETTINGS``, or ``NAME:VAR=VAL;VAR=VAL``.

    Raises:
        ValueError: unknown name or malformed spec.
    """
    if ":" not in spec:
        if spec not in SETTINGS:
            raise ValueError(f"unknown setting {spec!r}; known: {', '.join(SETTINGS)}")
        env, about = SETTINGS[spec]
        return Setting(spec, dict(env), about)
    name, _, rest = spec.partition(":")
    env = {}
    for item in filter(None, rest.split(";")):
        key, eq, val = item.partition("=")
        if not eq or not key:
            raise ValueError(f"setting {spec!r}: {item!r} is not VAR=VAL")
        env[key] = val
    return Setting(name, env, "custom")


def env_text(env: dict[str, str]) -> str:
    """``VAR=VAL VAR=VAL``, or ``(none)``."""
    return " ".join(f"{k}={v}" for k, v in env.items()) or "(none)"
