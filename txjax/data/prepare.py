"""`run.py prepare`: tokenize a corpus once into shards of token ids that training memory-maps (txjax.data.shards).

    inputs -> chunks (txjax.data.readers: whole documents, ~shard_mb each) -> worker processes, one chunk each:
    documents -> tokens -> DIR/{train,valid}/{stream}-NNNNN.bin  (one shard per chunk and split)

A document goes to the valid split iff blake2b(its text) / 2^64 < valid_fraction: a pure function of the text, so
the split does not depend on chunking or the number of workers, and copies of a document share a split. A document
is never cut: one text file without --delimiter is one document, so an empty split names --delimiter (nanoGPT's
prepare.py cuts its one file at 90% of the tokens; here `--delimiter='\\n\\n'` makes tinyshakespeare's speeches the
documents). An LM document is stored as its tokens followed by EOS (when the tokenizer has one): each split is one
flat stream, the nanoGPT layout, and `{stream}-documents.npy` (int64[D + 1]) holds where each document starts in it.
TSV pairs (the translation task) are two streams, `src` and `tgt`, without EOS (the reader truncates and appends
it). Tokens are uint16 when the vocabulary has at most 65,536 ids, else uint32. Conversations (--chat,
txjax.data.chat) are two streams as well, `tokens` (the rendered chat, no EOS added: the template ends its turns)
and `mask` (uint8, 1 on the assistant's tokens), and index.json counts those cut and dropped.

Everything is written into DIR.partial-PID, renamed to DIR once index.json is in it: a DIR that exists is complete;
a failed write (a full or read-only disk) is one line naming DIR, and the partial folder is removed.
index.json records the options, the inputs' sizes and SHA-256, the tokenizer's fingerprint and each shard's token
count; a rerun with the same inputs and options finds it and does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import json
import multiprocessing
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from txjax.data import chat as chat_lib
from txjax.data import readers
from txjax.data import tokenizers as tok_lib
from txjax.data.documents import in_valid_split
from txjax.data.prepare_tokenizer import RECIPES, TokenizerInputs, batches, closing
from txjax.data.shards import INDEX_FILE, fingerprint, shard_dtype
from txjax.data.tokenizer_base import TOKENIZER_DIR
from txjax.ops import preemption, storage

SHARD_SPLITS = ("train", "valid")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_worker_tokenizers: dict[str, tok_lib.Tokenizer] = {}  # fingerprint -> tokenizer: each worker process loads it once


def prepare(
    inputs: list[str],
    output: str | os.PathLike,
    tokenizer: str = "char",
    fmt: str = "",
    delimiter: str = "",
    field: str = "text",
    vocab_size: int = 8000,
    sample_mb: float = 64.0,
    valid_fraction: float = 0.01,
    shard_mb: float = 16.0,
    workers: int = 0,
    progress: bool = True,
    chat: bool = False,
    max_tokens: int = 0,
) -> dict:
    """Tokenizes `inputs` (files or globs) into shards in `output`; returns a summary (throughput included).

    tokenizer: a kind of txjax.data.prepare_tokenizer.RECIPES (char, byte, sentencepiece or bpe: the last two
    trained to `vocab_size` ids on about `sample_mb` of documents spread over the inputs) or the path of a workdir
    or tokenizer folder. `inputs`: files, globs or folders in any format of txjax.data.readers.FORMATS.
    chat: the documents are conversations (JSONL or Parquet, txjax.data.chat) rendered with the workdir tokenizer's
    chat template, each cut at a turn boundary to at most `max_tokens` (0: whole), their assistant mask the stream
    `mask` beside `tokens`.
    """
    began = time.monotonic()
    paths = readers.expand_inputs(inputs)
    fmt = fmt or readers.infer_format(paths)
    if fmt not in readers.FORMATS:
        raise ValueError(f"--format={fmt!r} is not one of {', '.join(readers.FORMATS)}")
    if not 0.0 < valid_fraction < 1.0:
        raise ValueError(
            f"--valid_fraction={valid_fraction} must be in (0, 1): the valid split is split off by document"
        )
    tokenizer_dir = _tokenizer_dir(tokenizer)
    trained = tokenizer in RECIPES and RECIPES[tokenizer].trained
    given = {"delimiter": delimiter, "field": field, "vocab_size": vocab_size, "sample_mb": sample_mb}
    if refused := unread_options(fmt, tokenizer, trained, given | {"chat": chat, "max_tokens": max_tokens}):
        raise ValueError(refused)
    if chat:
        chat_lib.check_chat_inputs(fmt, tokenizer_dir and tok_lib.load_tokenizer(tokenizer_dir), tokenizer)
    options = {
        "format": fmt,
        "delimiter": delimiter if fmt == "text" else "",
        "field": field if readers.FORMATS[fmt].field else "",
        "tokenizer": str(tokenizer_dir or tokenizer),
        "vocab_size": vocab_size if trained else 0,
        "sample_mb": sample_mb if trained else 0,
        "valid_fraction": valid_fraction,
        "shard_mb": shard_mb,
    }
    if chat:  # only then: the options of folders prepared before --chat stay as they were
        options |= {"chat": True, "max_tokens": max_tokens}
    if tokenizer_dir:
        options["tokenizer_fingerprint"] = fingerprint(tok_lib.load_tokenizer(tokenizer_dir))
    files = [{"path": str(p), "bytes": p.stat().st_size, "sha256": storage.sha256(p)} for p in paths]
    output = Path(output).expanduser().resolve()
    if _up_to_date(output, options, files):
        return {"output": str(output), "up_to_date": True}
    _remove_stale_partials(output)
    partial = output.with_name(f"{output.name}.partial-{os.getpid()}")
    with storage.writing(
        str(output), "nothing of it was kept: free space there or pass a writable --output, then rerun"
    ):
        partial.mkdir(parents=True)
        try:
            index = _write(partial, paths, files, options, tokenizer, tokenizer_dir, workers, progress)
            if output.is_dir():  # empty: _up_to_date refused any other folder
                output.rmdir()
            partial.rename(output)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    seconds = time.monotonic() - began
    total_bytes = sum(f["bytes"] for f in files)
    tokens = sum(s["streams"][index["streams"][0]]["tokens"] for s in index["splits"].values())
    return {
        "output": str(output),
        "up_to_date": False,
        "documents": {split: s["documents"] for split, s in index["splits"].items()},
        "tokens": tokens,
        "input_mb": total_bytes / 1e6,
        "seconds": seconds,
        "mb_per_s": total_bytes / 1e6 / seconds,
        "tokens_per_s": tokens / seconds,
        "workers": index["workers"],
    } | ({"chat": index["chat"]} if chat else {})


def unread_options(fmt: str, tokenizer: str, trained: bool, given: dict) -> str | None:
    """One line naming every option of `given` that the format or the tokenizer leaves unread and that is set to
    another value than prepare's default (each is applied or refused, never ignored), or None."""
    defaults = {name: p.default for name, p in inspect.signature(prepare).parameters.items()}
    with_field = [name for name, f in readers.FORMATS.items() if f.field]
    by_recipe = [name for name, kind in RECIPES.items() if kind.trained]
    reads = {  # option: (whether it is read, by what, the setting that leaves it unread)
        "delimiter": (fmt == "text", "--format text", f"--format={fmt}"),
        "field": (readers.FORMATS[fmt].field, f"--format {', '.join(with_field)}", f"--format={fmt}"),
        "vocab_size": (trained, f"--tokenizer {' or '.join(by_recipe)}", f"--tokenizer={tokenizer}"),
        "sample_mb": (trained, f"--tokenizer {' or '.join(by_recipe)}", f"--tokenizer={tokenizer}"),
        "max_tokens": (given["chat"], "--chat", "documents of text"),
    }
    if given["chat"]:  # a conversation is its `messages` field
        reads["field"] = (False, reads["field"][1], "--chat")
    unread = [n for n, value in given.items() if n in reads and not reads[n][0] and value != defaults[n]]
    if not unread:
        return None
    shown = lambda name, value: repr(value) if name == "delimiter" else value  # a delimiter's \n as typed
    each = "; ".join(f"--{n}={shown(n, given[n])} is read by {reads[n][1]}, not {reads[n][2]}" for n in unread)
    back = " ".join(f"--{n}={shown(n, defaults[n])}" for n in unread)
    return f"{each}: leave {'them' if len(unread) > 1 else 'it'} out ({back}, the default{'s' * (len(unread) > 1)})"


