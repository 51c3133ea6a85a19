"""Prompts of a requested token count for an HTTP endpoint, and the word tokenizer used where a model has none.

An endpoint takes text. With a tokenizer (`--tokenizer FOLDER`), a prompt is random token ids decoded to text, so
it re-encodes to about the requested count (a decode/encode round trip may merge or split a few tokens: the count
the endpoint reports in `usage` is what is recorded). Without one, a prompt is that many synthetic words, which
`transbench server` over a preset (random weights, no tokenizer) reads one token a word (WordTokenizer), so the
requested length is exact there; a real server's tokenizer splits them into about 1-3 tokens each. Each request's
prompt is made as it is sent (Prompts), from a pool drawn once."""

from __future__ import annotations

import functools
import hashlib
import random

from ...errors import SpecError

# Short, common English words: most tokenizers keep each one token (with its leading space).
WORDS = ("the of and to in is was for on are as with his they at be this from have or one had by word but not "
         "what all were when your can said there use each which she do how their if will up other about out many "
         "then them these so some her would make like him into time has look two more write go see number no way "
         "could people my than first water been call who oil its now find long down day did get come made may "
         "part").split()


# Cached: the server's HTTP process tokenizes every request's words on its event loop, and hashing them was a fifth
# of that loop's busy time (py-spy, bert-tiny behind `transbench server` at 600 requests/s on a 2-core CPU). Bounded,
# so text of ever new words cannot grow it.
@functools.lru_cache(maxsize=1 << 16)
def stable_id(word: str, vocab: int) -> int:
    """A word's id in [1, vocab): the same in every process (Python's hash() is salted per process)."""
    return 1 + int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little") % max(1, vocab - 1)


class WordTokenizer:
    """One token per whitespace-separated word, its id a stable hash of the word: text in, ids out, for a model
    with no tokenizer of its own (a preset's random weights). The server and the client's reference check use
    the same one, so a synthetic prompt of N words is N tokens at both ends."""

    name = "words"

    def __init__(self, vocab: int):
        self.vocab = vocab

    def encode(self, text: str) -> list[int]:
        return [stable_id(w, self.vocab) for w in text.split()]

    def decode(self, ids) -> str:
        return "".join(f" w{int(i)}" for i in ids)  # generated ids have no word: shown by number


class HFTokenizer:
    """A folder's transformers tokenizer; encoding adds the model's special tokens (BERT's [CLS] and [SEP]; none for
    GPT-2), as servers do."""

    def __init__(self, folder: str):
        from pathlib import Path

        from transformers import AutoTokenizer

        from ...models.build import read_tokenizer_json

        # through the input boundary first, as `--lengths text:` reads it: bounded (a tokenizer.json of 600 MB held
        # 1.5 GB before its JSON error), its model and vocabulary checked
        read_tokenizer_json(Path(folder) / "tokenizer.json")
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.name = f"tokenizer:{folder}"
        self.vocab = len(self.tok)

    def encode(self, text: str) -> list[int]:
        return self.tok(text)["input_ids"]

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)


# A text longer than this many characters a position of the limit is tokenized by its start first (encode_within).
# Real text runs about 4 characters a token; 16 leaves a prompt of long words whole.
PROBE_CHARS = 16


def encode_within(tok, text: str, limit: int) -> tuple[list[int], bool]:
    """(text's token ids, True), or, where the text's start alone is over `limit` tokens, (that start's ids, False):
    the whole text was not tokenized. A tokenizer's time grows with the text (16 MiB of words took 14.3 s through
    MiniLM's), so a text past PROBE_CHARS characters a position is first tokenized up to its last whitespace within
    that reach (or the reach itself in a text without any): the tokenizers served here split at whitespace before
    anything else, so the start's tokens begin the whole text's, and more than `limit` of them settle it."""
    reach = PROBE_CHARS * (limit + 8)
    if len(text) > reach:
        cut = max(text.rfind(c, 0, reach) for c in " \n\t")
        head = tok.encode(text[:cut if cut > 0 else reach])
        if len(head) > limit:
            return head, False
    return tok.encode(text), True


def has_tokenizer(folder: str | None) -> bool:
    from pathlib import Path

    from .lengths import TOKENIZER_FILES

    return folder is not None and any((Path(folder) / f).is_file() for f in TOKENIZER_FILES)


def local_tokenizer(tokenizer: str | None, reference_model: str | None) -> HFTokenizer | None:
    """The tokenizer of `serve --url` (--tokenizer, else the reference folder's), or None: synthetic words."""
    for folder in (tokenizer, reference_model):
        if has_tokenizer(folder):
            return HFTokenizer(folder)
    return None


