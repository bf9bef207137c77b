"""What each kind of loss term is, in one place: the facts config validation, pre-flight, the cross-tokenizer table,
task KD and the weighted sum read (`TermSpec`). Computing a term is `biodistil.methods.terms`: one short function per
form (token by token, and across tokenizers word by word), checked against these specs when it is imported.

Adding a term kind touches two places: a `TermSpec` here and its form(s) there. docs/methods.md gives every
equation; each spec's `equation` names it in one line.
"""

from dataclasses import dataclass, field
from typing import Literal

Reads = Literal["logits", "hidden", "attention", "qkv", "cls"]
Scope = Literal["masked_lm", "task", "both"]  # the objective it belongs to: masked-LM distillation, task KD, or both
Formed = Literal["never", "always", "unless_fused"]
Mixture = Literal["softmax", "sigmoid", "logits"]  # where several teachers' predictions mix (losses.multi_teacher)

LAYER_OPTIONS = frozenset({"student_layer", "teacher_layer", "layer_map", "layer_reduction"})
# The options of TermConfig that belong to some kinds only (weight, epsilon and hinge_weight belong to every kind;
# positions, student_layer and teacher_layer have defaults every kind accepts)
CHECKED_OPTIONS = ("layer_map", "layer_reduction", "vocab_reduction", "attention_map", "token_reduction",
                   "num_relation_heads", "relations")


@dataclass(frozen=True)
class TermSpec:
    """One kind of loss term.

    `reads`: the features it compares; `needs_teacher`: whether it reads the teacher at all; `cached`: whether a
    teacher cache can serve it (top-k logits at the masked positions, hidden states of mapped layers); `options`: the
    recipe options that apply to it; `positions`: the fixed position set it reads (None: the recipe's `positions`);
    `formed`: whether it reads the student's logits formed at its positions ("unless_fused": unless the vocabulary KL
    forms them inside the loss); in a masked-LM objective across tokenizers, `words`: how its word form compares the
    two tokenizations, or `no_words`: why it has none; `kd_soft`: its name as task KD's `kd.soft_loss`; with several
    teachers, `mixture`: the space their weighted mixture is formed in (`biodistil.losses.multi_teacher`), or None:
    one term per teacher, weighted (hidden, attention, relation and [CLS] terms; `kd.combine: per_teacher` for all).
    """

    name: str
    reads: Reads
    equation: str
    needs_teacher: bool = True
    scope: Scope = "masked_lm"
    cached: bool = False
    options: frozenset[str] = field(default_factory=frozenset)
    positions: str | None = None
    formed: Formed = "never"
    words: str = ""
    no_words: str = ""
    kd_soft: str | None = None
    mixture: Mixture | None = None

    def __post_init__(self) -> None:
        has_one = bool(self.words) != bool(self.no_words)
        if (self.scope == "task") == has_one or (self.scope == "task" and self.words):
            raise ValueError(f"term spec {self.name}: a masked-LM term gives exactly one of words (its word form) and "
                             "no_words (why it has none); a task term neither (classifier outputs are aligned before "
                             "the terms, biodistil.methods.cross_tokenizer)")
        unknown = self.options - set(CHECKED_OPTIONS) - LAYER_OPTIONS - {"positions"}
        if unknown:
            raise ValueError(f"term spec {self.name}: unknown options {sorted(unknown)}")

    @property
    def has_words(self) -> bool:
        return bool(self.words)


_LAYER_MAPPED = LAYER_OPTIONS | {"positions"}
_ATTENTION = LAYER_OPTIONS
_HEADS_NOTE = "; both models need the same number of heads"

