"""The one training engine (on Accelerate) that every stage runs on: pre-training, distillation, fine-tuning.

A stage hands the engine a module whose forward takes a batch and returns `(loss, logs)`; everything the
module owns is trained and checkpointed (e.g. student + projections), anything it merely references (a
frozen teacher) is not. The engine owns the rest: data order, optimizer and schedule, accumulation,
clipping, mixed precision, distributed training, held-out evaluation, atomic checkpoints, exact resume,
metrics (JSON lines + TensorBoard) and the progress bar.

Exact resume: the data order of each epoch is a permutation drawn from (seed, epoch); per-batch randomness
(MLM masks) comes from a generator seeded by (seed, micro-step, process); dropout uses the torch RNG,
which checkpoints save and restore. A resumed run therefore replays the same batches, masks and dropout.

The hot path: the per-batch hook (`prepare_batch`, e.g. MLM masking) runs in the data-loading stage on the CPU
(in `train.num_workers` worker processes: by default none on a CPU, some on CUDA, `machine.loader_plan`), before the
batch moves to the device (pinned on CUDA, copied without blocking the host); a dataset with a
`set_epoch(epoch)` method hears each epoch's number first (static masking picks its pattern from it). Losses and
logs stay tensors until they are logged, so a step needs no host synchronisation; they are checked for
non-finite values at every log, evaluation and checkpoint, before anything is written.
"""

import functools
import json
import math
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import gather_object
from safetensors.torch import load_model, save_model
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm
from transformers import get_scheduler

from biodistil.config import TrainConfig
from biodistil.data.batch import Batch
from biodistil.errors import BiodistilError
from biodistil.io import atomic_directory, read_jsonl, truncate_jsonl
from biodistil.models.dropout import FastDropout, use_fast_dropout
from biodistil.training import checkpoint as ckpt
from biodistil.training.compiling import apply_compile
from biodistil.training.machine import LoaderPlan, loader_plan, resolve_precision, stage_settings, training_device
from biodistil.training.onednn import bound_caches
from biodistil.training.sampling import length_grouped_order
from biodistil.training.threads import StageThreads, announce

PrepareBatch = Callable[[Batch, torch.Generator], Batch]
Collate = Callable[[list[Any]], Batch]


class PreStep(Protocol):
    """An extra update run before each optimizer step, on that step's prepared micro-batches.

    It owns `optimizer`, over module parameters that the main optimizer then leaves alone (e.g. a teacher
    learned by meta-gradients); that optimizer's state is checkpointed with the run and restored on resume.
    It must leave no gradients on the other parameters. `step` is the number of optimizer steps done so far
    (use it to seed any sampling, so a resumed run repeats it). Returns floats to log with the step.
    """

    optimizer: torch.optim.Optimizer

    def __call__(self, model: nn.Module, batches: list[Batch], step: int) -> dict[str, float]: ...


@dataclass
class TrainResult:
    steps: int
    tokens_seen: int
    seconds: float
    tokens_per_second: float
    final_train: dict[str, float]
    final_eval: dict[str, float]
    best_step: int | None = None
    best_score: float | None = None
    peak_gpu_memory_mb: float | None = None  # on CUDA: torch.cuda.max_memory_allocated during `fit`
    earlier_seconds: float = 0.0  # a resumed run: the training time of its segments before the checkpoint resumed
    # what the machine decided for the stage, for its report: `train.precision` and why, what `train.compile` compiled,
    # torch's CPU threads (the first count and each change)
    precision: str | None = None
    compiled: str | None = None
    threads: str | None = None
    dropout: str | None = None
    loader: str | None = None  # `train.num_workers`: the loader workers, pinned and prefetched batches

    @property
    def training_seconds(self) -> float:
        """The run's training time across its segments (this one's and those before the checkpoint it resumed)."""
        return self.seconds + self.earlier_seconds


