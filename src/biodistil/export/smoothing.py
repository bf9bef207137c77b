"""SmoothQuant's migration (Xiao et al. 2023) applied to an fp32 ONNX graph before dynamic int8 quantisation.

Dynamic per-tensor quantisation gives a whole activation tensor one scale, so the few channels with large values that
transformer activations carry leave every other channel a handful of int8 steps. SmoothQuant divides input channel j
of a matrix product by

    s_j = max|X_j|^α / max|W_j|^(1−α)        (eq. 4; X the activation, W_j the weights that read channel j)

and multiplies the weights that read channel j by s_j: X·W is unchanged, X is flatter, W a little less flat (its
int8 scales are per tensor or per output column, so it absorbs the factor far better than the activation would).

Where it goes in the graph. In a post-LayerNorm encoder (BERT, MPNet) the LayerNorm's output is also the residual
stream, so 1/s cannot be folded into the LayerNorm's weights as in pre-LayerNorm decoders: it is an explicit `Mul`
by the constant 1/s, one per activation tensor, shared by every quantised product that reads it (Q, K and V read
one), an elementwise operation beside their matrix products. Products migrated: `MatMul` with a constant weight
(ONNX's [in, out]: row j reads channel j) and ONNX Runtime's fused `Attention` (weights [in, 3 · hidden], the same
rows), the operations `quantize_dynamic` quantises; the activation-by-activation products inside attention are
not. max|X_j| is read by running the fp32 graph on calibration data (`calibrate`), over the non-padding positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from biodistil.errors import BiodistilError
from biodistil.export.runtime import OnnxModel

MIGRATED_OPS = ("MatMul", "Attention")  # the products quantize_dynamic quantises with a constant weight
LAYER_NORMS = ("LayerNormalization", "SkipLayerNormalization", "EmbedLayerNormalization")  # unfused and fused
FLOOR = 1e-5  # channel maxima and factors at least this (a dead channel would divide by zero)
SMOOTHED_INPUTS = {"all": None, "layernorm": LAYER_NORMS}  # which activations migrate (producers; None: any)
WATCHED_MB = 256.0  # calibration: the watched activations one session run may return


@dataclass
class MigrationGroup:
    """The products that read one activation tensor, and the constant weight of each (rows = input channels)."""

    activation: str
    nodes: list[Any] = field(default_factory=list)
    weights: list[str] = field(default_factory=list)


def migration_groups(graph: Any, producers: tuple[str, ...] | None = None) -> list[MigrationGroup]:
    """Each activation read by a migratable product, with every such product reading it; with `producers`, only the
    activations those operations produce. A weight shared by several nodes, or not a matrix, leaves its product out
    (scaling it for one reader would change the others)."""
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    made_by = {output: node.op_type for node in graph.node for output in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    groups: dict[str, MigrationGroup] = {}
    for node in graph.node:
        if node.op_type not in MIGRATED_OPS or len(node.input) < 2:
            continue
        activation, weight = node.input[0], node.input[1]
        if activation in initializers or weight not in initializers:
            continue
        if producers is not None and made_by.get(activation) not in producers:
            continue
        if len(initializers[weight].dims) != 2 or readers[weight] != 1:
            continue
        group = groups.setdefault(activation, MigrationGroup(activation))
        group.nodes.append(node)
        group.weights.append(weight)
    return list(groups.values())


class ChannelMaxima(OnnxModel):
    """The fp32 graph called like the model (`model(**batch).logits`), keeping for each watched tensor (name →
    channels) the largest |value| of every channel (its last axis) over the batches' non-padding positions. A batch
    runs in slices of rows (`OnnxModel`'s) so that the watched tensors of one run stay within WATCHED_MB."""

    def __init__(self, onnx_file: str | Path, watched: dict[str, int]):
        super().__init__(onnx_file, variant="fp32")
        self.watched = watched
        self.maxima: dict[str, np.ndarray] = {}

    def rows_per_run(self, rows: int, length: int) -> int:
        return max(1, min(rows, int(WATCHED_MB * 2**20) // (4 * length * max(1, sum(self.watched.values())))))

    def run_rows(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        logits, *values = self.session.run(["logits", *self.watched], feed)
        keep = feed["attention_mask"].astype(bool)
        for name, value in zip(self.watched, values, strict=True):
            positions = value[keep] if value.ndim == 3 and value.shape[:2] == keep.shape else value.reshape(
                -1, value.shape[-1])
            found = np.abs(positions).max(axis=0)
            self.maxima[name] = np.maximum(self.maxima[name], found) if name in self.maxima else found
        return logits


def migration_factors(activation_max: np.ndarray, weight_max: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|X_j|^α / max|W_j|^(1−α) per input channel (eq. 4), both maxima floored at FLOOR."""
    activation_max = np.maximum(activation_max, FLOOR).astype(np.float64)
    weight_max = np.maximum(weight_max, FLOOR).astype(np.float64)
    return np.maximum(activation_max**alpha / weight_max ** (1 - alpha), FLOOR)


def smooth_graph(source: Path, target: Path, alpha: float, calibrate: Callable[[OnnxModel], None],
                 inputs: str = "all") -> dict[str, Any]:
    """Write `source` with SmoothQuant's migration at `alpha` to `target`; `calibrate(model)` runs the calibration
    data through `model` (called like the Hugging Face model); `inputs`: migrate every activation (`all`) or only
    LayerNorm outputs (`layernorm`). Returns what was migrated, for export.json.

    The calibration graph (the source with the watched tensors as extra outputs) is written beside `source`, whose
    folder must hold the model's config.json (an export folder), and removed afterwards."""
    import onnx
    from onnx import numpy_helper

    if not 0 < alpha < 1:
        raise BiodistilError(f"SmoothQuant's α must lie strictly between 0 and 1; got {alpha}")
    if inputs not in SMOOTHED_INPUTS:
        raise BiodistilError(f"SmoothQuant's inputs must be one of {', '.join(SMOOTHED_INPUTS)}; got {inputs!r}")
    model = onnx.load(str(source))
    groups = migration_groups(model.graph, SMOOTHED_INPUTS[inputs])
    if not groups:
        raise BiodistilError(f"{source}: no MatMul or Attention with a constant weight to migrate; export without "
                             "--int8-smooth")
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    channels = {g.activation: int(initializers[g.weights[0]].dims[0]) for g in groups}
    maxima = _calibrated_maxima(model, channels, source.with_name(".calibration.onnx"), calibrate)
    ratios, divisions = [], []
    for group in groups:
        weights = {name: numpy_helper.to_array(initializers[name]) for name in group.weights}
        weight_max = np.max([np.abs(w).max(axis=1) for w in weights.values()], axis=0)
        factors = migration_factors(maxima[group.activation], weight_max, alpha)
        for name, weight in weights.items():
            initializers[name].CopyFrom(numpy_helper.from_array((weight * factors[:, None]).astype(weight.dtype),
                                                                name))
        divisions.append(_divide_activation(model.graph, group, (1 / factors).astype(np.float32)))
        ratios.append(_flatness(maxima[group.activation], factors))
    _insert_after_producers(model.graph, divisions)
    onnx.save(model, str(target))
    return {"method": "SmoothQuant (Xiao et al. 2023, eq. 4) folded into the weights, 1/s as a Mul before them",
            "alpha": alpha, "inputs": inputs, "activations": len(groups), "products": sum(len(g.nodes) for g in groups),
            "outlier_ratio": {"before": round(float(np.median([r[0] for r in ratios])), 2),
                              "after": round(float(np.median([r[1] for r in ratios])), 2)}}


def _calibrated_maxima(model: Any, watched: dict[str, int], path: Path,
                       calibrate: Callable[[OnnxModel], None]) -> dict[str, np.ndarray]:
    """Per watched tensor, the channel maxima over the calibration data (the graph with them as extra outputs)."""
    import onnx

    augmented = onnx.ModelProto()
    augmented.CopyFrom(model)
    outputs = {o.name for o in augmented.graph.output}
    augmented.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                                  for name in watched if name not in outputs)
    try:
        onnx.save(augmented, str(path))
        runner = ChannelMaxima(path, watched)
        calibrate(runner)
    finally:
        path.unlink(missing_ok=True)
    missing = [name for name in watched if name not in runner.maxima]
    if missing:
        raise BiodistilError(f"SmoothQuant calibration ran no batch through {len(missing)} of the graph's "
                             "activations; calibrate on a non-empty split")
    return runner.maxima


def _divide_activation(graph: Any, group: MigrationGroup, inverse: np.ndarray) -> Any:
    """`activation · (1/s)` as one Mul (returned, not yet placed) whose output the group's products read instead of
    the activation."""
    import onnx
    from onnx import numpy_helper

    scaled, constant = f"{group.activation}/smoothed", f"{group.activation}/smooth_inverse"
    graph.initializer.append(numpy_helper.from_array(inverse, constant))
    for node in group.nodes:
        node.input[0] = scaled
    return onnx.helper.make_node("Mul", [group.activation, constant], [scaled], name=f"{group.activation}/smooth")


def _insert_after_producers(graph: Any, divisions: list[Any]) -> None:
    """Each Mul placed right after the node that produces its activation (first, for a graph input), so that the
    nodes stay in the topological order ONNX requires."""
    after: dict[str, list[Any]] = {}
    for mul in divisions:
        after.setdefault(mul.input[0], []).append(mul)
    ordered = [mul for name in (i.name for i in graph.input) for mul in after.get(name, [])]
    for node in graph.node:
        ordered.append(node)
        ordered.extend(mul for name in node.output for mul in after.get(name, []))
    del graph.node[:]
    graph.node.extend(ordered)


def _flatness(activation_max: np.ndarray, factors: np.ndarray) -> tuple[float, float]:
    """Largest channel maximum over the median one, before and after the migration (how outlying the worst channel
    is: what per-tensor int8 pays for)."""
    before = np.maximum(activation_max, FLOOR)
    after = before / factors
    return float(before.max() / np.median(before)), float(after.max() / np.median(after))
