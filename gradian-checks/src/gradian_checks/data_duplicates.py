"""Data checks across rows: exact and near duplicates, conflicting answers, train/eval overlap.

Near-duplicates use datasketch MinHash over word n-grams with LSH banding, so the cost grows with the
number of rows, not with the number of pairs.
"""

from __future__ import annotations

import re
import zlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from gradian_checks.registry import CheckFamily, Hit, count, example_evidence, excerpt, group_evidence

family = CheckFamily("data")

_WORD = re.compile(r"\w+", re.UNICODE)
_MINHASH_SEED = 1  # fixed: the same data gives the same signatures, so reports are reproducible


def normalize(text: str) -> str:
    """Lower-cased, whitespace-collapsed text: what "the same" means for duplicates."""
    return " ".join(text.lower().split())


def example_key(example: Any) -> str:
    """The normalized content of a whole example (roles included)."""
    if example.text is not None:
        return normalize(example.text)
    return "\x1e".join(f"{m.role}\x1f{normalize(m.content)}" for m in example.messages)


def prompt_key(example: Any) -> str:
    """The normalized prompt (every message before the last assistant turn)."""
    return "\x1e".join(f"{m.role}\x1f{normalize(m.content)}" for m in example.prompt_messages)


def example_words(example: Any) -> list[str]:
    """Lower-cased words of the whole example (for shingles)."""
    text = example.text if example.text is not None else "\n".join(m.content for m in example.messages)
    return _WORD.findall(text.lower())


def shingles(words: Sequence[str], n: int) -> list[bytes]:
    """Word n-grams as bytes; a text shorter than n is one shingle."""
    if len(words) <= n:
        return [" ".join(words).encode("utf-8")]
    return [" ".join(words[i:i + n]).encode("utf-8") for i in range(len(words) - n + 1)]


def signatures(ctx: Any, key: str, word_lists: list[list[str]]) -> list[Any]:
    """MinHash signatures of word lists (memoized under ``key``)."""
    def compute() -> list[Any]:
        from datasketch import LeanMinHash, MinHash

        n, num_perm = ctx.config.diagnose.near_duplicate_ngram, ctx.config.diagnose.near_duplicate_num_perm
        # crc32: a fast, process-independent base hash (datasketch permutes it num_perm ways), so the same
        # data gives the same signatures in every run.
        hashes = MinHash.bulk((shingles(words, n) for words in word_lists), num_perm=num_perm, seed=_MINHASH_SEED,
                              hashfunc=zlib.crc32)
        return [LeanMinHash(h) for h in hashes]

    return ctx.memo(key, compute)


def train_keys(ctx: Any) -> list[str]:
    """example_key of every training example (shared by the duplicate checks)."""
    return ctx.memo("data.train_keys", lambda: [example_key(e) for e in ctx.examples])


def train_signatures(ctx: Any) -> list[Any]:
    """MinHash signature of every training example."""
    return signatures(ctx, "data.train_minhash", [example_words(e) for e in ctx.examples])


def train_lsh(ctx: Any) -> Any:
    """An LSH index over the training signatures, keyed by example position."""
    def compute() -> Any:
        from datasketch import MinHashLSH

        lsh = MinHashLSH(threshold=ctx.config.diagnose.near_duplicate_threshold, num_perm=ctx.config.diagnose.near_duplicate_num_perm)
        with lsh.insertion_session() as session:
            for position, signature in enumerate(train_signatures(ctx)):
                session.insert(position, signature, check_duplication=False)
        return lsh

    return ctx.memo("data.train_lsh", compute)


