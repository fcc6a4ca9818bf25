"""Secure aggregation's arithmetic and cryptography, which devices and the aggregator share
(SecAgg, Bonawitz et al. 2017; SecAgg+, Bell et al. 2020).

A device's weighted update is flattened (tensors in name order), each coordinate clipped to
``[-range, range]`` and stochastically rounded onto a grid of ``2^bits`` levels shared by
every device (:func:`quantise`). Masking then works modulo ``2^F``, ``F = bits +
bit_length(devices)`` (:func:`field_bits`), so that the sum of every device's levels cannot
wrap; :func:`dequantise_sum` turns the unmasked sum back into floats.

The cryptography is a maintained library's, never this module's own:

- key agreement: X25519 with HKDF-SHA256 (``cryptography``); each device makes two key
  pairs a round, one to encrypt its shares to its neighbours, one to agree mask seeds;
- masks: the ChaCha20 keystream of a 32-byte seed (``cryptography``) read as 64-bit words,
  a PRG. Flower's ``pseudo_rand_gen`` is not used: it folds the seed to 32 bits and draws
  from NumPy's Mersenne Twister, so a mask could be found by trying every seed;
- secret sharing: pycryptodome's Shamir over GF(2^128), as Flower's
  ``secure_aggregation.crypto.shamir`` uses it, and Flower's share plaintext layout
  (``secaggplus_utils``);
- authenticated encryption of shares: Flower's Fernet wrappers (``symmetric_encryption``);
- a device commits to its self-mask seed with SHA-256 (``hashlib``), so that a seed rebuilt
  from tampered shares is caught rather than unmasking to garbage.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import math
import os
import random
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)

__all__ = [
    "KEY_BYTES",
    "NEIGHBOURS_PER_LOG2",
    "REBUILD_TRIES",
    "SEED_BYTES",
    "MaskingError",
    "agree",
    "commitment",
    "dequantise_sum",
    "field_bits",
    "flatten",
    "key_from_seed",
    "mask",
    "neighbourhood_size",
    "new_key_pair",
    "new_seed",
    "open_share",
    "public_of",
    "quantise",
    "rebuild",
    "rebuild_checked",
    "seal_share",
    "self_mask",
    "shares_of",
    "threshold_of",
    "unflatten",
    "word_dtype",
]

#: The automatic neighbourhood: this many neighbours per doubling of the round's devices.
NEIGHBOURS_PER_LOG2 = 3
#: Bytes of an X25519 key and of an agreed key.
KEY_BYTES = 32
#: Bytes of a self-mask seed: 128 bits, one Shamir chunk (the aggregator rebuilds one per
#: device in every sum, and pycryptodome's Shamir costs by the chunk).
SEED_BYTES = 16
_CHUNK = 16  # Shamir over GF(2^128): 16-byte chunks
_NONCE = bytes(16)  # ChaCha20's nonce and counter: each seed masks one vector, once
_PURPOSE_SHARES = b"fedstream secagg shares"
_PURPOSE_MASK = b"fedstream secagg mask"
_PURPOSE_SELF = b"fedstream secagg self mask"
_PURPOSE_KEY = b"fedstream secagg mask key"


class MaskingError(ValueError):
    """A secret, share or vector that does not fit the protocol."""


def field_bits(bits: int, devices: int) -> int:
    """Bits of the field the round masks in: a sum of ``devices`` values below ``2^bits``
    stays below ``2^F``.

    Raises
    ------
    MaskingError
        If the field would not fit 64-bit words.
    """
    width = bits + max(1, devices.bit_length())
    if width > 64:
        raise MaskingError(
            f"secagg-bits {bits} with {devices} devices needs a {width}-bit field; 64 at most"
        )
    return width


def word_dtype(width: int) -> np.dtype:
    """The little-endian words a masked vector of a ``width``-bit field travels in."""
    return np.dtype("<u4") if width <= 32 else np.dtype("<u8")


def flatten(delta: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]]) -> np.ndarray:
    """The tensors of ``shapes`` (in name order) as one float64 vector.

    Raises
    ------
    MaskingError
        If a tensor is missing or of another shape.
    """
    parts = []
    for key in sorted(shapes):
        value = delta.get(key)
        if value is None or tuple(value.shape) != tuple(shapes[key]):
            raise MaskingError(f"tensor {key!r} missing or not of shape {shapes[key]}")
        parts.append(np.asarray(value, np.float64).ravel())
    return np.concatenate(parts) if parts else np.zeros(0)


def unflatten(vector: np.ndarray, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """:func:`flatten` undone: the tensors of ``shapes`` from one vector."""
    out, at = {}, 0
    for key in sorted(shapes):
        size = math.prod(shapes[key])
        out[key] = vector[at : at + size].reshape(shapes[key])
        at += size
    return out


def quantise(
    vector: np.ndarray, value_range: float, bits: int, rng: np.random.Generator
) -> tuple[np.ndarray, int]:
    """Clip each value to ``[-value_range, value_range]`` and round it stochastically (so
    that it is unbiased) to one of ``2^bits`` levels.

    Returns
    -------
    tuple
        The levels (uint64, each in ``[0, 2^bits - 1]``) and how many values were clipped.
    """
    levels = 2**bits - 1
    clipped = int(np.count_nonzero(np.abs(vector) > value_range))
    scaled = (np.clip(vector, -value_range, value_range) + value_range) * (
        levels / (2 * value_range)
    )
    low = np.floor(scaled)
    up = rng.random(scaled.shape) < (scaled - low)
    return np.minimum(low + up, levels).astype(np.uint64), clipped


def rounding_norm(value_range: float, bits: int, size: int) -> float:
    """The largest L2 norm :func:`quantise`'s rounding can add to a vector of ``size``
    values (less than one step of the grid each): what a clipped update must leave room
    for, since the masked sum cannot be clipped again."""
    return float(2 * value_range / (2**bits - 1) * math.sqrt(size))


def dequantise_sum(total: np.ndarray, count: int, value_range: float, bits: int) -> np.ndarray:
    """The float sum of ``count`` quantised vectors from the sum of their levels."""
    levels = 2**bits - 1
    values: np.ndarray = total.astype(np.float64) * (2 * value_range / levels)
    return values - count * value_range


def new_seed() -> bytes:
    """A fresh self-mask seed from the operating system's entropy."""
    return os.urandom(SEED_BYTES)


