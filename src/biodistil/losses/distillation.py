"""Token-level distillation losses for masked language models (DistilBERT, bio-lm distill + align)."""

import functools
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Masked-language-model cross-entropy, CE(labels, student) = mean over target positions of -log p(label).

    `logits` is [..., V] and `labels` the matching [...] ids, `ignore_index` where a position is no target.
    Returns 0 (with a graph) when no position is a target.
    """
    flat_logits = logits.reshape(-1, logits.size(-1)).float()
    flat_labels = labels.reshape(-1)
    if not bool((flat_labels != ignore_index).any()):
        return flat_logits.sum() * 0.0
    return F.cross_entropy(flat_logits, flat_labels, ignore_index=ignore_index)


# elements of one chunk of the chunked KL on a CPU: 2^22 float32 values (16 MiB) per temporary, near a core's share
# of the cache (137 rows at a vocabulary of 30,522)
KL_CHUNK_ELEMENTS = 1 << 22
# on CUDA: 2^26 (256 MiB per temporary, 2,198 rows at 30,522): a 32 x 512 batch's 2,458 masked rows in 2 chunks instead
# of 18, its 16,384 rows in 8 instead of 120 — fewer, larger kernels (what that gains is for bench/gpu_check.py to say)
CUDA_KL_CHUNK_ELEMENTS = 1 << 26
PROBABILITY_FLOOR = 1e-12  # a mixture of teachers' probabilities is floored here before its log


# a linear layer's input and parameters (x [N, d], W [V, d], b [V] or None) standing for the logit rows
# z = x·Wᵀ + b (an MLM head's decoder): the losses that take them form the logits a chunk of rows at a time
Linear = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


@runtime_checkable
class RowSource(Protocol):
    """Teacher logit rows [N, V] that form themselves on demand, a chunk of rows at a time, as z/T (several teachers'
    mixture: `losses.multi_teacher.MixedRows`); the fused KLs take them as a teacher like a tensor or a `Linear`.
    `parts` gives a chunk unmixed — each teacher's z_k/T [rows, V] and log w_k ([K, 1, 1] or [K, rows, 1]) — for a
    row kernel that mixes them in its own pass: log p_T = log Σ_k exp(z_k/T − logsumexp(z_k/T) + log w_k); `select`
    some of the rows, `logits` all of them formed whole (z, [N, V])."""

    @property
    def shape(self) -> tuple[int, int]: ...

    def scaled_rows(self, rows: slice, temperature: float) -> torch.Tensor: ...

    def parts(self, rows: slice, temperature: float) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]: ...

    def select(self, rows: torch.Tensor) -> "RowSource": ...

    def logits(self) -> torch.Tensor: ...


Teacher = torch.Tensor | Linear | RowSource

# a fused row kernel of the chunked KL: (z_S/T, z_T/T, scale[, log_weights]) of a chunk of rows -> (Σ_rows KL,
# scale·(p_S − p_T)); with log_weights, z_T/T is a tuple of K teachers' rows and p_T their mixture (`RowSource`).
# `compiled_kl_rows()` makes one; without one (the default) the rows are computed eagerly
KLRows = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def soft_kl_loss(student_logits: torch.Tensor, teacher_logits: Teacher, temperature: float = 1.0,
                 kernel: KLRows | None = None) -> torch.Tensor:
    """Temperature-scaled distillation loss T²·KL(softmax(z_T/T) ‖ softmax(z_S/T)) (Hinton et al., 2015).

    Logits are [N, V] rows already restricted to the positions that count; the KL is summed over the
    vocabulary and averaged over rows. The T² factor keeps gradient size independent of T. The teacher may come
    as a head's decoder input (`Linear`, z_T = x·Wᵀ + b), its logits then formed a chunk of rows at a time.

    Computed in chunks of rows (`kl_chunk_elements` values each: by device), so the float32 temporaries stay bounded at
    large vocabularies and batch sizes: the forward pass also forms the gradient with respect to the student,
    ∂/∂z_S = T·(softmax(z_S/T) − softmax(z_T/T))/N, and keeps only that one [N, V] tensor for the backward pass.
    A teacher that takes gradients (meta-learning) gets the plain autograd formula instead. `kernel` computes each
    chunk's KL and gradient in one fused kernel (`compiled_kl_rows`) instead of eagerly.
    """
    if student_logits.numel() == 0:
        return student_logits.sum() * 0.0
    if _takes_grad(teacher_logits):
        teacher_logits = teacher_logits if isinstance(teacher_logits, torch.Tensor) else F.linear(*teacher_logits)
        log_p_student, log_p_teacher = tempered_log_probs(student_logits, teacher_logits, temperature)
        kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1)
        return kl.mean() * temperature * temperature
    if tuple(student_logits.shape) != rows_shape(teacher_logits):
        raise ValueError(f"student logits {tuple(student_logits.shape)} != teacher {rows_shape(teacher_logits)}")
    return _ChunkedSoftKL.apply(student_logits, teacher_logits, float(temperature), kernel)


def linear_soft_kl_loss(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, teacher: Teacher,
                        temperature: float = 1.0, kernel: KLRows | None = None) -> torch.Tensor:
    """`soft_kl_loss` of the student logits z_S = x·Wᵀ + b (`inputs` x [N, d], `weight` W [V, d], `bias` b [V] or
    None), formed inside the loss a chunk of rows at a time (teacher logits likewise when they come as `Linear`):
    T²·(1/N)·Σ_rows KL(softmax(z_T/T) ‖ softmax(z_S/T)).

    Neither the [N, V] logits nor their gradient exist whole: per chunk, the forward pass forms G = ∂L/∂z_S =
    T·(softmax(z_S/T) − softmax(z_T/T))/N and accumulates the gradients of x (G·W), W (Gᵀ·x) and b (Σ_rows G),
    which are all it keeps for the backward pass ([N, d] + [V, d] + [V] values instead of [N, V]). The teacher takes
    no gradient. `kernel`: as in `soft_kl_loss`.
    """
    if (inputs.size(0), weight.size(0)) != rows_shape(teacher):
        raise ValueError(f"student logits {(inputs.size(0), weight.size(0))} != teacher {rows_shape(teacher)}")
    if inputs.size(0) == 0:
        return inputs.sum() * 0.0
    return _LinearSoftKL.apply(inputs, weight, bias, teacher, float(temperature), kernel)


def rows_shape(logits: Teacher) -> tuple[int, ...]:
    """(rows, vocabulary) of logit rows given whole, as `Linear` or as a `RowSource`."""
    return (logits[0].size(0), logits[1].size(0)) if isinstance(logits, tuple) else tuple(logits.shape)


def _takes_grad(logits: Teacher) -> bool:
    if not isinstance(logits, torch.Tensor | tuple):  # a RowSource: a teacher mixture, never trained
        return False
    tensors = logits if isinstance(logits, tuple) else (logits,)
    return any(tensor is not None and tensor.requires_grad for tensor in tensors)


def _spend(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """The gradients kept by a fused loss, scaled in place by the incoming one (no second copy); a second backward
    pass through the same graph (retain_graph) would see them scaled already, so it is refused."""
    if ctx.spent:
        raise RuntimeError("a fused distillation loss can be back-propagated once (its gradient is used up)")
    ctx.spent = True
    return tuple(None if grad is None else grad.mul_(grad_output.to(grad.dtype)) for grad in ctx.grads)


def scaled_chunk(logits: Teacher, rows: slice, temperature: float) -> torch.Tensor:
    """z/T for a chunk of logit rows, in a new tensor (float32, or the head's dtype: the 1/T is folded into the
    matmul that forms logits from `Linear`; a `RowSource` forms its own)."""
    if not isinstance(logits, torch.Tensor | tuple):
        return logits.scaled_rows(rows, temperature)
    if isinstance(logits, tuple):
        inputs, weight, bias = logits[0][rows], logits[1].t(), logits[2]
        if bias is None:
            return torch.mm(inputs, weight).div_(temperature)
        return torch.addmm(bias, inputs, weight, beta=1 / temperature, alpha=1 / temperature)
    chunk = logits[rows]
    return chunk / temperature if chunk.dtype == torch.float32 else chunk.float().div_(temperature)


def _teacher_chunk(teacher: Teacher, rows: slice, temperature: float,
                   kernel: KLRows | None) -> torch.Tensor | tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The teacher's z/T for a chunk of rows; a mixture left unmixed (`RowSource.parts`) when a row kernel will mix
    it in its own pass."""
    if kernel is not None and not isinstance(teacher, torch.Tensor | tuple):
        return teacher.parts(rows, temperature)
    return scaled_chunk(teacher, rows, temperature)


