"""A device's side of secure aggregation (SecAgg+): what it keeps after training, and its
answers to the three stages that follow (:mod:`edge_client.wire.secagg_records`).

After training (:func:`prepare_input`) the device weighs its update, clips each coordinate
to the shared range, quantises it and keeps it in its device state (a ClientApp process
lives one message; the state is in the buffer file, or a simulated device's
``context.state``), with two fresh X25519 key pairs and a self-mask seed. Its reply carries
only the public keys, a commitment to the seed, and its weight.

Then (:func:`serve_stage`, no torch):

- ``share-keys``: Shamir-share the seed and the mask key among its neighbours, each share
  sealed to one neighbour;
- ``masked-input``: open the shares addressed to it (one that fails authentication refuses
  the stage), then send ``x + PRG(seed) + sum(+-PRG(mask seed with each neighbour in))``
  modulo the field, and forget ``x``;
- ``unmask``: give the shares of its surviving neighbours' seeds and of its dropped
  neighbours' mask keys, never both for one neighbour, once a round.

Anything out of order (a stage it was not asked for yet, another round's message, a second
unmask) is refused with the reason, and the aggregator counts it.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Context, Message

from edge_client.runtime.device_open import node_of, open_device
from edge_client.runtime.device_state import DeviceState
from edge_client.wire import masking
from edge_client.wire.clipping import clip_to
from edge_client.wire.records import RecordError, RoundPlan
from edge_client.wire.run_config import RunSettings
from edge_client.wire.secagg_records import (
    MASKED_INPUT,
    SHARE_KEYS,
    UNMASK,
    Advert,
    MaskAsk,
    MaskReply,
    ShareKeysAsk,
    ShareKeysReply,
    StageReply,
    UnmaskAsk,
    UnmaskReply,
    charge_cpu,
    stage_of,
)

__all__ = ["prepare_input", "serve_stage", "weight_of"]

log = logging.getLogger(__name__)

# The device's progress through a round, in its state's "stage".
_TRAINED, _SHARED, _MASKED, _DONE = "trained", "shared", "masked", "done"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _raw(text: str) -> bytes:
    return base64.b64decode(text)


def weight_of(plan: RoundPlan, num_examples: int, local_steps: int) -> float:
    """What a device multiplies its update by (``secagg-weighting``): 1 / its steps
    (fednova, adaptive), its samples x the plan's scale, at most 1 (fedavg), or 1 (DP's equal
    weights)."""
    if plan.secagg_weighting == "steps":
        return 1.0 / max(1, local_steps)
    if plan.secagg_weighting == "samples":
        return min(1.0, num_examples * plan.secagg_weight_scale) or 1e-12
    return 1.0


def prepare_input(
    state: DeviceState,
    run_id: int,
    plan: RoundPlan,
    delta: Mapping[str, np.ndarray],
    weight: float,
    rng: np.random.Generator,
    min_peers: int = 1,
) -> Advert:
    """Keep the round's quantised update and fresh secrets in the device state; return the
    advert the training reply carries. ``min_peers``: the fewest neighbours, and surviving
    neighbours at unmasking, the device takes part with (its node config's
    ``secagg-min-peers``: an aggregator may shrink a neighbourhood to learn more of one
    device's update).

    Under differential privacy the update is clipped to the plan's ``dp-clip`` first and,
    local DP, noised (from the operating system's entropy) before it is weighed.
    """
    shapes = {k: v.shape for k, v in delta.items()}
    values = dict(delta)
    if plan.dp_clip > 0:
        # Clipped short of the clip by what rounding onto the grid can add: the quantised
        # update, all the sum is made of, must stay within the clip the noise covers.
        size = sum(int(np.prod(s)) for s in shapes.values())
        room = plan.dp_clip - masking.rounding_norm(plan.secagg_range, plan.secagg_bits, size)
        if room <= 0:
            raise masking.MaskingError(
                f"secagg-bits {plan.secagg_bits} leave no room under dp-clip {plan.dp_clip:g} "
                f"for a model of {size} values: raise secagg-bits"
            )
        values, _fits = clip_to(values, room)
        if plan.dp_noise > 0:
            noise = np.random.default_rng()
            values = {
                k: v + noise.normal(0.0, plan.dp_noise * plan.dp_clip, v.shape)
                for k, v in values.items()
            }
    vector = masking.flatten(values, shapes) * weight
    levels, clipped = masking.quantise(vector, plan.secagg_range, plan.secagg_bits, rng)
    share_private, share_public = masking.new_key_pair()
    mask_seed = masking.new_seed()  # the mask key's: shared, and rebuilt if the device drops
    mask_public = masking.public_of(masking.key_from_seed(mask_seed))
    seed = masking.new_seed()
    doc = {
        "run": run_id,
        "round": plan.server_round,
        "stage": _TRAINED,
        "share-private": _b64(share_private),
        "mask-seed": _b64(mask_seed),
        "seed": _b64(seed),
        "min-peers": int(min_peers),
    }
    state.save_secure_round(doc, levels.astype("<u8").tobytes())
    if clipped:
        log.info(
            "secure aggregation: %d of %d coordinates clipped to secagg-range %g",
            clipped,
            levels.size,
            plan.secagg_range,
        )
    return Advert(share_public, mask_public, masking.commitment(seed), weight, clipped)


def serve_stage(msg: Message, context: Context) -> Message:
    """Answer a ``query.secagg`` message: the stage it names, from the device's state."""
    started = time.process_time()
    try:
        stage, server_round = stage_of(msg.content)
    except RecordError as err:
        reply = StageReply("", 0, refused=f"malformed: {err}").to_content()
        return Message(reply, reply_to=msg)
    settings = RunSettings.from_run_config(context.run_config)
    node = node_of(context, settings, server_round)
    with open_device(context, settings, node, server_round) as (_store, state):
        doc = state.secure_round()
        head = StageReply(stage, server_round)
        refusal = _out_of_order(doc, stage, server_round, context.run_id)
        if refusal:
            content = StageReply(stage, server_round, refused=refusal).to_content()
        else:
            try:
                content = _STAGES[stage](msg, doc, state, head)
            except (RecordError, masking.MaskingError) as err:
                log.warning("secure aggregation, round %d, %s: %s", server_round, stage, err)
                reason = "share-auth" if "authentication" in str(err) else "malformed"
                content = StageReply(stage, server_round, refused=reason).to_content()
    spent = time.process_time() - started
    charge_cpu(content, spent)
    return Message(content, reply_to=msg)


def _out_of_order(doc: Mapping[str, Any], stage: str, server_round: int, run_id: int) -> str:
    """Why a stage message cannot be served now ('' when it can)."""
    if doc.get("run") != run_id or doc.get("round") != server_round:
        return "no-secrets"  # it did not train this round, or the state is another round's
    expected = {SHARE_KEYS: _TRAINED, MASKED_INPUT: _SHARED, UNMASK: _MASKED}[stage]
    return "" if doc.get("stage") == expected else "wrong-stage"


def _share_keys(msg: Message, doc: dict[str, Any], state: DeviceState, head: StageReply) -> Any:
    ask = ShareKeysAsk.from_content(msg.content)
    count = len(ask.neighbours)
    if ask.index in ask.neighbours or len(set(ask.neighbours)) != count:
        raise RecordError("malformed", "the neighbours repeat, or name this device")
    # The plan comes from the aggregator the masks protect against: the device holds it to
    # the protocol's floors itself (Bell et al. 2020; Flower's secaggplus_mod does too).
    private = _raw(doc["share-private"])
    own = {
        masking.public_of(private),
        masking.public_of(masking.key_from_seed(_raw(doc["mask-seed"]))),
    }
    keys = [*ask.share_keys, *ask.mask_keys]
    if len(set(keys)) != len(keys) or own & set(keys):
        return _refuse(head, "duplicate-keys", "neighbours' public keys repeat, or are its own")
    if not count // 2 < ask.threshold <= count:
        # below a majority, an aggregator that lies about who dropped can gather both of a
        # neighbour's secrets from disjoint sets of devices
        return _refuse(head, "low-threshold", f"threshold {ask.threshold} of {count} neighbours")
    if count < int(doc.get("min-peers", 1)):
        return _refuse(head, "too-few-neighbours", f"{count} neighbours, fewer than its minimum")
    seeds = masking.shares_of(_raw(doc["seed"]), ask.threshold, count)
    key_shares = masking.shares_of(_raw(doc["mask-seed"]), ask.threshold, count)
    # each neighbour's share key, kept for opening what it sends in the next stage
    agreed = [masking.agree(private, public, "shares") for public in ask.share_keys]
    sealed = [
        masking.seal_share(agreed[i], ask.index, dst, seeds[i], key_shares[i])
        for i, dst in enumerate(ask.neighbours)
    ]
    doc.update(
        stage=_SHARED,
        index=ask.index,
        threshold=ask.threshold,
        width=ask.width,
        neighbours={
            str(n): [_b64(k), _b64(m)]
            for n, k, m in zip(ask.neighbours, agreed, ask.mask_keys, strict=True)
        },
    )
    state.save_secure_round(doc)
    return ShareKeysReply(head, list(ask.neighbours), sealed).to_content()


def _masked_input(msg: Message, doc: dict[str, Any], state: DeviceState, head: StageReply) -> Any:
    ask = MaskAsk.from_content(msg.content)
    neighbours: dict[str, list[str]] = doc["neighbours"]
    index, width = int(doc["index"]), int(doc["width"])
    if len(set(ask.sources)) != len(ask.sources) or any(
        str(s) not in neighbours for s in ask.sources
    ):
        raise RecordError("malformed", "shares from devices that are not its neighbours")
    if len(ask.sources) < int(doc["threshold"]):
        return StageReply(head.stage, head.server_round, refused="too-few-neighbours").to_content()
    held = {}
    for src, sealed in zip(ask.sources, ask.sealed, strict=True):
        key = _raw(neighbours[str(src)][0])  # agreed in the share-keys stage
        seed_share, key_share = masking.open_share(key, sealed, src, index)
        held[str(src)] = [_b64(seed_share), _b64(key_share)]
    levels = np.frombuffer(state.secure_input(), dtype="<u8").astype(np.uint64)
    masked = levels + masking.self_mask(_raw(doc["seed"]), levels.size, width)
    mask_private = masking.key_from_seed(_raw(doc["mask-seed"]))
    for src in ask.sources:
        seed = masking.agree(mask_private, _raw(neighbours[str(src)][1]), "mask")
        pair = masking.mask(seed, levels.size, width)
        masked = masked + pair if index < src else masked - pair  # wraps modulo 2^64
    masked &= np.uint64((1 << width) - 1) if width < 64 else np.uint64(2**64 - 1)
    doc.update(stage=_MASKED, held=held)
    state.save_secure_round(doc, b"")  # the update itself is no longer kept
    words = masked.astype(masking.word_dtype(width)).tobytes()
    return MaskReply(head, words).to_content()


def _unmask(msg: Message, doc: dict[str, Any], state: DeviceState, head: StageReply) -> Any:
    ask = UnmaskAsk.from_content(msg.content)
    held: dict[str, list[str]] = doc.get("held", {})
    both = set(ask.survivors) & set(ask.dropped)
    # Once a round, answered or refused (asked again, it says no); the round's secrets are
    # erased from the device state either way, the shares it answers with kept in memory.
    answer = {str(n): held[str(n)] for n in (*ask.survivors, *ask.dropped) if str(n) in held}
    state.save_secure_round(_spent(doc))
    if both:  # the aggregator would learn a device's seed and mask key: its update
        log.warning("secure aggregation: asked for both secrets of %s; refused", sorted(both))
        return StageReply(head.stage, head.server_round, refused="both-secrets").to_content()
    listed = [*ask.survivors, *ask.dropped]
    if len(set(listed)) != len(listed) or {str(n) for n in listed} != set(held):
        # The survivors and the dropped split exactly the neighbours whose shares it holds:
        # a list that leaves some out can tell each helper a different story.
        return _refuse(head, "not-the-neighbourhood", f"{sorted(listed)} against {sorted(held)}")
    floor = max(int(doc["threshold"]), int(doc.get("min-peers", 1)))
    if len(ask.survivors) < floor:
        # Told that most neighbours dropped, a device would hand over their mask keys: with a
        # few such lies an aggregator rebuilds one device's every mask (Flower refuses too).
        return _refuse(head, "too-few-survivors", f"{len(ask.survivors)} survivors, floor {floor}")
    return UnmaskReply(
        head,
        list(ask.survivors),
        [_raw(answer[str(n)][0]) for n in ask.survivors],
        list(ask.dropped),
        [_raw(answer[str(n)][1]) for n in ask.dropped],
    ).to_content()


def _spent(doc: dict[str, Any]) -> dict[str, Any]:
    """The round's record once unmasking was asked: its stage done, its secrets (the
    self-mask seed, the keys, the shares held) gone."""
    keep = ("run", "round", "index", "threshold", "width", "min-peers")
    return {**{k: doc[k] for k in keep if k in doc}, "stage": _DONE}


def _refuse(head: StageReply, reason: str, detail: str) -> Any:
    """A stage the device refuses to serve as asked: ``reason`` goes to the aggregator (its
    count), ``detail`` to the device's log."""
    log.warning(
        "secure aggregation, round %d, %s refused: %s", head.server_round, head.stage, detail
    )
    return StageReply(head.stage, head.server_round, refused=reason).to_content()


_STAGES = {SHARE_KEYS: _share_keys, MASKED_INPUT: _masked_input, UNMASK: _unmask}