def _tokenizer_dir(tokenizer: str) -> Path | None:
    """The folder holding tokenizer.json when `tokenizer` is a path (a workdir or a tokenizer folder), else None."""
    if tokenizer in RECIPES:
        return None
    path = Path(tokenizer).expanduser().resolve()
    for folder in (path, path / TOKENIZER_DIR):
        if (folder / tok_lib.TOKENIZER_FILE).is_file():
            return folder
    raise FileNotFoundError(
        f"--tokenizer={tokenizer}: not one of {', '.join(RECIPES)}, and {path} holds no {tok_lib.TOKENIZER_FILE} "
        f"(nor {TOKENIZER_DIR}/{tok_lib.TOKENIZER_FILE}); pass a workdir of run.py train / import, or a tokenizer kind"
    )


def _up_to_date(output: Path, options: dict, files: list[dict]) -> bool:
    """True when `output` holds shards of exactly these inputs and options; False when it is absent or an empty
    folder; ValueError (nothing is touched) when it holds anything else."""
    index_path = output / INDEX_FILE
    if index_path.is_file():
        index = json.loads(index_path.read_text())
        old = index["options"]
        changed = [f"--{k} {old.get(k)!r} -> {v!r}" for k, v in options.items() if old.get(k) != v]
        if [f["path"] for f in index["inputs"]] != [f["path"] for f in files]:
            changed.append("the input files")
        else:
            changed += [f"{f['path']} changed" for f, old in zip(files, index["inputs"]) if f != old]
        if not changed:
            return True
        raise ValueError(
            f"{output} holds shards of other inputs or options ({'; '.join(changed)}): pass another --output, "
            "or delete that folder to prepare it again"
        )
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ValueError(
            f"--output={output} exists and is not a prepared folder (no {INDEX_FILE}): pass another --output"
        )
    return False


