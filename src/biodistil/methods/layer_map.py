"""Which teacher layer each student layer learns from.

Layer indices follow Hugging Face `hidden_states`: 0 is the embedding output and l (1..N) the output of
transformer layer l. A full map g is a list of length M + 2: g[0] = 0 (embeddings), g[l] for the student
layers 1..M, and g[M + 1] = N + 1, which stands for the prediction layer (logits), as in TinyBERT.
PatientKD maps are lists of (student_layer, teacher_layer) pairs for the student's intermediate layers only.
"""

from collections.abc import Sequence
from itertools import pairwise

from biodistil.errors import BiodistilError


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BiodistilError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_sizes(num_student_layers: int, num_teacher_layers: int) -> tuple[int, int]:
    m = _check_count("num_student_layers", num_student_layers, 1)
    n = _check_count("num_teacher_layers", num_teacher_layers, 1)
    if n < m:
        raise BiodistilError(
            f"num_teacher_layers={n} is smaller than num_student_layers={m}; the student must not be deeper"
        )
    return m, n


def uniform_layer_map(num_student_layers: int, num_teacher_layers: int) -> list[int]:
    """TinyBERT uniform map g(0) = 0, g(l) = ⌊l·N/M⌋ for 1 ≤ l ≤ M, g(M + 1) = N + 1.

    When N is a multiple of M this is TinyBERT's g(l) = l·N/M exactly; otherwise it rounds down.
    The last student layer always maps to the last teacher layer N.
    """
    m, n = _check_sizes(num_student_layers, num_teacher_layers)
    return [0, *(layer * n // m for layer in range(1, m + 1)), n + 1]


def explicit_layer_map(teacher_layers: Sequence[int], num_teacher_layers: int) -> list[int]:
    """Full map g = [0, *teacher_layers, N + 1]: student layer l learns from teacher_layers[l − 1].

    The list must be non-empty, strictly increasing and within 1..N.
    """
    n = _check_count("num_teacher_layers", num_teacher_layers, 1)
    layers = list(teacher_layers)
    if not layers:
        raise BiodistilError(f"teacher_layers is empty; give one teacher layer in 1..{n} per student layer")
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= n:
            raise BiodistilError(f"teacher layer {layer!r} is out of range; valid layers are integers 1..{n}")
    for earlier, later in pairwise(layers):
        if later <= earlier:
            raise BiodistilError(
                f"teacher_layers {layers} must be strictly increasing ({later} follows {earlier})"
            )
    return [0, *layers, n + 1]


def pkd_skip_map(num_student_layers: int, num_teacher_layers: int) -> list[tuple[int, int]]:
    """PatientKD PKD-Skip: student layer i ↦ teacher layer i·k, k = ⌊N/M⌋, for i = 1..M−1.

    The student's last layer M is left out: its output is covered by the KD loss on the logits.
    E.g. M = 6, N = 12 → teacher layers {2, 4, 6, 8, 10}.
    """
    m, n = _check_sizes(num_student_layers, num_teacher_layers)
    step = n // m
    return [(i, i * step) for i in range(1, m)]


def pkd_last_map(num_student_layers: int, num_teacher_layers: int) -> list[tuple[int, int]]:
    """PatientKD PKD-Last: student layer i ↦ teacher layer N − M + i, for i = 1..M−1.

    These are the M − 1 teacher layers just below the top layer N; the student's last layer M is left out
    (covered by the KD loss). E.g. M = 6, N = 12 → teacher layers {7, 8, 9, 10, 11}.
    """
    m, n = _check_sizes(num_student_layers, num_teacher_layers)
    return [(i, n - m + i) for i in range(1, m)]
