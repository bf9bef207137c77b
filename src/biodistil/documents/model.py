"""The document model every span reader fills and every span writer reads.

A `SpanDocument` is the original text (as the annotation tool shows it: PubTator's title + " " + abstract, a brat
.txt file, BioC's passages at their offsets), its passages, and its entity spans. A `Span` has a type and one or
more fragments, each a [start, end) pair of character offsets into the document's text (several for a
discontinuous mention). Where an annotation came from (file and line) travels with it, so a problem found later
(a type outside the task's labels) names the line. What a reader repaired or left out (byte offsets counted as
characters, mention texts found a few characters away, relation and event lines) is counted in `notes`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

Fragment = tuple[int, int]


@dataclass(frozen=True)
class Span:
    """One entity mention: its type and its fragments ([start, end) character offsets, in text order)."""

    type: str
    fragments: tuple[Fragment, ...]
    id: str = ""
    line: int | None = None  # the line of its source file that holds it, when the format has lines
    identifier: str = ""  # a normalised concept id (PubTator's MeSH id, BioC's `identifier` infon); "" when none

    @property
    def start(self) -> int:
        return self.fragments[0][0]

    @property
    def end(self) -> int:
        return self.fragments[-1][1]

    @property
    def discontinuous(self) -> bool:
        return len(self.fragments) > 1

    def text(self, document: str) -> str:
        """The mention's text in `document`: its fragments joined by a space (as brat writes them)."""
        return " ".join(document[a:b] for a, b in self.fragments)

    def key(self) -> tuple[str, tuple[Fragment, ...]]:
        """What two spans share when they are the same entity (strict match): type and fragments."""
        return self.type, self.fragments


@dataclass(frozen=True)
class Passage:
    """A part of the document's text (PubTator's title or abstract, a BioC passage): where it starts and its kind."""

    offset: int
    text: str
    kind: str = ""

    @property
    def end(self) -> int:
        return self.offset + len(self.text)


@dataclass
class SpanDocument:
    """A document with its entity spans; `source` names the file it came from (for messages)."""

    id: str
    text: str
    spans: list[Span] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    source: str = ""
    notes: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if not self.passages:
            self.passages = [Passage(0, self.text)]

    def where(self, span: Span | None = None) -> str:
        """`file:line` of a span (or the file and document id) for an error message."""
        if span is not None and span.line is not None:
            return f"{self.source}:{span.line}"
        return f"{self.source} (document {self.id}{f', annotation {span.id}' if span and span.id else ''})"

    def with_spans(self, spans: list[Span]) -> SpanDocument:
        """The same text and passages with other spans (a model's predictions)."""
        return SpanDocument(self.id, self.text, list(spans), list(self.passages), self.source)


def types_of(documents: list[SpanDocument]) -> list[str]:
    """The entity types the documents use, sorted."""
    return sorted({span.type for document in documents for span in document.spans})