def _kl_rows(student: torch.Tensor, teacher: torch.Tensor | tuple[tuple[torch.Tensor, ...], torch.Tensor],
             scale: float, grad: torch.Tensor | None, kernel: KLRows | None = None) -> torch.Tensor:
    """Σ_rows KL(softmax(teacher) ‖ softmax(student)) of a chunk of tempered logit rows (z/T); when `grad` ([rows, V]
    float32) is given, it receives scale·(softmax(student) − softmax(teacher)) (scale 1: left to the caller). Two
    [rows, V] float32 temporaries; with a `kernel` (`compiled_kl_rows()`), one fused kernel instead. `teacher` may be
    a mixture's parts (`RowSource.parts`), mixed by the kernel, or here without one."""
    if kernel is not None and grad is not None:
        kl, rows_grad = kernel(student, *teacher, scale) if isinstance(teacher, tuple) else \
            kernel(student, teacher, scale)
        grad.copy_(rows_grad)
        return kl
    if isinstance(teacher, tuple):
        teacher = teacher_probs(*teacher)[0]
    log_p_student = F.log_softmax(student, dim=-1, dtype=torch.float32)
    log_p_teacher = F.log_softmax(teacher, dim=-1, dtype=torch.float32)
    p_teacher = log_p_teacher.exp() if grad is None else torch.exp(log_p_teacher, out=grad)
    kl = torch.dot(p_teacher.reshape(-1), log_p_teacher.sub_(log_p_student).reshape(-1))
    if grad is not None:
        torch.sub(log_p_student.exp_(), grad, out=grad)
        if scale != 1:
            grad.mul_(scale)
    return kl


