"""The subset of a Kineto event that overlapcheck reads; msgspec skips every other field without building it."""

from __future__ import annotations

from typing import ClassVar

import msgspec

Id = int | str | None
NO_VALUE = msgspec.Raw()  # a raw field's value when the event does not have it


class Args(msgspec.Struct, frozen=True, gc=False):
    """Event args used by the analysis and the diagnosis (old and new Kineto spellings)."""

    stream: Id = None
    correlation: int | None = None
    device: Id = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_old: int | None = msgspec.field(default=None, name="external id")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    pg_name: Id = msgspec.field(default=None, name="Process Group Name")
    pg_id: Id = msgspec.field(default=None, name="Process Group ID")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    in_size: int | None = msgspec.field(default=None, name="In msg size")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    out_size: int | None = msgspec.field(default=None, name="Out msg size")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    name: str | None = None  # thread_name / process_name metadata
    sync_kind: str | None = msgspec.field(default=None, name="cuda_sync_kind")
    wait_on_stream: int | None = None
    wait_on_event_corr: int | None = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    nbytes: int | None = msgspec.field(default=None, name="bytes")
    # record_shapes: read on the nccl:* ops of traces without record_param_comms sizes (torch < 2.1). Kept as raw
    # JSON and decoded only there: every op carries them, and building their nested lists for every event took
    # half of the decoding time (1.45 s against 0.6 s per 100 MB of a real A100 trace)
    input_dims: msgspec.Raw = msgspec.field(default=NO_VALUE, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=NO_VALUE, name="Input type")

    RAW_FIELDS: ClassVar[tuple[str, ...]] = ("input_dims", "input_type")


class Event(msgspec.Struct, frozen=True, gc=False):
    """One trace event. `ph` X = complete, M = metadata, s/f = flow start/finish, i = instant."""

    ph: str = ""
    cat: str | None = None
    name: str | None = ""
    pid: Id = None
    tid: Id = None
    ts: float | None = None
    dur: float | None = None
    id: Id = None
    args: Args | None = None


EVENTS_DECODER = msgspec.json.Decoder(list[Event], strict=False)
