"""Throughput and peak memory of distillation against plain MLM training of the same student, on the same batches.

    python bench/throughput.py [--teacher-layers 6 --hidden 384 --heads 6 --vocab 30522 --seq 128 --batch 16]
    python bench/throughput.py --only live-all --teacher-layers 4 --hidden 256 --heads 4 --vocab 8000 --batch 32

Measures, in one process, on identical batches (the same blocks under the same static masks) and the same student
(the teacher's every other layer), each step = reading and collating the batch + forward/backward + AdamW step:
  mlm          plain MLM of the student (logits only at the masked positions);
  live-all     live distillation, DistilBERT's triple loss 2·MLM + 5·T²·KL + cosine(last hidden), KL at every
               position: the teacher runs on the batch (inference mode, `teacher.dtype`: auto = bf16 where the
               hardware has it);
  live-masked  the same with the KL at the masked positions only;
  cache-head   distillation from a teacher cache (built once beforehand, not timed): batches read from memory-mapped
               Arrow shards; the teacher's head (the rest of the teacher dropped) forms its exact logits from the
               stored last hidden state at the masked positions; KL there + cosine;
  cache-top-k  the same from a cache of the teacher's top-k logits and tail draws: top-k KL + cosine, no teacher;
  peer-all     (asked for with --modes or --only) the peer: Hugging Face's DistilBERT distiller step, re-typed
               (`PeerStep`: float32, nothing compiled, both models' logits at every position, the KL's rows picked by
               `masked_select`), the same triple loss on the same batches; peer-masked: its KL at the masked
               positions (`restrict_ce_to_mask`); the optimizer is the engine's AdamW in every mode. `--only
               peer-all` against `--only live-all` compares the peak RSS of two processes that do the same work.
The modes run alternately, one step each per round, so that machine load falls on all of them alike; tokens/s is the
median over the rounds, and a mode's ratio to plain MLM the median over the rounds of its tokens/s divided by plain
MLM's in the same round (on a shared machine whose speed drifts, a steadier figure than the ratio of the medians).
Peak memory: the largest resident set size sampled (every millisecond) during each mode's steps; the process's own
peak RSS (ru_maxrss) and its RSS after every measured round with the growth per round (the least-squares slope: a
round is one step of every mode), which a process whose memory is flat has near 0; with --only MODE the process runs
that mode alone, so its peak and growth per step are the figures to compare with another program's; a cache mode
then has its cache built by a child process first, as a run finds it built after `biodistil cache-teacher` (the
build's own peak, the teacher's logits over whole batches, is not the training's).
Weights are random: speed does not depend on them. It also prints the CPU's model and the flags that decide
the dtypes (the teacher's: `teacher.dtype: auto`, said with its reason), the student's precision and compile setting,
each mode's estimated GFLOP/s (`flops_per_token`) and its FLOP bound (the ratio to plain MLM it would have at plain
MLM's FLOP/s: above it, a mode computes its extra work more efficiently than the student's own step), the median
milliseconds of each phase of its step (reading and collating the batch, forward, backward, optimizer) and the
machine's own ceiling: a 2048² float32 and bfloat16 matmul measured in the same process. The last line is JSON.
`--student-precision`, `--compile` and `--teachers` say what they add in `--help`.
"""

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import tempfile
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch
from torch import nn
from transformers import BertConfig, BertForMaskedLM

from biodistil.config import MaskingConfig, ObjectiveConfig, TermConfig, TrainConfig
from biodistil.data.batch import AsBatch
from biodistil.data.masking import MaskingVocabulary, StaticMaskedBlocks, collate_masked_blocks
from biodistil.evaluation.bench import PeakRSS, current_rss, matmul_flops
from biodistil.losses.distillation import compiled_kl_rows
from biodistil.methods.masked_lm import MaskedLMModule
from biodistil.methods.objective import Objective
from biodistil.models.families import head_only
from biodistil.models.student import student_from_teacher_layers
from biodistil.teachers.masked_lm_cache import Cache, CacheReader, CacheSpec, MaskedLMOutputs, build_cache
from biodistil.teachers.signal import CachedTeacher, OnlineTeacher
from biodistil.training.compiling import CompileChoice, apply_compile
from biodistil.training.engine import adamw
from biodistil.training.machine import cpu_line, dtype_note, resolve_precision, teacher_dtype