def _remove_stale_partials(output: Path) -> None:
    """Removes DIR.partial-PID folders that interrupted prepares left (their process is gone)."""
    for partial in output.parent.glob(f"{output.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write(partial, paths, files, options, tokenizer, tokenizer_dir, workers, progress) -> dict:
    """Tokenizer, shards, documents.npy and (last: its presence means complete) index.json, all into `partial`."""
    fmt, delimiter, field = options["format"], options["delimiter"], options["field"] or "text"
    chunk_bytes = max(int(options["shard_mb"] * 2**20), 1)
    chunks = readers.plan_chunks(paths, fmt, delimiter, chunk_bytes)
    workers = max(1, min(workers or os.cpu_count() or 1, len(chunks) or 1))
    chat = options.get("chat", False)
    streams = ["src", "tgt"] if fmt == "tsv" else ["tokens", "mask"] if chat else ["tokens"]
    bar = lambda desc: tqdm(total=sum(f["bytes"] for f in files), unit="B", unit_scale=True, desc=desc,
                            disable=not progress)  # fmt: skip
    pool = None  # one worker: tokenize in this process
    try:
        if workers > 1:  # spawned, not forked: the parent has imported jax, which is multithreaded
            with preemption.starting_processes():  # a Stopped half-way would leave workers and semaphores behind
                pool = multiprocessing.get_context("spawn").Pool(workers, _die_with_parent, (os.getpid(),))
        run = pool.imap if pool else map
        if tokenizer_dir:
            tok = tok_lib.load_tokenizer(tokenizer_dir)
        else:
            source = TokenizerInputs(chunks, fmt, delimiter, field, chunk_bytes, run, bar)
            tok = RECIPES[tokenizer].build(source, options["vocab_size"], options["sample_mb"])
        tok.save(partial / TOKENIZER_DIR)
        tok_fingerprint = fingerprint(tok)
        for split in SHARD_SPLITS:
            (partial / split).mkdir()
        capacity = (options["max_tokens"] or 2**62) if chat else 0
        tasks = [
            (i, c, fmt, delimiter, field, options["valid_fraction"], str(partial), streams, tok_fingerprint, capacity)
            for i, c in enumerate(chunks)
        ]
        results, documents, tokens = [], 0, 0
        progress_bar = bar("tokenize")
        for result in closing(progress_bar, run(_tokenize_chunk, tasks)):
            results.append(result)
            documents += sum(len(result[split][streams[0]]) for split in SHARD_SPLITS)
            tokens += sum(int(result[split][streams[0]].sum()) for split in SHARD_SPLITS)
            progress_bar.update(result["bytes"])
            progress_bar.set_postfix(documents=documents, tokens=tokens, refresh=False)
    finally:
        if pool:  # a stop or an error: no worker goes on writing into the partial folder that is then removed
            pool.terminate()
            pool.join()
    if not documents:
        raise ValueError(f"no documents in {', '.join(map(str, paths))}: the inputs are empty (or blank)")
    index = {
        "format": 1,
        "kind": "pairs" if fmt == "tsv" else "chat" if chat else "lm",
        "streams": streams,
        "dtype": np.dtype(shard_dtype(tok.vocab_size)).name,
        "dtypes": {"mask": "uint8"} if chat else {},  # a stream's own, where it is not `dtype`
        "tokenizer": {
            "kind": tok.kind,
            "vocab_size": tok.vocab_size,
            "eos_id": tok.eos_id,
            "fingerprint": tok_fingerprint,
        },  # fmt: skip
        "options": options,
        "inputs": files,
        "splits": {split: _split_index(partial, split, streams, results, options, documents) for split in SHARD_SPLITS},
        "workers": workers,
    }
    if chat:  # conversations cut at a turn boundary (to max_tokens), dropped (no assistant token left)
        index["chat"] = {k: sum(r[k] for r in results) for k in ("cut", "dropped")}
    (partial / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n")
    return index


def _split_index(partial: Path, split: str, streams: list[str], results: list[dict], options, total: int) -> dict:
    """One split's shards and document count; writes its {stream}-documents.npy (where each document starts)."""
    documents = sum(len(r[split][streams[0]]) for r in results)
    if not documents:
        raise ValueError(f"the {split} split has no documents (of {total}): {_split_fix(split, options, total)}")
    out = {"documents": documents, "streams": {}}
    for s in streams:
        n_E = np.concatenate([r[split][s] for r in results])
        starts = np.zeros(len(n_E) + 1, np.int64)  # one array of D + 1, not the copies of concatenate and cumsum
        np.cumsum(n_E, out=starts[1:])
        np.save(partial / split / f"{s}-documents.npy", starts)
        shards = [{"file": r["files"][split][s], "tokens": int(r[split][s].sum())} for r in results]
        out["streams"][s] = {"tokens": int(n_E.sum()), "shards": [x for x in shards if x["tokens"]]}
    return out


def _split_fix(split: str, options: dict, total: int) -> str:
    """How an empty split gets documents. Documents are never cut (the split is a function of each document's text),
    so one document needs --delimiter (a plain text file is one document without it), not another valid_fraction."""
    one_per_file = options["format"] == "text" and not options["delimiter"]
    if total == 1 and one_per_file:
        return "a text file is one document unless --delimiter splits it: give e.g. --delimiter='\\n\\n' (blank lines)"
    if total == 1:
        return "one document cannot be split into train and valid: give more"
    fix = f"{'raise' if split == 'valid' else 'lower'} --valid_fraction={options['valid_fraction']}"
    return fix + (", or split the files into documents with --delimiter" if one_per_file else "")


def _die_with_parent(parent: int) -> None:
    """A worker's initializer: the kernel SIGKILLs it when the parent dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing). It ignores SIGINT from its start (preemption.starting_processes): a
    Ctrl-C reaches every process of the terminal's group, and the parent alone reports it and stops the workers.
    The multiprocessing resource tracker ends too, once the last process holding its pipe (parent and workers) is
    gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux
        return
    if os.getppid() != parent:  # the parent died before prctl: the signal will never come
        os._exit(1)


def _tokenize_chunk(task) -> dict:
    """One chunk's documents tokenized into one shard per split and stream, a batch of documents at a time (memory
    does not grow with the chunk); returns the documents' lengths."""
    i, chunk, fmt, delimiter, field, valid_fraction, partial, streams, tokenizer_fingerprint, capacity = task
    if tokenizer_fingerprint not in _worker_tokenizers:
        _worker_tokenizers[tokenizer_fingerprint] = tok_lib.load_tokenizer(os.path.join(partial, TOKENIZER_DIR))
    tok = _worker_tokenizers[tokenizer_fingerprint]
    dtypes = {s: np.uint8 if s == "mask" else shard_dtype(tok.vocab_size) for s in streams}
    counts = {"cut": 0, "dropped": 0}  # conversations (capacity > 0: chat)
    names = {split: {s: f"{split}/{s}-{i:05d}.bin" for s in streams} for split in SHARD_SPLITS}
    lengths = {split: {s: [] for s in streams} for split in SHARD_SPLITS}
    with contextlib.ExitStack() as files:
        opened = {}  # name -> file, opened at its first token: a split without tokens has no shard file
        source = chat_lib.conversations(chunk, fmt) if capacity else readers.documents(chunk, fmt, delimiter, field)
        for batch in batches(source):
            parts = {split: [] for split in SHARD_SPLITS}
            for d in batch:
                if capacity:
                    valid = chat_lib.in_valid(d.messages, valid_fraction)
                else:
                    valid = in_valid_split("\t".join(d) if isinstance(d, tuple) else d, valid_fraction)
                parts["valid" if valid else "train"].append(d)
            for split, documents in parts.items():
                if capacity:
                    kept = chat_lib.fit_all(tok, documents, capacity, counts)
                    n = np.array([len(t.ids) for t in kept], np.int64)
                    encoded = {"tokens": ([t.ids for t in kept], n), "mask": ([t.mask for t in kept], n)}
                else:
                    encoded = _texts(tok, documents, streams, chunk, fmt)
                for s, (ids, n) in encoded.items():
                    if n.sum():
                        name = names[split][s]
                        if name not in opened:
                            opened[name] = files.enter_context(storage.Appending(os.path.join(partial, name)))
                        opened[name].write(np.concatenate(ids).astype(dtypes[s]).data)
                    lengths[split][s].append(n)
    result = {"bytes": chunk.nbytes, "files": names, **counts}
    for split in SHARD_SPLITS:
        result[split] = {s: np.concatenate([np.zeros(0, np.int64), *lengths[split][s]]) for s in streams}
    return result


def _texts(tok, documents: list, streams: list[str], chunk, fmt: str) -> dict:
    """{stream: (ids, lengths)} of documents of text: LM documents end with EOS, TSV pairs are two streams."""
    out = {}
    for j, s in enumerate(streams):
        texts = [d[j] for d in documents] if len(streams) > 1 else documents
        out[s] = _encode(tok, texts, len(streams) == 1 and tok.eos_id is not None, chunk, fmt)
    return out


def _encode(tok, texts: list[str], eos: bool, chunk, fmt: str) -> tuple[list[np.ndarray], np.ndarray]:
    """The ids of `texts`, each followed by EOS when `eos` (an LM stream), and their lengths."""
    try:
        ids = tok.encode_batch(texts) if texts else []
    except ValueError as e:  # a character the tokenizer (of a workdir) cannot encode
        raise ValueError(f"{readers.where(chunk, fmt)}: {e}") from None
    if eos:
        ids = [a for x in ids for a in (x, np.array([tok.eos_id], np.int32))]
        return ids, np.array([len(x) + 1 for x in ids[::2]], np.int64)
    return ids, np.array([len(x) for x in ids], np.int64)
