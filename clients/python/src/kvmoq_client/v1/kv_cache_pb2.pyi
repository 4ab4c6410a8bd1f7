import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from kvmoq_client.v1 import tensor_handle_pb2 as _tensor_handle_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KVPart(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_PART_UNSPECIFIED: _ClassVar[KVPart]
    KV_PART_KEY: _ClassVar[KVPart]
    KV_PART_VALUE: _ClassVar[KVPart]
    KV_PART_KEY_VALUE: _ClassVar[KVPart]

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STOP_REASON_UNSPECIFIED: _ClassVar[StopReason]
    STOP_REASON_COMPLETE: _ClassVar[StopReason]
    STOP_REASON_NOT_FOUND: _ClassVar[StopReason]
    STOP_REASON_DEADLINE: _ClassVar[StopReason]
    STOP_REASON_PUBLISHER_GONE: _ClassVar[StopReason]
    STOP_REASON_CATALOG_INVALID: _ClassVar[StopReason]
    STOP_REASON_RELAY_GONE: _ClassVar[StopReason]
    STOP_REASON_CANCELLED: _ClassVar[StopReason]
    STOP_REASON_QUALITY_FLOOR: _ClassVar[StopReason]
    STOP_REASON_COMPUTE_FASTER: _ClassVar[StopReason]
KV_PART_UNSPECIFIED: KVPart
KV_PART_KEY: KVPart
KV_PART_VALUE: KVPart
KV_PART_KEY_VALUE: KVPart
STOP_REASON_UNSPECIFIED: StopReason
STOP_REASON_COMPLETE: StopReason
STOP_REASON_NOT_FOUND: StopReason
STOP_REASON_DEADLINE: StopReason
STOP_REASON_PUBLISHER_GONE: StopReason
STOP_REASON_CATALOG_INVALID: StopReason
STOP_REASON_RELAY_GONE: StopReason
STOP_REASON_CANCELLED: StopReason
STOP_REASON_QUALITY_FLOOR: StopReason
STOP_REASON_COMPUTE_FASTER: StopReason

class KVLayout(_message.Message):
    __slots__ = ("num_layers", "num_kv_heads", "head_dim", "dtype")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: _tensor_handle_pb2.DType
    def __init__(self, num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., dtype: _Optional[_Union[_tensor_handle_pb2.DType, str]] = ...) -> None: ...

class ContiguousLayout(_message.Message):
    __slots__ = ("max_tokens",)
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    def __init__(self, max_tokens: _Optional[int] = ...) -> None: ...

class PagedLayout(_message.Message):
    __slots__ = ("block_size", "num_blocks")
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    num_blocks: int
    def __init__(self, block_size: _Optional[int] = ..., num_blocks: _Optional[int] = ...) -> None: ...

class KVBuffer(_message.Message):
    __slots__ = ("layer", "part", "handle")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    layer: int
    part: KVPart
    handle: _tensor_handle_pb2.TensorHandle
    def __init__(self, layer: _Optional[int] = ..., part: _Optional[_Union[KVPart, str]] = ..., handle: _Optional[_Union[_tensor_handle_pb2.TensorHandle, _Mapping]] = ...) -> None: ...

class RegisterBuffersRequest(_message.Message):
    __slots__ = ("model", "layout", "contiguous", "paged", "buffers")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    CONTIGUOUS_FIELD_NUMBER: _ClassVar[int]
    PAGED_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    model: str
    layout: KVLayout
    contiguous: ContiguousLayout
    paged: PagedLayout
    buffers: _containers.RepeatedCompositeFieldContainer[KVBuffer]
    def __init__(self, model: _Optional[str] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., contiguous: _Optional[_Union[ContiguousLayout, _Mapping]] = ..., paged: _Optional[_Union[PagedLayout, _Mapping]] = ..., buffers: _Optional[_Iterable[_Union[KVBuffer, _Mapping]]] = ...) -> None: ...

class RegisterBuffersResponse(_message.Message):
    __slots__ = ("buffer_set_id",)
    BUFFER_SET_ID_FIELD_NUMBER: _ClassVar[int]
    buffer_set_id: str
    def __init__(self, buffer_set_id: _Optional[str] = ...) -> None: ...

class UnregisterBuffersRequest(_message.Message):
    __slots__ = ("buffer_set_id",)
    BUFFER_SET_ID_FIELD_NUMBER: _ClassVar[int]
    buffer_set_id: str
    def __init__(self, buffer_set_id: _Optional[str] = ...) -> None: ...

class UnregisterBuffersResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TokenRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class BlockList(_message.Message):
    __slots__ = ("block_ids",)
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class KVLocation(_message.Message):
    __slots__ = ("token_range", "blocks")
    TOKEN_RANGE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    token_range: TokenRange
    blocks: BlockList
    def __init__(self, token_range: _Optional[_Union[TokenRange, _Mapping]] = ..., blocks: _Optional[_Union[BlockList, _Mapping]] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("buffer_set_id", "token_ids", "source", "tracks", "default_track")
    BUFFER_SET_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TRACKS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TRACK_FIELD_NUMBER: _ClassVar[int]
    buffer_set_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    source: KVLocation
    tracks: _containers.RepeatedScalarFieldContainer[str]
    default_track: str
    def __init__(self, buffer_set_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., source: _Optional[_Union[KVLocation, _Mapping]] = ..., tracks: _Optional[_Iterable[str]] = ..., default_track: _Optional[str] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("prompt_id", "namespace", "tracks", "chunks")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TRACKS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    namespace: _containers.RepeatedScalarFieldContainer[str]
    tracks: _containers.RepeatedScalarFieldContainer[str]
    chunks: int
    def __init__(self, prompt_id: _Optional[str] = ..., namespace: _Optional[_Iterable[str]] = ..., tracks: _Optional[_Iterable[str]] = ..., chunks: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("buffer_set_id", "token_ids", "max_kl")
    BUFFER_SET_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_KL_FIELD_NUMBER: _ClassVar[int]
    buffer_set_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_kl: float
    def __init__(self, buffer_set_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., max_kl: _Optional[float] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("available_tokens", "ready_tokens", "prompt_id", "relay_url", "estimated_seconds", "withdrawn")
    AVAILABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    READY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    RELAY_URL_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    available_tokens: int
    ready_tokens: int
    prompt_id: str
    relay_url: str
    estimated_seconds: float
    withdrawn: bool
    def __init__(self, available_tokens: _Optional[int] = ..., ready_tokens: _Optional[int] = ..., prompt_id: _Optional[str] = ..., relay_url: _Optional[str] = ..., estimated_seconds: _Optional[float] = ..., withdrawn: _Optional[bool] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("buffer_set_id", "token_ids", "destination", "deadline", "tracks", "held_tokens", "relay_wait", "write_tokens", "max_kl", "compute_tokens_per_second")
    BUFFER_SET_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    TRACKS_FIELD_NUMBER: _ClassVar[int]
    HELD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RELAY_WAIT_FIELD_NUMBER: _ClassVar[int]
    WRITE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_KL_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    buffer_set_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    destination: KVLocation
    deadline: _timestamp_pb2.Timestamp
    tracks: _containers.RepeatedScalarFieldContainer[str]
    held_tokens: int
    relay_wait: _duration_pb2.Duration
    write_tokens: int
    max_kl: float
    compute_tokens_per_second: float
    def __init__(self, buffer_set_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., destination: _Optional[_Union[KVLocation, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tracks: _Optional[_Iterable[str]] = ..., held_tokens: _Optional[int] = ..., relay_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., write_tokens: _Optional[int] = ..., max_kl: _Optional[float] = ..., compute_tokens_per_second: _Optional[float] = ...) -> None: ...

class LoadProgress(_message.Message):
    __slots__ = ("chunk_loaded", "finished")
    CHUNK_LOADED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    chunk_loaded: ChunkLoaded
    finished: LoadFinished
    def __init__(self, chunk_loaded: _Optional[_Union[ChunkLoaded, _Mapping]] = ..., finished: _Optional[_Union[LoadFinished, _Mapping]] = ...) -> None: ...

class ChunkLoaded(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: TokenRange
    def __init__(self, tokens: _Optional[_Union[TokenRange, _Mapping]] = ...) -> None: ...

class ChunkRejected(_message.Message):
    __slots__ = ("chunk", "tokens", "track", "reason")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRACK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    tokens: TokenRange
    track: str
    reason: str
    def __init__(self, chunk: _Optional[int] = ..., tokens: _Optional[_Union[TokenRange, _Mapping]] = ..., track: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LoadFinished(_message.Message):
    __slots__ = ("loaded", "prefix_tokens", "compute_tokens", "stop_reason", "rejected", "prompt_id", "available_tokens", "track_bytes", "max_kl", "expected_kl")
    class TrackBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    LOADED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRACK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_KL_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_KL_FIELD_NUMBER: _ClassVar[int]
    loaded: _containers.RepeatedCompositeFieldContainer[TokenRange]
    prefix_tokens: int
    compute_tokens: int
    stop_reason: StopReason
    rejected: _containers.RepeatedCompositeFieldContainer[ChunkRejected]
    prompt_id: str
    available_tokens: int
    track_bytes: _containers.ScalarMap[str, int]
    max_kl: float
    expected_kl: float
    def __init__(self, loaded: _Optional[_Iterable[_Union[TokenRange, _Mapping]]] = ..., prefix_tokens: _Optional[int] = ..., compute_tokens: _Optional[int] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., rejected: _Optional[_Iterable[_Union[ChunkRejected, _Mapping]]] = ..., prompt_id: _Optional[str] = ..., available_tokens: _Optional[int] = ..., track_bytes: _Optional[_Mapping[str, int]] = ..., max_kl: _Optional[float] = ..., expected_kl: _Optional[float] = ...) -> None: ...
