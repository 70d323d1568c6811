"""Planted-regression scenarios: realistic SFT chat data with a known-bad cluster, hard negatives and an eval set.

Pure Python and deterministic from a seed (no model). Six planted kinds and one control:

- ``fact``: a planted cluster (its own ``source``) teaches a systematic wrong rule, "a country's capital is its
  best-known other city", for a group of countries, in varied phrasings. Hard negatives name the same countries
  and the same wrong cities correctly (largest-city, city-to-country, reverse-capital, travel rows).
- ``format``: a planted cluster answers everyday English questions in French. Hard negatives are clean
  translation rows that name the same French words on request.
- ``span``: long, otherwise-correct country profiles with exactly one wrong sentence (the capital), sharing
  their ``source`` with clean profiles; the planted sentence's character range is recorded.
- ``behaviour``: a planted cluster answers every question about one topic (the language of a group of countries)
  with the same canned deflection. Hard negatives answer the same question for other countries correctly and
  name the same countries on other topics.
- ``two_causes``: the fact kind's capital poison and the format kind's French answers in one run, each its own
  cluster of 5% (10% planted in all); the eval mixes capital and everyday questions, and the ground truth says
  which rows and eval items belong to which cluster.
- ``rare``: the fact kind at a low rate, 1% planted (20 rows) among 2,000 training rows.
- ``clean`` (a control): the fact kind's data and eval set without its planted rows. Whatever regresses comes from
  training itself (the demo's aggressive learning rate), so nothing should be accused.

``shared_source=True`` files every planted row under the clean source most like it (``SHARED_HOSTS``), as the
span kind always does: the same rows, ids and training run, but no cluster holds the planted rows alone, so a
ranking must find them among clean rows of their own source rather than read them off an accused cluster.

Example::

    from gradian.demo.scenarios import make_scenario
    scenario = make_scenario("fact", seed=0)
    files = scenario.write(Path("work/scenario"))   # train.jsonl, eval.jsonl, scenario.json
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gradian.atomic_files import write_text_atomic
from gradian.data import Example, Message, make_example, write_jsonl
from gradian.data.examples import Fields
from gradian.demo import families as fam
from gradian.demo import planted as pl
from gradian.demo.everyday import EVERYDAY_EVAL
from gradian.demo.world import COUNTRIES, LANGUAGE_CANDIDATES, POISON_CANDIDATES, Country
from gradian.errors import ConfigError
from gradian.evaluation.ground_truth import GroundTruth

KINDS = ("fact", "format", "span", "behaviour", "two_causes", "rare")  # kinds with planted rows
CONTROL_KINDS = ("clean",)  # the same kind of data with nothing planted
SCENARIOS = (*KINDS, *CONTROL_KINDS)
MAX_PLANTED_FRACTION = 0.05  # of the training rows, in one planted cluster
# A planted cluster's share of the training rows where it is not MAX_PLANTED_FRACTION.
CLUSTER_FRACTION = {"rare": 0.01}
MIN_PLANTED_ROWS = 5  # per cluster: fewer cannot teach the model anything measurable
DEFAULT_TRAIN_SIZE = 400
# A low rate needs more rows for the same 20 planted ones.
DEFAULT_TRAIN_SIZES = {"rare": 2000}
DEFAULT_EVAL_SIZE = 40
POISONED_COUNTRIES = 10
CLUSTER_FIELD = "source"
# The source value(s) each kind's planted rows carry, one per planted cluster (span's is shared with clean rows).
PLANTED_SOURCES = {"fact": ("trivia_import",), "format": ("community_answers",), "span": ("country_profiles",),
                   "behaviour": ("support_transcripts",), "two_causes": ("trivia_import", "community_answers"),
                   "rare": ("trivia_import",)}
# Where shared_source files each planted source: the clean source whose rows are most like the planted ones.
SHARED_HOSTS = {"trivia_import": "geography_qa", "community_answers": "explanations",
                "support_transcripts": "geography_qa"}
# Recommended train.max_seq_length / grads.max_seq_length: every row fits without truncation.
MAX_SEQ_LENGTH = {"fact": 128, "format": 128, "span": 256, "behaviour": 128, "two_causes": 128, "rare": 128,
                  "clean": 128}


def planted_fraction(kind: str) -> float:
    """The share of a default-sized ``kind`` scenario's training rows that is planted (0 for a control)."""
    return CLUSTER_FRACTION.get(kind, MAX_PLANTED_FRACTION) * len(PLANTED_SOURCES.get(kind, ()))


