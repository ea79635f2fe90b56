"""experiments/shakespeare_char.py's model trained from prepared shards (`data.kind="shards"`), packed by document.

Prepare the shards once (a document per speech: the blank line between speeches is the delimiter; a tenth of the
speeches, chosen by a hash of their text, is the valid split; the char tokenizer adds pad/bos/eos, 68 ids):

    python run.py prepare --input=../shared/data/tinyshakespeare/input.txt --output=runs/data/shakespeare \\
        --tokenizer=char --delimiter='\\n\\n' --valid_fraction=0.1
    python run.py train --config=experiments/shakespeare_shards.py --workdir=runs/ss

Training rows are packed speeches (`data.pack`): pieces of at most 65 tokens, several per row, each its own segment
(positions restart, no attention across speeches); evaluation reads the valid speeches in order, a target in the
next speech not counted. The same run reads a corpus of any size: point data.path at another prepared folder
(`run.py prepare --input='corpus/*.jsonl' --tokenizer=sentencepiece ...`); memory does not grow with it.
Its valid loss is not comparable to shakespeare_char's: other valid text (whole speeches from across the play, not
the file's last 10%), and no target across a speech boundary.
"""

from txjax.config import REPO, load_config


def get_config():
    config = load_config(REPO / "experiments" / "shakespeare_char.py")
    config.data.update(kind="shards", path="runs/data/shakespeare", pack=True)
    return config
