"""Eval items that held but weakened as extra ranking queries: do they find the planted rows whose target held?

The misses table (bench/results/misses.md) puts most of the held-out shortfall on planted rows whose own eval item did
not regress ("The capital of India is Mumbai." while the model still says New Delhi): no regressed item's query asks
about them. Such an item often still weakened: the fine-tuned model gives the base model's answer word for word, but
one of its tokens (the capital) is less likely than before. This scores, at the final adapter, each such item with
the loss of that weakest token alone (the classic signal on one token), preconditioned as the report's queries, and
adds the items whose weakest token lost more than a threshold (nats of log-probability, base to adapter) to the
regressed items' columns of the shipped ranking (kurtosis-weighted smooth_max). Items whose fine-tuned answer differs
from the base one are left out: their largest drop is the first token of another wording, not a weakened answer.

The checkpoints are left out, so the ``adapter alone`` row, not the report, is what each variant is measured against.
Rule, written before any held-out case was scored (the threshold 0.3 chosen on the tuning cases): build it into the
product only if, at the adapter alone, the held-out cases gain 0.03 mean recall@k with none 0.05 lower.

    OMP_NUM_THREADS=2 .venv/bin/python bench/weakened_items.py --cases /work/bench-cases rank-lr5e4-fact-0 ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

RESULTS = Path(__file__).resolve().parent / "results" / "weakened_items"
THRESHOLDS = (0.1, 0.2, 0.3, 0.5)  # nats lost by the weakest answer token; 0.3 chosen on the tuning cases


def token_logprobs(model: Any, encoded: Any) -> dict[int, float]:
    """Log-probability of each supervised token of one encoded answer, by its position."""
    import torch

    ids = torch.tensor([list(encoded.input_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float().log_softmax(-1)
    labels = torch.tensor(list(encoded.labels)[1:])
    picked = logits.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return {step + 1: float(picked[step]) for step in range(len(labels)) if labels[step] != -100}


def weakest_tokens(case: Any, items: list[Any]) -> tuple[list[Any], np.ndarray, list[str]]:
    """Each item's base answer supervised at its weakest token alone, that token's drop in nats, and the token."""
    from gradian.data.encode import encode_answer
    from gradian.query.signals import _supervise_from

    model, tokenizer = case.loaded.model, case.loaded.tokenizer
    model.eval()
    encoded, drops, tokens = [], [], []
    for item in items:
        answer = encode_answer(case.prompts[item.id], item.base_output or item.wanted, tokenizer,
                               case.config.grads.max_seq_length)
        tuned = token_logprobs(model, answer)
        with model.disable_adapter():
            base = token_logprobs(model, answer)
        position = max(tuned, key=lambda step: base[step] - tuned[step])
        encoded.append(_supervise_from(answer, position, True))
        drops.append(base[position] - tuned[position])
        tokens.append(tokenizer.decode([answer.input_ids[position]]))
    return encoded, np.asarray(drops), tokens


def weakest_token_blame(case: Any, encoded: list[Any], item_ids: list[str]) -> np.ndarray:
    """Per-item blame [examples, items] of the weakest-token queries, preconditioned and scored as the report's."""
    from accuracy_methods import preconditioned_blame, preconditioner

    from gradian.query.signals import _encoded_gradients

    queries = _encoded_gradients(case.capture, case.loaded.tokenizer, encoded, case.config.grads.batch_size)
    return preconditioned_blame(case, preconditioner(case, case.config.attribution.preconditioner).apply(queries),
                                item_ids)


def shipped_ranking(blame: np.ndarray) -> np.ndarray:
    """The report's ranking of one point, by the product's own rescoring: kurtosis-weighted smooth_max over items."""
    from gradian.attribution.scoring import rescore_items

    rows, items = (list(map(str, range(n))) for n in blame.shape)
    return rescore_items(blame, rows, items, range(blame.shape[1]), aggregation="smooth_max",
                         item_weights="kurtosis").blame


def rankings(regressed: np.ndarray, weakened: np.ndarray, drops: np.ndarray) -> dict[str, np.ndarray]:
    """The adapter alone's shipped ranking and, per threshold, the same with the weakened items' columns added."""
    scored = {"adapter alone (shipped ranking)": shipped_ranking(regressed)}
    for threshold in THRESHOLDS:
        chosen = drops > threshold
        scored[f"+ weakened items, weakest token lost > {threshold} nats"] = shipped_ranking(
            np.concatenate([regressed, weakened[:, chosen]], axis=1))
    return scored


def score_case(directory: Path, base_model: str) -> dict[str, Any]:
    """recall@k / AUPRC of the adapter alone's ranking and of every threshold on one case."""
    from accuracy_methods import load_case, report_items
    from control_items import blame_on, split_items
    from finished_cases import planted_case, score_rankings

    from gradian.config import load_config

    row, report, truth = planted_case(directory)
    if truth is None:
        return row
    queried, held = split_items(report_items(report))
    held = [item for item in held if item.base_output and item.base_output == item.finetuned_output]
    case = load_case(directory, base_model, load_config(directory / "config.yaml"), report)
    signal = json.loads((directory / "report" / "report.json").read_text())["query_signal"]["effective"]
    encoded, drops, tokens = weakest_tokens(case, held)
    weakened = (weakest_token_blame(case, encoded, [item.id for item in held]) if held
                else np.zeros((len(case.examples), 0)))
    row.update(regressed_items=len(queried), held_same_answer=len(held),
               weakened={item.id: {"token": token, "drop": round(float(drop), 4)}
                         for item, token, drop in zip(held, tokens, drops, strict=True) if drop > min(THRESHOLDS)})
    score_rankings(row, truth, rankings(blame_on(case, queried, signal), weakened, drops))
    print(f"  {directory.name}: " + ", ".join(f"{m['recall_at_k']:.2f}" for m in row["methods"].values()), flush=True)
    return row


def markdown(cases: list[dict[str, Any]], command: str) -> str:
    """One row per ranking, one column per case, then the tuning and held-out means of recall@k."""
    from finished_cases import rankings_table

    return rankings_table("Held eval items that weakened as extra ranking queries (recall@k, the final adapter alone)",
                          "ranking", cases, command)


def main(argv: list[str] | None = None) -> int:
    """Score each named case and write bench/results/weakened_items.json and .md."""
    from finished_cases import indexed_case_main

    return indexed_case_main("weakened_items", __doc__.splitlines()[0], RESULTS, argv, score_case, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