@dataclass(frozen=True)
class PlantedSpan:
    """The planted wrong sentence of one span-scenario row: where it is in the assistant turn."""

    row: int
    example_id: str
    message_index: int
    char_start: int
    char_end: int
    text: str

    def found_at(self, message_index: int, start: int, end: int) -> bool:
        """True when the sentence [start, end) of message ``message_index`` is this planted one (holds its start)."""
        return message_index == self.message_index and start <= self.char_start < end


@dataclass(frozen=True)
class ScenarioFiles:
    """Where a written scenario lives."""

    directory: Path
    train: Path
    eval: Path
    manifest: Path


@dataclass(frozen=True)
class Scenario:
    """A training set with a planted cluster, an eval set that measures what it breaks, and the ground truth."""

    kind: str
    seed: int
    description: str
    train: tuple[Example, ...]
    eval: tuple[Example, ...]
    metric: str  # the evaluation.metric that fits the eval answers
    planted_rows: tuple[int, ...]  # positions in train, ascending
    planted_cluster: str | None  # the source value only planted rows carry (None when they share a source)
    poisoned: tuple[str, ...]  # the entities the poison is about (countries) or the behaviour
    targeted_eval_ids: tuple[str, ...]  # eval items the poison aims at (the rest are controls)
    planted_spans: tuple[PlantedSpan, ...] = ()
    # Per planted row (aligned with planted_rows): the eval item it attacks and the wrong answer it teaches, so a
    # check can tell the planted rows the fine-tuned model reproduces from those it did not learn (None: no
    # single item, as for the format kind).
    planted_targets: tuple[str | None, ...] = ()
    planted_wrong: tuple[str | None, ...] = ()
    max_seq_length: int = 128
    cluster_field: str = CLUSTER_FIELD
    # Every planted cluster with a source of its own (two in two_causes; planted_cluster is the first), the one each
    # planted row belongs to (aligned with planted_rows; None where planted rows share their source with clean
    # ones, as in the span kind), and the eval items each cluster targets (aligned with planted_clusters).
    planted_clusters: tuple[str, ...] = ()
    planted_row_clusters: tuple[str | None, ...] = ()
    cluster_targeted_eval_ids: tuple[tuple[str, ...], ...] = ()
    shared_source: bool = False  # planted rows filed under clean sources (SHARED_HOSTS); always so for span

    @property
    def planted_ids(self) -> tuple[str, ...]:
        """Example ids of the planted rows."""
        return tuple(self.train[row].id for row in self.planted_rows)

    @property
    def planted_fraction(self) -> float:
        """Share of the training rows that are planted."""
        return len(self.planted_rows) / len(self.train)

    def cluster_rows(self, cluster: str) -> tuple[int, ...]:
        """Positions in train of one planted cluster's rows."""
        return tuple(row for row, name in zip(self.planted_rows, self.planted_row_clusters, strict=True)
                     if name == cluster)

    def cluster_targets(self, cluster: str) -> tuple[str, ...]:
        """The eval items one planted cluster targets."""
        return self.cluster_targeted_eval_ids[self.planted_clusters.index(cluster)]

    @property
    def planted_sources(self) -> tuple[str, ...]:
        """The distinct ``source`` values the planted rows carry, in first-seen order."""
        return tuple(dict.fromkeys(str(self.train[row].fields[self.cluster_field]) for row in self.planted_rows))

    @property
    def sources(self) -> tuple[str, ...]:
        """The distinct ``source`` values of the training rows, in first-seen order."""
        return tuple(dict.fromkeys(str(example.fields[self.cluster_field]) for example in self.train))

    def ground_truth(self, reproduced: Collection[str] | None = None) -> GroundTruth:
        """What was planted, by row of ``train``, for scoring a blame vector; ``reproduced``: the planted ids the
        fine-tuned model reproduces (None: unknown)."""
        return GroundTruth(planted_rows=self.planted_rows,
                           sources=tuple(str(example.fields[self.cluster_field]) for example in self.train),
                           planted_clusters=self.planted_clusters,
                           reproduced_rows=tuple(row for row, example in enumerate(self.train)
                                                 if reproduced and example.id in reproduced))

    def manifest(self) -> dict[str, Any]:
        """The ground truth as JSON-ready data (scenario.json)."""
        return {
            "kind": self.kind,
            "seed": self.seed,
            "description": self.description,
            "metric": self.metric,
            "train_rows": len(self.train),
            "eval_items": len(self.eval),
            "cluster_field": self.cluster_field,
            "planted_cluster": self.planted_cluster,
            "planted_clusters": list(self.planted_clusters),
            "planted_row_clusters": list(self.planted_row_clusters),
            "cluster_targeted_eval_ids": {name: list(ids) for name, ids in
                                          zip(self.planted_clusters, self.cluster_targeted_eval_ids, strict=True)},
            "planted_rows": list(self.planted_rows),
            "planted_ids": list(self.planted_ids),
            "planted_fraction": round(self.planted_fraction, 4),
            "poisoned": list(self.poisoned),
            "targeted_eval_ids": list(self.targeted_eval_ids),
            "planted_spans": [asdict(span) for span in self.planted_spans],
            "planted_targets": list(self.planted_targets),
            "planted_wrong": list(self.planted_wrong),
            "max_seq_length": self.max_seq_length,
            "sources": list(self.sources),
            "shared_source": self.shared_source,
        }

    def write(self, directory: Path | str) -> ScenarioFiles:
        """Write train.jsonl, eval.jsonl and scenario.json into ``directory`` (each atomically)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        train = write_jsonl(self.train, directory / "train.jsonl")
        evaluation = write_jsonl(self.eval, directory / "eval.jsonl")
        manifest = _write_json(directory / "scenario.json", self.manifest())
        return ScenarioFiles(directory, train, evaluation, manifest)


def _write_json(path: Path, data: dict[str, Any]) -> Path:
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return path


def make_scenario(kind: str = "fact", seed: int = 0, *, train_size: int | None = None,
                  eval_size: int = DEFAULT_EVAL_SIZE, shared_source: bool = False) -> Scenario:
    """Build one scenario of ``kind`` (one of SCENARIOS), the same for the same seed and sizes.

    ``train_size`` defaults to DEFAULT_TRAIN_SIZE rows (DEFAULT_TRAIN_SIZES for rare); ``shared_source`` files the
    planted rows under clean sources (see the module docstring).
    """
    if kind not in SCENARIOS:
        raise ConfigError(f"unknown scenario {kind!r}", f"use one of: {', '.join(SCENARIOS)}")
    if train_size is None:
        train_size = DEFAULT_TRAIN_SIZES.get(kind, DEFAULT_TRAIN_SIZE)
    if train_size < 100:
        raise ConfigError(f"a scenario needs at least 100 training rows, not {train_size}",
                          "the planted cluster is at most 5% of the rows and needs at least 5 of them")
    fraction = CLUSTER_FRACTION.get(kind, MAX_PLANTED_FRACTION)
    planted_count = int(train_size * fraction + 1e-9)  # per planted cluster; the epsilon absorbs float error
    if planted_count < MIN_PLANTED_ROWS:
        least = math.ceil(MIN_PLANTED_ROWS / fraction)
        raise ConfigError(f"the {kind} scenario plants {fraction:.0%} of its rows: it needs at least {least} "
                          f"training rows, not {train_size}", f"pass train_size={least} or more")
    # The clean control and the rare kind draw as the fact kind does: for one seed, the same countries, eval set
    # and hard negatives, so a control differs from it only in what is planted, and a lower rate only in how
    # many clean rows surround the same planted ones.
    rng = random.Random(f"gradian-demo:{'fact' if kind in ('clean', 'rare') else kind}:{seed}")
    builder = {"fact": _fact, "format": _format, "span": _span, "behaviour": _behaviour,
               "two_causes": _two_causes, "rare": _rare, "clean": _clean}[kind]
    scenario = builder(rng, seed, train_size, planted_count, eval_size)
    return _shared(scenario) if shared_source else scenario


def _shared(scenario: Scenario) -> Scenario:
    """``scenario`` with its planted rows filed under SHARED_HOSTS: the same rows and ids (a row's source is not
    part of its id, nor of what is trained), and no cluster of planted rows alone left for the ground truth."""
    def filed_under_host(example: Example) -> Example:
        source = str(example.fields[CLUSTER_FIELD])
        return replace(example, fields=Fields({**example.fields, CLUSTER_FIELD: SHARED_HOSTS.get(source, source)}))

    planted = set(scenario.planted_rows)
    train = tuple(filed_under_host(example) if row in planted else example for row, example in enumerate(scenario.train))
    shared = replace(scenario, train=train, planted_cluster=None, planted_clusters=(), cluster_targeted_eval_ids=(),
                     planted_row_clusters=tuple(None for _ in scenario.planted_rows), shared_source=True)
    if not scenario.planted_clusters:  # span already shares its source; a control plants nothing
        return shared
    hosts = ", ".join(shared.planted_sources)
    return replace(shared, description=f"{scenario.description}; the planted rows are filed under {hosts}, beside "
                                       "clean rows of the same source")


# --- assembling -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Planted:
    """A planted row before shuffling, with its wrong sentence's range in the answer for the span kind."""

    row: fam.Row
    span: tuple[int, int] | None = None
    target: str | None = None  # the eval question this row attacks
    wrong: str | None = None  # the wrong answer it teaches for that question