def commitment(seed: bytes) -> bytes:
    """SHA-256 of a self-mask seed: what a device publishes so that the seed rebuilt from
    its shares can be checked."""
    return hashlib.sha256(seed).digest()


def new_key_pair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair: (private, public), 32 raw bytes each."""
    private = X25519PrivateKey.generate()
    return private.private_bytes_raw(), private.public_key().public_bytes_raw()


def key_from_seed(seed: bytes) -> bytes:
    """The X25519 private key a 16-byte seed stands for (HKDF-SHA256): a device shares the
    seed of its mask key rather than the 32-byte key, one Shamir chunk instead of two."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=_PURPOSE_KEY)
    return hkdf.derive(seed)


def public_of(private: bytes) -> bytes:
    """The public key of an X25519 private key (how a rebuilt key is checked).

    Raises
    ------
    MaskingError
        If ``private`` is not a 32-byte key.
    """
    try:
        return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()
    except ValueError as err:
        raise MaskingError(f"not an X25519 private key: {err}") from err


def agree(private: bytes, public: bytes, purpose: str) -> bytes:
    """The 32-byte key two devices share: X25519 between one's private and the other's
    public key, through HKDF-SHA256 bound to ``purpose`` (``"shares"`` or ``"mask"``).

    Raises
    ------
    MaskingError
        If a key is not a valid X25519 key.
    """
    info = {"shares": _PURPOSE_SHARES, "mask": _PURPOSE_MASK}[purpose]
    try:
        secret = X25519PrivateKey.from_private_bytes(private).exchange(
            X25519PublicKey.from_public_bytes(public)
        )
    except ValueError as err:
        raise MaskingError(f"key agreement failed: {err}") from err
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def self_mask(seed: bytes, length: int, width: int) -> np.ndarray:
    """A device's own mask: :func:`mask` under a key HKDF-SHA256 draws from its self-mask
    seed (bound to its own purpose: never the seed's commitment)."""
    key = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=_PURPOSE_SELF)
    return mask(key.derive(seed), length, width)


def mask(seed: bytes, length: int, width: int) -> np.ndarray:
    """``length`` words of ChaCha20's keystream under the 32-byte ``seed``, reduced to the
    ``width``-bit field (uint64)."""
    encryptor = Cipher(algorithms.ChaCha20(seed, _NONCE), mode=None).encryptor()
    words: np.ndarray = np.frombuffer(encryptor.update(bytes(8 * length)), dtype="<u8")
    words = words.astype(np.uint64)
    return words if width >= 64 else words & np.uint64((1 << width) - 1)


def seal_share(key: bytes, src: int, dst: int, seed_share: bytes, key_share: bytes) -> bytes:
    """One neighbour's shares of a device's two secrets, encrypted and authenticated under
    the pair's key (Fernet), with both node ids inside."""
    plaintext = share_keys_plaintext_concat(src, dst, seed_share, key_share)
    return encrypt(base64.urlsafe_b64encode(key), plaintext)


