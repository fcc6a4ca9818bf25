"""Local training from the buffer: wait policy, prequential evaluation, K steps at batch b,
steady-state timing. What is trained, on which loss, is the run's
:class:`~edge_client.task.interface.Task`."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch
from torch import nn
from torch.optim.sgd import sgd

from edge_client.runtime.buffer import BufferStore, SampleBuffer
from edge_client.runtime.injection.mixing import draw_pooled, mix_into, planned_mix
from edge_client.task.interface import EVAL_CHUNK, Classification, Scores, Task, evaluate
from edge_client.task.preprocess import Preprocessor
from edge_client.wire.constants import DIVERGED_LOSS_RATIO
from edge_client.wire.frames import SampleBatch
from edge_client.wire.records import RoundPlan

__all__ = [
    "LocalSGD",
    "TrainResult",
    "diverged",
    "pick_device",
    "probe_step_times",
    "step_sizes",
    "train_local",
]

POLL_S = 0.05


@dataclass(frozen=True)
class TrainResult:
    """What one round of local training did."""

    num_examples: int
    batch_size: int
    local_steps: int
    compute_s: float  # steady-state compute (incl. emulated slowdown), scaled to all steps
    step_s: float  # median steady-state seconds per step
    wait_s: float
    train_loss: float
    lr: float = 0.0  # the learning rate it trained with
    inject_used: int = 0  # samples of num_examples that came from the injection pool
    fresh: int = 0  # own samples trained on, each counted once (max-passes: fewer than b*K)
    taken: SampleBatch | None = field(default=None, repr=False)  # own samples consumed
    evaluated: Scores | None = None  # the received model on the own samples, before training
    eval_s: float = 0.0  # seconds that scoring took
    take_s: float = 0.0  # seconds taking and preparing the samples (after waiting)
    train_s: float = 0.0  # wall seconds of the K steps (warm-up, slowdown included)
    first_loss: float = math.nan  # the first step's: the model as received, before any step
    # Under a plan's time spread: (batch, median seconds per step) of each step size
    step_timings: tuple[tuple[int, float], ...] = ()


def diverged(train_loss: float, first_loss: float | None) -> bool:
    """Whether a round's training diverged: its loss is not finite, or above
    :data:`~edge_client.wire.constants.DIVERGED_LOSS_RATIO` times ``first_loss``, the first
    loss the device measured in the run (None, or not above 0: no bound but finiteness)."""
    if not math.isfinite(train_loss):
        return True
    if first_loss is None or not math.isfinite(first_loss) or first_loss <= 0:
        return False
    return train_loss > DIVERGED_LOSS_RATIO * first_loss


def pick_device() -> torch.device:
    """CUDA (e.g. a Jetson), else Apple MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class LocalSGD:
    """SGD with momentum, as ``torch.optim.SGD`` computes it, through torch's functional
    form (:func:`torch.optim.sgd.sgd`, the function ``SGD.step`` calls).

    Why not ``torch.optim.SGD`` itself: constructing any ``torch.optim`` optimizer imports
    ``torch._dynamo`` (a guard against compilation), 1.3-1.5 s of CPU on this 2-core
    machine and more on a Raspberry Pi, in every ClientApp process, for a compiler local
    training never uses. The functional form runs the same update on the same tensors, so
    the weights are the same to the bit.
    """

    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0):
        self.params = [p for p in params if p.requires_grad]
        self.lr = lr
        self.momentum = momentum
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        """Drop the gradients (as ``Optimizer.zero_grad()`` does by default)."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of the parameters that have a gradient."""
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        buffers = [self.buffers[i] for i in live]
        sgd(
            [self.params[i] for i in live],
            [cast(torch.Tensor, self.params[i].grad) for i in live],
            buffers,  # filled in place with the new momentum buffers
            weight_decay=0.0,
            momentum=self.momentum,
            lr=self.lr,
            dampening=0.0,
            nesterov=False,
            maximize=False,
        )
        if self.momentum != 0:
            for i, buffer in zip(live, buffers, strict=True):
                self.buffers[i] = buffer


def _sgd_step(
    model: nn.Module,
    opt: LocalSGD,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    task: Task,
    device: torch.device,
    slowdown: float,
    penalty: Callable[[], torch.Tensor] | None = None,
) -> tuple[float, float]:
    """One timed SGD step on inputs ``x`` and targets ``y`` by ``task``'s loss: its loss and
    seconds. ``slowdown`` > 1 stretches the step's wall time to that many times as long (a
    slower device, emulated)."""
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = task.loss(model(x), y)
    if penalty is not None:
        loss = loss + penalty()
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    if slowdown > 1.0:
        time.sleep(elapsed * (slowdown - 1.0))
        elapsed *= slowdown
    return float(loss.item()), elapsed


