"""MetaDistil and MetaAdaptiveKD: the teacher (and the KD weights) learn by meta-gradients how to teach.

Before every student step (the engine's `pre_step`), for each group of k training batches (Zhou et al., 2022,
*BERT Learns to Teach: Knowledge Distillation with Meta Learning*):

1. pilot step on a functional copy of the student (torch.func.functional_call; the real weights are untouched),
   keeping the graph so that the pilot's weights are a function of the teacher φ (and of α, β):
       θ'(φ) = θ − η·∇θ L_KD(θ; φ),   L_KD = α·soft(z_S, z_T(φ)) + β·CE(y, z_S) (+ γ·PatientKD), mean over k batches;
2. quiz step: the pilot's task loss on a held-out quiz batch updates the teacher (and, for MetaAdaptiveKD,
   the raw α and β, kept positive as α = softplus(a), β = softplus(b)):
       φ ← φ − μ·∇φ L_task(θ'(φ); quiz)
   - order "second": the exact meta-gradient, by autograd through step 1 (create_graph);
   - order "first": the same quantity, −η·∇²_{φ,θ} L_KD(θ, φ)·∇θ' L_task(θ'), approximated by a central finite
     difference of first-order gradients (as in DARTS, Liu et al. 2019):
       ≈ −η·[∇φ L_KD(θ + ε·v, φ) − ∇φ L_KD(θ − ε·v, φ)] / (2ε),  v = ∇θ' L_task(θ'),  ε = ε₀/‖v‖;
3. the engine then updates the real student with L_KD of the updated teacher (`KDModule.forward`).

The second-order pass runs attention with PyTorch's math kernel: the fused (flash / memory-efficient) kernels
have no double backward.

The teacher and the raw α, β belong to the KD module (checkpointed with it) but are optimised only here, by
this object's Adam optimizer, which the engine checkpoints with the run. Quiz batches are drawn with a
generator seeded by (seed, step), so a resumed run draws the same ones. α, β and the quiz loss of every step
are appended to `<run>/meta.jsonl`.
"""

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from biodistil.config import TrainConfig
from biodistil.data.batch import Batch
from biodistil.io import truncate_jsonl
from biodistil.kd.module import KDModule
from biodistil.kd.recipe import MetaConfig