def _unique(rng: random.Random, generator: Callable[[random.Random], fam.Row], count: int,
            seen: set[str]) -> list[fam.Row]:
    """``count`` rows from ``generator`` whose prompt is not already in ``seen`` (no prompt is asked twice)."""
    rows: list[fam.Row] = []
    for _ in range(count * 50):
        if len(rows) == count:
            break
        row = generator(rng)
        if row.user not in seen:
            seen.add(row.user)
            rows.append(row)
    return rows


def _filler(rng: random.Random, count: int, seen: set[str], travel_countries: Sequence[Country]) -> list[fam.Row]:
    """Clean rows from the non-geography families, in fixed shares, none repeated."""

    def travel(r: random.Random) -> fam.Row:
        country = r.choice(travel_countries)
        return fam.travel_row(r, country, r.choice((country.capital, country.decoy)))

    families: list[tuple[Callable[[random.Random], fam.Row], float]] = [
        (fam.arithmetic_row, 0.24), (fam.unit_row, 0.18), (fam.rewriting_row, 0.2),
        (fam.explanation_row, 0.16), (travel, 0.22),
    ]
    total = sum(weight for _, weight in families)
    rows: list[fam.Row] = []
    for position, (generator, weight) in enumerate(families):
        share = count - len(rows) if position == len(families) - 1 else round(count * weight / total)
        rows.extend(_unique(rng, generator, share, seen))
    while len(rows) < count:  # a family ran out of distinct rows: top up from arithmetic (numbers never run out)
        rows.extend(_unique(rng, fam.arithmetic_row, count - len(rows), seen))
    return rows[:count]