def probe_step_times(
    model: nn.Module,
    shape: tuple[int, ...],
    num_classes: int,
    batches: list[int],
    steps: int,
    *,
    task: Task | None = None,
    slowdown: float = 1.0,
    device: torch.device | None = None,
) -> list[float]:
    """Median seconds of one SGD step of ``model`` at each batch, with the prequential
    scoring of its samples (the controller's first timings, before any round has been
    trained: what a round's reply gives it, :meth:`~edge_client.wire.records.ReplyMetrics.costs`).

    Inputs are random samples of ``shape`` with random labels below ``num_classes``, made
    into inputs and targets by ``task`` (classification by default): the step's cost does
    not depend on the values.
    The model is trained on them, so pass a copy that is thrown away afterwards. One extra
    step per batch warms up and is not counted; the scoring is timed on one chunk of
    :data:`~edge_client.task.interface.EVAL_CHUNK` samples, after an untimed one.
    """
    task = task or Classification()
    device = device or torch.device("cpu")
    model.to(device).train()
    opt = LocalSGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    medians = []
    for b in batches:
        x, y = task.targets(
            torch.randn(b, *shape, generator=gen),
            torch.randint(0, num_classes, (b,), generator=gen),
        )
        x, y = x.to(device), y.to(device)
        times = [
            _sgd_step(model, opt, x, y, task=task, device=device, slowdown=slowdown)[1]
            for _ in range(steps + 1)
        ]
        medians.append(float(np.median(times[1:])))  # the first warmed up
    per_sample = _scoring_s(model, shape, num_classes, task, device, gen) / EVAL_CHUNK
    return [t + per_sample * b for t, b in zip(medians, batches, strict=True)]


def _scoring_s(
    model: nn.Module,
    shape: tuple[int, ...],
    num_classes: int,
    task: Task,
    device: torch.device,
    gen: torch.Generator,
) -> float:
    """Seconds :func:`evaluate` takes over one chunk of random samples (the mean of two
    timed passes after an untimed one); the model is left in train mode."""
    x = torch.randn(EVAL_CHUNK, *shape, generator=gen).numpy()
    y = torch.randint(0, num_classes, (EVAL_CHUNK,), generator=gen).numpy()
    times = []
    for _ in range(3):
        began = time.perf_counter()
        evaluate(task, model, x, y, device)
        times.append(time.perf_counter() - began)
    model.train()
    return float(np.mean(times[1:]))