MASKING = MaskingConfig(duplication=1)
MODES = ("mlm", "live-all", "live-masked", "cache-head", "cache-top-k")
TEACHER_MODES = MODES[1:]
PEER_MODES = ("peer-all", "peer-masked")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher-layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=64)
    parser.add_argument("--tail-samples", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=6, help="measured rounds (one step of every mode each)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    parser.add_argument("--teacher-dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    parser.add_argument("--only", choices=MODES + PEER_MODES,
                        help="run this mode alone (its peak RSS is the process's)")
    parser.add_argument("--modes", nargs="+", choices=MODES + PEER_MODES,
                        help="run these modes (default: all but the peer's)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--student-precision", choices=("auto", "no", "bf16"), default="auto",
                        help="bf16: every mode's student step under bf16 autocast (`train.precision: bf16`), plus "
                             "the mode `mlm-fp32` (plain MLM in float32, the same batches) for the bf16 speed-up; "
                             "auto (default): as `train.precision: auto` trains on this device — bf16 where it is "
                             "native, else float32 (no, also for fp16, which the bench has no path for)")
    parser.add_argument("--compile", choices=("auto", "true", "false", "rows"), default="auto",
                        help="as `train.compile`: auto = the KL's row kernel where a C++ compiler is found; true = "
                             "also the student's encoder and the live teacher's; false = nothing; rows = the KL's "
                             "row kernel alone, on any device; the compile happens in the unmeasured warm-up "
                             "rounds and its seconds are printed")
    parser.add_argument("--teachers", type=int, choices=(1, 2), default=1,
                        help="2: each teacher mode also with two teachers (`<mode>-x2`: a second random teacher "
                             "of the same shape, live or from its own cache; the logit KL on their mixture, from "
                             "top-k caches one KL per teacher), plus `forward-2` (the second teacher's forward "
                             "alone): two against one teacher's step time, and live, against the one-teacher step "
                             "plus the second forward")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after the measurement, profile N more rounds (torch.profiler) and print each mode's "
                             "N most expensive operators")
    args = parser.parse_args(argv)
    if args.student_precision == "auto":
        chosen = resolve_precision("auto", torch.device(args.device))[0]
        args.student_precision = chosen if chosen == "bf16" else "no"
    return args


class PhaseClock:
    """Wall time of the phases of one step (data, forward, backward, optimizer), appended to `record` per phase; with
    a `sampler`, also each phase's peak resident set size (appended to `peaks`)."""

    def __init__(self, record: dict[str, list[float]], device: torch.device, sampler: "PeakRSS | None" = None,
                 peaks: dict[str, list[int]] | None = None):
        self.record, self.device, self.last = record, device, time.perf_counter()
        self.sampler, self.peaks = sampler, peaks

    def lap(self, phase: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.record[phase].append(now - self.last)
        self.last = now
        if self.sampler is not None and self.peaks is not None and self.sampler.watching:
            self.peaks[phase].append(self.sampler.take())


def blocks_and_vocab(args) -> tuple[list[dict], MaskingVocabulary]:
    generator = torch.Generator().manual_seed(0)
    special = torch.zeros(args.vocab, dtype=torch.bool)
    special[:5] = True
    vocab = MaskingVocabulary(mask_id=4, special=special, word_start=torch.ones(args.vocab, dtype=torch.bool))
    count = args.batch * (args.warmup + args.repeats + args.profile)
    ids = torch.randint(5, args.vocab, (count, args.seq), generator=generator)
    ids[:, 0], ids[:, -1] = 2, 3
    return [{"input_ids": row.tolist()} for row in ids], vocab


def objective_config(positions: str | None, combine: str = "mixture") -> ObjectiveConfig:
    if positions is None:
        return ObjectiveConfig(temperature=1.0, terms=[TermConfig(loss="mlm")])
    return ObjectiveConfig(temperature=2.0, combine=combine, terms=[
        TermConfig(loss="mlm", weight=2.0), TermConfig(loss="logit_kl", weight=5.0, positions=positions),
        TermConfig(loss="hidden_cosine")])


def bench_teacher(args, seed: int = 0) -> BertForMaskedLM:
    """The random teacher of every mode (the same weights in every process: seeded); `seed` 1: the second one."""
    torch.manual_seed(seed)
    return BertForMaskedLM(BertConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                      num_hidden_layers=args.teacher_layers, num_attention_heads=args.heads,
                                      intermediate_size=4 * args.hidden,
                                      max_position_embeddings=max(512, args.seq)))