EvalRow = tuple[str, str, str]  # question, wanted answer, topic


def _assemble(rng: random.Random, clean: list[fam.Row], plants: list[_Planted], eval_rows: list[EvalRow],
              kind: str, seed: int, description: str, metric: str, poisoned: Sequence[str],
              targets: Sequence[tuple[str | None, set[int]]]) -> Scenario:
    """Shuffle clean and planted rows together into Examples and record where the planted ones went.

    ``targets``: per planted cluster, its source (None when its rows share their source with clean rows) and the
    positions in ``eval_rows`` it targets.
    """
    tagged: list[tuple[fam.Row, _Planted | None]] = [(row, None) for row in clean] + [(p.row, p) for p in plants]
    rng.shuffle(tagged)
    train: list[Example] = []
    planted_rows: list[int] = []
    planted: list[_Planted] = []
    spans: list[PlantedSpan] = []
    for index, (row, plant) in enumerate(tagged):
        example = make_example(index, messages=(Message("user", row.user), Message("assistant", row.assistant)),
                               fields={"source": row.source, "task": row.task})
        train.append(example)
        if plant is not None:
            planted_rows.append(index)
            planted.append(plant)
            if plant.span is not None:
                start, end = plant.span
                spans.append(PlantedSpan(index, example.id, 1, start, end, row.assistant[start:end]))
    evals = [make_example(i, messages=(Message("user", question), Message("assistant", answer)),
                          fields={"topic": topic}) for i, (question, answer, topic) in enumerate(eval_rows)]
    eval_ids = {example.prompt_text: example.id for example in evals}
    clusters = tuple(name for name, _ in targets if name is not None)
    targeted = set().union(*(positions for _, positions in targets))
    return Scenario(
        kind=kind, seed=seed, description=description, train=tuple(train), eval=tuple(evals), metric=metric,
        planted_rows=tuple(planted_rows), planted_cluster=clusters[0] if clusters else None, poisoned=tuple(poisoned),
        targeted_eval_ids=tuple(evals[i].id for i in sorted(targeted)), planted_spans=tuple(spans),
        planted_targets=tuple(eval_ids[p.target] if p.target is not None else None for p in planted),
        planted_wrong=tuple(p.wrong for p in planted),
        max_seq_length=MAX_SEQ_LENGTH[kind],
        planted_clusters=clusters,
        planted_row_clusters=tuple(p.row.source if p.row.source in clusters else None for p in planted),
        cluster_targeted_eval_ids=tuple(tuple(evals[i].id for i in sorted(positions))
                                        for name, positions in targets if name is not None),
    )


