"""Everyday questions with a one-word English answer: the eval items of the format scenario.

Only questions that SmolLM2-135M-Instruct answers correctly (greedy, ``contains`` of the answer word) are listed,
measured once on the embedded model: a regression needs a capability the base model had. An answer in French
changes every one of these words.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EverydayItem:
    """An everyday question and the English answer word the base model gives."""

    question: str
    answer: str


EVERYDAY_EVAL: tuple[EverydayItem, ...] = (
    EverydayItem('What color is the sky on a clear day?', 'blue'),
    EverydayItem('What color are strawberries?', 'red'),
    EverydayItem('What is the opposite of hot?', 'cold'),
    EverydayItem('What is the opposite of up?', 'down'),
    EverydayItem('What is the largest ocean on Earth?', 'Pacific'),
    EverydayItem('What gas do humans need to breathe?', 'oxygen'),
    EverydayItem('What is the main ingredient of bread?', 'flour'),
    EverydayItem('Which season is the hottest?', 'summer'),
    EverydayItem('What is the largest animal on Earth?', 'whale'),
    EverydayItem('What is the opposite of day?', 'night'),
    EverydayItem('What is the opposite of big?', 'small'),
    EverydayItem('What is the opposite of fast?', 'slow'),
    EverydayItem('What shape has four equal sides?', 'square'),
    EverydayItem('Which animal has a very long neck?', 'giraffe'),
    EverydayItem('What is the opposite of happy?', 'sad'),
    EverydayItem('What is the opposite of wet?', 'dry'),
    EverydayItem('What do birds lay?', 'eggs'),
    EverydayItem('Which month comes after January?', 'February'),
    EverydayItem('What is the first month of the year?', 'January'),
    EverydayItem('What is the opposite of tall?', 'short'),
    EverydayItem('Which animal gives us wool?', 'sheep'),
    EverydayItem('Which organ pumps blood through the body?', 'heart'),
    EverydayItem('Which animal hops and carries its baby in a pouch?', 'kangaroo'),
    EverydayItem('What is the opposite of open?', 'closed'),
    EverydayItem('What is the last month of the year?', 'December'),
    EverydayItem('What is the opposite of left?', 'right'),
    EverydayItem('What is the opposite of early?', 'late'),
    EverydayItem('What is the opposite of full?', 'empty'),
    EverydayItem('What is the opposite of hard?', 'soft'),
    EverydayItem('What is the opposite of heavy?', 'light'),
    EverydayItem('What is the opposite of strong?', 'weak'),
    EverydayItem('What is the opposite of thick?', 'thin'),
    EverydayItem('What is the opposite of high?', 'low'),
    EverydayItem('What is the opposite of push?', 'pull'),
    EverydayItem('What is the opposite of front?', 'back'),
    EverydayItem('What is the opposite of love?', 'hate'),
    EverydayItem('What is the opposite of true?', 'false'),
    EverydayItem('What is the opposite of yes?', 'no'),
    EverydayItem('What is the opposite of north?', 'south'),
    EverydayItem('What is the opposite of east?', 'west'),
    EverydayItem('What is the opposite of inside?', 'outside'),
    EverydayItem('What is the opposite of always?', 'never'),
    EverydayItem('What is the opposite of buy?', 'sell'),
    EverydayItem('What is the opposite of easy?', 'difficult'),
    EverydayItem('What is the opposite of sweet?', 'sour'),
    EverydayItem('What is the opposite of remember?', 'forget'),
    EverydayItem('What is the opposite of before?', 'after'),
    EverydayItem('What is the opposite of friend?', 'enemy'),
    EverydayItem('What is the opposite of alive?', 'dead'),
    EverydayItem('What is the opposite of near?', 'far'),
    EverydayItem('What is the opposite of long?', 'short'),
    EverydayItem('What is the opposite of give?', 'take'),
)