def teacher_cache(folder: Path, args, logits: str, dtype: torch.dtype, blocks: int, seed: int = 0) -> Cache:
    spec = CacheSpec(
        teacher=f"bench-{seed}", teacher_dtype=str(dtype).removeprefix("torch."), teacher_layers=args.teacher_layers,
        width=args.hidden, tokenizer="bench", corpus="bench", block_size=args.seq, masking=MASKING.model_dump(),
        top_k=args.top_k if logits == "top_k" else 0, tail_samples=args.tail_samples if logits == "top_k" else 0,
        temperature=2.0, hidden_layers=(args.teacher_layers,), logits=logits, shard_blocks=256, blocks=blocks,
    )
    return Cache(folder, spec)


def build_teacher_cache(folder: Path, args, logits: str, seed: int = 0) -> None:
    """Run the teacher over every block once and store what `logits` asks for (the cache a run finds built)."""
    device = torch.device(args.device)
    dtype = teacher_dtype(args.teacher_dtype, device)
    teacher = bench_teacher(args, seed).to(device, dtype=dtype).eval()
    blocks, vocab = blocks_and_vocab(args)
    cache = teacher_cache(folder, args, logits, dtype, len(blocks), seed)
    build_cache(cache, teacher, lambda b: blocks[b]["input_ids"], vocab, MASKING, [0], args.batch, 0, progress=False)


def cached_signal(folder: Path, args, logits: str, teacher, dtype: torch.dtype, blocks: int,
                  separate: bool, seed: int = 0) -> CachedTeacher:
    """The cached teacher of a cache mode (slot `seed`: the second teacher's is slot 1); with `separate` the cache is
    built by a child process, so that this process's peak memory is that of a run which finds its cache built (as
    `distill` does after `cache-teacher`)."""
    if separate:
        child = multiprocessing.get_context("spawn").Process(target=build_teacher_cache,
                                                             args=(folder, args, logits, seed))
        child.start()
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"building the teacher cache failed (exit code {child.exitcode})")
    else:
        build_teacher_cache(folder, args, logits, seed)
    reader = CacheReader(teacher_cache(folder, args, logits, dtype, blocks, seed), [0])
    return CachedTeacher(MaskedLMOutputs(reader, teacher if logits == "head" else None), slot=seed)


HEAD_ROWS = {"mlm": 0.15, "mlm-fp32": 0.15, "live-all": 1.0, "live-masked": 0.15, "cache-head": 0.15,
             "cache-top-k": 0.15, "peer-all": 1.0, "peer-masked": 1.0}  # the peer forms every row's logits


