from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegistrationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REGISTRATION_STATE_UNSPECIFIED: _ClassVar[RegistrationState]
    REGISTRATION_STATE_REGISTERED: _ClassVar[RegistrationState]
    REGISTRATION_STATE_SEARCHING: _ClassVar[RegistrationState]
    REGISTRATION_STATE_DENIED: _ClassVar[RegistrationState]
    REGISTRATION_STATE_IDLE: _ClassVar[RegistrationState]

class HandoverOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HANDOVER_OUTCOME_UNSPECIFIED: _ClassVar[HandoverOutcome]
    HANDOVER_OUTCOME_SUCCESS: _ClassVar[HandoverOutcome]
    HANDOVER_OUTCOME_FAILURE: _ClassVar[HandoverOutcome]
REGISTRATION_STATE_UNSPECIFIED: RegistrationState
REGISTRATION_STATE_REGISTERED: RegistrationState
REGISTRATION_STATE_SEARCHING: RegistrationState
REGISTRATION_STATE_DENIED: RegistrationState
REGISTRATION_STATE_IDLE: RegistrationState
HANDOVER_OUTCOME_UNSPECIFIED: HandoverOutcome
HANDOVER_OUTCOME_SUCCESS: HandoverOutcome
HANDOVER_OUTCOME_FAILURE: HandoverOutcome

class Record(_message.Message):
    __slots__ = ("train_id", "time_unix_ms", "gps", "cell", "handover", "path")
    TRAIN_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    GPS_FIELD_NUMBER: _ClassVar[int]
    CELL_FIELD_NUMBER: _ClassVar[int]
    HANDOVER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    train_id: str
    time_unix_ms: int
    gps: GpsFix
    cell: CellSample
    handover: HandoverEvent
    path: PathStatistics
    def __init__(self, train_id: _Optional[str] = ..., time_unix_ms: _Optional[int] = ..., gps: _Optional[_Union[GpsFix, _Mapping]] = ..., cell: _Optional[_Union[CellSample, _Mapping]] = ..., handover: _Optional[_Union[HandoverEvent, _Mapping]] = ..., path: _Optional[_Union[PathStatistics, _Mapping]] = ...) -> None: ...

class GpsFix(_message.Message):
    __slots__ = ("lat_deg", "lon_deg", "speed_mps", "heading_deg", "accuracy_m", "track_m")
    LAT_DEG_FIELD_NUMBER: _ClassVar[int]
    LON_DEG_FIELD_NUMBER: _ClassVar[int]
    SPEED_MPS_FIELD_NUMBER: _ClassVar[int]
    HEADING_DEG_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_M_FIELD_NUMBER: _ClassVar[int]
    TRACK_M_FIELD_NUMBER: _ClassVar[int]
    lat_deg: float
    lon_deg: float
    speed_mps: float
    heading_deg: float
    accuracy_m: float
    track_m: float
    def __init__(self, lat_deg: _Optional[float] = ..., lon_deg: _Optional[float] = ..., speed_mps: _Optional[float] = ..., heading_deg: _Optional[float] = ..., accuracy_m: _Optional[float] = ..., track_m: _Optional[float] = ...) -> None: ...

class CellSample(_message.Message):
    __slots__ = ("path", "carrier", "cell_id", "rsrp_dbm", "registration", "measured_unix_ms")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CARRIER_FIELD_NUMBER: _ClassVar[int]
    CELL_ID_FIELD_NUMBER: _ClassVar[int]
    RSRP_DBM_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    MEASURED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    path: int
    carrier: str
    cell_id: int
    rsrp_dbm: float
    registration: RegistrationState
    measured_unix_ms: int
    def __init__(self, path: _Optional[int] = ..., carrier: _Optional[str] = ..., cell_id: _Optional[int] = ..., rsrp_dbm: _Optional[float] = ..., registration: _Optional[_Union[RegistrationState, str]] = ..., measured_unix_ms: _Optional[int] = ...) -> None: ...

class HandoverEvent(_message.Message):
    __slots__ = ("path", "carrier", "source_cell_id", "target_cell_id", "start_unix_ms", "start_lat_deg", "start_lon_deg", "start_track_m", "rsrp_dbm", "outcome", "duration_ms")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CARRIER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_CELL_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_CELL_ID_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    START_LAT_DEG_FIELD_NUMBER: _ClassVar[int]
    START_LON_DEG_FIELD_NUMBER: _ClassVar[int]
    START_TRACK_M_FIELD_NUMBER: _ClassVar[int]
    RSRP_DBM_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    path: int
    carrier: str
    source_cell_id: int
    target_cell_id: int
    start_unix_ms: int
    start_lat_deg: float
    start_lon_deg: float
    start_track_m: float
    rsrp_dbm: float
    outcome: HandoverOutcome
    duration_ms: int
    def __init__(self, path: _Optional[int] = ..., carrier: _Optional[str] = ..., source_cell_id: _Optional[int] = ..., target_cell_id: _Optional[int] = ..., start_unix_ms: _Optional[int] = ..., start_lat_deg: _Optional[float] = ..., start_lon_deg: _Optional[float] = ..., start_track_m: _Optional[float] = ..., rsrp_dbm: _Optional[float] = ..., outcome: _Optional[_Union[HandoverOutcome, str]] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class PathStatistics(_message.Message):
    __slots__ = ("path", "carrier", "up", "srtt_us", "rate_bps", "bytes_sent", "bytes_acked", "reinjected_bytes", "redundant_bytes", "rto_count")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CARRIER_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    SRTT_US_FIELD_NUMBER: _ClassVar[int]
    RATE_BPS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_ACKED_FIELD_NUMBER: _ClassVar[int]
    REINJECTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REDUNDANT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RTO_COUNT_FIELD_NUMBER: _ClassVar[int]
    path: int
    carrier: str
    up: bool
    srtt_us: int
    rate_bps: int
    bytes_sent: int
    bytes_acked: int
    reinjected_bytes: int
    redundant_bytes: int
    rto_count: int
    def __init__(self, path: _Optional[int] = ..., carrier: _Optional[str] = ..., up: _Optional[bool] = ..., srtt_us: _Optional[int] = ..., rate_bps: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., bytes_acked: _Optional[int] = ..., reinjected_bytes: _Optional[int] = ..., redundant_bytes: _Optional[int] = ..., rto_count: _Optional[int] = ...) -> None: ...
