"""Spans ⇄ BIO tags of words: the one place where documents become tagged sentences and tags become spans again.

Training (a span task's splits), prediction (`Predictor.predict_documents`, `biodistil predict --format brat`) and
scoring (`evaluate --finetuned` on a span task) all go through `tag_documents` and `spans_from_tags`.

**The policy for what does not fit BIO tags** (every entity is counted as kept exactly, changed, or dropped, per
type and reason, in `Alignment`; nothing is dropped without a count):

* a boundary inside a word: the entity is widened to the whole words it touches (`boundary="expand"`, as spaCy's
  `alignment_mode="expand"`; changed) or narrowed to the words wholly inside it (`"contract"`; changed, or dropped
  when no word is wholly inside);
* a discontinuous span: its extent, from its first fragment's start to its last fragment's end (`discontinuous=
  "extent"`; changed), its first fragment (`"first"`; changed) or nothing (`"drop"`; dropped);
* overlapping and nested entities: BIO holds one layer, so the longest (in words; the earlier one on a tie) is kept
  and every entity that shares a word with it is dropped (an annotation given twice, same type and offsets, is one
  entity, kept);
* an entity across a sentence boundary: the sentences are joined (it is kept whole, and the joins counted);
* a sentence longer than a model's window is cut between words, never inside an entity
  (`biodistil.data.alignment.chunk_words` with the tags' entity continuations);
* relation and event lines never become entities (the readers count them).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from seqeval.scheme import IOB2, Entities

from biodistil.data.formats import TokenExample
from biodistil.documents.model import Fragment, Span, SpanDocument
from biodistil.documents.words import sentences

KEPT = "kept exactly"
UNTYPED = "_"  # seqeval's type of a bare B / I tag


@dataclass(frozen=True)
class SpanPolicy:
    """How entities that do not fit BIO tags are made to (see the module docstring)."""

    boundary: Literal["expand", "contract"] = "expand"
    discontinuous: Literal["extent", "first", "drop"] = "extent"


@dataclass
class SentenceExample(TokenExample):
    """A sentence of a document, as a token task's example: its words, their tags, the document's id and each word's
    [start, end) offsets into the document's text."""

    document: str = ""
    offsets: list[Fragment] = field(default_factory=list)


@dataclass
class Alignment:
    """What became of each gold entity on the way to BIO tags: `outcomes[type][reason]` counts entities (reason
    `KEPT`, `changed: …` or `dropped: …`); `joined` counts sentence boundaries removed to keep an entity whole;
    `examples` holds a few cases of each reason that is not KEPT (document, offsets, text) for the report."""

    outcomes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    joined: int = 0
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    read: Counter[str] = field(default_factory=Counter)  # what the readers repaired or left out (documents' notes)

    def count(self, span: Span, reason: str, document: SpanDocument) -> None:
        self.outcomes[span.type][reason] += 1
        if reason != KEPT and len(self.examples[reason]) < 5:
            self.examples[reason].append(f"{document.id} {span.start}-{span.end} {span.text(document.text)!r:.60}")

    def total(self, outcome: str = "") -> int:
        """Entities whose reason starts with `outcome` ("" all, KEPT, "changed", "dropped")."""
        return sum(n for reasons in self.outcomes.values() for r, n in reasons.items() if r.startswith(outcome))

    def reasons(self) -> Counter[str]:
        merged: Counter[str] = Counter()
        for reasons in self.outcomes.values():
            merged.update(reasons)
        return merged

    def record(self) -> dict[str, Any]:
        """The counts as a JSON-ready record (totals, per type, per reason, a few examples)."""
        return {"entities": self.total(), "kept": self.total(KEPT), "changed": self.total("changed"),
                "dropped": self.total("dropped"), "sentences_joined": self.joined,
                "by_reason": dict(sorted(self.reasons().items())), "reading": dict(sorted(self.read.items())),
                "by_type": {kind: {"kept": r[KEPT], "changed": sum(n for k, n in r.items() if k.startswith("changed")),
                                   "dropped": sum(n for k, n in r.items() if k.startswith("dropped"))}
                            for kind, r in sorted(self.outcomes.items())},
                "examples": {reason: list(cases) for reason, cases in sorted(self.examples.items())}}

    def summary(self, what: str = "") -> str:
        """One line per the module's policy: kept / changed / dropped, the reasons, and per type."""
        total = self.total()
        kept = self.total(KEPT)
        share = f" ({kept / total:.2%})" if total else ""
        reasons = ", ".join(f"{reason} {n:,}" for reason, n in sorted(self.reasons().items()) if reason != KEPT)
        per_type = "; ".join(f"{kind} {r[KEPT]:,}/{sum(r.values()):,}" for kind, r in sorted(self.outcomes.items()))
        return (f"{what}{total:,} gold entities: {kept:,} kept exactly{share}, {self.total('changed'):,} changed, "
                f"{self.total('dropped'):,} dropped" + (f" ({reasons})" if reasons else "")
                + (f"; {self.joined:,} sentence boundaries joined" if self.joined else "")
                + (f"; kept per type: {per_type}" if per_type else "")
                + ("; reading: " + ", ".join(f"{note} {n:,}" for note, n in sorted(self.read.items()))
                   if self.read else ""))