def flops_per_token(mode: str, student: BertConfig, teacher: BertConfig, seq: int) -> dict[str, float]:
    """Estimated FLOPs per token of one training step (Kaplan et al.'s count): a layer's forward is 2·12·d² (Q, K,
    V, O and the 4d feed-forward) + 2·2·s·d (attention scores and values); the MLM head's 2·(d² + d·V) at the rows a
    term forms (15% masked; every row for the KL at every position); training is 3× the forward. The teacher: its
    forward (live), its head at the masked rows (head cache), nothing (top-k cache)."""
    def layers(cfg: BertConfig) -> float:
        return cfg.num_hidden_layers * (24 * cfg.hidden_size ** 2 + 4 * seq * cfg.hidden_size)

    def head(cfg: BertConfig) -> float:
        return 2 * (cfg.hidden_size ** 2 + cfg.hidden_size * cfg.vocab_size)

    if mode == "forward-2":  # the second teacher's forward alone (KL at every position)
        return {"student": 0.0, "teacher": layers(teacher) + head(teacher)}
    base, teachers = mode.removesuffix("-x2"), 2 if mode.endswith("-x2") else 1
    rows = HEAD_ROWS[base]
    teacher_flops = {"mlm": 0.0, "mlm-fp32": 0.0, "cache-top-k": 0.0, "cache-head": rows * head(teacher)}.get(
        base, layers(teacher) + rows * head(teacher))
    return {"student": 3 * (layers(student) + rows * head(student)), "teacher": teachers * teacher_flops}


def profile_modes(modes: list[str], step, first: int, rounds: int, device: torch.device) -> None:
    """Each mode's `rounds` steps (batches from `first` on) under torch.profiler: its most expensive operators by
    self CPU time (on a GPU: by self device time, the kernels), to see where one mode's time goes that another's does
    not."""
    from torch.profiler import ProfilerActivity, profile

    gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if gpu else [ProfilerActivity.CPU]
    for mode in modes:
        with profile(activities=activities) as profiler:
            for index in range(first, first + rounds):
                step(mode, index)
            if gpu:
                torch.cuda.synchronize()
        key = "self_device_time_total" if gpu else "self_cpu_time_total"
        print(f"--- {mode}: {rounds} steps, operators by {key.removesuffix('_total').replace('_', ' ')}")
        print(profiler.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=60))