def prompt_ids(tokenizer) -> tuple[int, set[int]]:
    """(the lowest id prompts draw from, the ids they never draw): ids past a few hundred, since the first ones of
    many vocabularies are control, byte or unused tokens, and no special token; from 0 where every id past that
    is special. SpecError where every id is: a vocabulary of [PAD] [UNK] [CLS] [SEP] [MASK] alone had the prompt
    loop draw for ever, and the cell waited out its whole timeout."""
    special = set(getattr(tokenizer.tok, "all_special_ids", ()) or ()) if hasattr(tokenizer, "tok") else set()
    for low in (min(1000, tokenizer.vocab // 4), 0):
        if any(i not in special for i in range(low, tokenizer.vocab)):
            return low, special
    raise SpecError(f"the tokenizer of {tokenizer.name.removeprefix('tokenizer:')}: every id of its vocabulary "
                    f"({tokenizer.vocab}) is a special token, so no prompt can be drawn from it: give a tokenizer with "
                    "ordinary tokens")


# A prompt is made when its request is sent, from a pool drawn once: built in full before the load, every planned
# prompt was held at once with no bound on their total (a closed loop's 4,096, a rate's every arrival), and
# `--offline --lengths fixed:1048576` built about 18 GB of words for 25 minutes before its first request. A prompt
# of n units (words, or token ids through --tokenizer) is a head of HEAD to HEAD + BLOCK - 1 units drawn afresh
# for its request, then whole blocks of BLOCK units from the pool, consecutive from a block drawn for it: the head
# makes each request's prefix its own (a server's prefix cache meets no shared prefix beyond chance), the blocks
# are text made once and joined (a copy), so what a request costs at its send is a head's draw and decode (at
# most HEAD + BLOCK - 1 ids: a whole prompt's decode at each send, a 2,048-token one's, would add to the client's
# send lag at high rates, where a refusal past a bound on the total would refuse ordinary long loads).
# The pool holds max(MIN_BLOCKS, the longest prompt's) blocks: its memory and time grow with the longest prompt,
# never with the number of requests.
HEAD = 16
BLOCK = 64
MIN_BLOCKS = 64


class Prompts:
    """Request `rid`'s prompt, `prompts[rid]`: its planned length lengths[rid % len(lengths)], the same text for the
    same seed and rid in every process (fill_counts and the reference check ask for it again after the load)."""

    def __init__(self, lengths: list[int], seed: int, tokenizer=None):
        self.lengths, self.seed, self.tokenizer = list(lengths), seed, tokenizer
        if tokenizer is None:
            self.units, self.sep = WORDS, " "
        else:
            low, special = prompt_ids(tokenizer)
            # drawn from a list of the allowed ids: rejection against the specials drew id by id
            self.units = [i for i in range(low, tokenizer.vocab) if i not in special]
        rng = random.Random(seed)
        count = max(MIN_BLOCKS, -(-max(self.lengths, default=0) // BLOCK))
        drawn = [rng.choices(self.units, k=BLOCK) for _ in range(count)]
        if tokenizer is not None:
            # decoded apart, blocks are joined as the tokenizer joins them: a decode that drops a text's leading
            # space (SentencePiece's) would glue the last word of one block to the first of the next
            whole, a, b = (tokenizer.decode(drawn[0] + drawn[1]), tokenizer.decode(drawn[0]),
                           tokenizer.decode(drawn[1]))
            self.sep = " " if whole != a + b and whole == f"{a} {b}" else ""
        self.blocks = [self._text(units) for units in drawn]
        self.rng = random.Random()

    def _text(self, units: list) -> str:
        return " ".join(units) if self.tokenizer is None else self.tokenizer.decode(units)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, rid: int) -> str:
        n = self.lengths[rid % len(self.lengths)]
        rng = self.rng  # seeded anew for each request (one instance: a new one's seeding took twice as long)
        rng.seed(int.from_bytes(hashlib.blake2b(f"{self.seed}:{rid}".encode(), digest_size=8).digest(), "little"))
        whole = max(0, (n - HEAD) // BLOCK)
        head = self._text(rng.choices(self.units, k=n - whole * BLOCK))
        if not whole:
            return head
        start = rng.randrange(len(self.blocks))
        picked = [self.blocks[(start + j) % len(self.blocks)] for j in range(whole)]
        return self.sep.join([head, *picked])


def make_prompts(lengths: list[int], seed: int, tokenizer=None) -> tuple[Prompts, str]:
    """Every request's prompt, made as it is asked for (Prompts), and what makes them ("synthetic-words" or
    "tokenizer:FOLDER")."""
    return Prompts(lengths, seed, tokenizer), "synthetic-words" if tokenizer is None else tokenizer.name