def tag_documents(documents: Sequence[SpanDocument], policy: SpanPolicy = SpanPolicy(),
                  alignment: Alignment | None = None) -> tuple[list[SentenceExample], Alignment]:
    """The documents' sentences as tagged examples, and what became of every gold entity."""
    alignment = alignment if alignment is not None else Alignment()
    examples: list[SentenceExample] = []
    for document in documents:
        examples.extend(_document_sentences(document, policy, alignment))
        alignment.read.update(document.notes)
    return examples, alignment


def _document_sentences(document: SpanDocument, policy: SpanPolicy,
                        alignment: Alignment) -> list[SentenceExample]:
    found = sentences(document.text, document.passages)
    words = [word for sentence in found for word in sentence]
    ranges = _word_ranges(document, words, policy, alignment)
    kept = _one_layer(document, ranges, alignment)
    tags = ["O"] * len(words)
    for (first, last), span in kept:
        tags[first:last + 1] = [f"B-{span.type}"] + [f"I-{span.type}"] * (last - first)
    bounds = _joined(found, tags, alignment)
    return [SentenceExample(f"{document.id}:{number}", [document.text[a:b] for a, b in words[start:end]],
                            tags[start:end], document.id, words[start:end])
            for number, (start, end) in enumerate(bounds)]


def _word_ranges(document: SpanDocument, words: list[Fragment], policy: SpanPolicy,
                 alignment: Alignment) -> list[tuple[tuple[int, int], Span, str]]:
    """Each entity's first and last word, with the reason it was changed (KEPT when exact); dropped ones counted."""
    starts = [a for a, _ in words]
    ranges = []
    for span in document.spans:
        extent, reason = _contiguous(span, policy)
        if extent is None:
            alignment.count(span, reason, document)
            continue
        touched = _touched(starts, words, extent, policy.boundary)
        if touched is None:
            alignment.count(span, "dropped: no whole word inside it" if policy.boundary == "contract"
                            else "dropped: no word (whitespace only)", document)
            continue
        exact = (words[touched[0]][0], words[touched[1]][1]) == extent
        reason = reason if reason != KEPT else KEPT if exact else f"changed: boundary inside a word ({policy.boundary})"
        ranges.append((touched, span, reason))
    return ranges


def _contiguous(span: Span, policy: SpanPolicy) -> tuple[Fragment | None, str]:
    if not span.discontinuous:
        return (span.start, span.end), KEPT
    if policy.discontinuous == "drop":
        return None, "dropped: discontinuous"
    if policy.discontinuous == "first":
        return span.fragments[0], "changed: discontinuous (first fragment)"
    return (span.start, span.end), "changed: discontinuous (extent)"


