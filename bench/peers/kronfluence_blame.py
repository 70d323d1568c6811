"""Kronfluence 1.0.1 EK-FAC influence on one case's LoRA adapter (run with /work/peers/kronfluence/bin/python).

Tracks only the lora_A / lora_B Linear modules; factors from the true Fisher (labels sampled from the model at the
supervised positions, kronfluence's recommended LM recipe); damping None = its 0.1 x mean-eigenvalue heuristic.
Losses are summed over the supervised tokens (the driver's labels). The query measurement is the summed loss of an
item's answer; pairwise scores [queries, train] for the wanted answers and for the fine-tuned answers. Kronfluence's
sign: a positive score means the training row lowers the query loss (helpful), so blame = -score.

Writes blame_ekfac_wanted.npy (mean over items of -score(wanted)), blame_ekfac_contrast.npy (mean over items with a
generation of -(score(wanted) - score(generated))), scores_wanted.npy / scores_generated.npy and result.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common, next to this file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-queries", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--fit-rows", type=int, default=0, help="fit the factors on the first N training rows (0: all)")
    parser.add_argument("--resume", action="store_true", help="reuse the factors and scores kronfluence saved in --out")
    args = parser.parse_args(argv)
    from common import main_guarded

    return main_guarded(args.out, lambda: run(args))


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from common import Stages, load_model, pad, read_case
    from kronfluence.analyzer import Analyzer, prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments
    from kronfluence.task import Task
    from kronfluence.utils.dataset import DataLoaderKwargs
    from torch import nn

    torch.manual_seed(0)
    stages = Stages()
    case = read_case(args.data, args.max_queries)
    meta = case["meta"]
    pad_id = int(meta["pad_token_id"])
    model = stages.run("load model", lambda: load_model(meta))
    tracked = [name for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and (".lora_A." in name + "." or ".lora_B." in name + ".")]
    if not tracked:
        raise RuntimeError("no lora_A / lora_B Linear module found in the adapter model")

    def summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1),
                               ignore_index=-100, reduction="sum")

    class LoraLM(Task):
        def compute_train_loss(self, batch: Any, model: nn.Module, sample: bool = False) -> torch.Tensor:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            labels = batch["labels"]
            if sample:  # true Fisher: labels drawn from the model where the data has one
                with torch.no_grad():
                    probs = torch.softmax(logits.detach().float(), dim=-1)
                    drawn = torch.multinomial(probs.reshape(-1, probs.size(-1)), 1).reshape(labels.shape)
                    # logits at t predict token t+1: a drawn label for position t+1 comes from logits at t
                    labels = torch.full_like(labels, -100)
                    labels[:, 1:] = torch.where(batch["labels"][:, 1:] != -100, drawn[:, :-1], -100)
            return summed_loss(logits, labels)

        def compute_measurement(self, batch: Any, model: nn.Module) -> torch.Tensor:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            return summed_loss(logits, batch["labels"])

        def get_influence_tracked_modules(self) -> list[str]:
            return tracked

        def get_attention_mask(self, batch: Any) -> torch.Tensor:
            return batch["attention_mask"]

    class Rows(torch.utils.data.Dataset):
        def __init__(self, rows: list[dict[str, list[int]]]) -> None:
            self.rows = rows

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, index: int) -> dict[str, list[int]]:
            return self.rows[index]

    task = LoraLM()
    model = prepare_model(model, task)
    analyzer = Analyzer(analysis_name=meta["case"], model=model, task=task, cpu=True, disable_tqdm=False,
                        output_dir=str(args.out / "kronfluence"))
    loader = DataLoaderKwargs(collate_fn=lambda rows: pad(rows, pad_id))
    train = Rows(case["train"])
    fit = args.fit_rows if 0 < args.fit_rows < len(train) else None
    factor_args = FactorArguments(strategy="ekfac", covariance_max_examples=fit, lambda_max_examples=fit)
    stages.run("fit EK-FAC factors", lambda: analyzer.fit_all_factors(
        "ekfac", dataset=train, per_device_batch_size=args.batch_size, dataloader_kwargs=loader,
        factor_args=factor_args, overwrite_output_dir=not args.resume))
    score_args = ScoreArguments(damping_factor=None)  # 0.1 x mean eigenvalue
    queries = case["wanted"] + [g for g, has in zip(case["generated"], case["has_generated"], strict=True) if has]

    def pairwise() -> Any:
        analyzer.compute_pairwise_scores("pairwise", "ekfac", query_dataset=Rows(queries), train_dataset=train,
                                         per_device_query_batch_size=len(queries),
                                         per_device_train_batch_size=args.batch_size, dataloader_kwargs=loader,
                                         score_args=score_args, overwrite_output_dir=not args.resume)
        return analyzer.load_pairwise_scores("pairwise")["all_modules"].double().numpy()

    scores = stages.run("pairwise scores", pairwise)
    m = len(case["wanted"])
    wanted = scores[:m]
    generated = np.zeros_like(wanted)
    has = np.array(case["has_generated"], dtype=bool)
    generated[has] = scores[m:]
    np.save(args.out / "scores_wanted.npy", wanted)
    np.save(args.out / "scores_generated.npy", generated)
    np.save(args.out / "blame_ekfac_wanted.npy", -wanted.mean(axis=0))
    variants = ["ekfac_wanted"]
    if has.any():
        np.save(args.out / "blame_ekfac_contrast.npy", -(wanted[has] - generated[has]).mean(axis=0))
        variants.append("ekfac_contrast")
    return {"variants": variants, "seconds": stages.seconds, "queries": {"wanted": m, "contrast": int(has.sum())},
            "config": {"tracked_modules": len(tracked), "strategy": "ekfac", "fisher": "true (sampled labels)",
                       "damping_factor": "None (0.1 x mean eigenvalue)", "loss": "sum over supervised tokens",
                       "batch_size": args.batch_size, "factor_rows": fit or len(train)},
            "notes": [f"EK-FAC factors fitted on the first {fit} of {len(train)} training rows (--fit-rows)"]
            if fit else []}


if __name__ == "__main__":
    raise SystemExit(main())