def _kl_rows_fused(student: torch.Tensor, teacher: torch.Tensor | tuple[torch.Tensor, ...],
                   *weights_and_scale: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`_kl_rows` as one pure function for TorchInductor, which fuses its reductions and pointwise steps into two
    passes over the rows (the eager version makes ~20): (Σ_rows KL, scale·(softmax(student) − softmax(teacher))).
    Arguments (student, teacher, scale), or (student, parts, log_weights, scale) for a mixture of teachers."""
    *log_weights, scale = weights_and_scale
    student = student.float()
    log_p_student = student - torch.logsumexp(student, -1, keepdim=True)
    log_p_teacher, p_teacher = teacher_probs(teacher, *log_weights)
    kl = (p_teacher * (log_p_teacher - log_p_student)).sum()
    return kl, (log_p_student.exp() - p_teacher) * scale


def teacher_probs(teacher: torch.Tensor | tuple[torch.Tensor, ...], log_weights: torch.Tensor | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p, p) of tempered teacher rows z/T, float32: log softmax and softmax. Of K teachers' rows with
    `log_weights` ([K, 1, 1] or [K, rows, 1]), their mixture p = Σ_k w_k·softmax(z_k/T), summed in probability space
    (no [K, rows, V] stack), and log max(p, PROBABILITY_FLOOR) (`MixedRows` forms its rows so): one exp per teacher and
    element (a pairwise logaddexp in log space made the compiled kernel's second teacher cost 2.5× a one-teacher call;
    this, 1.1×)."""
    if log_weights is None:
        teacher = teacher.float()
        log_p = teacher - torch.logsumexp(teacher, -1, keepdim=True)
        return log_p, log_p.exp()
    mixed = None
    for part, log_weight in zip(teacher, log_weights, strict=True):
        part = part.float()
        share = torch.exp(part - torch.logsumexp(part, -1, keepdim=True) + log_weight)
        mixed = share if mixed is None else mixed + share
    return torch.log(mixed.clamp_min(PROBABILITY_FLOOR)), mixed


@functools.cache
def compiled_kl_rows() -> KLRows:
    """`_kl_rows_fused` compiled by TorchInductor (needs a C++ compiler on a CPU, Triton on a GPU), for the losses'
    `kernel` argument; shapes are dynamic, so one compile serves every chunk of rows (made once per process)."""
    return torch.compile(_kl_rows_fused, dynamic=True)


def kl_chunk_elements(device: torch.device) -> int:
    """Values per chunk of the chunked KL on `device`: `CUDA_KL_CHUNK_ELEMENTS` on CUDA, else `KL_CHUNK_ELEMENTS`
    (sized for a CPU's cache). The chunk changes only the order of the sum over rows, not the loss."""
    return CUDA_KL_CHUNK_ELEMENTS if device.type == "cuda" else KL_CHUNK_ELEMENTS


def _chunk_rows(vocab: int, device: torch.device) -> int:
    """Rows of `vocab` logits per chunk on `device`."""
    return max(1, kl_chunk_elements(device) // max(1, vocab))


class _FusedKL(torch.autograd.Function):
    """A chunked T²·mean-over-rows KL whose forward pass forms the gradients of its first inputs (`_keep`); its last
    three inputs (the teacher, the temperature, the row kernel) take none."""

    @staticmethod
    def _keep(ctx, grads: tuple[torch.Tensor | None, ...], total: torch.Tensor, temperature: float,
              rows: int) -> torch.Tensor:
        ctx.grads, ctx.spent = grads, False
        return total * (temperature * temperature / rows)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        return *_spend(ctx, grad_output), None, None, None


class _ChunkedSoftKL(_FusedKL):
    """T²·mean_rows KL(softmax(z_T/T) ‖ softmax(z_S/T)), row chunk by row chunk, with its student gradient."""

    @staticmethod
    def forward(ctx, student: torch.Tensor, teacher: Teacher, temperature: float,
                kernel: KLRows | None) -> torch.Tensor:
        rows = student.size(0)
        step = _chunk_rows(student.size(-1), student.device)
        grad = torch.empty(student.shape, dtype=torch.float32, device=student.device) if student.requires_grad \
            else None
        total = torch.zeros((), dtype=torch.float32, device=student.device)
        for start in range(0, rows, step):
            chunk = slice(start, start + step)
            total += _kl_rows(scaled_chunk(student, chunk, temperature),
                              _teacher_chunk(teacher, chunk, temperature, kernel), temperature / rows,
                              None if grad is None else grad[chunk], kernel)
        return _FusedKL._keep(ctx, (None if grad is None else grad.to(student.dtype),), total, temperature, rows)


class _LinearSoftKL(_FusedKL):
    """`linear_soft_kl_loss`: per chunk of rows, the logits, the KL and the gradients of x, W and b."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                teacher: Teacher, temperature: float, kernel: KLRows | None) -> torch.Tensor:
        rows, vocab = inputs.size(0), weight.size(0)
        step = _chunk_rows(vocab, inputs.device)
        grads = [torch.zeros_like(tensor, dtype=torch.float32) if tensor is not None and tensor.requires_grad
                 else None for tensor in (inputs, weight, bias)]
        grad_inputs, grad_weight, grad_bias = grads
        buffer = torch.empty((min(step, rows), vocab), dtype=torch.float32, device=inputs.device)
        total = torch.zeros((), dtype=torch.float32, device=inputs.device)
        scale = temperature / rows
        matmul = _Matmuls(weight, bias, grad_weight, min(step, rows), scale)
        for start in range(0, rows, step):
            chunk = slice(start, start + step)
            x = inputs[chunk]
            grad = buffer[:x.size(0)] if any(g is not None for g in grads) else None
            student = matmul.logits(x, temperature)
            teacher_rows = _teacher_chunk(teacher, chunk, temperature, kernel)
            total += _kl_rows(student, teacher_rows, 1.0, grad, kernel)  # ∂L/∂z_S = scale·grad
            if grad_inputs is not None or grad_weight is not None:
                matmul.backward_rows(grad, x, None if grad_inputs is None else grad_inputs[chunk])
            if grad_bias is not None:
                grad_bias.add_(grad.sum(0), alpha=scale)
        matmul.flush()
        grads = tuple(None if grad is None else grad.to(tensor.dtype)
                      for grad, tensor in zip(grads, (inputs, weight, bias), strict=True))
        return _FusedKL._keep(ctx, grads, total, temperature, rows)


# elements of the 16-bit gradient rows gathered before one matmul adds them to the weight's float32 gradient
GRAD_WEIGHT_GROUP_ELEMENTS = 1 << 24


class _Matmuls:
    """The three matmuls of `linear_soft_kl_loss` per chunk of rows: the student's logits x·Wᵀ + b, the input
    gradient G·W and the weight gradient Gᵀ·x. In float32, except under autocast (bf16 / fp16), where they run in its
    16-bit dtype as autograd would run the unfused loss: W is cast once, not per chunk, and the gradient rows G of
    several chunks are gathered in a 16-bit buffer (`GRAD_WEIGHT_GROUP_ELEMENTS`, whole chunks) that one matmul adds
    to the float32 weight gradient (a [V, d] product per chunk would cost more to add than it saves)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, grad_weight: torch.Tensor | None,
                 chunk_rows: int, scale: float):
        device = weight.device.type
        self.low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        self.weight = weight if self.low is None else weight.to(self.low)
        self.bias, self.grad_weight, self.scale, self.filled = bias, grad_weight, scale, 0
        if self.low is not None and grad_weight is not None:
            group = chunk_rows * max(1, GRAD_WEIGHT_GROUP_ELEMENTS // (chunk_rows * weight.size(0)))
            self.gathered = torch.empty((group, weight.size(0)), dtype=self.low, device=weight.device)
            self.gathered_inputs = torch.empty((group, weight.size(1)), dtype=self.low, device=weight.device)

    def logits(self, x: torch.Tensor, temperature: float) -> torch.Tensor:
        """z/T for the chunk's rows x (the 1/T folded into the matmul)."""
        inputs = x if self.low is None else x.to(self.low)
        return scaled_chunk((inputs, self.weight, self.bias), slice(None), temperature)

    def backward_rows(self, grad: torch.Tensor, x: torch.Tensor, grad_inputs: torch.Tensor | None) -> None:
        """grad_inputs = scale·G·W for the chunk's gradient rows G and inputs x; grad_W += scale·Gᵀ·x (under
        autocast once the gathered rows fill their buffer, or at `flush`)."""
        if self.low is None:
            if grad_inputs is not None:
                torch.mm(grad, self.weight.float(), out=grad_inputs).mul_(self.scale)
            if self.grad_weight is not None:
                self.grad_weight.addmm_(grad.t(), x.float(), alpha=self.scale)
            return
        if self.grad_weight is None:
            low = grad.to(self.low)
        else:
            rows = slice(self.filled, self.filled + grad.size(0))
            low = self.gathered[rows].copy_(grad)
            self.gathered_inputs[rows].copy_(x)
            self.filled += grad.size(0)
        if grad_inputs is not None:
            grad_inputs.copy_(torch.mm(low, self.weight)).mul_(self.scale)
        if self.grad_weight is not None and self.filled == self.gathered.size(0):
            self.flush()

    def flush(self) -> None:
        """Add the gathered rows' scale·Gᵀ·x to the float32 weight gradient."""
        if self.filled == 0:
            return
        used = slice(0, self.filled)
        self.grad_weight.add_(torch.mm(self.gathered[used].t(), self.gathered_inputs[used]), alpha=self.scale)
        self.filled = 0


def topk_kl_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, teacher_ids: torch.Tensor,
                 teacher_log_norm: torch.Tensor, temperature: float = 1.0, tail_logits: torch.Tensor | None = None,
                 tail_ids: torch.Tensor | None = None) -> torch.Tensor:
    """T²·KL from the teacher's top-k tokens, with the rest of the vocabulary as one tail bucket or, given samples of
    the tail, an unbiased estimate of the whole KL.

    The teacher arrives as a cache stores it, per row: its logits `teacher_logits` [N, k] of its top-k tokens
    `teacher_ids` [N, k] (shifted by any per-row constant, e.g. minus the largest logit) and `teacher_log_norm` [N] =
    log Σ_j exp(z_j / T) over the whole vocabulary (the same shift), so that q_i = exp(z_i / T − log_norm) is exactly
    softmax(z_T/T)_i. Teacher buckets: q_i for the k tokens and q_tail = max(1 − Σ_i q_i, 0), renormalised to sum 1
    (16-bit storage rounds); the student's: p_i = softmax(z_S/T)_i and p_tail = Σ_{j ∉ top-k} softmax(z_S/T)_j.

    Tail bucket (no samples):

        L = T²·(1/N)·Σ_rows [Σ_i q_i·log(q_i / p_i) + q_tail·log(q_tail / p_tail)]
          = T²·KL(full) − T²·(1/N)·Σ_rows q_tail·KL(q(·|tail) ‖ p(·|tail)),

    which misses the KL inside the tail, weighted by the teacher's tail mass, and never exceeds the full KL.

    Sampled tail: `tail_ids` [N, m] are m draws s from the teacher's tail q(·|tail) and `tail_logits` their logits
    (the same shift). Adding q_tail times the m-sample estimate of KL(q(·|tail) ‖ p(·|tail)) cancels the bucket term:

        L = T²·(1/N)·Σ_rows [Σ_i q_i·log(q_i / p_i) + (q_tail / m)·Σ_s log(q_s / p_s)],

    an unbiased estimate of the full KL, whose gradient T·(p − q̂)/N compares the student with the sampled teacher
    distribution q̂ (q_i on the k tokens, q_tail/m per draw of a tail token).
    """
    if student_logits.numel() == 0:
        return student_logits.sum() * 0.0
    samples = None if tail_ids is None else (tail_logits, tail_ids.long())
    if teacher_logits.requires_grad or teacher_log_norm.requires_grad:
        return _topk_kl_reference(student_logits, teacher_logits, teacher_ids.long(), teacher_log_norm,
                                  float(temperature), samples)
    return _FusedTopKKL.apply(student_logits, teacher_logits, teacher_ids.long(), teacher_log_norm,
                              float(temperature), samples)


def _teacher_buckets(teacher_logits: torch.Tensor, teacher_log_norm: torch.Tensor, t: float, tail: bool,
                     samples: tuple[torch.Tensor, torch.Tensor] | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q [N, k], q_tail [N], q_s [N, m] or None): the teacher's tempered probabilities of its k tokens, its tail mass
    and the probabilities of the tail samples, renormalised with the first two to sum 1."""
    log_norm = teacher_log_norm.float().unsqueeze(-1)
    q = (teacher_logits.float() / t - log_norm).exp()
    if not tail:
        return q / q.sum(-1, keepdim=True), torch.zeros_like(q[:, 0]), None
    q_tail = (1.0 - q.sum(-1)).clamp(min=0.0)
    total = (q.sum(-1) + q_tail).unsqueeze(-1)
    q_s = None if samples is None else (samples[0].float() / t - log_norm).exp() / total
    return q / total, q_tail / total.squeeze(-1), q_s


def _topk_kl_reference(student_logits, teacher_logits, ids, teacher_log_norm, t: float, samples) -> torch.Tensor:
    """`topk_kl_loss` by autograd (a teacher that takes gradients)."""
    scaled = student_logits.float() / t
    log_p_all = scaled - torch.logsumexp(scaled, -1, keepdim=True)
    tail = ids.size(-1) < scaled.size(-1)  # a tail bucket (none when the k tokens are the whole vocabulary)
    q, q_tail, q_s = _teacher_buckets(teacher_logits, teacher_log_norm, t, tail, samples)
    kl = (torch.xlogy(q, q) - q * log_p_all.gather(-1, ids)).sum(-1)
    if tail and samples is not None:
        log_ratio = q_s.log() - log_p_all.gather(-1, samples[1])
        kl = kl + q_tail * log_ratio.mean(-1)
    elif tail:
        log_p_tail = torch.logsumexp(log_p_all.scatter(-1, ids, float("-inf")), -1)
        kl = kl + torch.xlogy(q_tail, q_tail) - q_tail * log_p_tail
    return kl.mean() * t * t


class _FusedTopKKL(torch.autograd.Function):
    """`topk_kl_loss` with its student gradient formed in the forward pass (one [N, V] tensor kept):
    ∂L/∂z_S,j = T·(p_j − r_j)/N, r_i = q_i on the k tokens and, on the tail, r_j = q_tail·p_j/p_tail (bucket) or
    r_j = (q_tail/m)·(draws of j) (samples)."""

    @staticmethod
    def forward(ctx, student, teacher_logits, ids, teacher_log_norm, t: float, samples) -> torch.Tensor:
        rows, vocab = student.shape
        tail = ids.size(-1) < vocab
        q, q_tail, q_s = _teacher_buckets(teacher_logits, teacher_log_norm, t, tail, samples)
        log_p = student.to(torch.float32, copy=True).div_(t)
        log_p.sub_(torch.logsumexp(log_p, -1, keepdim=True))
        log_p_top = log_p.gather(-1, ids)
        kl = (torch.xlogy(q, q) - q * log_p_top).sum(-1)
        scale = None
        if tail and samples is not None:
            kl = kl + q_tail * (q_s.log() - log_p.gather(-1, samples[1])).mean(-1)
        elif tail:
            log_p.scatter_(-1, ids, float("-inf"))  # now the tail only: p_j outside the k tokens, 0 on them
            log_p_tail = torch.logsumexp(log_p, -1)
            kl = kl + torch.xlogy(q_tail, q_tail) - q_tail * log_p_tail
            scale = torch.where(q_tail > 0, 1.0 - (q_tail.clamp(min=1e-38).log() - log_p_tail).exp(), 1.0)
        grad = None
        if student.requires_grad:
            factor = t / rows
            grad = log_p.exp_().mul_(scale.unsqueeze(-1) * factor if scale is not None else factor)
            grad.scatter_(-1, ids, (log_p_top.exp() - q).mul_(factor))
            if tail and samples is not None:
                draws = samples[1]
                grad.scatter_add_(-1, draws, (-factor * q_tail / draws.size(-1)).unsqueeze(-1).expand_as(draws))
            grad = grad.to(student.dtype)
        ctx.grads = (grad,)
        ctx.spent = False
        return kl.mean() * t * t

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        return *_spend(ctx, grad_output), None, None, None, None, None


def tempered_log_probs(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log softmax(z_S/T), log softmax(z_T/T)) in float32, after checking the two shapes agree."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} != teacher {tuple(teacher_logits.shape)}")
    t = float(temperature)
    return F.log_softmax(student_logits.float() / t, dim=-1), F.log_softmax(teacher_logits.float() / t, dim=-1)


def cosine_embedding_loss(
    student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Hidden-state alignment 1 − cos(h_T, h_S), averaged over the positions where `mask` is True.

    Hidden states are [B, L, D] with equal D (project the student first when widths differ).
    """
    if student_hidden.shape != teacher_hidden.shape:
        raise ValueError(f"student hidden {tuple(student_hidden.shape)} != teacher {tuple(teacher_hidden.shape)}; "
                         "project the student to the teacher's width first")
    cos = F.cosine_similarity(student_hidden.float(), teacher_hidden.float(), dim=-1)
    return masked_mean(1.0 - cos, mask)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the entries where `mask` is True (0 with a graph when none is)."""
    weights = mask.to(values.dtype)
    count = weights.sum()
    if count == 0:
        return values.sum() * 0.0
    return (values * weights).sum() / count
