"""The real sentences task agreement is measured on where the model is a trained checkpoint: its answers on real
text are what a user would get, where random tokens leave even fp16 and fp32 split on near-ties (docs/quantization.md
measures both). Paraphrase pairs on unrelated topics, so every sentence's nearest neighbour is its pair by a wide
margin (all-MiniLM-L6-v2 in fp32: a pair's cosine 0.65 or more, 0.32 above any other sentence), and a neighbour that
changes is a changed answer, not a tie broken otherwise. Enough of them (1,113 real tokens with all-MiniLM-L6-v2's
WordPiece) that the fused engine's fp8 cells run their fp8 GEMMs on them (engine/ops.py FP8_MIN_ROWS, 1,024)."""

from __future__ import annotations

from pathlib import Path

from ...models import build
from ..inputs import Inputs
from ..serve.lengths import TOKENIZER_FILES  # any tokenizer a folder ships, read as `serve --lengths text:` reads it

SENTENCES = (
    "The cat slept all afternoon on the warm windowsill in the kitchen.",
    "All afternoon the cat was asleep on the sunny kitchen window ledge.",
    "My dog loves chasing a tennis ball across the park every morning.",
    "Every morning my dog runs around the park after a tennis ball.",
    "How can I reset my password if I no longer have access to my email?",
    "I lost access to my email account, so how do I change my password?",
    "I would like a full refund because the order arrived damaged.",
    "The package came broken, so I want my money back for the purchase.",
    "Paris is the capital of France and is famous for its museums.",
    "The French capital, Paris, is well known for its many museums.",
    "Stock markets fell sharply after the central bank raised interest rates.",
    "Share prices dropped steeply when the central bank increased rates.",
    "Heavy rain and strong winds are expected across the region tomorrow.",
    "The forecast warns of a lot of rain and high winds tomorrow.",
    "She scored the winning goal in the last minute of the final.",
    "Her goal in the final minute won the championship match for the team.",
    "Bake the bread in a hot oven for about forty minutes until golden.",
    "Put the loaf into a very hot oven for roughly forty minutes.",
    "The battery of my laptop drains far too quickly since the last update.",
    "Since the recent update my notebook's battery runs out very fast.",
    "The train to London leaves from platform four at nine in the morning.",
    "At nine o'clock the London train departs from platform four.",
    "Our flight was delayed by three hours because of thick fog.",
    "Dense fog meant the plane took off three hours late.",
    "Regular exercise improves your mood and helps you sleep better.",
    "Working out often makes people happier and improves their sleep.",
    "The doctor told him to drink more water and get plenty of rest.",
    "His physician advised him to rest a lot and stay hydrated.",
    "The novel follows one family through three generations of change.",
    "This book tells the story of a single family across three generations.",
    "Electrons move around the nucleus at the centre of an atom.",
    "An atom has a nucleus in the middle with electrons orbiting it.",
    "The telescope captured a detailed image of a distant spiral galaxy.",
    "Astronomers photographed a faraway spiral galaxy with the telescope.",
    "Light travels through the air much faster than sound does.",
    "Sound moves far more slowly than light through the air.",
    "The children built a huge sandcastle on the beach this afternoon.",
    "This afternoon the kids made a big castle out of sand by the sea.",
    "He plays electric guitar in a rock band that tours every summer.",
    "Every summer he tours as the guitarist of a rock group.",
    "The museum opens at ten in the morning on weekdays.",
    "On weekdays the doors of the museum open at ten o'clock.",
    "Please close the window, it is getting really cold in here.",
    "It is so chilly in this room, could you shut the window?",
    "The weekly team meeting has been moved from Monday to Thursday.",
    "We rescheduled our weekly team meeting to Thursday instead of Monday.",
    "Always wash your hands with soap before you eat anything.",
    "Before a meal you should clean your hands thoroughly with soap.",
    "The new smartphone has a bigger screen and a much better camera.",
    "This latest phone comes with a larger display and an improved camera.",
    "Farmers harvest the wheat at the end of the summer.",
    "The wheat crop is gathered by farmers in late summer.",
    "The bridge was closed for repairs after the earthquake.",
    "After the earthquake the bridge was shut so it could be repaired.",
    "She is learning to speak Japanese before her trip to Tokyo.",
    "Before travelling to Tokyo she is studying the Japanese language.",
    "The restaurant serves fresh seafood caught that same morning.",
    "Fish and shellfish served at this restaurant are caught the same day.",
    "Volunteers planted hundreds of trees along the river last weekend.",
    "Last weekend many volunteers put hundreds of trees in the ground by the river.",
    "The printer keeps jamming whenever I try to print on both sides.",
    "Every time I print double-sided the paper gets stuck in the printer.",
    "The orchestra played a symphony by Beethoven to a full concert hall.",
    "A packed concert hall listened to the orchestra perform Beethoven.",
    "The library extended its opening hours during the exam period.",
    "During exams the library stays open for longer each day.",
    "A thunderstorm knocked out the power in the whole neighbourhood last night.",
    "Last night the entire neighbourhood lost electricity because of a storm.",
    "The committee approved the new budget after a long debate.",
    "After hours of discussion the committee voted to accept the budget.",
    "My grandmother grows tomatoes and peppers in her small garden.",
    "In her little garden my grandma grows peppers and tomatoes.",
    "The software crashes every time I open a large spreadsheet.",
    "Opening a big spreadsheet always makes the program crash.",
    "The marathon runners crossed the finish line in under three hours.",
    "The runners of the marathon finished the race in less than three hours.",
)


def sentence_inputs(ref: build.ModelRef) -> Inputs | None:
    """SENTENCES as the model's inputs: its own tokenizer's ids, right-padded with its pad id under a mask. None for
    a preset (random weights, no tokenizer) or a folder whose tokenizer is missing, does not load, or gives ids
    outside the model's vocabulary: its agreement is then measured on the benchmark inputs."""
    if ref.path is None:
        return None
    folder = Path(ref.path)
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    import torch
    from transformers import AutoTokenizer

    try:
        build.read_tokenizer_json(folder / "tokenizer.json")  # through the input boundary first
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        ids = [tokenizer(s)["input_ids"][: ref.shape.max_positions] for s in SENTENCES]
    except Exception:  # noqa: BLE001 - a tokenizer that does not load only costs the real sentences
        return None
    if not all(ids) or max(max(row) for row in ids) >= ref.shape.vocab:
        return None
    kinds = build.input_kinds(ref)
    lengths = [len(row) for row in ids]
    width = max(lengths)
    input_ids = torch.tensor([row + [kinds.pad_id] * (width - len(row)) for row in ids])
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    types = torch.zeros_like(input_ids) if kinds.token_types else None
    return Inputs(input_ids, lengths, mask, types)
