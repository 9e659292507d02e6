"""UCX as ``tools/bench_kv.py`` sees it: the transports UCX chose for an endpoint (from its
protocol-selection report) and the transports the UCX bundled with nixl offers here."""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import re
from pathlib import Path

_TRANSPORT = re.compile(r"\b(?:tcp|cma|knem|xpmem|posix|sysv|self|rc_mlx5|rc_verbs|ud_mlx5|ud_verbs|dc_mlx5|"
                        r"cuda_copy|cuda_ipc|gdr_copy)/[\w.:-]+")
_PROTO_OPS = {"ucp_put": "put", "ucp_get": "get", "ucp_am_send": "am"}


def proto_transports(log: str) -> dict[str, list[str]]:
    """Transports UCX chose for the initiator's intra-node endpoint, from its protocol-selection
    report (``UCX_PROTO_INFO=y``): e.g. ``{"am": ["tcp/lo"], "get": ["cma/memory"],
    "put": ["cma/memory"]}``. Empty when the report is absent."""
    found: dict[str, set[str]] = {}
    endpoint, op = "", None
    for raw in log.splitlines():
        line = re.sub(r"^\[[^]]*\] \[[^]]*\]\s*", "", raw).strip()
        if not line.startswith("|"):
            continue
        cols = [c.strip() for c in line.strip("|").split("|")]
        if len(cols) == 1:
            if " cfg#" in cols[0]:
                endpoint, op = cols[0], None
            else:
                op = next((v for k, v in _PROTO_OPS.items() if k in cols[0]), op)
        elif op and "intra-node" in endpoint and cols[0] != "Range":
            found.setdefault(op, set()).update(_TRANSPORT.findall(cols[-1]))
    return {k: sorted(v) for k, v in sorted(found.items())}


def transport_summary(t: dict[str, list[str]]) -> str:
    """``op: transport ...; op: ...`` (``?`` where none was found)."""
    return "; ".join(f"{op}: {' '.join(v) or '?'}" for op, v in t.items()) or "?"


def ucx_inventory() -> dict:
    """The UCX bundled with nixl: version and transport/device pairs (what ``ucx_info -d`` lists),
    read through its C API. ``{"error": ...}`` when the libraries are not found."""
    try:
        libdir = next(Path(spec.origin).parent.parent / f"{name}.libs"
                      for name in ("nixl_cu13", "nixl_cu12")
                      if (spec := importlib.util.find_spec(name)) and spec.origin)
        libs = {}
        for lib in ("libucs", "libucm", "libuct", "libucp"):
            libs[lib] = ctypes.CDLL(glob.glob(str(libdir / f"{lib}-*.so*"))[0], mode=ctypes.RTLD_GLOBAL)
        ucp, uct = libs["libucp"], libs["libuct"]
        ucp.ucp_get_version_string.restype = ctypes.c_char_p

        class CompAttr(ctypes.Structure):  # uct_component_attr_t
            _fields_ = [("field_mask", ctypes.c_uint64), ("name", ctypes.c_char * 16),
                        ("md_resource_count", ctypes.c_uint), ("md_resources", ctypes.c_void_p),
                        ("flags", ctypes.c_uint64)]

        class TlRes(ctypes.Structure):  # uct_tl_resource_desc_t
            _fields_ = [("tl_name", ctypes.c_char * 10), ("dev_name", ctypes.c_char * 32),
                        ("dev_type", ctypes.c_int), ("sys_device", ctypes.c_uint8)]

        comps, ncomp = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_uint()
        uct.uct_query_components(ctypes.byref(comps), ctypes.byref(ncomp))
        transports, idle = [], []
        for i in range(ncomp.value):
            comp = ctypes.c_void_p(comps[i])
            attr = CompAttr(field_mask=0b11)
            uct.uct_component_query(comp, ctypes.byref(attr))
            mds = (ctypes.c_char * 16 * max(1, attr.md_resource_count))()
            attr2 = CompAttr(field_mask=0b111, md_resources=ctypes.cast(mds, ctypes.c_void_p).value)
            uct.uct_component_query(comp, ctypes.byref(attr2))
            if attr.md_resource_count == 0:
                idle.append(attr.name.decode())
            for j in range(attr.md_resource_count):
                cfg, md = ctypes.c_void_p(), ctypes.c_void_p()
                if uct.uct_md_config_read(comp, None, None, ctypes.byref(cfg)) or \
                        uct.uct_md_open(comp, mds[j].value, cfg, ctypes.byref(md)):
                    continue
                res, nres = ctypes.POINTER(TlRes)(), ctypes.c_uint()
                if uct.uct_md_query_tl_resources(md, ctypes.byref(res), ctypes.byref(nres)) == 0:
                    transports += [f"{res[k].tl_name.decode()}/{res[k].dev_name.decode()}" for k in range(nres.value)]
        return {"version": ucp.ucp_get_version_string().decode(), "libdir": libdir.name,
                "transports": transports, "components_without_devices": idle}
    except Exception as e:  # noqa: BLE001 - informational only
        return {"error": f"{type(e).__name__}: {e}"}