@dataclass(frozen=True)
class Selection:
    """Model selection on held-out evaluations: keep the best weights; optionally stop early.

    `metric` is a key of the evaluation results; after `patience` evaluations without improvement the run
    stops. At the end the module holds the best weights seen (kept in `<run>/best/` across resumes).
    """

    metric: str
    mode: Literal["max", "min"] = "max"
    patience: int | None = None

    def better(self, value: float, best: float | None) -> bool:
        return best is None or (value > best if self.mode == "max" else value < best)


@dataclass(frozen=True)
class TrainData:
    """What a stage trains on: its dataset and collate function, a per-batch hook run while loading (`prepare`, e.g.
    MLM masking, see `PrepareBatch`) and held-out data, whose mean logs are the default evaluation."""

    train: Dataset
    collate: Collate
    prepare: PrepareBatch | None = None
    held_out: Dataset | None = None


@dataclass(frozen=True)
class HeldOut:
    """How the held-out evaluations every `train.eval_every` steps go: `score(module)` replaces the mean of the
    module's logs on the held-out data (e.g. a dev set's task metric); `selection` keeps the best weights and stops
    early."""

    score: Callable[[nn.Module], dict[str, float]] | None = None
    selection: Selection | None = None

    def active(self, data: TrainData) -> bool:
        return data.held_out is not None or self.score is not None


def make_accelerator(precision: str, run_dir: Path | None = None, tensorboard: bool = False,
                     device: str = "auto") -> Accelerator:
    """An Accelerator on `train.device` (`training.machine.training_device`) with the recipe's precision ('auto':
    bf16 autocast where the hardware computes bf16 natively, `training.machine.resolve_precision`; said once per
    process when it changes). On several processes Accelerate's process group is NCCL on GPUs, gloo on CPUs.
    oneDNN's caches are bounded first (`training.onednn`), for a stage run from Python rather than the CLI."""
    bound_caches()
    target = training_device(device)
    precision, why = resolve_precision(precision, target)
    if os.environ.get("LOCAL_RANK", "0") == "0":
        _say_precision(why)
    if precision == "fp16" and target.type != "cuda":
        raise BiodistilError("train.precision=fp16 needs a GPU; use bf16 or no on CPU")
    _allow_precision(precision)
    log_with = "tensorboard" if tensorboard and run_dir is not None else None
    # the CPU where a GPU is visible, or several processes without one (torchrun / `accelerate launch`): gloo
    force_cpu = target.type == "cpu" and (torch.cuda.is_available() or int(os.environ.get("WORLD_SIZE", "1")) > 1)
    return Accelerator(mixed_precision=precision, log_with=log_with, project_dir=str(run_dir) if run_dir else None,
                       cpu=force_cpu)


@functools.cache
def _say_precision(why: str) -> None:
    """Print the training precision once per process and setting (a pipeline's stages mostly share one)."""
    print(f"Training precision: {why}", flush=True)


def _allow_precision(precision: str) -> None:
    """Accelerate keeps one process-wide state whose mixed precision cannot change, so a stage of a pipeline or a
    study trained under another precision than the one before would be refused: its state is started again (the
    process group, accelerate's PartialState, stays)."""
    current = AcceleratorState._shared_state.get("_mixed_precision")
    if current is not None and current != precision:
        AcceleratorState._reset_state(reset_partial_state=False)


@contextmanager
def accelerate_state_kept() -> Iterator[None]:
    """Accelerate's process-wide state (`AcceleratorState`: device and mixed precision; `GradientState`: the
    dataloaders it follows) put back as it was once a stage that made its own Accelerator ends, so that the next
    stage, or the caller's own code in the same process, starts from the state it had. The process group
    (`PartialState`) stays."""
    kept = {state: dict(state._shared_state) for state in (AcceleratorState, GradientState)}
    try:
        yield
    finally:
        for state, before in kept.items():  # the same dict object: every instance shares it
            state._shared_state.clear()
            state._shared_state.update(before)