class MetaTeacherUpdate:
    """The engine pre-step of MetaDistil / MetaAdaptiveKD (see the module docstring for the equations)."""

    def __init__(self, module: KDModule, quiz: list[dict[str, Any]], collate: Any, cfg: MetaConfig,
                 train: TrainConfig, seed: int, log_path: Path | None = None):
        if module.teacher is None or not any(p.requires_grad for p in module.teacher.parameters()):
            raise ValueError("MetaTeacherUpdate needs a KD module with a trainable teacher")
        if not quiz:
            raise ValueError("MetaTeacherUpdate needs a non-empty quiz set")
        self.module, self.quiz, self.collate, self.cfg = module, quiz, collate, cfg
        self.pilot_lr = cfg.pilot_learning_rate or train.learning_rate
        self.quiz_batch_size = cfg.quiz_batch_size or train.batch_size
        self.max_grad_norm = train.max_grad_norm
        self.seed, self.log_path = seed, log_path
        groups = [{"params": [p for p in module.teacher.parameters() if p.requires_grad],
                   "lr": cfg.teacher_learning_rate}]
        if module.adaptive:
            groups.append({"params": [module.raw_alpha, module.raw_beta], "lr": cfg.weights_learning_rate})
        self.optimizer = torch.optim.Adam(groups, fused=True)
        self.last: dict[str, float] = {}
        self._trimmed = False

    # --------------------------------------------------------------------------------------- the step
    def __call__(self, model: nn.Module, batches: list[Batch], step: int) -> dict[str, float]:
        size = self.cfg.pilot_batches or len(batches)
        device = batches[0].input_ids.device
        logs = [self.meta_update(batches[start:start + size], self.quiz_batch(step, group, device))
                for group, start in enumerate(range(0, len(batches), size))]
        self.last = {key: sum(entry[key] for entry in logs) / len(logs) for key in logs[0]}
        self._record(step + 1, self.last)
        return dict(self.last)

    def meta_update(self, pilot: list[Batch], quiz: Batch) -> dict[str, float]:
        """Steps 1 and 2 on one group of pilot batches: the teacher (and α, β) take one optimizer step."""
        student = self.module.student
        named = [(name, p) for name, p in student.named_parameters() if p.requires_grad]
        buffers = dict(student.named_buffers())
        targets = self.meta_parameters()
        if self.cfg.order == "second":
            grads, quiz_loss = self._second_order(named, buffers, pilot, quiz, targets)
        else:
            grads, quiz_loss = self._finite_difference(named, buffers, pilot, quiz, targets)
        for param, grad in zip(targets, grads, strict=True):
            param.grad = None if grad is None else grad.detach()
        norm = torch.nn.utils.clip_grad_norm_(targets, self.max_grad_norm or float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        alpha, beta = self.module.weights(detach=True)
        return {"quiz_loss": float(quiz_loss), "meta_grad_norm": float(norm), "meta_alpha": float(alpha),
                "meta_beta": float(beta)}

    def meta_parameters(self) -> list[nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    # ------------------------------------------------------------------------------------- gradients
    def pilot_loss(self, params: dict[str, torch.Tensor], batches: list[Batch]) -> torch.Tensor:
        """L_KD(θ; φ, α, β) of the student with weights `params`, mean over the pilot batches; the teacher runs
        with gradients so that the loss is a function of φ."""
        alpha, beta = self.module.weights()
        losses = []
        for batch in batches:
            student = self.module.student_outputs(batch, params)
            teacher = self.module.teacher_outputs(batch, grad=True)
            losses.append(self.module.distill_loss(student, teacher, batch, alpha, beta)[0])
        return torch.stack(losses).mean()

    def quiz_loss(self, params: dict[str, torch.Tensor], quiz: Batch) -> torch.Tensor:
        """L_task(θ'; quiz): the pilot student's task loss with the quiz batch's gold labels."""
        return self.module.objective.task_loss(self.module.student_outputs(quiz, params), quiz)

    def _second_order(self, named, buffers, pilot, quiz, targets):
        """∇φ L_task(θ − η·∇θ L_KD(θ; φ)) by autograd through the pilot step."""
        names, params = [n for n, _ in named], [p for _, p in named]
        with sdpa_kernel(SDPBackend.MATH):  # the fused attention kernels have no double backward
            loss = self.pilot_loss({**dict(named), **buffers}, pilot)
            grads = torch.autograd.grad(loss, params, create_graph=True)
            fast = {n: p - self.pilot_lr * g for n, p, g in zip(names, params, grads, strict=True)}
            quiz_loss = self.quiz_loss({**fast, **buffers}, quiz)
            return torch.autograd.grad(quiz_loss, targets, allow_unused=True), quiz_loss.detach()

    def _finite_difference(self, named, buffers, pilot, quiz, targets):
        """−η·[∇φ L_KD(θ + εv, φ) − ∇φ L_KD(θ − εv, φ)]/(2ε) with v = ∇θ' L_task(θ'): first-order gradients only."""
        names, params = [n for n, _ in named], [p for _, p in named]
        grads = torch.autograd.grad(self.pilot_loss({**dict(named), **buffers}, pilot), params)
        fast = {n: (p - self.pilot_lr * g).detach().requires_grad_(True)
                for n, p, g in zip(names, params, grads, strict=True)}
        quiz_loss = self.quiz_loss({**fast, **buffers}, quiz)
        direction = torch.autograd.grad(quiz_loss, list(fast.values()))
        eps = self.cfg.finite_difference / (torch.sqrt(sum((d.float() ** 2).sum() for d in direction)) + 1e-12)

        def meta_grads_at(sign: float):
            shifted = {n: (p + sign * eps * d).detach() for n, p, d in zip(names, params, direction, strict=True)}
            return torch.autograd.grad(self.pilot_loss({**shifted, **buffers}, pilot), targets, allow_unused=True)

        with torch.random.fork_rng(devices=_rng_devices()):  # the same dropout masks for both passes
            plus = meta_grads_at(1.0)
        minus = meta_grads_at(-1.0)
        scale = -self.pilot_lr / (2 * eps)
        grads = [None if a is None else scale * (a - b) for a, b in zip(plus, minus, strict=True)]
        return grads, quiz_loss.detach()

    # ------------------------------------------------------------------------------------- helpers
    def quiz_batch(self, step: int, group: int, device: torch.device) -> Batch:
        """A quiz batch drawn with a generator seeded by (seed, step, group): the same again after a resume."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 7_919 + group)
        chosen = torch.randperm(len(self.quiz), generator=generator)[: self.quiz_batch_size].tolist()
        return self.collate([self.quiz[i] for i in chosen]).to(device)

    def final_values(self) -> dict[str, float]:
        """The last α, β (MetaAdaptiveKD) and quiz loss, for the report."""
        alpha, beta = self.module.weights(detach=True)
        values = {"quiz_loss": self.last.get("quiz_loss", float("nan"))}
        if self.module.adaptive:
            values.update(alpha=float(alpha), beta=float(beta))
        return values

    def _record(self, step: int, values: dict[str, float]) -> None:
        """Append this step's values to meta.jsonl (main process); a resumed run first drops later records."""
        if self.log_path is None or (torch.distributed.is_initialized() and torch.distributed.get_rank() != 0):
            return
        path = Path(self.log_path)
        if not self._trimmed:
            truncate_jsonl(path, step - 1)
        self._trimmed = True
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, **{k: float(f"{v:.6g}") for k, v in values.items()}}) + "\n")


def _rng_devices() -> list[int]:
    return [torch.cuda.current_device()] if torch.cuda.is_available() else []
