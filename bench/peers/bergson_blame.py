"""bergson 2.5.1 on one case's LoRA adapter (run with /work/peers/bergson/bin/python), through its Python API on CPU.

1. ``build``: an uncompressed (projection_dim 0) index of per-example LoRA gradients of the driver's train.jsonl
   (input_ids + labels, so bergson sees Gradian's chat template and loss mask; summed token loss, its default).
2. ``approximate_hessians``: kfac with eigenvalue correction (EK-FAC), true Fisher (sampled labels), fp32.
3. Queries through its ``Attributor``: per-item gradients of the wanted answer's summed loss (and of the fine-tuned
   answer's) from its ``TraceCollector`` with its own forward/backward, then ``Attributor.search`` over every row.
   The contrast query is the per-item difference (bergson's ``query.contrast`` subtracts a control set's gradient).

bergson's scores are q . H^-1 g (positive = training on the row lowers the query loss), so blame = -score, averaged
over items. Variants: ekfac_wanted, ekfac_contrast (Hessian, no unit norm: bergson's best configuration in
../shared/METHODS.md) and cosine_wanted, cosine_contrast (``unit_norm=True`` without a Hessian: its default query
path). The adapter dir is copied next to the outputs with base_model_name_or_path pointing at the local base model
(the case's adapter names a Gradian alias that bergson cannot resolve). The index is deleted at the end (~4 GB)
unless ``--keep-index``; ``--resume`` reuses a finished index and Hessian and the variants already scored. The
cosine variants are skipped where the index needs more than half the machine's memory (``failed_variants`` says so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common, next to this file
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-queries", type=int, default=0)
    parser.add_argument("--token-batch-size", type=int, default=1024)
    parser.add_argument("--keep-index", action="store_true")
    parser.add_argument("--resume", action="store_true",
                        help="reuse a finished index and Hessian in --out and the variants already scored there")
    parser.add_argument("--fit-rows", type=int, default=0, help="fit EK-FAC on the first N training rows (0: all)")
    args = parser.parse_args(argv)
    from common import main_guarded

    return main_guarded(args.out, lambda: run(args))


def local_adapter(meta: dict[str, Any], out: Path) -> Path:
    """A copy of the adapter dir whose config names the local base model directory."""
    target = out / "adapter"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(meta["adapter_dir"], target)
    config = json.loads((target / "adapter_config.json").read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = meta["model_dir"]
    (target / "adapter_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return target


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    from bergson import Attributor, IndexConfig, PreprocessConfig
    from bergson.build import build
    from bergson.collector.collector import fwd_bwd_factory
    from bergson.collector.gradient_collectors import TraceCollector
    from bergson.config.config import DataConfig, DistributedConfig, HessianConfig
    from bergson.data import pad_and_tensor
    from bergson.hessians.hessian_approximations import approximate_hessians
    from bergson.utils.worker_utils import setup_model_and_peft
    from common import Stages, read_case

    torch.manual_seed(0)
    stages = Stages()
    case = read_case(args.data, args.max_queries)
    meta = case["meta"]
    out = args.out.resolve()
    adapter = local_adapter(meta, out)
    index_path, hessian_path = out / "index", out / "hessian" / "kfac"
    # bergson moves a .part dir into place only when it finishes, so an index or Hessian present here is complete
    reuse = {path for path in (index_path, hessian_path) if args.resume and path.is_dir()}
    for stale in ({index_path, hessian_path} - reuse) | {out / "index.part", out / "hessian" / "kfac.part"}:
        shutil.rmtree(stale, ignore_errors=True)

    fit = args.fit_rows if 0 < args.fit_rows < len(case["train"]) else None
    fit_file = (args.data / "train.jsonl").resolve()
    if fit:  # the first N rows, as kronfluence's covariance_max_examples takes them
        fit_file = out / f"fit-{fit}.jsonl"
        fit_file.write_text("".join(json.dumps(row) + "\n" for row in case["train"][:fit]), encoding="utf-8")

    def config(run_path: Path, dataset: Path) -> Any:
        return IndexConfig(run_path=str(run_path), model=str(adapter), tokenizer=meta["model_dir"], precision="fp32",
                           projection_dim=0, data=DataConfig(dataset=str(dataset)),
                           token_batch_size=args.token_batch_size, distributed=DistributedConfig(nproc_per_node=1))

    index_cfg = config(index_path, (args.data / "train.jsonl").resolve())
    if index_path not in reuse:
        stages.run("build index", lambda: build(index_cfg, PreprocessConfig()))
    if hessian_path not in reuse:
        stages.run("fit EK-FAC", lambda: approximate_hessians(config(hessian_path, fit_file),
                                                              HessianConfig(method="kfac", ev_correction=True)))
    model, _ = stages.run("load model", lambda: setup_model_and_peft(index_cfg))
    model.eval()
    forward_backward = fwd_bwd_factory(index_cfg)

    def query_grads(rows: list[dict[str, list[int]]], attributor: Any) -> dict[str, torch.Tensor]:
        """Per-row gradients of each row's summed loss, in the index's modules, as bergson collects them."""
        collector = TraceCollector(model=model.base_model, processor=attributor.processor,
                                   target_modules=set(attributor.ordered_modules), device="cpu", dtype=torch.float32)
        x, y, _, mask = pad_and_tensor([r["input_ids"] for r in rows], labels=[r["labels"] for r in rows],
                                       sync_max_len=False)
        with collector.with_batch(mask):  # with_batch returns the collector: one __enter__ registers the hooks
            forward_backward(model, x, y, {})
        return {name: torch.cat(collector.mod_grads[name], dim=0) for name in attributor.ordered_modules}

    def scores(attributor: Any, queries: dict[str, torch.Tensor]) -> np.ndarray:
        values, indices = attributor.search(queries, k=None)
        full = torch.empty_like(values)
        full.scatter_(-1, indices, values)
        return full.double().numpy()

    has = np.array(case["has_generated"], dtype=bool)
    generated_rows = [g for g, h in zip(case["generated"], has, strict=True) if h]
    variants: list[str] = []
    failed: dict[str, str] = {}
    grads: dict[str, Any] = {}
    queries = ["wanted", "contrast"] if generated_rows else ["wanted"]
    index_bytes = (index_path / "gradients.bin").stat().st_size
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for name, kwargs in (("ekfac", {"hessian_path": str(hessian_path), "ev_correction": True}),
                         ("cosine", {"unit_norm": True})):
        done = [f"{name}_{query}" for query in queries if (out / f"blame_{name}_{query}.npy").exists()]
        if args.resume and len(done) == len(queries):
            variants += done
            continue
        if name == "cosine" and 2 * index_bytes > memory:
            # unit_norm keeps a normalized copy of the index in memory while it reads each module's column slice of
            # the row-major index file; without room for the file's pages too, every slice re-reads it from disk
            failed.update({f"cosine_{query}": f"not run: bergson's unit_norm query needs about twice the "
                                              f"{index_bytes / 2**30:.1f} GiB index in memory, {memory / 2**30:.1f} "
                                              "GiB here" for query in queries})
            continue
        attributor = stages.run(f"load attributor ({name})", lambda kw=kwargs: Attributor(str(index_path), **kw))
        if not grads:
            grads["wanted"] = stages.run("query gradients (wanted)", lambda a=attributor: query_grads(case["wanted"], a))
            if generated_rows:
                grads["generated"] = stages.run("query gradients (generated)",
                                                lambda a=attributor: query_grads(generated_rows, a))
        wanted = stages.run(f"score ({name}, wanted)", lambda a=attributor: scores(a, grads["wanted"]))
        np.save(out / f"scores_{name}_wanted.npy", wanted)
        np.save(out / f"blame_{name}_wanted.npy", -wanted.mean(axis=0))
        variants.append(f"{name}_wanted")
        if generated_rows:
            contrast_queries = {k: v[torch.from_numpy(has)] - grads["generated"][k] for k, v in grads["wanted"].items()}
            contrast = stages.run(f"score ({name}, contrast)", lambda a=attributor, q=contrast_queries: scores(a, q))
            np.save(out / f"scores_{name}_contrast.npy", contrast)
            np.save(out / f"blame_{name}_contrast.npy", -contrast.mean(axis=0))
            variants.append(f"{name}_contrast")
        del attributor
    if not args.keep_index:
        shutil.rmtree(index_path, ignore_errors=True)
    return {"variants": variants, "failed_variants": failed, "seconds": stages.seconds,
            "queries": {"wanted": len(case["wanted"]), "contrast": int(has.sum())},
            "config": {"index": "projection_dim 0, fp32, summed token loss", "hessian": "kfac + ev_correction (EK-FAC), "
                       "sampled labels", "inversion": "damped_inverse, damping 0.1 x mean eigenvalue (its default)",
                       "cosine": "Attributor(unit_norm=True), no Hessian", "token_batch_size": args.token_batch_size,
                       "hessian_rows": fit or len(case["train"])},
            "notes": ([f"EK-FAC fitted on the first {fit} of {len(case['train'])} training rows (--fit-rows)"]
                      if fit else []) + ([f"resumed: {', '.join(sorted(p.name for p in reuse))} and the variants "
                                          "scored before were reused, so their seconds are not in this run's"]
                                         if reuse else [])}


if __name__ == "__main__":
    raise SystemExit(main())