class Engine:
    """Trains one module for `cfg.max_steps` optimizer steps, writing into `run_dir`."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, seed: int, accelerator: Accelerator | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.seed = seed
        self.accelerator = accelerator or make_accelerator(cfg.precision, self.run_dir, cfg.tensorboard,
                                                            cfg.device)
        self.state = ckpt.TrainerState()
        self.pre_step: PreStep | None = None
        self._resumed_at: int | None = None  # the step a resumed run continued from
        self.loading = LoaderPlan(0, False, None, "")  # how batches are loaded: decided when `fit` starts
        self.run_dir.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------------------------------- public
    def fit(self, module: nn.Module, data: TrainData, held_out: HeldOut = HeldOut(), resume: bool = False,
            stop_after: int | None = None, pre_step: PreStep | None = None) -> TrainResult:
        """Train on `data`, evaluating as `held_out` says; with `resume`, continue from the run folder's latest
        checkpoint. `stop_after` ends the run early at that step (after a checkpoint), as a job with a time limit
        would. `pre_step` runs an extra update with its own optimizer before every optimizer step (see
        `PreStep`). The stage's process settings (device settings, torch's threads: `train.threads`) hold while it
        trains and are put back after it."""
        acc = self.accelerator
        self.loading = loader_plan(self.cfg.num_workers, acc.device, acc.num_processes)
        with stage_settings(acc.device), StageThreads(self.cfg.threads, acc.num_processes,
                                                      self.loading.workers) as threads:
            announce(threads.line)
            return self._train(module, data, held_out, resume, stop_after, pre_step, threads)

    def _train(self, module: nn.Module, data: TrainData, held_out: HeldOut, resume: bool, stop_after: int | None,
               pre_step: PreStep | None, threads: StageThreads) -> TrainResult:
        acc = self.accelerator
        self._check_data(data.train)
        self.pre_step = pre_step
        self.loss_items = getattr(module, "loss_items", None)
        optimizer = adamw(module, self.cfg, _parameter_ids(pre_step.optimizer) if pre_step else set())
        scheduler = get_scheduler(
            self.cfg.schedule if self.cfg.schedule != "constant" else "constant_with_warmup",
            optimizer, num_warmup_steps=self.cfg.resolved_warmup(), num_training_steps=self.cfg.max_steps,
        )
        model, optimizer = acc.prepare(module, optimizer)
        if acc.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(acc.device)
        compiled = apply_compile(self.cfg.compile, module, acc.device)
        objective = getattr(module, "objective", None)
        if objective is not None:  # the objective owns the KL row kernel and hands it to its losses
            objective.kl_rows = compiled.kl_rows
        if self.cfg.compile is True and acc.is_local_main_process:
            print(f"train.compile {compiled.note}", flush=True)
        dropout = choose_dropout(self.cfg.dropout, module, acc.device)
        if resume:
            self._resume(module, optimizer, scheduler)
        if acc.is_main_process and self.cfg.tensorboard:
            acc.init_trackers("tensorboard")
        data = replace(data, prepare=data.prepare or _unchanged)
        started, tokens_at_start, earlier = time.perf_counter(), self.state.tokens_seen, self.state.train_seconds
        window: dict[str, list[float | torch.Tensor]] = defaultdict(list)
        last_train, last_eval = {}, {}
        bar = tqdm(total=self.cfg.max_steps, initial=self.state.step, unit="step", dynamic_ncols=True,
                   disable=not (acc.is_local_main_process and self.cfg.progress_bar))
        batches = self._batches(data.train, data.collate, data.prepare)
        model.train()
        with StopRequests() as requests:  # Ctrl-C or SIGTERM: stop after this step, with a checkpoint
            while self.state.step < self.cfg.max_steps:
                logs = self._optimizer_step(model, optimizer, scheduler, batches)
                announce(threads.after_step(self.state.step))
                for key, value in logs.items():
                    window[key].append(value)
                bar.update(1)
                stopping = requests.signal is not None or (stop_after is not None and self.state.step >= stop_after)
                evaluating = held_out.active(data) and self._due(self.cfg.eval_every)
                saving = self._due(self.cfg.save_every) or self.state.step == self.cfg.max_steps or stopping
                if self.state.step % self.cfg.log_every == 0 or self.state.step == self.cfg.max_steps or evaluating \
                        or saving:  # a host synchronisation: losses become floats, non-finite ones stop the run
                    rate = (self.state.tokens_seen - tokens_at_start) / max(time.perf_counter() - started, 1e-9)
                    last_train = _window_means(window)
                    bar.set_postfix(loss=f"{last_train['loss']:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
                    if self.state.step % self.cfg.log_every == 0 or self.state.step == self.cfg.max_steps:
                        self._log("train", {**last_train, "lr": scheduler.get_last_lr()[0], "tokens_per_s": rate})
                        window.clear()
                if evaluating:
                    last_eval, patience_out = self._evaluate(module, model, data, held_out)
                    stopping = stopping or patience_out
                if saving or stopping:
                    self.state.train_seconds = round(earlier + time.perf_counter() - started, 3)
                    self._save(module, optimizer, scheduler)
                if stopping:
                    break
        bar.close()
        if requests.signal is not None:
            raise KeyboardInterrupt(f"{signal.Signals(requests.signal).name} at step {self.state.step}")
        if held_out.active(data) and self.cfg.eval_every and not last_eval:
            last_eval, _ = self._evaluate(module, model, data, held_out)
        if held_out.selection is not None:
            self._restore_best(module)
        acc.wait_for_everyone()
        if acc.is_main_process and self.cfg.tensorboard:
            for tracker in acc.trackers:  # not `end_training`: it destroys the process group, still needed after fit
                tracker.finish()
        seconds = time.perf_counter() - started
        tokens = self.state.tokens_seen - tokens_at_start
        peak = round(torch.cuda.max_memory_allocated(acc.device) / 2**20, 1) if acc.device.type == "cuda" else None
        return TrainResult(self.state.step, self.state.tokens_seen, seconds, tokens / max(seconds, 1e-9),
                           last_train, last_eval, self.state.extra.get("best_step"),
                           self.state.extra.get("best_score"), peak,
                           precision=resolve_precision(self.cfg.precision, acc.device)[1], compiled=compiled.note,
                           threads=threads.summary(), dropout=dropout, loader=self.loading.note,
                           earlier_seconds=earlier)

    def _evaluate(self, module, model, data: TrainData, held_out: HeldOut) -> tuple[dict[str, float], bool]:
        """Score the held-out data, log it (once per step: a finished run resumed has it on record already) and,
        with a selection, keep the best weights; returns the scores and whether patience has run out."""
        scores = self._held_out(model, data, held_out)
        if not self._logged("eval"):
            self._log("eval", scores)
        return scores, held_out.selection is not None and self._select(module, scores, held_out.selection)

    def _held_out(self, model, data: TrainData, held_out: HeldOut) -> dict[str, float]:
        if held_out.score is None:
            return self.evaluate(model, data.held_out, data.collate, data.prepare)
        was_training = model.training
        model.eval()
        try:
            return held_out.score(self.accelerator.unwrap_model(model))
        finally:
            model.train(was_training)

    def _select(self, module: nn.Module, scores: dict[str, float], selection: Selection) -> bool:
        """Keep the best weights; return True when patience has run out."""
        if selection.metric not in scores:
            raise BiodistilError(f"Selection metric '{selection.metric}' is not among the evaluation results "
                                 f"{sorted(scores)}")
        extra = self.state.extra
        value = scores[selection.metric]
        if selection.better(value, extra.get("best_score")):
            extra.update(best_score=value, best_step=self.state.step, evals_without_gain=0)
            if self.accelerator.is_main_process:
                unwrapped = self.accelerator.unwrap_model(module)
                atomic_directory(self.run_dir / "best",
                                 lambda folder: save_model(unwrapped, str(folder / "trainable.safetensors")))
            self.accelerator.wait_for_everyone()
        else:
            extra["evals_without_gain"] = extra.get("evals_without_gain", 0) + 1
        return selection.patience is not None and extra["evals_without_gain"] >= selection.patience

    def _restore_best(self, module: nn.Module) -> None:
        best = self.run_dir / "best" / "trainable.safetensors"
        if best.is_file():
            load_model(self.accelerator.unwrap_model(module), str(best))

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, eval_data: Dataset, collate: Collate, prepare: PrepareBatch
    ) -> dict[str, float]:
        """Mean of the module's logs over the held-out set (fixed masks, sharded across processes)."""
        acc = self.accelerator
        was_training = model.training
        model.eval()
        sums: dict[str, torch.Tensor] = {}
        count = torch.zeros((), device=acc.device)
        order = list(range(acc.process_index, len(eval_data), acc.num_processes))
        if self.cfg.eval_batches is not None:
            order = order[: self.cfg.eval_batches * self.cfg.batch_size]
        batches = [(index, order[start:start + self.cfg.batch_size])
                   for index, start in enumerate(range(0, len(order), self.cfg.batch_size))]
        seeds = lambda index: self.seed * 7919 + index * 104729 + acc.process_index  # noqa: E731
        for batch in self._loader(eval_data, batches, collate, prepare, seeds):
            batch = batch.to(acc.device)
            with acc.autocast():
                loss, logs = model(batch)
            for key, value in {"loss": loss, **logs}.items():
                sums[key] = sums.get(key, torch.zeros((), device=acc.device)) + value.detach().float()
            count += 1
        totals = {key: acc.reduce(value, reduction="sum") for key, value in sums.items()}
        count = acc.reduce(count, reduction="sum")
        model.train(was_training)
        return {key: float(value / count.clamp(min=1)) for key, value in totals.items()}

    # ----------------------------------------------------------------------------------------- steps
    def _optimizer_step(self, model, optimizer, scheduler,
                        batches: Iterator[tuple[Batch, int, int | None]]) -> dict[str, Any]:
        """One optimizer step over `grad_accumulation` micro-batches; returns the step's logs as tensors (and the
        pre-step's floats), averaged over the micro-batches, with `grad_norm` (before clipping) when clipping."""
        acc = self.accelerator
        sums: dict[str, Any] = {}
        micro_batches, tokens, items = zip(*(next(batches) for _ in range(self.cfg.grad_accumulation)), strict=True)
        if self.pre_step is not None:
            sums.update(self.pre_step(model, list(micro_batches), self.state.step))
        for micro, (batch, weight) in enumerate(zip(micro_batches, self._loss_weights(items), strict=True)):
            last = micro == self.cfg.grad_accumulation - 1
            with acc.no_sync(model) if not last and acc.num_processes > 1 else nullcontext():
                with acc.autocast():
                    loss, logs = model(batch)
                acc.backward(loss * weight)
            for key, value in {"loss": loss, **logs}.items():
                share = value.detach().float() * weight
                sums[key] = share if key not in sums else sums[key] + share
            self.state.micro_step += 1
        self.state.tokens_seen += sum(tokens) * acc.num_processes
        if self.cfg.max_grad_norm is not None:
            norm = acc.clip_grad_norm_(model.parameters(), self.cfg.max_grad_norm)
            if isinstance(norm, torch.Tensor):
                sums["grad_norm"] = norm.detach().float()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        sums["_step"] = self.state.step  # which step a non-finite loss belongs to (see `_window_means`)
        return sums

    def _loss_weights(self, items: Sequence[int | None]) -> list[float]:
        """Each micro-batch's weight in the step's loss. By default `1 / grad_accumulation`: the step's loss is the
        mean of its micro-batches' losses, and DDP averages it over processes. A module whose loss is a mean over a
        varying number of items (the labelled tokens of a token task) says how many a batch has (`loss_items(batch)`);
        each micro-batch then weighs its share of the items of the whole step on every process (× processes, which
        DDP's average divides out), so the step's loss is the mean over the global batch's items however it is split
        across processes and micro-batches — as Hugging Face's `Trainer` does with `num_items_in_batch`. `items`:
        each micro-batch's count (`_batches` takes it from the host copy), None without `loss_items`."""
        if self.loss_items is None:
            return [1 / self.cfg.grad_accumulation] * len(items)
        acc = self.accelerator
        counts = [float(count) for count in items]
        total = float(acc.reduce(torch.tensor(sum(counts), device=acc.device), reduction="sum")) \
            if acc.num_processes > 1 else sum(counts)
        return [count * acc.num_processes / max(total, 1.0) for count in counts]

    def _batches(self, data: Dataset, collate: Collate,
                 prepare: PrepareBatch) -> Iterator[tuple[Batch, int, int | None]]:
        """Endless stream of this process's prepared batches (on the device), their token counts and the items their
        loss averages over (`loss_items`, else None), starting at
        the saved data position. The n-th batch of the stream is micro-step `micro_step + n`: its hook's generator
        is seeded by (seed, that micro-step, process), wherever the hook runs."""
        acc = self.accelerator
        per_step = self.cfg.batch_size * acc.num_processes
        per_epoch = len(data) // per_step
        micro_step = self.state.micro_step
        seeds = lambda micro: self.seed * 1_000_003 + micro * 7_919 + acc.process_index  # noqa: E731
        while True:
            if hasattr(data, "set_epoch"):
                data.set_epoch(self.state.epoch)
            shards = EpochBatches(self._epoch_order(data, per_step), micro_step, self.state.batch_in_epoch, per_epoch,
                                  per_step, acc.process_index * self.cfg.batch_size, self.cfg.batch_size)
            micro_step += len(shards)
            for batch in self._loader(data, shards, collate, prepare, seeds):
                self.state.batch_in_epoch += 1
                tokens = int(batch.attention_mask.sum())  # counted on the host copy: no device synchronisation
                items = None if self.loss_items is None else self.loss_items(batch)
                yield batch.to(acc.device), tokens, items
            self.state.epoch += 1
            self.state.batch_in_epoch = 0

    def _epoch_order(self, data: Dataset, per_step: int) -> torch.Tensor:
        """This epoch's permutation, drawn from (seed, epoch); length-grouped with `train.group_by_length`."""
        generator = torch.Generator().manual_seed(self.seed + self.state.epoch)
        if not self.cfg.group_by_length:
            return torch.randperm(len(data), generator=generator)
        lengths = [len(data[i]["input_ids"]) for i in range(len(data))]
        return length_grouped_order(lengths, per_step, generator)

    def _loader(self, data: Dataset, batches: Sequence[tuple[int, Sequence[int]]], collate: Collate,
                prepare: PrepareBatch, seeds: Callable[[int], int]) -> DataLoader:
        """A loader over (number, indices) batches that collates and prepares each batch on the CPU (in worker
        processes as `self.loading` says: pinned and prefetched on CUDA), the hook's generator seeded by
        `seeds(number)`. One loader per epoch, its workers not persistent: the dataset hears `set_epoch` before the
        workers copy it, so a persistent worker would keep the last epoch's static masks."""
        plan = self.loading
        # a private generator: creating a loader must not draw from the global RNG that dropout uses
        return DataLoader(_Numbered(data), batch_sampler=_Tagged(batches),
                          collate_fn=_Prepared(collate, prepare, seeds), num_workers=plan.workers,
                          generator=torch.Generator(), pin_memory=plan.pin, prefetch_factor=plan.prefetch)

    # ----------------------------------------------------------------------------------------- setup
    def _check_data(self, data: Dataset) -> None:
        needed = self.cfg.batch_size * self.accelerator.num_processes
        if len(data) < needed:
            raise BiodistilError(f"The training data has {len(data)} examples, fewer than one batch "
                                 f"({self.cfg.batch_size} x {self.accelerator.num_processes} processes); "
                                 "lower train.batch_size or give more data")

    def _due(self, every: int) -> bool:
        return every > 0 and self.state.step % every == 0

    # ----------------------------------------------------------------------------------------- I/O
    def _save(self, module: nn.Module, optimizer, scheduler) -> None:
        acc = self.accelerator
        rng_states = gather_object([ckpt.capture_torch_rng()]) if acc.num_processes > 1 else [ckpt.capture_torch_rng()]
        if acc.is_main_process:
            target = ckpt.checkpoint_dir(self.run_dir, self.state.step)
            ckpt.save_checkpoint(target, acc.unwrap_model(module), optimizer, scheduler, self.state, rng_states,
                                 self._extra_optimizers())
            ckpt.prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints)
        acc.wait_for_everyone()

    def _resume(self, module: nn.Module, optimizer, scheduler) -> None:
        candidates = ckpt.complete_checkpoints(self.run_dir)
        if not candidates:
            raise BiodistilError(f"--resume: no checkpoint in {self.run_dir / 'checkpoints'}")
        for number, folder in enumerate(candidates):
            try:
                self.state = ckpt.load_checkpoint(folder, self.accelerator.unwrap_model(module), optimizer,
                                                  scheduler, self.accelerator.process_index, self._extra_optimizers())
                break
            except ckpt.DamagedCheckpoint as err:
                if number == len(candidates) - 1:
                    raise BiodistilError(f"--resume: no checkpoint of {self.run_dir} can be read; the last one: "
                                         f"{err}. Start the run again in another folder") from None
                print(f"{err}; trying the previous one, {candidates[number + 1].name}", file=sys.stderr, flush=True)
        self._resumed_at = self.state.step
        if self.accelerator.is_main_process:
            print(f"Resuming from {folder} (step {self.state.step})")
            truncate_jsonl(self.run_dir / "metrics.jsonl", self.state.step)  # records after it come again
        self.accelerator.wait_for_everyone()

    def _extra_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"pre_step": self.pre_step.optimizer} if self.pre_step is not None else {}

    def _logged(self, split: str) -> bool:
        """Whether metrics.jsonl holds a `split` record of the current step (only a resumed run's first step can)."""
        path = self.run_dir / "metrics.jsonl"
        if self.state.step != self._resumed_at or not path.is_file():
            return False
        return any(r.get("step") == self.state.step and r.get("split") == split for r in read_jsonl(path))

    def _log(self, split: str, values: dict[str, float]) -> None:
        acc = self.accelerator
        if not acc.is_main_process:
            return
        record = {"step": self.state.step, "split": split, **{k: _round(v) for k, v in values.items()}}
        with (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.cfg.tensorboard:
            acc.log({f"{split}/{k}": v for k, v in values.items()}, step=self.state.step)


class EpochBatches(Sequence):
    """This process's batches of one epoch, (number, indices), made when asked from the epoch's permutation: the
    plan takes the permutation's 8 bytes per example, not a Python list per batch (which grew with the corpus)."""

    def __init__(self, order: torch.Tensor, first_number: int, first_batch: int, per_epoch: int, per_step: int,
                 offset: int, batch_size: int):
        self.order, self.first_number, self.first_batch = order, first_number, first_batch
        self.per_epoch, self.per_step, self.offset, self.batch_size = per_epoch, per_step, offset, batch_size

    def __len__(self) -> int:
        return max(0, self.per_epoch - self.first_batch)

    def __getitem__(self, n: int) -> tuple[int, list[int]]:
        if not 0 <= n < len(self):
            raise IndexError(n)
        start = (self.first_batch + n) * self.per_step + self.offset
        return self.first_number + n, self.order[start:start + self.batch_size].tolist()


class _Tagged:
    """A batch sampler over (number, indices) batches: lists of (number, index) keys, one batch at a time."""

    def __init__(self, batches: Sequence[tuple[int, Sequence[int]]]):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for number, indices in self.batches:
            yield [(number, index) for index in indices]


class _Numbered(Dataset):
    """`data` read by (batch number, index) keys: item = (batch number, example)."""

    def __init__(self, data: Dataset):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, key: tuple[int, int]) -> tuple[int, Any]:
        number, index = key
        return number, self.data[index]


