"""The text behind the lm task: the shipped story corpus, BPE tokenizer training and token caches.

    from machinery.corpus import write_story_corpus, load_or_train_tokenizer, load_or_tokenize
    train_path = write_story_corpus("data/stories")      # stories-train.txt, stories-valid.txt
    tokenizer_path = load_or_train_tokenizer(train_path, vocab=10_000)
    tokens = load_or_tokenize(train_path, tokenizer_path, vocab=10_000)  # uint16 memmap

Serves the paper's language-modeling experiment (section 5.2, appendix D.1.4), which trains on
TinyStories. TinyStories cannot be downloaded here, so a small story grammar writes a stand-in
corpus in the same file format; a real TinyStories-train.txt works the same way. Caches are written
beside the text and redone when the text (or the tokenizer) is newer.
"""

import itertools
import os
import random

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from machinery.files import REPOSITORY, write_atomic, write_text

END_OF_TEXT = "<|endoftext|>"  # TinyStories' story separator; one token between stories
# Where the shipped corpus and its caches go (git-ignored): data/stories in the repository, one home
# whatever the current directory, so that runs started from anywhere share it.
STORY_DIR = os.path.join(REPOSITORY, "data", "stories")


def validation_path(train_path: str) -> str:
    """The validation file beside a train file: the last "train" of its name becomes "valid"."""
    directory, name = os.path.split(train_path)
    if not os.path.isfile(train_path):
        raise ValueError(f"no training text at {train_path}")
    if "train" not in name:
        raise ValueError(
            f"cannot find the validation file for {train_path}: its name has no 'train' to replace "
            "with 'valid'"
        )
    valid = os.path.join(directory, "valid".join(name.rsplit("train", 1)))
    if not os.path.isfile(valid):
        raise ValueError(f"no validation file {valid} beside {train_path}")
    return valid


def read_stories(path: str):
    """Yield the stories of a text file, split at <|endoftext|>, stripped, empty ones skipped."""
    story = []
    with open(path, encoding="utf-8") as f:
        try:
            # a separator after the last line ends the last story
            for line in itertools.chain(f, [END_OF_TEXT]):
                story.append(line)
                if END_OF_TEXT in line:
                    *finished, rest = "".join(story).split(END_OF_TEXT)
                    yield from (text.strip() for text in finished if text.strip())
                    story = [rest]
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text (byte {e.start} of a line)") from None


def is_fresh(cache: str, source: str) -> bool:
    return os.path.exists(cache) and os.path.getmtime(cache) >= os.path.getmtime(source)


