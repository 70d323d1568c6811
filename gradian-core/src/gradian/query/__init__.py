"""Query gradients: what the eval failure looks like in LoRA-gradient space, per item and per sentence."""

from gradian.query.signals import QueryGradients, QueryTerm, QueryTerms, query_gradients, query_terms
from gradian.query.spans import SpanBlame, sentence_spans, span_blames

__all__ = ["QueryGradients", "QueryTerm", "QueryTerms", "SpanBlame", "query_gradients", "query_terms",
           "sentence_spans", "span_blames"]
