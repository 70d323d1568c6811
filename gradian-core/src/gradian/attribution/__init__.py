"""Attribution: preconditioned, streamed blame of every training example, aggregated over regressed items,
clustered, with permutation p-values.

Importing this package imports numpy only (no torch).
"""

from __future__ import annotations

from gradian.attribution.aggregation import AGGREGATIONS, RunningMoments, TopK, average_ranks, borda_score, ranks_of
from gradian.attribution.clusters import (
    assign_clusters,
    auto_clusters,
    cluster_blame,
    clusters_from_field,
    default_num_clusters,
    score_clusters,
    sketch_rows,
)
from gradian.attribution.preconditioners import (
    PRECONDITIONERS,
    BlockMoment,
    IndexStatistics,
    Preconditioner,
    adam_preconditioner,
    block_preconditioner,
    diagonal_preconditioner,
    fit_preconditioner,
    from_config,
)
from gradian.attribution.results import (
    ACCUSE_ALPHA,
    ClusterAssignment,
    ClusterResult,
    ClusterScore,
    ExampleScores,
    SpanDrill,
)
from gradian.attribution.scoring import (
    ArraySource,
    ChunkSource,
    item_blame,
    leading_rows,
    score_examples,
    score_with_config,
)

__all__ = [
    "ACCUSE_ALPHA",
    "AGGREGATIONS",
    "PRECONDITIONERS",
    "ArraySource",
    "BlockMoment",
    "ChunkSource",
    "ClusterAssignment",
    "ClusterResult",
    "ClusterScore",
    "ExampleScores",
    "IndexStatistics",
    "Preconditioner",
    "RunningMoments",
    "SpanDrill",
    "TopK",
    "adam_preconditioner",
    "assign_clusters",
    "auto_clusters",
    "average_ranks",
    "block_preconditioner",
    "borda_score",
    "cluster_blame",
    "clusters_from_field",
    "default_num_clusters",
    "diagonal_preconditioner",
    "fit_preconditioner",
    "from_config",
    "item_blame",
    "leading_rows",
    "ranks_of",
    "score_clusters",
    "score_examples",
    "score_with_config",
    "sketch_rows",
]
