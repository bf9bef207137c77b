"""The forms of every term kind of `biodistil.term_specs`: one short function per form, token by token (`tokens`) and,
for a masked-LM objective across tokenizers, word by word (`words`), each module ending with its table of forms
(`FORMS`). `form_for` picks the form; importing this package fails when a spec has no form or a form has no spec, or
when a word form and its spec disagree. A new term kind: its `TermSpec` and its function(s) with their table line."""


from biodistil.errors import BiodistilError
from biodistil.methods.terms import classifier, layers, logits
from biodistil.methods.terms.base import (
    Compute,
    Pairs,
    Term,
    TermForms,
    TermInputs,
    TermOwner,
    Weight,
    position_masks,
)
from biodistil.term_specs import TERM_SPECS

__all__ = ["FORMS", "Compute", "Pairs", "Term", "TermForms", "TermInputs", "TermOwner", "Weight", "form_for",
           "position_masks"]


FORMS: dict[str, TermForms] = {**logits.FORMS, **layers.FORMS, **classifier.FORMS}


def _check_forms() -> None:
    if set(FORMS) != set(TERM_SPECS):
        raise ImportError(f"term kinds without a form: {sorted(set(TERM_SPECS) - set(FORMS))}; forms without a "
                          f"spec: {sorted(set(FORMS) - set(TERM_SPECS))} (biodistil.term_specs)")
    disagree = [name for name, spec in TERM_SPECS.items() if spec.has_words != (FORMS[name].words is not None)]
    if disagree:
        raise ImportError(f"term kinds whose word form disagrees with their spec: {disagree}")


_check_forms()


def form_for(term: Term, x: TermInputs) -> Compute:
    """The function that computes the term on these inputs: its token form, or across tokenizers (`x.units`) its
    word form."""
    forms = FORMS[term.cfg.loss]
    if x.units is None:
        return forms.tokens
    if forms.words is None:
        raise BiodistilError(f"Objective term {term.cfg.loss} has no form across tokenizers: {term.spec.no_words}")
    return forms.words
