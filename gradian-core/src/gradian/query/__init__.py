"""Query gradients: what the eval failure looks like in LoRA-gradient space, per item and per sentence."""

from gradian.query.signals import QueryGradients, QueryTerm, query_gradients
from gradian.query.spans import SpanBlame, sentence_spans, span_blames

__all__ = ["QueryGradients", "QueryTerm", "SpanBlame", "query_gradients", "sentence_spans", "span_blames"]