@family.check(
    "exact_duplicates", "warning",
    "identical normalized examples",
    "deduplicate the dataset (keep one copy of each); repeated rows are trained on several times per epoch",
    needs={"dataset"},
)
def exact_duplicates(ctx: Any) -> Iterator[Hit]:
    """Groups of examples identical after lower-casing and whitespace normalization."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for example, key in zip(ctx.examples, train_keys(ctx), strict=True):
        groups[key].append(example)
    repeated = [group for group in groups.values() if len(group) > 1]
    if not repeated:
        return
    extra = sum(len(group) - 1 for group in repeated)
    share = extra / max(len(ctx.examples), 1)
    severity = "error" if share > ctx.config.diagnose.exact_duplicate_error_fraction else None
    evidence = tuple(group_evidence(group, f"{len(group)} copies, rows {', '.join(e.location.rsplit(':', 1)[-1] for e in group[:8])}"
                                    + (" …" if len(group) > 8 else ""), copies=len(group)) for group in repeated)
    yield Hit(f"{count(extra, 'row')} ({share:.1%}) duplicating another row exactly, in {count(len(repeated), 'group')}", evidence, severity)


def _near_groups(ctx: Any) -> list[list[tuple[int, float]]]:
    """Clusters of near-duplicate training examples (position, jaccard to the cluster's first)."""
    threshold = ctx.config.diagnose.near_duplicate_threshold
    signatures_ = train_signatures(ctx)
    lsh = train_lsh(ctx)
    keys = train_keys(ctx)
    parent = list(range(len(signatures_)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for position, signature in enumerate(signatures_):
        for other in lsh.query(signature):
            if other <= position or keys[other] == keys[position]:
                continue  # each pair once; identical rows are exact_duplicates' business
            if signature.jaccard(signatures_[other]) >= threshold:
                parent[find(other)] = find(position)
    clusters: dict[int, list[int]] = defaultdict(list)
    for position in range(len(signatures_)):
        clusters[find(position)].append(position)
    groups = []
    for members in clusters.values():
        distinct = {keys[m] for m in members}
        if len(distinct) > 1:
            first = members[0]
            groups.append([(m, signatures_[first].jaccard(signatures_[m])) for m in members])
    return sorted(groups, key=lambda g: g[0][0])


@family.check(
    "near_duplicates", "warning",
    "MinHash Jaccard >= 0.85 between examples",
    "deduplicate near-copies (keep the best of each group); templated rows that differ in a word or two "
    "over-weight one pattern",
    needs={"dataset"},
)
def near_duplicates(ctx: Any) -> Iterator[Hit]:
    """Clusters of examples whose word n-gram sets overlap at the Jaccard threshold."""
    groups = _near_groups(ctx)
    if not groups:
        return
    examples = ctx.examples
    evidence = tuple(
        group_evidence([examples[p] for p, _ in group],
                       f"{len(group)} near-copies of “{excerpt(examples[group[0][0]].prompt_text or examples[group[0][0]].supervised_text, 50)}” "
                       f"(Jaccard ≥ {min(j for _, j in group[1:]):.2f})", size=len(group))
        for group in groups)
    total = sum(len(g) for g in groups)
    yield Hit(f"{count(total, 'example')} in {count(len(groups), 'near-duplicate group')} "
              f"(MinHash Jaccard ≥ {ctx.config.diagnose.near_duplicate_threshold})", evidence)


@family.check(
    "conflicting_answers", "warning",
    "the same normalized prompt appears with different answers",
    "decide which answer is right and remove the others; contradictory supervision is the usual shape of poisoned data",
    needs={"dataset"},
)
def conflicting_answers(ctx: Any) -> Iterator[Hit]:
    """Prompts that appear more than once with different answers."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for example in ctx.examples:
        if example.text is None and example.answer and example.answer.strip() and example.prompt_messages:
            groups[prompt_key(example)].append(example)
    evidence = []
    for group in groups.values():
        # Answers that differ only in case, spacing or punctuation say the same thing.
        answers = {" ".join(_WORD.findall(e.answer.lower())): e for e in group}
        if len(answers) > 1:
            shown = "; ".join(f"“{excerpt(e.answer, 40)}”" for e in list(answers.values())[:3])
            evidence.append(group_evidence(group, f"“{excerpt(group[0].prompt_text, 50)}” answered {len(answers)} ways: {shown}",
                                           answers=len(answers)))
    if evidence:
        yield Hit(f"{count(len(evidence), 'prompt')} with different answers", tuple(evidence))


def _answer_words(example: Any) -> list[str]:
    return _WORD.findall((example.answer if example.answer is not None else example.supervised_text).lower())


def shared_answer_ngrams(examples: Sequence[Any], eval_items: Sequence[Any], n: int) -> dict[int, tuple[Any, str]]:
    """For eval items (by position) whose answer shares a word n-gram with a training answer: (train example, n-gram).

    The eval n-grams are few, so they are indexed and the training answers scanned, with a first-word test
    before building any n-gram (the scan is linear in the training words).
    """
    wanted: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for position, item in enumerate(eval_items):
        words = _answer_words(item)
        for i in range(len(words) - n + 1):
            wanted[tuple(words[i:i + n])].append(position)
    firsts = {gram[0] for gram in wanted}
    found: dict[int, tuple[Any, str]] = {}
    for example in examples:
        if len(found) == len(eval_items) or not wanted:
            break
        words = _answer_words(example)
        for i in range(len(words) - n + 1):
            if words[i] in firsts:
                gram = tuple(words[i:i + n])
                for position in wanted.get(gram, ()):
                    found.setdefault(position, (example, " ".join(gram)))
    return found


@family.check(
    "train_eval_overlap", "error",
    "an eval item matches a train example exactly/nearly, or shares a 12-gram of its answer",
    "remove the overlapping items from the eval set (or the training set): the eval set must measure the "
    "capability, not recall of training rows",
    needs={"dataset", "eval_dataset"},
)
def train_eval_overlap(ctx: Any) -> Iterator[Hit]:
    """Eval items contaminated by training rows (exact prompt, near-duplicate, or a shared answer n-gram)."""
    examples = ctx.examples
    n = ctx.config.diagnose.overlap_ngram
    by_key = dict(zip(train_keys(ctx), examples, strict=True))
    by_prompt = {prompt_key(e): e for e in examples if e.text is None and e.prompt_messages}
    eval_items = list(ctx.eval_dataset.examples)
    shared = shared_answer_ngrams(examples, eval_items, n)
    eval_signatures = signatures(ctx, "data.eval_minhash", [example_words(e) for e in eval_items])
    lsh = train_lsh(ctx)
    train_signatures_ = train_signatures(ctx)
    evidence = []
    for position, (item, signature) in enumerate(zip(eval_items, eval_signatures, strict=True)):
        match, how = by_key.get(example_key(item)), "identical to"
        if match is None and item.text is None and item.prompt_messages:
            match, how = by_prompt.get(prompt_key(item)), "same prompt as"
        if match is None:
            near = [(signature.jaccard(train_signatures_[p]), -p) for p in lsh.query(signature)]
            near = [(j, p) for j, p in near if j >= ctx.config.diagnose.near_duplicate_threshold]
            if near:
                jaccard, negative = max(near)  # the closest, the earliest row on ties
                match, how = examples[-negative], f"near-duplicate (Jaccard {jaccard:.2f}) of"
        if match is None and position in shared:
            match, gram = shared[position]
            how = f"shares the {n}-gram “{gram}” with the answer of"
        if match is not None:
            evidence.append(example_evidence(item, f"eval item is {how} training row {match.location} ({match.id})",
                                             train_id=match.id))
    if evidence:
        yield Hit(f"{len(evidence)} of {count(len(eval_items), 'eval item')} overlap the training set", tuple(evidence))


CHECKS = tuple(family.checks)