def _touched(starts: list[int], words: list[Fragment], extent: Fragment, boundary: str) -> tuple[int, int] | None:
    """First and last word the extent covers: those it touches (expand) or holds whole (contract)."""
    from bisect import bisect_left, bisect_right

    start, end = extent
    if boundary == "expand":
        first = bisect_right(starts, start) - 1
        if first < 0 or words[first][1] <= start:
            first += 1
        last = bisect_left(starts, end) - 1
    else:
        first = bisect_left(starts, start)
        last = bisect_right(starts, end) - 1
        if last >= 0 and words[last][1] > end:
            last -= 1
    return (first, last) if 0 <= first <= last < len(words) else None


def _one_layer(document: SpanDocument, ranges: list[tuple[tuple[int, int], Span, str]],
               alignment: Alignment) -> list[tuple[tuple[int, int], Span]]:
    """The entities BIO can hold: longest first, then earlier; one that shares a word with a kept one is dropped."""
    taken: dict[int, tuple[tuple[int, int], Span]] = {}
    kept = []
    for (first, last), span, reason in sorted(ranges, key=lambda r: (r[0][0] - r[0][1], r[0][0])):
        clash = next((taken[w] for w in range(first, last + 1) if w in taken), None)
        if clash is None:
            for word in range(first, last + 1):
                taken[word] = ((first, last), span)
            kept.append(((first, last), span))
            alignment.count(span, reason, document)
        elif clash[1].key() == span.key():
            alignment.count(span, KEPT, document)  # the same annotation twice: one entity, kept exactly
        else:
            alignment.count(span, "dropped: overlaps or nests in a longer entity", document)
    return sorted(kept, key=lambda k: k[0])


def _joined(found: list[list[Fragment]], tags: list[str], alignment: Alignment) -> list[tuple[int, int]]:
    """[start, end) word ranges of the sentences, joined where an entity crosses a sentence boundary."""
    bounds: list[tuple[int, int]] = []
    start = 0
    for sentence in found:
        end = start + len(sentence)
        if bounds and tags[start].startswith("I-"):
            bounds[-1] = (bounds[-1][0], end)
            alignment.joined += 1
        else:
            bounds.append((start, end))
        start = end
    return bounds


# ------------------------------------------------------------------------------------------------ back to spans


def entity_spans(tags: Sequence[str]) -> list[tuple[int, int, str]]:
    """(first word, last word, type) of each entity, read by seqeval's strict IOB2 parser: a B starts one, the I tags
    of its type that follow continue it, an I with no B before it starts none. Untyped tags (`B`, `I`) give the type
    "entity"."""
    if not any(tag[:1] == "B" for tag in tags):  # no entity starts: seqeval's parse (about 0.2 ms) is not needed
        return []
    entities = Entities([list(tags)], IOB2).entities[0]
    return [(e.start, e.end - 1, "entity" if e.tag == UNTYPED else e.tag) for e in entities]


def spans_from_tags(tags: Sequence[str], offsets: Sequence[Fragment]) -> list[Span]:
    """The entities of one sentence's tags as spans of character offsets (each word's offsets in `offsets`)."""
    return [Span(kind, ((offsets[first][0], offsets[last][1]),)) for first, last, kind in entity_spans(tags)]


def documents_from_tags(documents: Sequence[SpanDocument], examples: Sequence[SentenceExample],
                        tags: Sequence[Sequence[str]]) -> list[SpanDocument]:
    """Each document with the spans its sentences' tags say (a model's predictions, or the gold tags back)."""
    found: dict[str, list[Span]] = defaultdict(list)
    for example, sentence_tags in zip(examples, tags, strict=True):
        found[example.document].extend(spans_from_tags(sentence_tags, example.offsets))
    return [document.with_spans(found.get(document.id, [])) for document in documents]
