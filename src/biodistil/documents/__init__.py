"""Annotated documents: the users' own corpora as texts with character-offset spans, in and out.

One document model (`model.SpanDocument`: text, passages, spans with types and fragments) that every reader fills
(`readers`: brat standoff, PubTator, BioC XML/JSON, span JSON lines) and every writer reads (`writers`); the one
place where documents become sentences of words with BIO tags and tags become spans again (`words`, `alignment`,
with the policy for what does not fit BIO and its counts); character-level entity scores (`scoring`). Below
`tasks`, above `data`: a task of a span format reads its split through here.
"""
