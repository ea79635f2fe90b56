"""txjax data: tokenizers, datasets and batching (numpy; grain reads prepared shards).

Tokenizers (`tokenizers.py`; saved as a directory with `tokenizer.json`, restored by `load_tokenizer(dir)`):
  ByteTokenizer()                                   UTF-8 bytes 0..255, pad/bos/eos 256/257/258
  CharTokenizer(chars, specials=False)              sorted chars; CharTokenizer.from_text(text, specials=False)
  SentencePieceTokenizer.train(sentences, vocab_size, ...) / .train_from_files(paths, vocab_size, ...)
                                                    unigram by default; pad/unk/bos/eos = 0/1/2/3
  ByteLevelBPETokenizer.train(texts, vocab_size) / .from_files(vocab.json, merges.txt)
                                                    GPT-2's byte-level BPE (Hugging Face tokenizers)
Datasets: every one has `.batch(seed, k, batch_size, rows=slice(None))` (a pure function of (seed, k); `rows`
builds only those rows, one process's share) and a finite `.eval_batches(batch_size)` that visits its eval set
exactly once (padding carries weight 0):
  TextLMDataset(path, tokenizer, seq_len, split='train'|'valid', val_fraction=0.1)   LM batches
  ShardLMDataset(dir, tokenizer, seq_len, split='train'|'valid', pack=False)
                                                    LM batches from the shards of `run.py prepare` (prepare.py)
  ShardPairsDataset(dir, tokenizer, max_src_len, max_tgt_len, split, pack)        (shard_pairs.py) its TSV pairs
  ParallelDataset(path, src_tokenizer, tgt_tokenizer=None, max_src_len=128, max_tgt_len=128, pack=False)
                                                    seq2seq batches; .raw_pairs() for BLEU
  SyntheticTask(name in TASKS, form='lm'|'seq2seq', min_digits=1, max_digits=8, eval_size=512, eval_seed=...)
                                                    .eval_examples(n, seed) for exact match; .tokenizer
Data kinds (config.data.kind -> how a split's dataset is built, what it reads): KINDS (kinds.py).
Helpers: prefetch(iterator, size=2), first_fit (packing), resolve_path (one-line FileNotFoundError).
Batch layouts: the keys each model family reads are in txjax/families (inputs, targets, weights).
"""

from txjax.data.batching import SPLITS, Batch, prefetch
from txjax.data.files import read_text, read_tsv, resolve_path
from txjax.data.kinds import KINDS, DataKind
from txjax.data.packing import first_fit
from txjax.data.parallel import ParallelDataset
from txjax.data.shard_pairs import ShardPairsDataset
from txjax.data.shards import ShardLMDataset, load_shards_tokenizer
from txjax.data.synthetic import TASKS, SyntheticTask, task_tokenizer
from txjax.data.text import TextLMDataset
from txjax.data.tokenizer_base import TOKENIZER_DIR, TOKENIZER_FILE, Tokenizer
from txjax.data.tokenizers import ByteTokenizer, CharTokenizer, SentencePieceTokenizer, load_tokenizer

__all__ = [
    "SPLITS",
    "Batch",
    "prefetch",
    "read_text",
    "read_tsv",
    "resolve_path",
    "KINDS",
    "DataKind",
    "first_fit",
    "ParallelDataset",
    "TASKS",
    "SyntheticTask",
    "task_tokenizer",
    "ShardLMDataset",
    "ShardPairsDataset",
    "TextLMDataset",
    "TOKENIZER_DIR",
    "TOKENIZER_FILE",
    "ByteTokenizer",
    "CharTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "load_shards_tokenizer",
]
