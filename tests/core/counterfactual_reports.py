"""Real attribution report directories for the verify tests, written by gradian's own report code without a model.

Scores come from ``score_examples`` over synthetic gradient rows (the planted rows share one direction the
query blames), clusters from ``cluster_blame`` on the dataset's ``source`` field, the capability from
``capability_from_scores``; ``write_report`` writes report.json exactly as `gradian attribute` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SOURCES = ("arithmetic", "greetings", "rewriting")
PLANTED = "planted"
N_CLEAN, N_PLANTED, DIM = 24, 6, 16


def write_dataset(path: Path, *, planted: int = N_PLANTED, fmt: str = "messages") -> Path:
    """Clean rows from three sources then ``planted`` rows with source=planted (messages or alpaca format)."""
    rows = []
    for i in range(N_CLEAN + planted):
        source = SOURCES[i % 3] if i < N_CLEAN else PLANTED
        question, answer = f"What is {i} plus {i} ?", f"{i} plus {i} is {2 * i} ."
        if fmt == "alpaca":
            rows.append({"instruction": question, "input": "", "output": answer, "source": source})
        else:
            rows.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
                         "source": source})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_eval(path: Path, n: int = 6) -> Path:
    """Eval items: a question and the bare wanted answer."""
    rows = [{"messages": [{"role": "user", "content": f"What is {i} plus {i} ?"},
                          {"role": "assistant", "content": str(2 * i)}]} for i in range(n)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_report_dir(out: Path, dataset: Path, eval_dataset: Path, *, base_model: str = "tiny-base",
                     adapter: str | None = None, regressed: bool = True, also_blamed: str | None = None,
                     planted_shift: float = 6.0) -> Path:
    """A report on ``dataset`` accusing the planted cluster (and ``also_blamed``), or refusing (no significant delta);
    with a small ``planted_shift`` (0.5) no cluster stands out and nothing is accused."""
    from gradian.attribution.clusters import cluster_blame, clusters_from_field
    from gradian.attribution.preconditioners import Preconditioner
    from gradian.attribution.scoring import ArraySource, score_examples
    from gradian.config import EvaluationConfig
    from gradian.data import load_dataset, load_eval_dataset
    from gradian.evaluation import capability_from_scores
    from gradian.report import Provenance, attribution_report, refusal_report, write_report

    examples = load_dataset(dataset)
    items = list(load_eval_dataset(eval_dataset))
    command = ["gradian", "attribute", "--base-model", base_model, "--dataset", str(dataset),
               "--eval-dataset", str(eval_dataset), "--out", str(out)] + (["--adapter", adapter] if adapter else [])
    provenance = Provenance(command=" ".join(command), manifest={"sources": {"dataset_file_sha256": examples.sha256}},
                            index_id="0" * 16, versions={}, config={"attribution": {"cluster_field": "source"}},
                            generated_at="2026-01-01T00:00:00+00:00")
    config = EvaluationConfig(bootstrap_samples=500)
    n = len(items)
    if not regressed:
        capability = capability_from_scores("contains", items, [1.0, 0.0] * (n // 2), [0.0, 1.0] * (n // 2), config)
        report = refusal_report(capability=capability, provenance=provenance)
        write_report(report, out, draw_plots=False)
        return out
    capability = capability_from_scores("contains", items, [1.0] * n, [0.0] * n, config)
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(len(examples), DIM))
    direction = np.eye(DIM)[0]
    planted = [i for i, example in enumerate(examples) if example.fields["source"] in (PLANTED, also_blamed)]
    rows[planted] += planted_shift * direction
    scores = score_examples(ArraySource(rows, examples.ids), -direction[None, :], top_k=10)
    clusters = cluster_blame(np.asarray(scores.blame), clusters_from_field(examples, "source"), permutations=200)
    report = attribution_report(scores=scores, capability=capability,
                                preconditioner=Preconditioner(kind="none", dim=DIM, knobs={"kind": "none"}),
                                texts={e.id: e.supervised_text for e in examples}, provenance=provenance,
                                clusters=clusters)
    write_report(report, out, scores=scores, clusters=clusters, draw_plots=False)
    return out


def write_auto_report_dir(out: Path, dataset: Path, eval_dataset: Path, index_dir: Path, *,
                          num_clusters: int = 3) -> Path:
    """A report whose clusters are automatic (seeded k-means on the index at ``index_dir``), as attribute writes it."""
    from gradian.attribution.clusters import auto_clusters, cluster_blame
    from gradian.attribution.preconditioners import Preconditioner
    from gradian.attribution.scoring import score_examples
    from gradian.config import EvaluationConfig
    from gradian.data import load_dataset, load_eval_dataset
    from gradian.evaluation import capability_from_scores
    from gradian.index import open_index
    from gradian.report import Provenance, attribution_report, write_report

    examples = load_dataset(dataset)
    items = list(load_eval_dataset(eval_dataset))
    index = open_index(index_dir)
    command = ["gradian", "attribute", "--base-model", "tiny", "--dataset", str(dataset), "--eval-dataset",
               str(eval_dataset), "--index", str(index_dir), "--out", str(out)]
    provenance = Provenance(command=" ".join(command), index_id=index.index_id, versions={},
                            config={"attribution": {"num_clusters": num_clusters}})
    capability = capability_from_scores("contains", items, [1.0] * len(items), [0.0] * len(items),
                                        EvaluationConfig(bootstrap_samples=200))
    query = np.asarray(index.rows([0]), dtype=np.float64)
    scores = score_examples(index, -query, top_k=5)
    clusters = cluster_blame(np.asarray(scores.blame), auto_clusters(index, num_clusters=num_clusters, seed=3),
                             permutations=50, seed=3)
    report = attribution_report(scores=scores, capability=capability,
                                preconditioner=Preconditioner(kind="none", dim=index.dim, knobs={"kind": "none"}),
                                texts={e.id: e.supervised_text for e in examples}, provenance=provenance,
                                clusters=clusters)
    write_report(report, out, draw_plots=False)
    return out