def open_share(key: bytes, sealed: bytes, src: int, dst: int) -> tuple[bytes, bytes]:
    """:func:`seal_share` undone: (seed share, key share).

    Raises
    ------
    MaskingError
        If the ciphertext fails authentication, or names other nodes than ``src`` and
        ``dst``.
    """
    try:
        plaintext = decrypt(base64.urlsafe_b64encode(key), sealed)
    except Exception as err:  # cryptography's InvalidToken, and malformed input
        raise MaskingError(f"a share from node {src} failed authentication") from err
    got_src, got_dst, seed_share, key_share = share_keys_plaintext_separate(plaintext)
    if (got_src, got_dst) != (src, dst):
        raise MaskingError(f"a share names nodes {got_src} -> {got_dst}, not {src} -> {dst}")
    return seed_share, key_share


def neighbourhood_size(devices: int, asked: int) -> int:
    """How many neighbours each of ``devices`` devices shares its secrets with: ``asked``
    (``secagg-neighbours``) when given, else every other device while that is under
    ``3 log2(devices)``, else the even number at or above it (SecAgg+'s O(log n))."""
    everyone = devices - 1
    if asked > 0:
        return min(everyone, asked)
    k = math.ceil(NEIGHBOURS_PER_LOG2 * math.log2(max(devices, 2)))
    k += k % 2
    return min(everyone, k)


def threshold_of(neighbours: int, fraction: float) -> int:
    """Shares that rebuild a secret: more than half the neighbourhood (so that an
    aggregator lying about who dropped cannot gather both of a device's secrets), and at
    least ``fraction`` of it."""
    return max(neighbours // 2 + 1, math.ceil(fraction * neighbours - 1e-9))


def shares_of(secret: bytes, threshold: int, count: int) -> list[bytes]:
    """``count`` Shamir shares of ``secret`` (a multiple of 16 bytes), any ``threshold`` of
    which rebuild it: each its 4-byte index, then its share of each 16-byte chunk (Flower's
    layout, without the padding block Flower adds to every secret: a third less work for
    a 32-byte key)."""
    if len(secret) % _CHUNK:
        raise MaskingError(f"a secret of {len(secret)} bytes: a multiple of {_CHUNK} is shared")
    shares = [bytearray(i.to_bytes(4, "little")) for i in range(1, count + 1)]
    for at in range(0, len(secret), _CHUNK):
        for index, share in Shamir.split(threshold, count, secret[at : at + _CHUNK], ssss=False):
            shares[index - 1] += share
    return [bytes(s) for s in shares]


def rebuild(shares: Sequence[bytes]) -> bytes:
    """The secret from Shamir shares (:func:`shares_of`).

    Raises
    ------
    MaskingError
        If the shares are malformed, or do not rebuild a secret.
    """
    if not shares or any(len(s) != len(shares[0]) or (len(s) - 4) % _CHUNK for s in shares):
        raise MaskingError("shares of unequal or malformed length")
    indices = [int.from_bytes(s[:4], "little") for s in shares]
    if len(set(indices)) != len(indices) or not all(1 <= i < 2**16 for i in indices):
        raise MaskingError("shares with repeated or impossible indices")
    secret = bytearray()
    for at in range(4, len(shares[0]), _CHUNK):
        try:
            secret += Shamir.combine(
                [(i, s[at : at + _CHUNK]) for i, s in zip(indices, shares, strict=True)],
                ssss=False,
            )
        except ValueError as err:
            raise MaskingError(f"shares do not rebuild a secret: {err}") from err
    return bytes(secret)


#: Subsets of shares tried before a secret counts as not rebuilt (all of them when fewer).
REBUILD_TRIES = 64


def rebuild_checked(
    shares: Sequence[bytes], threshold: int, expected: bytes, kind: str
) -> bytes | None:
    """A secret from ``threshold`` of ``shares`` that checks out against ``expected``:
    for ``kind`` ``seed``, its commitment (:func:`commitment`); for ``key``, the public key
    of the mask key it seeds (:func:`key_from_seed`). Other subsets are tried when one does
    not (a tampered share): all of them when there are few, else the first shares in and
    random others. None with fewer shares than the threshold, or when none tried checks
    out. A top-level function of its arguments, so that worker processes can run it."""
    if len(shares) < threshold:
        return None
    subsets: Iterable[Sequence[bytes]]
    if math.comb(len(shares), threshold) <= REBUILD_TRIES:
        subsets = itertools.combinations(shares, threshold)
    else:
        draw = random.Random(len(shares))
        others = (draw.sample(list(shares), threshold) for _ in range(REBUILD_TRIES - 1))
        subsets = itertools.chain([shares[:threshold]], others)
    for subset in subsets:
        try:
            secret = rebuild(subset)
        except MaskingError:
            continue
        if _checks_out(secret, expected, kind):
            return secret
    return None


def _checks_out(secret: bytes, expected: bytes, kind: str) -> bool:
    if kind == "seed":
        return commitment(secret) == expected
    try:
        return public_of(key_from_seed(secret)) == expected
    except (MaskingError, ValueError):
        return False