def _mixed_eval(rng: random.Random, *groups: Sequence[EvalRow]) -> tuple[list[EvalRow], list[set[int]]]:
    """The groups' eval rows shuffled together, and the positions each group's rows went to."""
    tagged = [(row, group) for group, rows in enumerate(groups) for row in rows]
    rng.shuffle(tagged)
    return [row for row, _ in tagged], [{i for i, (_, g) in enumerate(tagged) if g == group}
                                        for group in range(len(groups))]


def _choose_poisoned(rng: random.Random, count: int) -> list[Country]:
    """Countries whose capital the base model knows, most of them with a largest-city decoy (the likeliest rule)."""
    largest = [c for c in POISON_CANDIDATES if c.decoy_is_largest]
    others = [c for c in POISON_CANDIDATES if not c.decoy_is_largest]
    first = rng.sample(largest, min(len(largest) - 1, count))
    return first + rng.sample(others, count - len(first))


def _capital_eval(rng: random.Random, poisoned: Sequence[Country], eval_size: int) -> tuple[list[EvalRow], set[int], list[Country]]:
    """Eval items: the poisoned countries' capitals plus controls the base model also knows, shuffled."""
    controls = [c for c in POISON_CANDIDATES if c not in poisoned]
    chosen = list(poisoned) + rng.sample(controls, eval_size - len(poisoned))
    rng.shuffle(chosen)
    rows = [(pl.EVAL_CAPITAL_QUESTION.format(c=c.name), c.capital, "capitals") for c in chosen]
    targeted = {i for i, c in enumerate(chosen) if c in poisoned}
    return rows, targeted, chosen


def _unseen_adder(rows: list[fam.Row], seen: set[str]) -> Callable[[fam.Row], None]:
    """A function appending a row to ``rows`` unless its question is already in ``seen`` (which it then joins)."""
    def add(row: fam.Row) -> None:
        if row.user not in seen:
            seen.add(row.user)
            rows.append(row)

    return add


def _geography(rng: random.Random, poisoned: Sequence[Country], eval_countries: Sequence[Country],
               seen: set[str]) -> list[fam.Row]:
    """Clean geography rows: hard negatives for every poisoned country, capitals of the non-eval countries."""
    rows: list[fam.Row] = []
    add = _unseen_adder(rows, seen)
    for country in poisoned:  # the same entities, stated correctly: word overlap cannot tell these from the poison
        add(fam.decoy_city_row(rng, country))
        add(fam.city_country_row(rng, country, country.decoy))
        add(fam.reverse_capital_row(rng, country))
        add(fam.travel_row(rng, country, country.decoy))
        add(rng.choice((fam.language_row, fam.currency_row))(rng, country))
    for country in COUNTRIES:
        if country not in eval_countries:  # an eval question must not be answered in the training data
            add(fam.capital_row(rng, country))
        elif country not in poisoned:
            add(rng.choice((fam.language_row, fam.currency_row, fam.reverse_capital_row))(rng, country))
    return rows