SPECS = (
    TermSpec("mlm", "logits", "CE(labels, z_S) over the MLM targets", needs_teacher=False, positions="masked",
             formed="always", words="the student's own labels; mask_same_words masks the same words on both sides"),
    TermSpec("logit_kl", "logits", "T²·KL(softmax(z_T/T) ‖ softmax(z_S/T)) at the term's positions", scope="both",
             cached=True, options=frozenset({"positions"}), formed="unless_fused", kd_soft="hinton", mixture="softmax",
             words="at each whole-word-masked word's first token on both sides: shared_vocab_kl_loss over the strings "
                   "both vocabularies name (a uld term covers the rest)"),
    TermSpec("uld", "logits", "(1/N)·Σ_rows Σ_i |p_S,(i) − p_T,(i)| on sorted probabilities (ULD)",
             options=frozenset({"positions"}), formed="always",
             words="at each whole-word-masked word's first token on both sides: uld_loss on the sorted probabilities, "
                   "no shared string needed"),
    TermSpec("soft_ce", "logits", "−Σ softmax(z_T/T)·log softmax(z_S/T) (TinyBERT)", scope="both",
             options=frozenset({"positions"}), formed="always", mixture="softmax",
             no_words="a cross-entropy over one vocabulary; use logit_kl (shared strings + ULD)"),
    TermSpec("logit_mse", "logits", "(1/N)·Σ_rows squared errors, averaged or summed over the vocabulary", scope="both",
             options=frozenset({"positions", "vocab_reduction"}), formed="always", kd_soft="logit_mse",
             mixture="logits",
             no_words="logits over two vocabularies do not correspond entry by entry; use logit_kl (shared strings + "
                      "ULD)"),
    TermSpec("hidden_cosine", "hidden", "1 − cos(h_S^l·W_l, h_T^g(l)) per position", cached=True,
             options=_LAYER_MAPPED,
             words="word_hidden_cosine_loss on mean-pooled words"),
    TermSpec("hidden_mse", "hidden", "MSE(h_S^l·W_l, h_T^g(l))", cached=True, options=_LAYER_MAPPED,
             words="word_hidden_mse_loss on mean-pooled words (a projection where widths differ)"),
    TermSpec("attention_mse", "attention", "Σ_l (1/H)·Σ_heads MSE(a_S^l, a_T^g(l))",
             options=_ATTENTION | {"attention_map"},
             words="word_attention_mse_loss on word × word maps of probabilities" + _HEADS_NOTE),
    TermSpec("attention_kl", "attention", "Σ_l KL(a_S^l ‖ a_T^g(l)) per query row", options=_ATTENTION | {
             "token_reduction"},
             words="word_attention_kl_loss on word × word maps (keys summed, queries averaged, rows renormalised)"
                   + _HEADS_NOTE),
    TermSpec("minilm_relations", "qkv", "Σ_r KL(R_T^r ‖ R_S^r), r in Q-Q, K-K, V-V (MiniLMv2)",
             options=frozenset({"student_layer", "teacher_layer", "num_relation_heads", "relations"}),
             words="word_relations_loss on word-pooled Q/K/V"),
    TermSpec("ce", "logits", "CE(y, z_S) on the gold labels (BCE per label for multi-label tasks)",
             needs_teacher=False, scope="task", positions="masked", formed="always"),
    TermSpec("sigmoid_kd", "logits", "BCE(σ(z_T/T), σ(z_S/T)) of the positive class", scope="task", formed="always",
             kd_soft="sigmoid", mixture="sigmoid"),
    TermSpec("patient_kd", "cls", "Σ_i MSE(h_S,i/‖h_S,i‖, h_T,g(i)/‖h_T,g(i)‖) of the [CLS] states (PatientKD)",
             scope="task"),
)
TERM_SPECS: dict[str, TermSpec] = {spec.name: spec for spec in SPECS}
TERM_NAMES = tuple(TERM_SPECS)
MASKED_LM_TERMS = tuple(name for name, spec in TERM_SPECS.items() if spec.scope != "task")
TASK_TERMS = tuple(name for name, spec in TERM_SPECS.items() if spec.scope == "task")
KD_SOFT_TERMS = {spec.kd_soft: name for name, spec in TERM_SPECS.items() if spec.kd_soft}  # kd.soft_loss → kind


def terms_with(option: str) -> tuple[str, ...]:
    """The kinds an option applies to."""
    return tuple(name for name, spec in TERM_SPECS.items() if option in spec.options)


def misplaced_options(loss: str, chosen: dict[str, object], defaults: dict[str, object]) -> list[str]:
    """For a recipe term of kind `loss`: one message per option set away from its default that does not apply to it."""
    spec = TERM_SPECS[loss]
    return [f"{option} applies to {', '.join(terms_with(option))}; not to loss={loss}"
            for option in CHECKED_OPTIONS
            if option not in spec.options and chosen.get(option) != defaults.get(option)]
