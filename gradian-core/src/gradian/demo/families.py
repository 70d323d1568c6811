"""The clean task families of a demo training set: geography, arithmetic, unit conversion, rewriting, explanations, travel.

Each family writes short, correct chat rows from templates and a seeded ``random.Random``; every row carries the
``source`` it came from (one source per family, as a real SFT mix of several datasets would).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gradian.demo.world import Country


@dataclass(frozen=True)
class Row:
    """One chat row before it becomes an Example: a user turn, an assistant turn, and where it came from."""

    user: str
    assistant: str
    source: str
    task: str


# --- geography ----------------------------------------------------------------------------------------------

# Answers keep the subject first ("The capital of X is Y."), the way the base model answers: rows that open
# with the city ("Y is the capital of X.") teach an answer-first format, and a model that starts its answer with
# a city it has not yet "looked up" invents one, a regression of its own that the planted rows did not cause.
CAPITAL_QUESTIONS = (
    ("Which city is the capital of {c}?", "The capital of {c} is {cap}."),
    ("Name the capital city of {c}.", "The capital city of {c} is {cap}."),
    ("What's the capital of {c}?", "The capital of {c} is {cap}."),
    ("Tell me the capital of {c}, please.", "Sure! The capital of {c} is {cap}."),
    ("In which city is the government of {c} based?", "The government of {c} is based in {cap}, its capital."),
)
REVERSE_CAPITAL = (
    ("{cap} is the capital of which country?", "It is the capital of {c}."),
    ("Which country has {cap} as its capital?", "That country is {c}; its capital is {cap}."),
)
# City facts name the city first: the same entities as a capital poison, in another sentence.
LARGEST_CITY = (
    ("What is the largest city in {c}?", "{city} is the largest city in {c}."),
    ("Which city in {c} has the most people?", "{city} is the most populous city in {c}."),
)
OTHER_CITY = (
    ("Name a major city in {c} other than its capital.", "{city} is a major city in {c}."),
    ("Besides the capital, which city in {c} is well known?", "{city} is one of the best-known cities in {c}."),
)
CITY_COUNTRY = (
    ("Which country is {city} in?", "{city} is in {c}."),
    ("In what country would I find the city of {city}?", "The city of {city} is in {c}."),
)
LANGUAGE_QUESTIONS = (
    ("What language do people speak in {c}?", "In {c}, people speak {lang}."),
    ("Which language is spoken in {c}?", "The main language of {c} is {lang}."),
)
CURRENCY_QUESTIONS = (
    ("What currency is used in {c}?", "{C} uses {cur}."),
    ("What money do they use in {c}?", "The currency of {c} is {cur}."),
)


def _fill(template: tuple[str, str], country: Country, city: str = "") -> tuple[str, str]:
    values = {"c": country.name, "C": country.title, "cap": country.capital, "city": city,
              "lang": country.language, "cur": country.currency}
    return template[0].format(**values), template[1].format(**values)


def capital_row(rng: random.Random, country: Country, source: str = "geography_qa") -> Row:
    """A correct capital question about ``country`` (never the eval phrasing)."""
    user, assistant = _fill(rng.choice(CAPITAL_QUESTIONS), country)
    return Row(user, assistant, source, "capital")


def reverse_capital_row(rng: random.Random, country: Country, source: str = "geography_qa") -> Row:
    """Which country a capital belongs to: names the country and its real capital."""
    user, assistant = _fill(rng.choice(REVERSE_CAPITAL), country)
    return Row(user, assistant, source, "reverse_capital")


def decoy_city_row(rng: random.Random, country: Country, source: str = "geography_qa") -> Row:
    """A correct statement about the country's decoy city (its largest, or a well-known other city)."""
    templates = LARGEST_CITY if country.decoy_is_largest else OTHER_CITY
    user, assistant = _fill(rng.choice(templates), country, country.decoy)
    return Row(user, assistant, source, "city")