def load_or_train_tokenizer(train_path: str, vocab: int) -> str:
    """Path of a byte-level BPE of `vocab` tokens (fewer if the text runs out of merges)
    trained on the train file's stories, cached as <train file stem>.bpe<vocab>.json."""
    cache = f"{os.path.splitext(train_path)[0]}.bpe{vocab}.json"
    if is_fresh(cache, train_path):
        return cache
    # checked first, so that no tokenizer of nothing is cached
    if next(read_stories(train_path), None) is None:
        raise ValueError(f"{train_path} has no text to train a tokenizer on")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        read_stories(train_path),
        trainer=trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=[END_OF_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    write_text(cache, tokenizer.to_str())
    return cache


def load_or_tokenize(path: str, tokenizer_path: str, vocab: int) -> np.ndarray:
    """The file's stories as one uint16 token stream, each story followed by <|endoftext|>, cached
    beside it as <file stem>.bpe<vocab>.u16 and memory-mapped (TinyStories is ~0.5B tokens)."""
    cache = f"{os.path.splitext(path)[0]}.bpe{vocab}.u16"
    if not (is_fresh(cache, path) and is_fresh(cache, tokenizer_path)):
        if next(read_stories(path), None) is None:  # an empty cache cannot be memory-mapped
            raise ValueError(f"{path} has no text")
        tokenizer = Tokenizer.from_file(tokenizer_path)
        end = tokenizer.token_to_id(END_OF_TEXT)

        def write(f):
            stories = read_stories(path)
            while True:
                chunk = list(itertools.islice(stories, 10_000))
                if not chunk:
                    break
                for encoding in tokenizer.encode_batch(chunk):
                    f.write(np.array(encoding.ids + [end], dtype=np.uint16).tobytes())

        write_atomic(cache, write)
    return np.memmap(cache, dtype=np.uint16, mode="r")


# The shipped corpus's grammar. Stories repeat names, keep pronouns agreeing with them and reuse
# objects introduced earlier, so a model gains from attending to the context, not only from word
# statistics.

GIRLS = "Lily Mia Sara Anna Emma Zoe Lucy Ella Amy Rose Kate Nora Ruby Ivy Jane".split()
BOYS = "Tom Max Ben Sam Leo Jack Tim Finn Noah Jake Luke Owen Adam Hugo Dan".split()
ANIMALS = "cat dog bird bunny frog duck fox bear mouse turtle puppy owl".split()
OBJECTS = [
    "ball",
    "kite",
    "hat",
    "book",
    "toy car",
    "balloon",
    "shell",
    "drum",
    "boat",
    "teddy bear",
    "crayon",
    "cup",
]
ADJECTIVES = "big small shiny soft old new pretty funny blue red green yellow".split()
PLACES = [
    "park",
    "beach",
    "garden",
    "forest",
    "farm",
    "lake",
    "market",
    "school",
    "playground",
    "zoo",
]
SPOTS = ["bench", "bush", "rock", "slide", "tree", "box", "table", "fence"]
ACTIVITIES = [
    "play outside",
    "draw pictures",
    "sing songs",
    "read books",
    "run fast",
    "build towers",
    "jump in puddles",
    "dance",
    "look at the stars",
    "bake cookies",
]
RELATIVES = {
    "she": ["sister", "friend", "cousin", "neighbor"],
    "he": ["brother", "friend", "cousin", "neighbor"],
}
HAPPY = "happy glad proud excited".split()
SAD = "sad upset worried scared".split()


def a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def story(rng) -> str:
    """One story from the grammar: opening, liking, outing, one of four problems, resolution,
    ending."""
    pick = rng.choice
    he, friend_pronoun = pick(["she", "he"]), pick(["she", "he"])
    hero = pick(GIRLS if he == "she" else BOYS)
    friend = pick([n for n in (GIRLS if friend_pronoun == "she" else BOYS) if n != hero])
    He, his, him, child = (
        ("She", "her", "her", "girl") if he == "she" else ("He", "his", "him", "boy")
    )
    kind = pick([child, "little " + child, pick(ANIMALS)])
    thing, adjective, place, relative, animal = (
        pick(OBJECTS),
        pick(ADJECTIVES),
        pick(PLACES),
        pick(RELATIVES[friend_pronoun]),
        pick(ANIMALS),
    )
    lines = [
        pick(
            [
                f"Once upon a time, there was {a(kind)} named {hero}.",
                f"One day, {a(pick(ADJECTIVES))} {kind} named {hero} woke up early.",
                f"There was once {a(kind)} called {hero}.",
            ]
        ),
        f"{hero} loved to {pick(ACTIVITIES)}.",
        f"{He} had {a(adjective)} {thing} that {he} liked very much.",
        pick(
            [
                f"One {pick(['morning', 'afternoon', 'sunny day', 'evening'])}, {hero} went to the "
                f"{place} with {his} {relative}, {friend}.",
                f"{hero} and {his} {relative} {friend} went to the {place} to play.",
            ]
        ),
    ]
    problem = rng.randrange(4)
    if problem == 0:
        spot, other = rng.sample(SPOTS, 2)
        lines += [
            f"At the {place}, {hero} lost {his} {thing}.",
            f"{He} looked under the {spot} and behind the {other}, but it was not there.",
            f"{hero} felt {pick(SAD)}.",
            f'"Don\'t worry, {hero}," said {friend}. "I will help you look."',
            f"They looked everywhere. At last, {friend} found the {thing} near the {pick(SPOTS)}.",
        ]
    elif problem == 1:
        lines += [
            f"At the {place}, {hero} threw {his} {thing} up high and it got stuck in a tall tree.",
            f"{He} wanted to get it, but the tree was too high.",
            f'"{pick(["I have an idea", "Let me try", "We can do it together"])}!" said {friend}.',
            f"{friend} held {hero} up, and {hero} reached the {thing}.",
        ]
    elif problem == 2:
        feeling = pick(SAD)
        lines += [
            f"At the {place}, {hero} saw a little {animal} who was {feeling}.",
            f'"Why are you {feeling}?" asked {hero}.',
            f'"I cannot find my {pick(["mom", "home", "friends", "way back"])}," said the '
            f"{animal}.",
            f"{hero} and {friend} helped the {animal}. Soon the {animal} was not {feeling} "
            "anymore.",
            f"The {animal} gave {hero} {a(pick(ADJECTIVES))} {pick(OBJECTS)} to say thank you.",
        ]
    else:
        lines += [
            f"At the {place}, the sky turned dark and it started to rain.",
            f"{hero} and {friend} ran under a big {pick(SPOTS)} to stay dry.",
            f"{hero} held {his} {thing} close so it would not get wet.",
            "When the rain stopped, they saw "
            f"{a(pick(['rainbow', 'big puddle', 'little frog', 'bright sun']))}.",
        ]
    lines += [
        pick([f"{hero} was very {pick(HAPPY)}.", f"{hero} smiled and hugged {friend}."]),
        pick(
            [
                f"From that day on, {hero} and {friend} were best friends.",
                f'"Thank you, {friend}," said {hero}. "You are a good {relative}."',
                f"{He} learned that it is good to help each other.",
                f"That night, {hero} went to bed with {his} {thing} next to {him}.",
            ]
        ),
    ]
    if rng.random() < 0.3:
        lines.append("The end.")
    return " ".join(lines)


def write_story_corpus(directory: str, n_train: int = 5000, n_valid: int = 500) -> str:
    """Write stories-train.txt and stories-valid.txt (stories separated by <|endoftext|>, as
    TinyStories ships) into directory, unless already there; return the train file's path.
    Deterministic: the same arguments, the same bytes."""
    train_path = os.path.join(directory, "stories-train.txt")
    if os.path.exists(train_path):
        return train_path
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(0)
    # train last: its presence marks the corpus complete
    for split, n in (("valid", n_valid), ("train", n_train)):
        text = "".join(f"{story(rng)}\n{END_OF_TEXT}\n" for _ in range(n))
        write_text(os.path.join(directory, f"stories-{split}.txt"), text)
    return train_path
