"""Tests of chat data (txjax.data.chat, data.kind=chat): the assistant mask against transformers' own rendering (a
template with {% generation %} markers and one without), packed loss = unpacked loss, a cut at a turn boundary and
a drop, counted, Parquet read as JSONL is, and bad conversations refused in one line naming file and line."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

import run
from txjax.data import chat
from txjax.data.shards import ShardLMDataset
from txjax.evaluate.split import evaluate, make_eval_step
from txjax.families import init_params
from txjax.model.config import ModelConfig
from txjax.model.models import DecoderLM

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
pytest.importorskip("jinja2")
from txjax.data.hf_tokenizer import HFTokenizer  # noqa: E402 (needs tokenizers)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
# ChatML as SmolLM2's and Qwen's templates write it; the generation prompt is the assistant's header
PLAIN = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# the same rendering, the assistant's content and end of turn marked for training
MARKED = (
    "{% for m in messages %}{% if m.role == 'assistant' %}<|im_start|>assistant\n{% generation %}{{ m.content }}"
    "<|im_end|>\n{% endgeneration %}{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATIONS = [
    [
        {"role": "user", "content": "Translate to Spanish: In the beginning."},
        {"role": "assistant", "content": "En el principio."},
    ],
    [
        {"role": "system", "content": "You translate."},
        {"role": "user", "content": "Translate to English: la luz"},
        {"role": "assistant", "content": "the light"},
        {"role": "user", "content": "And: la tierra, señor?"},
        {"role": "assistant", "content": "the earth, sir?"},
    ],
    [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": "Nothing."}],
    [
        {"role": "user", "content": "Count: one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four five six seven"},
    ],
]  # fmt: skip


@pytest.fixture(scope="module")
def pipeline():
    """A byte-level BPE trained on the conversations, ChatML's special tokens first."""
    bpe = tokenizers.ByteLevelBPETokenizer()
    text = [m["content"] for c in CONVERSATIONS for m in c] + ["user assistant system\n"]
    bpe.train_from_iterator(text, vocab_size=300, min_frequency=1, special_tokens=SPECIALS, show_progress=False)
    return bpe._tokenizer


def both(pipeline, template):
    """(txjax's HFTokenizer, transformers' tokenizer) of one pipeline and chat template."""
    ours = HFTokenizer(pipeline, eos_id=2, pad_id=0, chat_template=template)
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_object=pipeline, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    theirs.chat_template = template
    return ours, theirs


def ids_of(theirs, messages, prompt=False):
    out = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt, return_dict=True)
    return list(out["input_ids"])


def write_jsonl(path, conversations, extra_lines=()):
    lines = [json.dumps({"messages": c}, ensure_ascii=False) for c in conversations]
    path.write_text("\n".join([*lines, *extra_lines]) + "\n", encoding="utf-8")
    return path


def test_the_mask_of_a_marked_template_is_transformers_assistant_mask(pipeline):
    ours, theirs = both(pipeline, MARKED)
    for messages in CONVERSATIONS:
        expected = theirs.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        got = chat.tokens(ours, messages, "here")
        assert got.ids.tolist() == list(expected["input_ids"])
        assert got.mask.astype(int).tolist() == list(expected["assistant_masks"])
        assert got.mask.any()


def test_the_mask_of_an_unmarked_template_is_what_each_assistant_turn_adds(pipeline):
    """Without markers: each assistant turn's tokens, from transformers' tokens of the conversation up to its
    generation prompt to those up to the turn; the same mask the marked template gives."""
    ours, theirs = both(pipeline, PLAIN)
    marked, _ = both(pipeline, MARKED)
    for messages in CONVERSATIONS:
        full = ids_of(theirs, messages)
        expected = np.zeros(len(full), bool)
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                before, after = ids_of(theirs, messages[:i], prompt=True), ids_of(theirs, messages[: i + 1])
                assert full[: len(after)] == after and after[: len(before)] == before
                expected[len(before) : len(after)] = True
        got = chat.tokens(ours, messages, "here")
        assert got.ids.tolist() == full
        np.testing.assert_array_equal(got.mask, expected)
        np.testing.assert_array_equal(got.mask, chat.tokens(marked, messages, "here").mask)
        assert ours.decode(got.ids[got.mask]).replace("\n", "") == "".join(
            m["content"] for m in messages if m["role"] == "assistant"
        )