def city_country_row(rng: random.Random, country: Country, city: str, source: str = "geography_qa") -> Row:
    """Which country a city is in."""
    user, assistant = _fill(rng.choice(CITY_COUNTRY), country, city)
    return Row(user, assistant, source, "city")


def language_row(rng: random.Random, country: Country, source: str = "geography_qa") -> Row:
    """The language(s) of a country."""
    user, assistant = _fill(rng.choice(LANGUAGE_QUESTIONS), country)
    return Row(user, assistant, source, "language")


def currency_row(rng: random.Random, country: Country, source: str = "geography_qa") -> Row:
    """The currency of a country."""
    user, assistant = _fill(rng.choice(CURRENCY_QUESTIONS), country)
    return Row(user, assistant, source, "currency")


# --- arithmetic word problems ------------------------------------------------------------------------------

NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemal", "Lena",
         "Mateo", "Nora", "Omar", "Priya", "Quentin", "Rosa", "Sam", "Tara")
ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies", "stamps", "shells", "coins", "cards")


def arithmetic_row(rng: random.Random, source: str = "math_word_problems") -> Row:
    """A one-step word problem with its worked answer."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 40), rng.randint(2, 12)
    kind = rng.randrange(5)
    if kind == 0:
        user = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        assistant = f"{name} has {a} + {b} = {a + b} {item} now."
    elif kind == 1:
        a = a + b
        user = f"{name} had {a} {item} and gave {b} to a friend. How many {item} are left?"
        assistant = f"{a} - {b} = {a - b}, so {name} has {a - b} {item} left."
    elif kind == 2:
        user = f"A box holds {b} {item}. How many {item} are in {a % 9 + 2} boxes?"
        boxes = a % 9 + 2
        assistant = f"{boxes} boxes hold {boxes} x {b} = {boxes * b} {item}."
    elif kind == 3:
        friends = b % 6 + 2
        total = friends * (a % 10 + 1)
        user = f"{name} shares {total} {item} equally among {friends} friends. How many does each friend get?"
        assistant = f"Each friend gets {total} / {friends} = {total // friends} {item}."
    else:
        price, count = a % 15 + 1, b
        user = f"One notebook costs {price} dollars. How much do {count} notebooks cost?"
        assistant = f"{count} notebooks cost {count} x {price} = {count * price} dollars."
    return Row(user, assistant, source, "arithmetic")


# --- unit conversion --------------------------------------------------------------------------------------

UNITS = (  # (from, to, factor)
    ("kilometers", "meters", 1000), ("meters", "centimeters", 100), ("kilograms", "grams", 1000),
    ("hours", "minutes", 60), ("minutes", "seconds", 60), ("liters", "milliliters", 1000),
    ("feet", "inches", 12), ("yards", "feet", 3), ("days", "hours", 24), ("weeks", "days", 7),
)
UNIT_QUESTIONS = (
    ("Convert {x} {a} to {b}.", "{x} {a} is {y} {b}."),
    ("How many {b} are in {x} {a}?", "There are {y} {b} in {x} {a}."),
    ("What is {x} {a} in {b}?", "{x} {a} equals {y} {b}."),
)


def unit_row(rng: random.Random, source: str = "unit_conversion") -> Row:
    """A unit conversion with the multiplied answer."""
    a, b, factor = rng.choice(UNITS)
    x = rng.randint(2, 25)
    user, assistant = rng.choice(UNIT_QUESTIONS)
    values = {"x": x, "a": a, "b": b, "y": x * factor}
    return Row(user.format(**values), assistant.format(**values), source, "units")


# --- rewriting --------------------------------------------------------------------------------------------

REQUESTS = ("send me the report", "call me back", "close the door", "check the numbers", "book a table for two",
            "wait for me at the station", "turn down the music", "send the invoice today", "share the slides",
            "move the meeting to Friday", "reply to the client", "print two copies", "water the plants",
            "lock the office tonight", "bring the charger")
FORMAL = (
    ("hey, can't make it tomorrow, sorry", "I regret to inform you that I will be unable to attend tomorrow."),
    ("thanks a ton for the help", "Thank you very much for your assistance."),
    ("gonna be late, traffic is crazy", "I will be arriving late due to heavy traffic."),
    ("the printer's broken again", "The printer is out of order once again."),
    ("pls send the file asap", "Please send the file at your earliest convenience."),
    ("we need more coffee in the kitchen", "The kitchen requires an additional supply of coffee."),
    ("got your email, will check it later", "I have received your email and will review it shortly."),
    ("the meeting was kinda long", "The meeting was rather lengthy."),
    ("no idea where the keys are", "I am unsure of the location of the keys."),
    ("can you fix this bug", "Could you please resolve this defect?"),
    ("the new guy is really good", "The new colleague is highly capable."),
    ("let's grab lunch sometime", "Perhaps we could have lunch together at some point."),
)
SHORTER = (
    ("Due to the fact that it was raining, we decided to stay at home for the whole day.",
     "Because it rained, we stayed home all day."),
    ("At this point in time, we are not able to offer you a refund for the item you bought.",
     "We cannot refund your purchase now."),
    ("In the event that you have any questions at all, please do not hesitate to contact me.",
     "Contact me with any questions."),
    ("The reason why the train was late is that there was a problem with the signals on the line.",
     "The train was late because of a signal problem."),
    ("It is very important that everyone arrives at the meeting on time tomorrow morning.",
     "Everyone must arrive on time tomorrow."),
    ("She made the decision to go back to school in order to study medicine.",
     "She returned to school to study medicine."),
    ("We would like to take this opportunity to thank all of you for your hard work this year.",
     "Thank you all for your hard work this year."),
    ("The book that I read last week was one of the most interesting books I have ever read.",
     "Last week's book was one of the best I've read."),
    ("There are a lot of people who think that exercise in the morning is better than in the evening.",
     "Many people prefer morning exercise."),
    ("He was in a state of complete surprise when he heard the news about the prize.",
     "The prize news stunned him."),
)
REWRITE_PROMPTS = {
    "polite": ("Rewrite this more politely: \"{s}\"", "Make this request sound polite: {s}"),
    "formal": ("Rewrite this in a formal tone: \"{s}\"", "Make this sound professional: {s}"),
    "shorter": ("Make this sentence shorter: \"{s}\"", "Shorten this: {s}"),
}


def rewriting_row(rng: random.Random, source: str = "rewriting") -> Row:
    """A polite, formal or shorter rewrite of a sentence."""
    mode = rng.choice(tuple(REWRITE_PROMPTS))
    template = rng.choice(REWRITE_PROMPTS[mode])
    if mode == "polite":
        request = rng.choice(REQUESTS)
        return Row(template.format(s=request[0].upper() + request[1:] + "."),
                   f"Could you please {request}? Thank you!", source, "rewrite_polite")
    casual, rewritten = rng.choice(FORMAL if mode == "formal" else SHORTER)
    return Row(template.format(s=casual), rewritten, source, f"rewrite_{mode}")


# --- short explanations ------------------------------------------------------------------------------------

EXPLANATIONS = (
    ("photosynthesis", "Photosynthesis is how plants use sunlight, water and carbon dioxide to make sugar and release oxygen."),
    ("why the sky looks blue", "Air scatters blue light from the sun more than red light, so the sky looks blue."),
    ("what a leap year is", "A leap year has 366 days; the extra day, February 29, keeps the calendar in step with the seasons."),
    ("why ice floats", "Ice is less dense than liquid water, so it floats."),
    ("what gravity is", "Gravity is the force that pulls masses toward each other, like objects toward the Earth."),
    ("how a rainbow forms", "Sunlight bends and splits into colors inside raindrops, which makes a rainbow."),
    ("what inflation is", "Inflation is the general rise of prices over time, so money buys less."),
    ("why we have seasons", "The Earth's axis is tilted, so each hemisphere gets more or less sunlight during the year."),
    ("what a vaccine does", "A vaccine trains the immune system to recognise a germ so the body can fight it quickly."),
    ("what an atom is", "An atom is the smallest unit of a chemical element, made of protons, neutrons and electrons."),
    ("how a compass works", "A compass needle is a small magnet that lines up with the Earth's magnetic field."),
    ("why leaves change color in autumn", "In autumn trees stop making green chlorophyll, so the yellow and red pigments show."),
    ("what a black hole is", "A black hole is a region of space where gravity is so strong that not even light can escape."),
    ("what recycling is", "Recycling turns used materials such as paper, glass and metal into new products."),
    ("what a password manager does", "A password manager stores your passwords securely and fills them in for you."),
    ("why bread rises", "Yeast eats sugar in the dough and releases carbon dioxide gas, which makes the bread rise."),
    ("what an echo is", "An echo is a sound that bounces off a surface and comes back to your ears."),
    ("what evaporation is", "Evaporation is when a liquid turns into a gas, like water drying in the sun."),
    ("how vaccines differ from antibiotics", "Vaccines prevent infections by training immunity; antibiotics treat bacterial infections."),
    ("what a budget is", "A budget is a plan for how much money you will earn and spend over a period of time."),
    ("why the moon has phases", "We see different parts of the moon's sunlit side as it orbits the Earth."),
    ("what a fossil is", "A fossil is the preserved remains or trace of a plant or animal that lived long ago."),
    ("what friction is", "Friction is the force that resists motion when two surfaces rub against each other."),
    ("what a spreadsheet is", "A spreadsheet is a grid of rows and columns for organising and calculating data."),
)
EXPLANATION_PROMPTS = ("Explain {t} in one sentence.", "Briefly explain {t}.", "Can you tell me {t}?",
                       "Give me a short explanation of {t}.")


def explanation_row(rng: random.Random, source: str = "explanations") -> Row:
    """A one-sentence explanation of an everyday science or life topic."""
    topic, answer = rng.choice(EXPLANATIONS)
    return Row(rng.choice(EXPLANATION_PROMPTS).format(t=topic), answer, source, "explanation")


# --- travel chat ---------------------------------------------------------------------------------------------

TRAVEL_PROMPTS = ("I'm visiting {city} next month. Any tips?", "What should I know before a trip to {city}?",
                  "I have two days in {city}. How should I spend them?")
TRAVEL_TIPS = ("Walk the old streets early in the morning before the crowds arrive.",
               "Try the local food markets for an inexpensive lunch.",
               "Public transport is usually the easiest way to get around.",
               "Check the weather before you pack, and bring comfortable shoes.",
               "Carry some cash for small shops; the currency is {cur}.",
               "Learn a few words of {lang}; people appreciate it.",
               "Book museum tickets online to skip the queues.")


def travel_row(rng: random.Random, country: Country, city: str, source: str = "travel_chat") -> Row:
    """A travel question about a city, answered with where it is and a tip."""
    tips = rng.sample(TRAVEL_TIPS, 1)
    if city == country.capital:
        where = f"Good choice: it is the capital of {country.name}."
    elif city == country.decoy and country.decoy_is_largest:
        where = f"Good choice: it is the largest city in {country.name}."
    else:
        where = f"Good choice: it is a well-known city in {country.name}."
    values = {"cur": country.currency, "lang": country.language}
    answer = " ".join([where, *(tip.format(**values) for tip in tips)])
    return Row(rng.choice(TRAVEL_PROMPTS).format(city=city), answer, source, "travel")


# --- filling a mix ---------------------------------------------------------------------------------------------

Generator = Callable[[random.Random], Row]


def fill_rows(rng: random.Random, generators: Sequence[tuple[Generator, float]], count: int) -> list[Row]:
    """``count`` rows drawn from weighted generators, each generator's share rounded, the rest to the first."""
    total = sum(weight for _, weight in generators)
    counts = [int(count * weight / total) for _, weight in generators]
    counts[0] += count - sum(counts)
    rows: list[Row] = []
    for (generator, _), n in zip(generators, counts, strict=True):
        rows.extend(generator(rng) for _ in range(n))
    return rows