class _Prepared:
    """Collate a numbered batch, then apply the per-batch hook with a generator seeded by its number."""

    def __init__(self, collate: Collate, prepare: PrepareBatch, seeds: Callable[[int], int]):
        self.collate, self.prepare, self.seeds = collate, prepare, seeds

    def __call__(self, items: list[tuple[int, Any]]) -> Batch:
        generator = torch.Generator().manual_seed(self.seeds(items[0][0]))
        return self.prepare(self.collate([example for _, example in items]), generator)


def _unchanged(batch: Batch, _generator: torch.Generator) -> Batch:
    return batch


class StopRequests:
    """SIGINT (Ctrl-C) and SIGTERM (schedulers, `docker stop`) while training: the first asks the loop to stop after
    the current optimizer step, with a checkpoint, so that `--resume` continues exactly; a second one interrupts at
    once. Handlers are installed only in the main thread and restored on exit."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def _handle(self, number: int, frame: Any) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt(signal.Signals(number).name)
        self.signal = number
        print(f"\n{signal.Signals(number).name}: stopping after this step with a checkpoint (send it again to stop "
              "at once, without one)", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def _window_means(window: dict[str, list[float | torch.Tensor]]) -> dict[str, float]:
    """The logged values of the steps since the last log, averaged (one host synchronisation). A non-finite loss
    stops the run here, naming its step, before anything is evaluated or saved."""
    steps = window.get("_step", [])
    means = {}
    for key, values in window.items():
        if key == "_step":
            continue
        if key == "loss":
            losses = torch.stack(values).tolist()
            bad = [(step, loss) for step, loss in zip(steps, losses, strict=True) if not math.isfinite(loss)]
            if bad:
                raise BiodistilError(f"Loss became {bad[0][1]} at step {bad[0][0]}; lower train.learning_rate or "
                                     "check the data")
            means[key] = sum(losses) / len(losses)
        else:
            tensors = [v for v in values if isinstance(v, torch.Tensor)]
            total = sum(float(v) for v in values if not isinstance(v, torch.Tensor))
            means[key] = (total + (float(torch.stack(tensors).sum()) if tensors else 0.0)) / len(values)
    return means


def adamw(module: nn.Module, cfg: TrainConfig, exclude: set[int] | frozenset[int] = frozenset()) -> torch.optim.AdamW:
    """AdamW over the module's trainable parameters (those of `exclude`, a pre-step's, left out), weight decay on
    matrices only."""
    decay, no_decay = [], []
    for _, param in sorted(module.named_parameters(), key=lambda item: item[0]):
        if param.requires_grad and id(param) not in exclude:
            (no_decay if param.ndim < 2 else decay).append(param)
    if not decay and not no_decay:
        raise BiodistilError("Nothing to train: the module has no trainable parameters")
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # one fused kernel for the whole update, on CUDA and on the CPU: PyTorch's CPU default is a loop over the tensors
    # with a temporary per operation, 4.9-5.5x slower for the demo's 17 M student (bench/research/optimizer.py)
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=cfg.adam_betas, eps=cfg.adam_eps, fused=True)


def choose_dropout(setting: str, module: nn.Module, device: torch.device) -> str:
    """`train.dropout` applied to `module` (biodistil.models.dropout); returns the report's note."""
    if device.type != "cpu":
        return "PyTorch's (on a GPU)"
    if setting == "torch":
        return "torch: PyTorch's"
    use_fast_dropout(module)
    count = sum(isinstance(child, FastDropout) for child in module.modules())
    return f"fast: {count} nn.Dropout module(s) with 15-bit-field masks; attention-probability dropout PyTorch's"


def _parameter_ids(optimizer: torch.optim.Optimizer) -> set[int]:
    return {id(param) for group in optimizer.param_groups for param in group["params"]}


def _round(value: float) -> float:
    return value if not math.isfinite(value) else float(f"{value:.6g}")