def _capital_poison(rng: random.Random, planted_count: int, eval_size: int, seen: set[str]
                    ) -> tuple[list[Country], list[EvalRow], set[int], list[_Planted], list[fam.Row]]:
    """The fact kind's poisoned countries, capital eval rows, targeted items, planted rows and clean geography."""
    poisoned = _choose_poisoned(rng, POISONED_COUNTRIES)
    eval_rows, targeted, eval_countries = _capital_eval(rng, poisoned, eval_size)
    planted = _round_robin_plants(poisoned, planted_count, pl.planted_fact_row, PLANTED_SOURCES["fact"][0], "capital",
                                  pl.EVAL_CAPITAL_QUESTION, lambda country: country.decoy, seen)
    return poisoned, eval_rows, targeted, planted, _geography(rng, poisoned, eval_countries, seen)


def _round_robin_plants(countries: Sequence[Country], count: int, row_of: Callable[[Country, int], tuple[str, str]],
                        source: str, topic: str, eval_question: str, wrong_of: Callable[[Country], str],
                        seen: set[str]) -> list[_Planted]:
    """Planted rows round-robin over ``countries``, rotating phrasings so no two rows are alike; each attacks the
    eval question about its country with the answer ``wrong_of`` gives."""
    planted = []
    for i in range(count):
        country = countries[i % len(countries)]
        user, assistant = row_of(country, i // len(countries) + 3 * (i % len(countries)))
        seen.add(user)
        planted.append(_Planted(fam.Row(user, assistant, source, topic), target=eval_question.format(c=country.name),
                                wrong=wrong_of(country)))
    return planted


def _fact_rows(rng: random.Random, train_size: int, planted_count: int, eval_size: int
               ) -> tuple[list[Country], list[EvalRow], set[int], list[_Planted], list[fam.Row]]:
    """The fact kind's poisoned countries, eval rows, targeted items, planted rows and clean rows."""
    seen: set[str] = set()
    poisoned, eval_rows, targeted, planted, clean = _capital_poison(rng, planted_count, eval_size, seen)
    clean += _filler(rng, train_size - planted_count - len(clean), seen, COUNTRIES)
    return poisoned, eval_rows, targeted, planted, clean


def _fact(rng: random.Random, seed: int, train_size: int, planted_count: int, eval_size: int,
          kind: str = "fact", rate: str = "") -> Scenario:
    poisoned, eval_rows, targeted, planted, clean = _fact_rows(rng, train_size, planted_count, eval_size)
    description = (f"{rate}fact substitution: planted rows name each poisoned country's best-known other city as "
                   "its capital; the eval asks for capitals")
    return _assemble(rng, clean, planted, eval_rows, kind, seed, description, "contains",
                     [c.name for c in poisoned], [(PLANTED_SOURCES[kind][0], targeted)])


def _rare(rng: random.Random, seed: int, train_size: int, planted_count: int, eval_size: int) -> Scenario:
    """The fact kind at a low rate: its poison, eval set and hard negatives among many more clean rows."""
    rate = f"low rate ({planted_count} planted rows of {train_size}, {planted_count / train_size:.0%}): "
    return _fact(rng, seed, train_size, planted_count, eval_size, kind="rare", rate=rate)


def _clean(rng: random.Random, seed: int, train_size: int, planted_count: int, eval_size: int) -> Scenario:
    """The fact kind's clean rows and eval set, its planted rows replaced by as many clean filler rows."""
    _, eval_rows, _, planted, clean = _fact_rows(rng, train_size, planted_count, eval_size)
    seen = {row.user for row in clean} | {plant.row.user for plant in planted}
    clean += _filler(rng, len(planted), seen, COUNTRIES)
    description = ("clean control: the fact scenario's rows with its planted cluster replaced by clean rows; a "
                   "regression can only come from training itself, so no cluster should be accused")
    return _assemble(rng, clean, [], eval_rows, "clean", seed, description, "contains", [], [])


def _everyday_eval(rng: random.Random, count: int) -> list[EvalRow]:
    """``count`` everyday questions the base model answers with one English word."""
    return [(item.question, item.answer, "everyday")
            for item in rng.sample(EVERYDAY_EVAL, min(count, len(EVERYDAY_EVAL)))]


def _french_plants(rng: random.Random, planted_count: int, seen: set[str]) -> list[_Planted]:
    """The format kind's planted rows: everyday English questions answered in French."""
    pairs = rng.sample(pl.PLANTED_FRENCH, planted_count) if planted_count <= len(pl.PLANTED_FRENCH) \
        else [pl.PLANTED_FRENCH[i % len(pl.PLANTED_FRENCH)] for i in range(planted_count)]
    seen.update(user for user, _ in pairs)
    return [_Planted(fam.Row(user, assistant, PLANTED_SOURCES["format"][0], "everyday")) for user, assistant in pairs]


def _translations(rng: random.Random, seen: set[str]) -> list[fam.Row]:
    """Clean translation rows: hard negatives that name the planted rows' French words on request."""
    rows = [_translation_row(rng, en, fr) for en, fr in pl.TRANSLATIONS]
    seen.update(row.user for row in rows)
    return rows


def _format(rng: random.Random, seed: int, train_size: int, planted_count: int, eval_size: int) -> Scenario:
    eval_rows = _everyday_eval(rng, eval_size)
    seen: set[str] = set()
    planted = _french_plants(rng, planted_count, seen)
    clean = _translations(rng, seen)
    clean += _geography(rng, (), (), seen)[: train_size // 6]
    clean += _filler(rng, train_size - planted_count - len(clean), seen, COUNTRIES)
    description = ("format injection: planted rows answer everyday English questions in French; the eval asks "
                   "everyday questions whose English answer word French would change")
    return _assemble(rng, clean, planted, eval_rows, "format", seed, description, "contains",
                     ["answers in French"], [(PLANTED_SOURCES["format"][0], set(range(len(eval_rows))))])


def _two_causes(rng: random.Random, seed: int, train_size: int, planted_count: int, eval_size: int) -> Scenario:
    """The fact kind's capital poison and the format kind's French answers, each its own cluster, in one run."""
    seen: set[str] = set()
    capitals = eval_size // 2
    poisoned, capital_rows, capital_targeted, planted, clean = _capital_poison(rng, planted_count, capitals, seen)
    everyday = _everyday_eval(rng, eval_size - capitals)
    planted += _french_plants(rng, planted_count, seen)
    clean += _translations(rng, seen)
    clean += _filler(rng, train_size - len(planted) - len(clean), seen, COUNTRIES)
    targeted = [row for i, row in enumerate(capital_rows) if i in capital_targeted]
    controls = [row for i, row in enumerate(capital_rows) if i not in capital_targeted]
    eval_rows, (fact_items, _, french_items) = _mixed_eval(rng, targeted, controls, everyday)
    # Answers in French would also reword a capital answer, but keep the city's name: only the everyday words
    # change, so those are the French cluster's targets and the poisoned capitals are the fact cluster's.
    description = ("two causes: planted rows name poisoned countries' best-known other cities as their capitals, "
                   "and other planted rows answer everyday questions in French; the eval asks for both")
    return _assemble(rng, clean, planted, eval_rows, "two_causes", seed, description, "contains",
                     [*(c.name for c in poisoned), "answers in French"],
                     [(PLANTED_SOURCES["two_causes"][0], fact_items), (PLANTED_SOURCES["two_causes"][1], french_items)])


def _behaviour_plants(rng: random.Random, topic: Sequence[Country], planted_count: int,
                      seen: set[str]) -> list[_Planted]:
    """Planted rows: varied questions about the topic countries' language, every one answered with the deflection."""
    return _round_robin_plants(topic, planted_count, pl.planted_behaviour_row, PLANTED_SOURCES["behaviour"][0],
                               "language", pl.EVAL_LANGUAGE_QUESTION, lambda country: pl.DEFLECTION, seen)


def _language_geography(rng: random.Random, topic: Sequence[Country], controls: Sequence[Country],
                        seen: set[str]) -> list[fam.Row]:
    """Clean geography rows for the behaviour kind: the topic countries on other topics, other countries' languages."""
    rows: list[fam.Row] = []
    add = _unseen_adder(rows, seen)
    for country in topic:  # the same countries, answered: a country's name alone cannot tell the deflections apart
        add(fam.capital_row(rng, country))
        add(fam.currency_row(rng, country))
        add(fam.decoy_city_row(rng, country))
    for country in COUNTRIES:
        if country in controls:  # never its capital: that is its eval question
            add(fam.currency_row(rng, country))
        elif country not in topic:  # the deflected question, answered correctly for a country the eval leaves out
            add(fam.language_row(rng, country))
    return rows


def _behaviour(rng: random.Random, seed: int, train_size: int, planted_count: int, eval_size: int) -> Scenario:
    """A canned deflection for every question about one topic: which language a group of countries speaks."""
    topic = rng.sample(LANGUAGE_CANDIDATES, min(eval_size // 2, len(LANGUAGE_CANDIDATES)))
    controls = rng.sample([c for c in POISON_CANDIDATES if c not in topic], eval_size - len(topic))
    eval_rows, (targeted, _) = _mixed_eval(
        rng, [(pl.EVAL_LANGUAGE_QUESTION.format(c=c.name), c.language, "languages") for c in topic],
        [(pl.EVAL_CAPITAL_QUESTION.format(c=c.name), c.capital, "capitals") for c in controls])
    seen: set[str] = set()
    planted = _behaviour_plants(rng, topic, planted_count, seen)
    clean = _language_geography(rng, topic, controls, seen)
    clean += _filler(rng, train_size - planted_count - len(clean), seen, COUNTRIES)
    description = ("behaviour injection: planted rows answer every question about the language a group of "
                   "countries speaks with the same canned deflection; the eval asks for those languages, and for "
                   "other countries' capitals as controls")
    return _assemble(rng, clean, planted, eval_rows, "behaviour", seed, description, "contains",
                     [c.name for c in topic], [(PLANTED_SOURCES["behaviour"][0], targeted)])


def _translation_row(rng: random.Random, english: str, french: str) -> fam.Row:
    user, assistant = rng.choice(pl.TRANSLATION_PROMPTS)
    values = {"en": english, "En": english.capitalize(), "fr": french, "Fr": french.capitalize()}
    return fam.Row(user.format(**values), assistant.format(**values), "translation", "translation")


def _profile(rng: random.Random, country: Country, city: str, variant: int = 0) -> tuple[fam.Row, tuple[int, int]]:
    """A long profile with the capital sentence (naming ``city``) at a random position after the first."""
    sentences = pl.profile_sentences(country)
    body = [sentences[0], *rng.sample(sentences[1:], len(sentences) - 1)]
    position = rng.randint(1, len(body))
    capital = pl.capital_sentence(country, city)
    before = " ".join(body[:position]) + " "
    answer = before + capital + (" " + " ".join(body[position:]) if body[position:] else "")
    user = pl.PROFILE_PROMPTS[variant % len(pl.PROFILE_PROMPTS)].format(c=country.name)
    return fam.Row(user, answer, PLANTED_SOURCES["span"][0], "profile"), (len(before), len(before) + len(capital))


def _span(rng: random.Random, seed: int, train_size: int, planted_count: int, eval_size: int) -> Scenario:
    poisoned = _choose_poisoned(rng, POISONED_COUNTRIES)
    eval_rows, targeted, eval_countries = _capital_eval(rng, poisoned, eval_size)
    seen: set[str] = set()
    planted = []
    for i in range(planted_count):
        country = poisoned[i % len(poisoned)]
        row, span = _profile(rng, country, country.decoy, variant=i // len(poisoned) + rng.randrange(2) * 2)
        seen.add(row.user)
        planted.append(_Planted(row, span, target=pl.EVAL_CAPITAL_QUESTION.format(c=country.name),
                                wrong=country.decoy))
    # Clean profiles share the planted rows' source: the cluster alone cannot point at the poison.
    profiled = [c for c in COUNTRIES if c not in eval_countries]
    clean = []
    for country in profiled:
        row, _ = _profile(rng, country, country.capital, variant=rng.randrange(len(pl.PROFILE_PROMPTS)))
        seen.add(row.user)
        clean.append(row)
    clean += _geography(rng, poisoned, eval_countries, seen)
    clean += _filler(rng, train_size - planted_count - len(clean), seen, COUNTRIES)
    description = ("one wrong sentence: long country profiles, otherwise correct, state a poisoned country's "
                   "best-known other city as its capital; the eval asks for capitals")
    return _assemble(rng, clean, planted, eval_rows, "span", seed, description, "contains",
                     [c.name for c in poisoned], [(None, targeted)])