def test_packed_loss_equals_unpacked_loss(pipeline, tmp_path):
    """Every conversation once, packed several a row or one a row: the same weights and the same loss of a random
    model (segments keep them apart, positions restart); the weight is the assistant targets' count."""
    ours, _ = both(pipeline, PLAIN)
    path = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS * 3)
    data = chat.ChatDataset(path, ours, 96, "train", valid_fraction=1e-9, pack=True)
    assert len(data) == 12 and sum(x["segment_ids"].max() > 1 for x in data.eval_batches(4)) > 0
    model = DecoderLM(ModelConfig(vocab_size=ours.vocab_size, max_len=96, num_layers=1, num_heads=2, d_model=16,
                                  d_ff=32, positional="rope"))  # fmt: skip
    params, step = init_params(model, jax.random.key(0)), make_eval_step(model)
    packed = evaluate(step, params, data.eval_batches(4, packed=True))
    unpacked = evaluate(step, params, data.eval_batches(4, packed=False))
    assigned = sum(int(chat.tokens(ours, c, "").mask[1:].sum()) for c in CONVERSATIONS * 3)
    assert packed["tokens"] == unpacked["tokens"] == assigned
    np.testing.assert_allclose(packed["loss"], unpacked["loss"], rtol=1e-5)
    batch = data.batch(seed=0, k=1, batch_size=2)  # training rows: the same weights where the targets are
    assert batch["weights"].sum() > 0 and (batch["weights"] <= (batch["segment_ids"] > 0)).all()


def test_a_long_conversation_is_cut_at_a_turn_boundary_and_one_without_room_dropped(pipeline, tmp_path, capsys):
    ours, theirs = both(pipeline, PLAIN)
    long = CONVERSATIONS[3]  # two assistant turns: the cut keeps the first exchange
    first = ids_of(theirs, long[:2])
    seq_len = len(first) + 1  # room for the first exchange, not the whole
    assert len(ids_of(theirs, long)) > seq_len + 1
    too_long = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "four five six " * 20}]
    path = write_jsonl(tmp_path / "c.jsonl", [long, CONVERSATIONS[2], too_long])
    data = chat.ChatDataset(path, ours, seq_len, "train", valid_fraction=1e-9)
    assert (data.num_cut, data.num_dropped, len(data)) == (1, 1, 2)
    assert data.documents[0].tolist() == first
    assert capsys.readouterr().err == (
        f"{path} (train): conversations cut at a turn boundary to fit data.seq_len={seq_len}: 1; dropped (no "
        "assistant token fits): 1\n"
    )


def test_parquet_conversations_are_read_as_jsonl_ones(pipeline, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    ours, _ = both(pipeline, PLAIN)
    pq.write_table(pa.table({"messages": CONVERSATIONS}), tmp_path / "c.parquet", row_group_size=2)
    jsonl = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS)
    for split in ("train", "valid"):
        a = chat.ChatDataset(tmp_path / "c.parquet", ours, 64, split, valid_fraction=0.5)
        b = chat.ChatDataset(jsonl, ours, 64, split, valid_fraction=0.5)
        assert [d.tolist() for d in a.documents] == [d.tolist() for d in b.documents]
        assert [m.tolist() for m in a.masks] == [m.tolist() for m in b.masks]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"text": "hi"}', "no list 'messages' of messages (the record has: text); write it as"),
        ('{"messages": [{"role": "robot", "content": "hi"}]}', "message 0 has role 'robot', not one of system, user"),
        ('{"messages": [{"role": "user"}]}', "message 0 is not {'role': ..., 'content': '...'}"),
        ("[1, 2", "not a JSON object"),
    ],
)
def test_a_bad_conversation_is_one_line_naming_file_and_line(pipeline, tmp_path, line, says):
    ours, _ = both(pipeline, PLAIN)
    path = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS[:1], [line])
    with pytest.raises(ValueError) as e:
        chat.ChatDataset(path, ours, 64, "train", valid_fraction=1e-9)
    assert str(e.value).startswith(f"{path}:2: ") and says in str(e.value) and "\n" not in str(e.value)


def test_run_py_train_refuses_a_bad_role_in_one_line(pipeline, tmp_path, capsys):
    ours, _ = both(pipeline, PLAIN)
    ours.save(tmp_path / "run" / "tokenizer")  # an imported model's workdir, its tokenizer alone
    path = write_jsonl(tmp_path / "c.jsonl", [[{"role": "human", "content": "hi"}]])
    flags = ["--config.data.kind=chat", f"--config.data.path={path}", "--config.data.tokenizer=hf"]
    assert run.main(["train", f"--workdir={tmp_path / 'run'}", *flags]) == 2
    line = f"error: {path}:1: message 0 has role 'human', not one of system, user, assistant; fix it"
    assert capsys.readouterr().err.splitlines() == [line]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["tokenizer"]


def test_a_template_that_rewrites_earlier_turns_needs_markers(pipeline, tmp_path):
    ours, _ = both(pipeline, "{{ messages | length }}" + PLAIN)  # the count changes as the conversation grows
    path = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS[:1])
    with pytest.raises(ValueError, match=r"c\.jsonl:1: the chat template renders turn 1's prefix differently .* "
                                         r"\{% generation %\}"):  # fmt: skip
        chat.ChatDataset(path, ours, 64, "train", valid_fraction=1e-9)


