"""Secure aggregation's messages (:mod:`aggregator.secure_round` drives them): what each stage
sends a device and what the device replies, as Flower records.

A round under ``secure-aggregation`` is four exchanges:

1. ``train`` (the usual :class:`~edge_client.wire.records.RoundPlan`): the device trains,
   keeps its quantised update, and replies with its metrics, no update frame, and a
   :class:`Advert` (``secagg`` record): its two public keys, a commitment to its self-mask
   seed, and the weight it multiplied its update by;
2. ``share-keys`` (:class:`ShareKeysAsk`): its neighbours' public keys; the device replies
   with its secrets' Shamir shares, one encrypted to each neighbour (:class:`ShareKeysReply`);
3. ``masked-input`` (:class:`MaskAsk`): the shares addressed to it by the neighbours still
   in; it replies with its masked vector (:class:`MaskReply`);
4. ``unmask`` (:class:`UnmaskAsk`): which of its neighbours sent masked input and which did
   not; it replies with its share of the first's self-mask seed and of the second's mask
   key, never both for one device (:class:`UnmaskReply`).

Stages 2-4 are ``query.secagg`` messages; their ``config`` record names the stage and
round. A reply may instead refuse (``refused``: why), which the aggregator counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from flwr.app import ConfigRecord, RecordDict

from edge_client.wire.records import CONFIG, RecordError

__all__ = [
    "ADVERT",
    "MASKED_INPUT",
    "SECAGG_ACTION",
    "SECAGG_STAGE",
    "SHARE_KEYS",
    "STAGES",
    "UNMASK",
    "Advert",
    "MaskAsk",
    "MaskReply",
    "ShareKeysAsk",
    "ShareKeysReply",
    "StageReply",
    "UnmaskAsk",
    "UnmaskReply",
    "charge_cpu",
    "stage_of",
]

#: The ClientApp's query action that serves stages 2-4 (``query.secagg``).
SECAGG_ACTION = "secagg"
#: The record a training reply carries its :class:`Advert` in.
ADVERT = "secagg"
SHARE_KEYS = "share-keys"
MASKED_INPUT = "masked-input"
UNMASK = "unmask"
STAGES = (SHARE_KEYS, MASKED_INPUT, UNMASK)
SECAGG_STAGE = "secagg-stage"
_ROUND = "server-round"
_REFUSED = "refused"
_CPU = "stage-cpu-s"


def _get(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = record.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise RecordError("malformed", f"secure aggregation: {key!r} missing or ill-typed")
    return value


def _ints(record: Mapping[str, Any], key: str) -> list[int]:
    values = record.get(key, [])
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise RecordError("malformed", f"secure aggregation: {key!r} is not a list of ints")
    return list(values)


def _blobs(record: Mapping[str, Any], key: str, count: int) -> list[bytes]:
    values = record.get(key, [])
    if not isinstance(values, list) or not all(isinstance(v, bytes) for v in values):
        raise RecordError("malformed", f"secure aggregation: {key!r} is not a list of bytes")
    if len(values) != count:
        raise RecordError("malformed", f"secure aggregation: {key!r} has {len(values)} of {count}")
    return list(values)


def charge_cpu(content: RecordDict, seconds: float) -> None:
    """Put the CPU seconds a device spent on a stage into its reply."""
    content.config_records[CONFIG][_CPU] = float(seconds)


def stage_of(content: RecordDict) -> tuple[str, int]:
    """The (stage, round) a stage message or reply is of.

    Raises
    ------
    RecordError
        If it names none, or a stage that is not one of :data:`STAGES`.
    """
    record = content.config_records.get(CONFIG)
    if record is None:
        raise RecordError("malformed", "secure aggregation: no config record")
    stage = _get(record, SECAGG_STAGE, str)
    if stage not in STAGES:
        raise RecordError("malformed", f"secure aggregation: unknown stage {stage!r}")
    return stage, _get(record, _ROUND, int)


@dataclass(frozen=True)
class Advert:
    """What a device that trained publishes with its training reply.

    Attributes
    ----------
    share_key, mask_key : bytes
        Its X25519 public keys: to encrypt shares to it, and to agree mask seeds with it.
    seed_hash : bytes
        SHA-256 of its self-mask seed.
    weight : float
        What it multiplied its update by before quantising (the aggregator divides the sum
        by the survivors' weights).
    clipped : int
        Coordinates the shared range clipped (``secagg-range`` too narrow when many).
    """

    share_key: bytes
    mask_key: bytes
    seed_hash: bytes
    weight: float
    clipped: int = 0

    def to_record(self) -> ConfigRecord:
        """The ``secagg`` record of the training reply."""
        return ConfigRecord(
            {
                "share-key": self.share_key,
                "mask-key": self.mask_key,
                "seed-hash": self.seed_hash,
                "weight": float(self.weight),
                "clipped": int(self.clipped),
            }
        )

    @classmethod
    def from_content(cls, content: RecordDict) -> Self:
        """Read a training reply's advert.

        Raises
        ------
        RecordError
            If it has none, or a key is missing or ill-typed.
        """
        record = content.config_records.get(ADVERT)
        if record is None:
            raise RecordError("malformed", "secure aggregation: the reply has no advert")
        keys = [_get(record, k, bytes) for k in ("share-key", "mask-key", "seed-hash")]
        if any(len(k) != 32 for k in keys):
            raise RecordError("malformed", "secure aggregation: keys and hash are 32 bytes")
        weight = float(_get(record, "weight", (int, float)))
        if not weight > 0 or weight != weight or weight == float("inf"):
            raise RecordError("malformed", f"secure aggregation: weight {weight} is not > 0")
        return cls(keys[0], keys[1], keys[2], weight, int(_get(record, "clipped", int)))


@dataclass(frozen=True)
class ShareKeysAsk:
    """Stage 2: the device's neighbours and their public keys.

    Attributes
    ----------
    index : int
        The device's number in the round (1..devices): what the other stages name it by
        (Flower's node ids are 64-bit unsigned, more than a record's int holds).
    neighbours : list of int
        Their numbers.
    share_keys, mask_keys : list of bytes
        Their public keys, in the same order.
    threshold : int
        Shares that rebuild a secret.
    width : int
        The field's bits.
    """

    server_round: int
    index: int
    neighbours: list[int]
    share_keys: list[bytes]
    mask_keys: list[bytes]
    threshold: int
    width: int

    def to_content(self) -> RecordDict:
        """The message's content."""
        return _ask(
            SHARE_KEYS,
            self.server_round,
            {
                "index": self.index,
                "neighbours": self.neighbours,
                "share-keys": self.share_keys,
                "mask-keys": self.mask_keys,
                "threshold": self.threshold,
                "field-bits": self.width,
            },
        )

    @classmethod
    def from_content(cls, content: RecordDict) -> Self:
        """Read it (:class:`RecordError` when malformed)."""
        record = content.config_records[CONFIG]
        neighbours = _ints(record, "neighbours")
        return cls(
            _get(record, _ROUND, int),
            _get(record, "index", int),
            neighbours,
            _blobs(record, "share-keys", len(neighbours)),
            _blobs(record, "mask-keys", len(neighbours)),
            _get(record, "threshold", int),
            _get(record, "field-bits", int),
        )


@dataclass(frozen=True)
class MaskAsk:
    """Stage 3: the shares addressed to the device by its neighbours still in."""

    server_round: int
    sources: list[int]
    sealed: list[bytes]

    def to_content(self) -> RecordDict:
        """The message's content."""
        return _ask(
            MASKED_INPUT, self.server_round, {"sources": self.sources, "sealed": self.sealed}
        )

    @classmethod
    def from_content(cls, content: RecordDict) -> Self:
        """Read it (:class:`RecordError` when malformed)."""
        record = content.config_records[CONFIG]
        sources = _ints(record, "sources")
        return cls(_get(record, _ROUND, int), sources, _blobs(record, "sealed", len(sources)))


@dataclass(frozen=True)
class UnmaskAsk:
    """Stage 4: which of the device's neighbours sent masked input (``survivors``: their
    self-mask seed's shares are asked) and which did not (``dropped``: their mask key's)."""

    server_round: int
    survivors: list[int]
    dropped: list[int]

    def to_content(self) -> RecordDict:
        """The message's content."""
        return _ask(
            UNMASK, self.server_round, {"survivors": self.survivors, "dropped": self.dropped}
        )

    @classmethod
    def from_content(cls, content: RecordDict) -> Self:
        """Read it (:class:`RecordError` when malformed)."""
        record = content.config_records[CONFIG]
        return cls(_get(record, _ROUND, int), _ints(record, "survivors"), _ints(record, "dropped"))


def _ask(stage: str, server_round: int, values: dict[str, Any]) -> RecordDict:
    return RecordDict(
        {CONFIG: ConfigRecord({SECAGG_STAGE: stage, _ROUND: int(server_round), **values})}
    )


@dataclass(frozen=True)
class StageReply:
    """What every stage reply carries: its stage and round, the device's CPU seconds on it,
    and why it refused (empty: it did not)."""

    stage: str
    server_round: int
    cpu_s: float = 0.0
    refused: str = ""

    def header(self) -> dict[str, Any]:
        return {
            SECAGG_STAGE: self.stage,
            _ROUND: int(self.server_round),
            _CPU: float(self.cpu_s),
            _REFUSED: self.refused,
        }

    def to_content(self) -> RecordDict:
        """A reply with the header alone (a refusal)."""
        return RecordDict({CONFIG: ConfigRecord(self.header())})

    @classmethod
    def read(cls, content: RecordDict) -> StageReply:
        """The header of a stage reply (:class:`RecordError` when malformed)."""
        stage, server_round = stage_of(content)
        record = content.config_records[CONFIG]
        cpu = float(_get(record, _CPU, (int, float)))
        return StageReply(stage, server_round, cpu, str(_get(record, _REFUSED, str)))


@dataclass(frozen=True)
class ShareKeysReply:
    """Stage 2's answer: one sealed share pair per neighbour (``destinations``)."""

    head: StageReply
    destinations: list[int] = field(default_factory=list)
    sealed: list[bytes] = field(default_factory=list)

    def to_content(self) -> RecordDict:
        record = ConfigRecord(
            {**self.head.header(), "destinations": self.destinations, "sealed": self.sealed}
        )
        return RecordDict({CONFIG: record})

    @classmethod
    def from_content(cls, content: RecordDict) -> Self:
        head = StageReply.read(content)
        record = content.config_records[CONFIG]
        destinations = _ints(record, "destinations")
        return cls(head, destinations, _blobs(record, "sealed", len(destinations)))


@dataclass(frozen=True)
class MaskReply:
    """Stage 3's answer: the masked vector, as little-endian words of the field."""

    head: StageReply
    masked: bytes = b""

    def to_content(self) -> RecordDict:
        return RecordDict({CONFIG: ConfigRecord({**self.head.header(), "masked": self.masked})})

    @classmethod
    def from_content(cls, content: RecordDict) -> Self:
        head = StageReply.read(content)
        return cls(head, _get(content.config_records[CONFIG], "masked", bytes))


@dataclass(frozen=True)
class UnmaskReply:
    """Stage 4's answer: shares of survivors' seeds and of dropped devices' mask keys, each
    list with the node ids it is of."""

    head: StageReply
    seed_of: list[int] = field(default_factory=list)
    seed_shares: list[bytes] = field(default_factory=list)
    key_of: list[int] = field(default_factory=list)
    key_shares: list[bytes] = field(default_factory=list)

    def to_content(self) -> RecordDict:
        record = ConfigRecord(
            {
                **self.head.header(),
                "seed-of": self.seed_of,
                "seed-shares": self.seed_shares,
                "key-of": self.key_of,
                "key-shares": self.key_shares,
            }
        )
        return RecordDict({CONFIG: record})

    @classmethod
    def from_content(cls, content: RecordDict) -> Self:
        head = StageReply.read(content)
        record = content.config_records[CONFIG]
        seed_of, key_of = _ints(record, "seed-of"), _ints(record, "key-of")
        return cls(
            head,
            seed_of,
            _blobs(record, "seed-shares", len(seed_of)),
            key_of,
            _blobs(record, "key-shares", len(key_of)),
        )