def _gather(store: SampleBuffer, plan: RoundPlan) -> int:
    """Wait per the plan's wait rule; return the samples per step to use."""
    # a buffer that cannot grow meanwhile (a virtual device's) is not waited for
    need = plan.samples_to_wait_for() if store.arriving else 0
    deadline = time.monotonic() + plan.deadline_s
    fill = store.fill
    while fill < need and time.monotonic() < deadline:
        time.sleep(POLL_S)
        fill = store.fill
    return min(plan.batch_size, fill * plan.max_passes // plan.local_steps)


@dataclass(frozen=True)
class _Round:
    """A round's samples, taken and prepared: own per step (``own``) and pooled (``mixed``).

    ``own_x`` holds the K steps' own samples in training order: the fresh ones shuffled
    (its first ``fresh``, each sample once), then, under ``max-passes``, more shuffled
    passes over them until the K steps are filled."""

    data: SampleBatch  # the own samples taken from the buffer
    own: int
    mixed: int
    own_x: np.ndarray  # preprocessed
    own_y: np.ndarray
    fresh: int  # the own samples trained on, each counted once (the first pass)
    pooled: SampleBatch | None


def _take(
    store: SampleBuffer,
    plan: RoundPlan,
    batch: int,
    pool: BufferStore | None,
    rng: np.random.Generator | None,
    preprocessor: Preprocessor | None,
) -> _Round:
    """Take the round's own samples from the buffer and its pool samples, as planned; update
    and apply the ``preprocessor`` on the own ones."""
    k_steps = plan.local_steps
    mixed = planned_mix(plan.inject_mix, batch, pool)
    # Every own sample the steps can use; fewer when the stream brought fewer, but at least
    # 1 / max-passes of them (the batch was sized so). Settled when the reply is ready.
    data = store.take((batch - mixed) * k_steps, hold=True)
    own = min(batch - mixed, len(data) * plan.max_passes // k_steps)
    fresh = min(len(data), own * k_steps)
    pooled = draw_pooled(pool, mixed, k_steps, rng)
    # Local epochs over the round's samples, each shuffled: a stream arrives in the order
    # things happen (minutes of one activity), and K steps in that order would each see
    # one class. One epoch unless the stream brought fewer than b*K (max-passes > 1).
    order = _epochs(rng or np.random.default_rng(plan.server_round), fresh, own * k_steps)
    own_x, own_y = data.x[:fresh][order], data.y[:fresh][order]
    if preprocessor is not None:
        preprocessor.update(own_x[:fresh])  # the first epoch: each fresh sample once
        own_x = preprocessor(own_x)
    return _Round(data, own, mixed, own_x, own_y, fresh, pooled)


def _epochs(rng: np.random.Generator, fresh: int, total: int) -> np.ndarray:
    """Indices of ``total`` training samples drawn from ``fresh`` ones: shuffled passes
    over all of them, the last cut short (each sample at most once more than another)."""
    if fresh == 0:
        return np.zeros(0, dtype=np.int64)
    passes = -(-total // fresh)
    return np.concatenate([rng.permutation(fresh) for _ in range(passes)])[:total]


def _tensors(
    taken: _Round,
    steps: int,
    task: Task,
    device: torch.device,
    preprocessor: Preprocessor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The K steps' batches, one after the other: each step's own samples then its pool
    samples, as ``task``'s inputs and targets on ``device``."""
    x_np = taken.own_x.reshape(steps, taken.own, *taken.data.x.shape[1:])
    y_np = taken.own_y.reshape(steps, taken.own)
    x_np, y_np = mix_into(x_np, y_np, taken.pooled, taken.mixed, preprocessor)
    x, y = task.targets(
        torch.from_numpy(np.ascontiguousarray(x_np.reshape(-1, *x_np.shape[2:]))),
        torch.from_numpy(np.ascontiguousarray(y_np.reshape(-1))),
    )
    return x.to(device), y.to(device)


def step_sizes(batch: int, steps: int, spread: float) -> list[int]:
    """Each local step's batch: ``batch`` every step, or under a time ``spread`` alternately
    ``(1 - spread) * batch`` and ``(1 + spread) * batch`` (an odd last step at ``batch``), so
    that the steps train ``batch * steps`` samples either way.

    The first step warms up and is not timed, so the alternation starts at the larger size:
    each size is then timed at least once from four steps on. Fewer steps, or a spread that
    rounds to no difference, train every step at ``batch``.
    """
    low = max(1, round(batch * (1.0 - spread)))
    if spread <= 0 or steps < 4 or low >= batch:
        return [batch] * steps
    high = 2 * batch - low
    sizes = [high if k % 2 == 0 else low for k in range(steps - steps % 2)]
    return sizes + [batch] * (steps % 2)


def _steps(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    plan: RoundPlan,
    *,
    sizes: list[int],
    lr: float,
    task: Task,
    device: torch.device,
    slowdown: float,
) -> tuple[dict[int, list[float]], list[float]]:
    """Train the plan's K SGD steps, step ``k`` on the next ``sizes[k]`` samples (momentum
    0.9, FedProx's proximal term when ``proximal_mu`` > 0); each step's loss, and the
    seconds of every step but the first (warm-up; the only one when K = 1) by step size."""
    model.to(device).train()
    global_params = [p.detach().clone() for p in model.parameters()]
    opt = LocalSGD(model.parameters(), lr=lr, momentum=0.9)

    def proximal() -> torch.Tensor:  # FedProx: mu/2 * ||w - w_global||^2
        pairs = zip(model.parameters(), global_params, strict=True)
        distance = cast(torch.Tensor, sum(((p - g) ** 2).sum() for p, g in pairs))
        return plan.proximal_mu / 2 * distance

    times: dict[int, list[float]] = {}
    losses: list[float] = []
    start = 0
    for k, size in enumerate(sizes):
        xb, yb = x[start : start + size], y[start : start + size]
        start += size
        loss, elapsed = _sgd_step(
            model,
            opt,
            xb,
            yb,
            task=task,
            device=device,
            slowdown=slowdown,
            penalty=proximal if plan.proximal_mu > 0 else None,
        )
        if k > 0 or len(sizes) == 1:
            times.setdefault(size, []).append(elapsed)
        losses.append(loss)
    return times, losses


def train_local(
    model: nn.Module,
    store: SampleBuffer,
    plan: RoundPlan,
    *,
    task: Task | None = None,
    preprocessor: Preprocessor | None = None,
    slowdown: float = 1.0,
    device: torch.device | None = None,
    pool: BufferStore | None = None,
    rng: np.random.Generator | None = None,
) -> TrainResult:
    """Take ``b * K`` samples from the buffer, score the received model on them
    (prequential evaluation), then train ``K`` SGD steps at batch ``b`` on ``task``'s loss
    (classification by default), over the taken samples in an order shuffled by ``rng``
    (a stream's order is the order things happened: one class for minutes). Under the
    plan's ``max_passes`` P > 1, a stream that brought fewer than ``b * K`` samples (but at
    least ``b * K / P``) is not waited for: the steps go over the samples there are in up
    to P shuffled passes (local epochs over the round's window; each sample at most once
    more than another), and the model is scored on each sample once.

    With ``wait`` the device blocks until ``b*K`` samples are buffered (up to the deadline);
    with ``adapt`` it trains on what is there, lowering its batch but never below ``b_min``
    (it waits for ``b_min*K`` samples if needed), scaling its learning rate by the batch it
    trains over the planned one (linear scaling rule). Step times exclude the first (warm-up)
    step; ``slowdown`` > 1 really stretches each step's wall time to emulate a slower device.
    Under the plan's ``time_spread`` the steps alternate two sizes around the batch
    (:func:`step_sizes`) and each size is timed (``step_timings``).
    With a ``pool`` of injected samples and ``plan.inject_mix`` > 0, each batch holds
    ``round(mix * b)`` samples drawn from the pool (not consumed) and the rest from the buffer
    (:mod:`edge_client.runtime.injection.mixing`).

    Prequential evaluation: before the first step, ``model`` as received is scored on the
    device's own samples it is about to train on (never on pool samples), so no sample is
    scored by a model that has trained on it. A ``preprocessor`` is first updated with the
    own samples' features, then applied to every sample (own and pooled) before scoring
    and training.

    Returns
    -------
    TrainResult
        With ``num_examples == 0`` when not even one sample per step arrived in time.
    """
    # The parts (wait, take, eval, train) are consecutive spans of one clock, so that they
    # add up to the call: a pause between them (a garbage collection, a busy core) lands in
    # a part, not in a gap the round's breakdown cannot name.
    t_wait = time.perf_counter()
    task = task or Classification()
    device = device or torch.device("cpu")
    batch = _gather(store, plan)
    t_take = time.perf_counter()
    wait_s = t_take - t_wait
    if batch < 1:
        return TrainResult(0, 0, 0, 0.0, 0.0, wait_s, math.nan)
    k_steps = plan.local_steps
    taken = _take(store, plan, batch, pool, rng, preprocessor)
    t_eval = time.perf_counter()
    # test, then train: on the fresh samples, each once
    evaluated = evaluate(
        task, model, taken.own_x[: taken.fresh], taken.own_y[: taken.fresh], device
    )
    t_train = time.perf_counter()  # batches, optimizer and the K steps
    batch = taken.own + taken.mixed
    # Linear scaling rule: a batch smaller than planned (a starved stream under `adapt`, or
    # the deadline) trains at the plan's rate scaled by the batch actually trained.
    lr = plan.lr * min(1.0, batch / plan.batch_size) if plan.batch_size > 0 else plan.lr
    x, y = _tensors(taken, k_steps, task, device, preprocessor)
    sizes = step_sizes(batch, k_steps, plan.time_spread)
    times, losses = _steps(
        model, x, y, plan, sizes=sizes, lr=lr, task=task, device=device, slowdown=slowdown
    )
    # medians: robust to the odd scheduler hiccup
    medians = {b: float(np.median(t)) for b, t in times.items()}
    spread = sorted(b for b in medians if b != batch)  # the sizes of a spread round
    timings = tuple((b, medians[b]) for b in spread)
    # a spread's two sizes straddle the batch evenly: its step time is their mean
    step_s = float(np.mean([medians[b] for b in spread])) if spread else medians[batch]
    train_loss = float(np.mean(losses))
    train_s = time.perf_counter() - t_train
    return TrainResult(
        num_examples=batch * plan.local_steps,
        batch_size=batch,
        local_steps=plan.local_steps,
        compute_s=step_s * plan.local_steps,
        step_s=step_s,
        wait_s=wait_s,
        train_loss=train_loss,
        lr=lr,
        inject_used=taken.mixed * k_steps,
        fresh=taken.fresh,
        taken=taken.data,
        evaluated=evaluated,
        eval_s=t_train - t_eval,
        take_s=t_eval - t_take,
        train_s=train_s,
        first_loss=losses[0],
        step_timings=timings,
    )
