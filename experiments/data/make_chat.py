"""Conversations for supervised fine-tuning built from text that ships here (nothing downloaded): the verse-aligned
English-Spanish pairs of ../shared/data/bible as translation requests, JSONL in the `messages` form that
data.kind=chat reads (txjax.data.chat).

    python experiments/data/make_chat.py --output=runs/data/bible_chat
    -> runs/data/bible_chat/chat.jsonl      from train.en-es.tsv (--pairs of them, spread over the whole file)
       runs/data/bible_chat/heldout.jsonl   from test.en-es.tsv, never trained on (for generate --chat, lm-eval)

Each pair is asked in one direction, alternating ("Translate to Spanish: <English verse>" -> the Spanish verse, then
"Translate to English: <Spanish verse>" -> the English one); every third conversation goes on with a second
exchange (the next pair, the other direction), so the set has multi-turn conversations whose every assistant turn
carries the loss. A system message states the task. The files are a pure function of the inputs and the options.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIBLE = REPO / "../shared/data/bible"
SYSTEM = "You translate Bible verses between English and Spanish."
LANGUAGES = ("English", "Spanish")


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """(English, Spanish) of a TSV file of `english<TAB>spanish` lines."""
    pairs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        english, tab, spanish = line.partition("\t")
        if not tab:
            raise ValueError(f"{path}:{n}: expected 'english<TAB>spanish'")
        pairs.append((english, spanish))
    return pairs


def exchange(pair: tuple[str, str], to_spanish: bool) -> list[dict]:
    """One request and its answer: the pair's verse in one language, the other as the assistant's turn."""
    source, target = pair if to_spanish else pair[::-1]
    language = LANGUAGES[1] if to_spanish else LANGUAGES[0]
    return [
        {"role": "user", "content": f"Translate to {language}: {source}"},
        {"role": "assistant", "content": target},
    ]


def conversations(pairs: list[tuple[str, str]], count: int) -> list[dict]:
    """`count` conversations (or fewer, when the pairs run out) from pairs spread evenly over `pairs`."""
    needed = count + count // 3  # every third conversation takes two pairs
    stride = max(1, len(pairs) // max(needed, 1))
    chosen = pairs[::stride]
    out, i = [], 0
    while i < len(chosen) and len(out) < count:
        messages = [{"role": "system", "content": SYSTEM}, *exchange(chosen[i], len(out) % 2 == 0)]
        i += 1
        if len(out) % 3 == 2 and i < len(chosen):  # a second exchange: the next pair, the other direction
            messages += exchange(chosen[i], len(out) % 2 == 1)
            i += 1
        out.append({"messages": messages})
    return out


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="folder to write chat.jsonl and heldout.jsonl into")
    parser.add_argument("--pairs", type=int, default=2000, help="conversations built from the train split")
    parser.add_argument("--heldout", type=int, default=200, help="conversations built from the test split")
    parser.add_argument("--bible", default=str(BIBLE), help="the folder of {train,test}.en-es.tsv")
    args = parser.parse_args(argv)
    try:
        train = read_pairs(Path(args.bible) / "train.en-es.tsv")
        test = read_pairs(Path(args.bible) / "test.en-es.tsv")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    made = {"chat.jsonl": conversations(train, args.pairs), "heldout.jsonl": conversations(test, args.heldout)}
    for name, records in made.items():
        write_jsonl(output / name, records)
    print(json.dumps({name: len(records) for name, records in made.items()} | {"output": str(output)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