def measure(args: argparse.Namespace) -> dict:
    """Run the measurement `args` describe (see `parse`) in this process; returns the result `main` prints."""
    device = torch.device(args.device)
    teacher = bench_teacher(args)
    student = student_from_teacher_layers(teacher).to(device)
    peer_only = args.only in PEER_MODES  # the peer as it ships: float32, nothing compiled
    dtype = torch.float32 if peer_only else teacher_dtype(args.teacher_dtype, device)
    teacher.to(device, dtype=dtype).eval()
    blocks, vocab = blocks_and_vocab(args)
    masked = StaticMaskedBlocks(blocks, vocab, MASKING)
    collate = AsBatch(partial(collate_masked_blocks, pad_id=0))
    modes = [args.only] if args.only else list(args.modes or MODES)
    if args.student_precision == "bf16" and not args.only:
        modes.append("mlm-fp32")
    models = nn.Module()  # what a stage's module holds: the student and the online teacher
    models.student, models.teacher = student, teacher
    if peer_only:
        compiled = CompileChoice("nothing (the peer's step, eager)")
    elif args.compile == "rows":
        compiled = CompileChoice("rows: the vocabulary KL's row kernel (TorchInductor)", compiled_kl_rows())
    else:
        compiled = apply_compile({"auto": "auto", "true": True, "false": False}[args.compile], models, device)
    workdir = tempfile.TemporaryDirectory()
    signals = {"mlm": None, "mlm-fp32": None, "live-all": OnlineTeacher(teacher), "live-masked": OnlineTeacher(teacher)}
    data = {mode: (masked, collate) for mode in [*signals, *PEER_MODES]}
    for mode, logits in (("cache-head", "head"), ("cache-top-k", "top_k")):
        if mode in modes:
            folder = Path(workdir.name) / logits
            signals[mode] = cached_signal(folder, args, logits, teacher, dtype, len(blocks), args.only is not None)
            data[mode] = signals[mode].data(masked, collate)
    second = None
    if args.teachers == 2:
        second = bench_teacher(args, seed=1).to(device, dtype=dtype).eval()
        modes += two_teacher_modes(modes, signals, data, second, args, dtype, len(blocks), Path(workdir.name))
    if args.only == "cache-head":
        head_only(teacher)  # the rest of the teacher leaves memory
    elif args.only == "cache-top-k":
        teacher.to("meta")  # no teacher in memory while the student trains from the cache
    positions = {"mlm": None, "mlm-fp32": None, "live-all": "all", "live-masked": "masked", "cache-head": "masked",
                 "cache-top-k": "masked"}
    modules = {}
    peer_teacher = None  # the peer's teacher in float32, as it ships: a copy where biodistil's is bf16
    if set(modes) & set(PEER_MODES):
        peer_teacher = teacher if dtype == torch.float32 else bench_teacher(args).to(device).eval()
    for mode in modes:
        base = mode.removesuffix("-x2")
        if mode in PEER_MODES:
            modules[mode] = (PeerStep(student, peer_teacher, mode.removeprefix("peer-")),
                             adamw(student, TrainConfig(learning_rate=1e-5)))
            continue
        if mode == "forward-2":
            modules[mode] = (SecondForward(second, Objective(objective_config("all"), student, second)), None)
            continue
        teachers = None if positions[base] is None else [teacher, second] if mode.endswith("-x2") else teacher
        combine = "per_teacher" if base == "cache-top-k" else "mixture"
        objective = Objective(objective_config(positions[base], combine), student, teachers,
                              teacher_weights=(0.5, 0.5))
        objective.kl_rows = compiled.kl_rows  # as the engine hands it to a stage's objective
        module = MaskedLMModule(student, objective, signals[mode]).train()
        optimizer = adamw(module, TrainConfig(learning_rate=1e-5))  # the engine's optimizer
        modules[mode] = (module, optimizer)

    phases: dict[str, dict[str, list[float]]] = {mode: defaultdict(list) for mode in modes}
    phase_peaks: dict[str, dict[str, list[int]]] = {mode: defaultdict(list) for mode in modes}
    sampler = PeakRSS()
    before_steps = current_rss()  # imports, models, optimizers and data, before any step

    def step(mode: str, index: int) -> int:
        module, optimizer = modules[mode]
        dataset, collate_fn = data[mode]
        clock = PhaseClock(phases[mode], device, sampler if device.type == "cpu" else None, phase_peaks[mode])
        batch = collate_fn([dataset[i] for i in range(index * args.batch, (index + 1) * args.batch)])
        batch = batch.to(device)
        clock.lap("data")
        if optimizer is None:  # the second teacher's forward alone
            module(batch)
            clock.lap("forward")
            return int(batch.attention_mask.sum())
        bf16 = args.student_precision == "bf16" and mode != "mlm-fp32" and mode not in PEER_MODES
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = module(batch)
        clock.lap("forward")
        loss.backward()
        clock.lap("backward")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.lap("optimizer")
        return int(batch.attention_mask.sum())

    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    peaks: dict[str, int] = dict.fromkeys(modes, 0)
    after_rounds: list[int] = []  # the process's RSS after each measured round
    warmup_seconds = 0.0
    for index in range(args.warmup + args.repeats):
        if index > args.warmup:
            after_rounds.append(current_rss())
        for mode in modes:
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            sampler.start()
            started = time.perf_counter()
            tokens = step(mode, index)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else sampler.stop()
            sampler.watching = False
            if index < args.warmup:
                warmup_seconds += seconds
            else:
                rates[mode].append(tokens / seconds)
                peaks[mode] = max(peaks[mode], peak)

    after_rounds.append(current_rss())
    measured = slice(args.warmup, args.warmup + args.repeats)
    phase_ms = {mode: {phase: round(1000 * statistics.median(times[measured]), 1) for phase, times in laps.items()}
                for mode, laps in phases.items()}
    if args.profile:
        profile_modes(modes, step, args.warmup + args.repeats, args.profile, device)
    tokens_per_s = {mode: statistics.median(values) for mode, values in rates.items()}
    result = {
        "device": str(device), "threads": torch.get_num_threads(), "load_1min": os.getloadavg()[0],
        "teacher": f"{args.teacher_layers} x {args.hidden}, {dtype}".replace("torch.", ""),
        "student_layers": student.config.num_hidden_layers, "vocab": args.vocab, "batch": f"{args.batch} x {args.seq}",
        "top_k": args.top_k, "tail_samples": args.tail_samples, "rounds": args.repeats,
        "tokens_per_s": {mode: round(rate) for mode, rate in tokens_per_s.items()},
        "peak_memory_mb": {mode: round(peak / 2**20) for mode, peak in peaks.items()},
    }
    if "mlm" in tokens_per_s:
        result["ratio_to_mlm"] = {
            mode: round(statistics.median(a / b for a, b in zip(values, rates["mlm"], strict=True)), 3)
            for mode, values in rates.items()
        }
    result["process_max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    result.update(rss_growth(after_rounds))
    flops = {mode: flops_per_token(mode, student.config, teacher.config, args.seq) for mode in modes}
    result["gflops"] = {mode: round(tokens_per_s[mode] * sum(flops[mode].values()) / 1e9, 1) for mode in modes}
    result["flop_bound_ratio"] = {  # the ratio to plain MLM if every mode ran at plain MLM's FLOP/s
        mode: round(sum(flops["mlm"].values()) / sum(flops[mode].values()), 3) for mode in modes} \
        if "mlm" in flops else {}
    ceilings = {name: matmul_flops(dtype, device, repeats=5) for name, dtype in (("float32", torch.float32),
                                                                                ("bfloat16", torch.bfloat16))}
    result["ceiling_gflops"] = {name: round(flops / 1e9, 1) for name, (flops, _) in ceilings.items()}
    result["ceiling_side"] = {name: side for name, (_, side) in ceilings.items()}
    result["cpu"] = cpu_line() if device.type == "cpu" else str(device)
    result["teacher_dtype_choice"] = dtype_note(args.teacher_dtype, dtype, device)
    result["student_precision"] = "bf16 autocast" if args.student_precision == "bf16" else "float32"
    result["phase_ms"] = phase_ms
    if device.type == "cpu":  # where the peak is reached: RSS before the first step, then each phase's peak
        result["rss_before_steps_mb"] = round(before_steps / 2**20)
        result["phase_peak_mb"] = {mode: {phase: round(max(values) / 2**20) for phase, values in peaks.items()}
                                   for mode, peaks in phase_peaks.items()}
    result["compile"] = f"{compiled.note} (warm-up rounds, the compile included: {warmup_seconds:.0f} s)"
    if args.teachers == 2:
        result["two_teachers"] = two_teacher_costs(rates)
    if "mlm-fp32" in rates:
        result["bf16_speedup"] = round(statistics.median(
            a / b for a, b in zip(rates["mlm"], rates["mlm-fp32"], strict=True)), 3)
    workdir.cleanup()
    return result


class PeerStep(nn.Module):
    """Hugging Face's DistilBERT distiller step, re-typed (transformers' examples/research_projects/distillation/
    distiller.py, `Distiller.step`, MLM mode, as it runs on a CPU: float32, no compile): the student's and the
    teacher's logits at every position, the rows of every non-padding position (`all`) or of the masked ones
    (`masked`: its `restrict_ce_to_mask`) selected by `masked_select`, then 5·T²·KLDiv(batchmean) + 2·MLM CE +
    1·cosine embedding loss of the last hidden states at the non-padding positions, T = 2."""

    def __init__(self, student: nn.Module, teacher: nn.Module, positions: str, temperature: float = 2.0):
        super().__init__()
        self.student, self.positions, self.temperature = student, positions, temperature
        self.teacher = [teacher]  # not a submodule: its parameters stay out of the optimizer

    def forward(self, batch) -> tuple[torch.Tensor, dict]:
        ids, attention, labels = batch.input_ids, batch.attention_mask, batch.labels
        student = self.student(input_ids=ids, attention_mask=attention, output_hidden_states=True)
        with torch.no_grad():
            teacher = self.teacher[0](input_ids=ids, attention_mask=attention, output_hidden_states=True)
        s_logits, t_logits, temperature = student.logits, teacher.logits, self.temperature
        rows = (labels > -1) if self.positions == "masked" else attention.bool()
        mask = rows.unsqueeze(-1).expand_as(s_logits)
        s_slct = torch.masked_select(s_logits, mask).view(-1, s_logits.size(-1))
        t_slct = torch.masked_select(t_logits, mask).view(-1, s_logits.size(-1))
        loss_ce = nn.KLDivLoss(reduction="batchmean")(nn.functional.log_softmax(s_slct / temperature, dim=-1),
                                                       nn.functional.softmax(t_slct / temperature, dim=-1))
        loss = 5.0 * loss_ce * temperature ** 2
        loss = loss + 2.0 * nn.CrossEntropyLoss(ignore_index=-100)(s_logits.view(-1, s_logits.size(-1)),
                                                                    labels.view(-1))
        s_hidden, t_hidden = student.hidden_states[-1], teacher.hidden_states[-1]
        hidden_mask = attention.bool().unsqueeze(-1).expand_as(s_hidden)
        s_hidden = torch.masked_select(s_hidden, hidden_mask).view(-1, s_hidden.size(-1))
        t_hidden = torch.masked_select(t_hidden, hidden_mask).view(-1, s_hidden.size(-1))
        target = s_hidden.new(s_hidden.size(0)).fill_(1)
        loss = loss + nn.CosineEmbeddingLoss(reduction="mean")(s_hidden, t_hidden, target)
        return loss, {}


class SecondForward:
    """The second teacher's forward of a live mode alone (what its terms request, under inference mode)."""

    def __init__(self, teacher, objective: Objective):
        self.signal, self.objective = OnlineTeacher(teacher), objective

    def __call__(self, batch) -> None:
        masks = {"all": batch.attention_mask.bool(), "masked": batch.labels != -100}
        self.signal.get_signal(batch, self.objective.teacher_request(), self.objective.logit_positions(masks, True))


def two_teacher_modes(modes: list[str], signals: dict, data: dict, second, args, dtype: torch.dtype, blocks: int,
                      workdir: Path) -> list[str]:
    """The `-x2` twin of each teacher mode in `modes` (both teachers' signals, the second in slot 1; a cache mode's
    second cache built like the first) and `forward-2` where a live mode runs; their signals and data added."""
    added = []
    for mode in [mode for mode in modes if mode in TEACHER_MODES]:
        twin = f"{mode}-x2"
        if mode.startswith("live"):
            signals[twin], data[twin] = [signals[mode], OnlineTeacher(second, slot=1)], data[mode]
        else:
            logits = "head" if mode == "cache-head" else "top_k"
            other = cached_signal(workdir / f"{logits}-2", args, logits, second, dtype, blocks, args.only is not None,
                                  seed=1)
            signals[twin], data[twin] = [signals[mode], other], other.data(*data[mode])
        added.append(twin)
    if any(mode.startswith("live") for mode in modes):
        added.append("forward-2")
        data["forward-2"] = data["live-all" if "live-all" in modes else "live-masked"]
    return added


def two_teacher_costs(rates: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per teacher mode: the two-teacher step's time over the one-teacher step's (median over rounds) and, live, over
    the one-teacher step plus the second teacher's forward (time per token = 1 / tokens per second)."""
    costs = {}
    for twin in [mode for mode in rates if mode.endswith("-x2")]:
        one, two = rates[twin.removesuffix("-x2")], rates[twin]
        entry = {"two_over_one": round(statistics.median(a / b for a, b in zip(one, two, strict=True)), 3)}
        if twin.startswith("live") and "forward-2" in rates:
            entry["two_over_one_plus_forward"] = round(statistics.median(
                (1 / b) / (1 / a + 1 / f) for a, b, f in zip(one, two, rates["forward-2"], strict=True)), 3)
        costs[twin] = entry
    return costs


def rss_growth(after_rounds: list[int]) -> dict:
    """The process's RSS after each measured round (MiB) and its growth per round: the least-squares slope over the
    rounds (a round is one step of each mode; with --only, one step), steadier than last minus first where freed
    memory comes and goes."""
    mb = [value / 2**20 for value in after_rounds]
    slope = statistics.linear_regression(range(len(mb)), mb).slope if len(mb) > 1 else 0.0
    return {"rss_after_round_mb": [round(value) for value in mb], "rss_growth_mb_per_round": round(slope, 2)}


def show(result: dict, args: argparse.Namespace) -> None:
    """Print a measurement's lines and, last, its JSON."""
    tokens_per_s, peaks = result["tokens_per_s"], result["peak_memory_mb"]
    print(f"{result['device']} ({result['threads']} threads, load {result['load_1min']:.2f}); teacher "
          f"{result['teacher']}, student {result['student_layers']} layers, vocab {args.vocab}, batch "
          f"{result['batch']}; median of {args.repeats} alternated rounds")
    print(f"CPU: {result['cpu']}. {result['teacher_dtype_choice']} Student: {result['student_precision']}; compile: "
          f"{result['compile']}. Matmul ceiling: {result['ceiling_gflops']['float32']:,.0f} GFLOP/s float32 "
          f"({result['ceiling_side']['float32']}²), {result['ceiling_gflops']['bfloat16']:,.0f} GFLOP/s bfloat16 "
          f"({result['ceiling_side']['bfloat16']}²)")
    for mode in tokens_per_s:
        ratio = f"  {result['ratio_to_mlm'][mode]:.2f} x mlm (FLOP bound {result['flop_bound_ratio'][mode]:.2f})" \
            if "ratio_to_mlm" in result else ""
        print(f"  {mode:12s} {tokens_per_s[mode]:10,.0f} tokens/s  peak {peaks[mode]:8,} MiB{ratio}"
              f"  ~{result['gflops'][mode]:,.0f} GFLOP/s  ms: " + ", ".join(
                  f"{phase} {ms:,.1f}" for phase, ms in result["phase_ms"][mode].items()))
    if "phase_peak_mb" in result:
        print(f"peak RSS by phase (MiB; {result['rss_before_steps_mb']:,} before the first step, models and data "
              "loaded): " + "; ".join(f"{mode} " + ", ".join(f"{phase} {mb:,}" for phase, mb in peaks.items())
                                      for mode, peaks in result["phase_peak_mb"].items()))
    print(f"process: peak RSS {result['process_max_rss_mb']:,} MiB (ru_maxrss; without --only, a cache mode's build "
          f"included), RSS {result['rss_after_round_mb'][0]:,} MiB after the first measured round, "
          f"{result['rss_after_round_mb'][-1]:,} after the last: {result['rss_growth_mb_per_round']:+.2f} MiB a round")
    if "bf16_speedup" in result:
        print(f"bf16 student: {result['bf16_speedup']:.2f} x the float32 student's plain-MLM tokens/s")
    for twin, cost in result.get("two_teachers", {}).items():
        extra = (f", {cost['two_over_one_plus_forward']:.3f} x (one-teacher step + second forward)"
                 if "two_over_one_plus_forward" in cost else "")
        print(f"two teachers, {twin}: step time {cost['two_over_one']:.3f} x one teacher's{extra}")
    print(json.dumps(result))


def main() -> None:
    args = parse()
    show(measure(args), args)


if __name__ == "__main__":
    main()