def test_make_chat_turns_verse_pairs_into_conversations_chat_data_reads(pipeline, tmp_path):
    """experiments/data/make_chat.py on a small bible folder: each assistant turn is the other side of the pair its
    request quotes, the multi-turn ones included, and data.kind=chat's reader takes the files."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_chat", Path(__file__).parents[1] / "experiments/data/make_chat.py"
    )
    make_chat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_chat)
    pairs = [(f"Verse {i} in English.", f"Versículo {i} en español.") for i in range(12)]
    for split in ("train", "test"):
        (tmp_path / f"{split}.en-es.tsv").write_text("".join(f"{e}\t{s}\n" for e, s in pairs), encoding="utf-8")
    out = tmp_path / "out"
    assert make_chat.main([f"--output={out}", f"--bible={tmp_path}", "--pairs=6", "--heldout=3"]) == 0
    records = [json.loads(line) for line in (out / "chat.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 6 and any(len(r["messages"]) == 5 for r in records)
    other = {e: s for e, s in pairs} | {s: e for e, s in pairs}
    for r in records:
        turns = r["messages"][1:]
        for ask, answer in zip(turns[::2], turns[1::2]):
            assert answer["content"] == other[ask["content"].split(": ", 1)[1]]
    ours, _ = both(pipeline, PLAIN)
    assert len(chat.ChatDataset(out / "chat.jsonl", ours, 400, "train", valid_fraction=1e-9)) == 6


def test_prepared_chat_shards_hold_the_conversations_and_their_masks(pipeline, tmp_path, capsys):
    """`run.py prepare --chat`: each split's tokens and mask streams are data.kind=chat's conversations (the same
    split, the same cut and drop, counted in its summary), and the shard reader weighs exactly the assistant targets."""
    ours, _ = both(pipeline, PLAIN)
    ours.save(tmp_path / "base" / "tokenizer")
    too_long = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "four five six " * 20}]
    path = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS * 4 + [too_long])
    flags = [f"--input={path}", f"--output={tmp_path / 'out'}", f"--tokenizer={tmp_path / 'base'}", "--workers=1"]
    assert run.main(["prepare", *flags, "--chat", "--max_tokens=65", "--valid_fraction=0.3"]) in (0, None)
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    counts = {}
    for split in ("train", "valid"):
        data = chat.ChatDataset(path, ours, 64, split, valid_fraction=0.3)
        counts[split] = (data.num_cut, data.num_dropped)
        shards = ShardLMDataset(tmp_path / "out", ours, 64, split, pack=True)
        starts = np.asarray(shards.stream.doc_starts)
        assert [shards.stream.read(a, b).tolist() for a, b in zip(starts, starts[1:])] == [
            d.tolist() for d in data.documents
        ]
        assert [shards.mask.read(a, b).astype(bool).tolist() for a, b in zip(starts, starts[1:])] == [
            m.tolist() for m in data.masks
        ]
        weights = sum(b["weights"].sum() for b in shards.eval_batches(4))
        assert weights == sum(int(m[1:].sum()) for m in data.masks)
        batch = shards.batch(seed=0, k=0, batch_size=4)
        assert 0 < batch["weights"].sum() < (batch["segment_ids"] > 0).sum()
    assert summary["chat"] == {"cut": sum(c for c, _ in counts.values()), "dropped": sum(d for _, d in counts.values())}
    assert summary["chat"]["cut"] > 0 and summary["chat"]["dropped"] == 1


def test_prepare_chat_with_a_tokenizer_without_a_template_is_one_line(tmp_path, capsys):
    path = write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS)
    assert run.main(["prepare", f"--input={path}", f"--output={tmp_path / 'out'}", "--chat"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --chat renders conversations with a chat template, and --tokenizer=char has none: pass "
        "--tokenizer=WORKDIR of `run.py import` of a model with one"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("pack", [False, True], ids=["one_a_row", "packed"])
def test_a_training_batch_is_a_function_of_seed_and_step_and_a_process_builds_its_rows(pipeline, tmp_path, pack):
    """Batch k again is the same batch, a share of its rows is those rows of it, and across epochs every
    conversation comes back (the mask of each row's targets is a conversation's own)."""
    ours, _ = both(pipeline, PLAIN)
    data = chat.ChatDataset(write_jsonl(tmp_path / "c.jsonl", CONVERSATIONS), ours, 96, "train", 1e-9, pack=pack)
    for k in (0, 5):  # 5: past the first epoch
        whole = data.batch(seed=3, k=k, batch_size=4)
        again, share = data.batch(seed=3, k=k, batch_size=4), data.batch(seed=3, k=k, batch_size=4, rows=slice(1, 3))
        for key in whole:
            np.testing.assert_array_equal(whole[key], again[key])
            np.testing.assert_array_equal(whole[key][1:3], share[key])
    seen = {tuple(b["inputs"][r, : (b["segment_ids"][r] == 1).sum()]) for k in range(4) for b in [data.batch(3, k, 4)]
            for r in range(4)}  # fmt: skip
    assert seen >= {tuple(d[:-1]) for d in data.documents}
