"""The control channel between prefill and decode workers: ZeroMQ + msgspec (msgpack).

A decode worker binds a ROUTER socket and publishes its endpoint in the run directory; each
prefill worker connects a DEALER socket to every decode worker. Prefill sends :class:`Handoff`
messages; the decode worker acknowledges each as it arrives (:class:`Received`) and answers it
with one :class:`Result` on the same connection. A hand-off not acknowledged within
``transport.ack_timeout_s`` is withdrawn (:class:`Cancel`, queued behind it on the same
connection, so a link that comes back delivers both and the decode worker drops it).
Messages are typed msgspec structs: nothing received from the network is unpickled. Every
message is signed with the run's secret (:mod:`pipeline.wire.auth`); unsigned ones are dropped.
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec


class Handoff(msgspec.Struct, tag="handoff"):
    """A prefilled request handed to a decode worker.

    ``request_id`` is the vLLM request id the prefill engine used (the decode engine must use
    the same one). ``kv_transfer_params`` is the dict vLLM returned with the prefill output (the NIXL connector's
    block ids, engine id and side-channel address), passed to decode unchanged; empty for a row
    the decode worker prefills itself (``pools.local_prefill_tokens``).
    ``row_key`` names the row in the run (:func:`pipeline.runtime.ids.row_key`).
    ``prefill_worker`` is the prefill worker's id and ``attempt`` the start time of its process: a
    decode worker that sees a newer attempt of a prefill worker drops what an older attempt left in
    flight (the prefill worker was restarted and serves those rows again). ``sampling`` is the
    row's :class:`~pipeline.config.SamplingConfig` as a dict (``job.sampling`` with the row's own
    overrides), which the decode worker samples with. ``lora`` names the row's LoRA adapter
    (``model.lora``; None: the base model): the decode engine computes with the same adapter the
    KV was computed with. Times are wall-clock seconds since the epoch (``time.time()``).
    """

    row_key: str
    request_id: str
    prefill_worker: str
    attempt: float
    prompt_token_ids: list[int]
    sampling: dict[str, Any]
    kv_transfer_params: dict[str, Any]
    prefill_done_at: float
    lora: Optional[str] = None


class Sample(msgspec.Struct):
    """One more sample of a request (``sampling.n`` > 1): the fields of :class:`Result` that
    differ per sample."""

    token_ids: list[int]
    text: str
    finish_reason: Optional[str]
    stop_reason: Optional[str] = None
    logprobs: Optional[list[list[tuple[int, float]]]] = None
    cumulative_logprob: Optional[float] = None


class Result(msgspec.Struct, tag="result"):
    """The decode worker's answer to one :class:`Handoff`.

    ``kv_tokens`` is the number of prompt tokens whose KV the decode engine did not compute itself
    (vLLM's ``num_cached_tokens``: KV that arrived over NIXL). ``token_times`` holds the wall-clock
    time each output token was seen (seconds since the epoch), one per token id. ``retry`` means
    the request never started decoding (its KV did not arrive within ``transport.kv_timeout_s``):
    the prefill worker should prefill it again and hand it off anew. The fields are sample 0's;
    ``others`` holds samples 1..n-1 (``sampling.n`` > 1); ``token_times`` are sample 0's.
    """

    row_key: str
    decode_worker: str
    token_ids: list[int]
    text: str
    finish_reason: Optional[str]
    error: Optional[str]
    kv_tokens: int
    arrived_at: float
    token_times: list[float]
    retry: bool = False
    stop_reason: Optional[str] = None
    logprobs: Optional[list[list[tuple[int, float]]]] = None
    cumulative_logprob: Optional[float] = None
    others: list[Sample] = msgspec.field(default_factory=list)


class Reserve(msgspec.Struct, tag="reserve"):
    """Ask a decode worker for ``blocks`` slots of its DRAM tier for request ``request_id`` of row
    ``row_key`` (``offload=dram``), before its prefill starts. Answered by :class:`Reserved`."""

    row_key: str
    request_id: str
    prefill_worker: str
    attempt: float
    blocks: int


class Reserved(msgspec.Struct, tag="reserved"):
    """The answer to :class:`Reserve`: ``pool`` is what the prefill engine needs to WRITE into the
    DRAM tier (:meth:`pipeline.engine.dram_pool.DramPool.describe` with the reserved ``"slots"``), or
    ``error`` says why there is no room."""

    row_key: str
    request_id: str
    pool: Optional[dict[str, Any]]
    error: Optional[str] = None


class Release(msgspec.Struct, tag="release"):
    """Give back the slots reserved for ``request_id`` (its prefill failed; no hand-off follows)."""

    request_id: str


class Renew(msgspec.Struct, tag="renew"):
    """The prefill worker still holds the reservations of ``request_ids`` (their rows are queued
    for prefill or being prefilled): the decode worker restarts their expiry. Sent every quarter
    of ``transport.handoff_timeout_s``, so a reservation expires only when its prefill worker has
    stopped renewing it (died), never because a long prefill queue outlasted the timeout."""

    request_ids: list[str]


class Received(msgspec.Struct, tag="received"):
    """A decode worker's acknowledgment, sent as soon as a message arrives and before any work:
    of the :class:`Handoff` or :class:`Reserve` of ``request_id``, or (``request_id`` None) of a
    :class:`Probe`. Its absence within ``transport.ack_timeout_s`` tells the prefill worker that
    the link to that decode worker is down even while its heartbeat (written to the run
    directory, not sent over the link) goes on."""

    request_id: Optional[str] = None


class Cancel(msgspec.Struct, tag="cancel"):
    """The prefill worker gave up on ``request_id`` (it was not acknowledged in time) and serves
    its row elsewhere: a decode worker that receives it late drops the request (and its DRAM-tier
    reservation), so the row is never decoded twice."""

    request_id: str


class Expect(msgspec.Struct, tag="expect"):
    """A hand-off of ``request_id`` (``kv_tokens`` KV tokens) will follow once its prefill ends
    (``pools.elastic``): the decode worker counts it in its load now, so that it claims no unit
    and no other prefill worker counts on the room meanwhile. Not answered; dropped by the
    hand-off, a :class:`Cancel`, or after ``transport.handoff_timeout_s``."""

    request_id: str
    kv_tokens: int


class Probe(msgspec.Struct, tag="probe"):
    """Sent to a decode worker the prefill worker found unreachable, every
    ``transport.ack_timeout_s``; the first :class:`Received` that comes back makes it reachable
    again."""


Message = Handoff | Result | Reserve | Reserved | Release | Renew | Received | Cancel | Probe | Expect
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    """Decode one message. Raises ``msgspec.DecodeError`` on anything that is not a valid
    :data:`Message`."""
    return _decoder.decode(data)
