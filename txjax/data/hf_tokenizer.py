"""A pretrained model's own tokenizer: any Hugging Face `tokenizers` pipeline (byte-level BPE with its pre-tokenizer,
special tokens), its BOS/EOS/pad ids and chat template, as txjax's Tokenizer protocol (txjax.data.tokenizers).

Built by the importers (txjax.convert: from a Hugging Face folder's tokenizer.json, or from a GGUF file's metadata);
saved as the pipeline's own `hf_tokenizer.json` next to txjax's tokenizer.json (kind "hf", the ids, the template, and
`before` / `after`: the ids the model's own tokenizer puts around a text, as `tokenizer(text).input_ids` in
transformers has them, recorded by the importer: what tokenizer.json's post-processor adds (`added_around`), a
GGUF file's add_bos/add_eos flags, MarianTokenizer's EOS). `encode` gives the text's tokens only; `around` says what
goes around them (`Tokenizer.encode_with_specials`: an encoder's source; `prefix`: an LM's BOS, where scoring and
generation put it); `decode` drops special tokens. `render_chat` applies the chat template with jinja2 as
transformers' apply_chat_template does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from contextvars import ContextVar
from pathlib import Path

import numpy as np

from txjax.data.tokenizer_base import Tokenizer
from txjax.extras import require

# (blocks rendered so far, spans found) while render_chat_spans renders: where {% generation %} records its block
_GENERATION_SPANS: ContextVar[tuple[list[str], list[tuple[int, int]]] | None] = ContextVar("spans", default=None)


class HFTokenizer(Tokenizer):
    kind = "hf"
    FILE = "hf_tokenizer.json"

    def __init__(
        self,
        pipeline,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        before: Sequence[int] = (),
        after: Sequence[int] = (),
        chat_template: str | None = None,
    ):
        """pipeline: a tokenizers.Tokenizer; before/after: the ids the model's tokenizer adds around one text."""
        self.tok = pipeline
        self.vocab_size = pipeline.get_vocab_size(with_added_tokens=True)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.before, self.after = [int(i) for i in before], [int(i) for i in after]
        self.chat_template = chat_template
        for name in ("bos_id", "eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"tokenizer: {name}={value} is outside the vocabulary [0, {self.vocab_size})")
        self._check_ids([*self.before, *self.after])

    @property
    def add_bos(self) -> bool:
        """Whether the model expects BOS before a text (transformers' add_bos_token)."""
        return self.bos_id is not None and self.before[:1] == [self.bos_id]

    def token(self, i: int | None) -> str | None:
        return None if i is None else self.tok.id_to_token(i)

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        out = self.tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in out]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(self._check_ids(ids).tolist(), skip_special_tokens=True)

    def around(self) -> tuple[list[int], list[int]]:
        """The ids recorded at import: what the model's own tokenizer adds before and after a text."""
        return list(self.before), list(self.after)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The chat template applied to [{"role": ..., "content": ...}, ...] (jinja2, as transformers does); a template
        that does not compile or render is a one-line ValueError."""
        return self.render_chat_spans(messages, add_generation_prompt)[0]

    def render_chat_spans(self, messages: list[dict], add_generation_prompt: bool = False):
        """(text, spans): the rendered conversation and the [start, stop) characters of its {% generation %} blocks
        (the assistant's parts a template marks for training; [] when it marks none), as transformers records them
        for apply_chat_template(return_assistant_tokens_mask=True)."""
        if not self.chat_template:
            raise ValueError("this model's tokenizer has no chat template: drop --chat")
        where, fix = "the workdir's tokenizer/tokenizer.json", "correct its chat_template there, or drop --chat"
        template = chat_template(self.chat_template, where, fix)
        import jinja2  # installed: chat_template required it

        blocks, spans = [], []
        token = _GENERATION_SPANS.set((blocks, spans))
        try:
            blocks.extend(
                template.generate(
                    messages=messages,
                    add_generation_prompt=add_generation_prompt,
                    bos_token=self.token(self.bos_id) or "",
                    eos_token=self.token(self.eos_id) or "",
                )
            )
        except jinja2.TemplateError as e:  # a template's raise_exception refusing the conversation, or its own error
            raise ValueError(f"the chat template of the workdir's tokenizer fails on this conversation: {e}") from None
        finally:
            _GENERATION_SPANS.reset(token)
        return "".join(blocks), spans

    @property
    def marks_generation(self) -> bool:
        """Whether the chat template marks the assistant's parts with {% generation %} (transformers' test)."""
        return bool(self.chat_template and re.search(r"\{\%-?\s*generation\s*-?\%\}", self.chat_template))

    def encode_offsets(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32[N], offsets int64[N, 2]): the text's tokens (special tokens written in it included, as
        apply_chat_template tokenizes a rendered chat) and the [start, stop) characters each covers."""
        encoding = self.tok.encode(text, add_special_tokens=False)
        offsets = np.asarray(encoding.offsets, np.int64).reshape(-1, 2)
        return np.asarray(encoding.ids, np.int32), offsets

    def _config(self, directory: Path) -> dict:
        self.tok.save(str(directory / self.FILE))
        return {
            "file": self.FILE,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "before": self.before,
            "after": self.after,
            "chat_template": self.chat_template,
        }

    @classmethod
    def load(cls, directory: Path, config: dict) -> HFTokenizer:
        tokenizers = require("tokenizers", "a pretrained model's tokenizer (kind 'hf')")
        fields = {k: config[k] for k in ("bos_id", "eos_id", "pad_id", "chat_template")}
        if "before" in config:
            fields |= {"before": config["before"], "after": config["after"]}
        else:  # saved before the record: BOS first where add_bos said so, and a source ended with EOS, as then
            bos, eos = config["bos_id"], config["eos_id"]
            fields |= {"before": [bos] if config["add_bos"] else [], "after": [] if eos is None else [eos]}
        return cls(tokenizers.Tokenizer.from_file(str(directory / config["file"])), **fields)


def added_around(pipeline, probe: str = "a, A 0.") -> tuple[list[int], list[int]]:
    """(before, after): the ids a `tokenizers` pipeline's post-processor (tokenizer.json's post_processor: Llama's
    and Gemma's BOS, BART's <s> ... </s>, T5's ... </s>, GPT-2's and Qwen's nothing) adds around one text, as
    `Tokenizer.encode(text, add_special_tokens=True)` applies it; read off a probe text encoded with and without
    them (padding and truncation off, which tokenizer.json may switch on)."""
    tokenizers = require("tokenizers", "a pretrained model's tokenizer.json")
    bare_pipeline = tokenizers.Tokenizer.from_str(pipeline.to_str())
    bare_pipeline.no_padding()
    bare_pipeline.no_truncation()
    bare = bare_pipeline.encode(probe, add_special_tokens=False).ids
    full = bare_pipeline.encode(probe, add_special_tokens=True).ids
    starts = range(len(full) - len(bare) + 1) if bare else ()  # an empty probe would place nothing
    for start in starts:
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    raise ValueError(
        f"tokenizer.json: its post_processor turns {probe!r} ({bare}) into {full}, not the text's tokens with "
        "special tokens around them (txjax reads post-processors that add tokens around a text)"
    )


def pipeline_adding_around(tokenizer: HFTokenizer):
    """The tokenizer's pipeline with a post-processor that adds what it records around a text (its before / after),
    for an exported folder whose transformers tokenizer then writes a text as txjax reads it: the pipeline itself
    where its own post-processor does that (a Hugging Face folder's), else a template of the record (a .gguf
    file's flags, MarianTokenizer's EOS) after its own post-processor when that adds nothing (GPT-2's ByteLevel
    offsets), instead of it when it adds other ids."""
    tokenizers = require("tokenizers", "a pretrained model's tokenizer.json")
    own = added_around(tokenizer.tok)
    if own == tokenizer.around():
        return tokenizer.tok
    before, after = tokenizer.around()
    template = tokenizers.processors.TemplateProcessing(
        single=[*map(tokenizer.token, before), "$A", *map(tokenizer.token, after)],
        special_tokens=[(tokenizer.token(i), i) for i in dict.fromkeys([*before, *after])],
    )
    pipeline = tokenizers.Tokenizer.from_str(tokenizer.tok.to_str())
    keep = pipeline.post_processor is not None and own == ([], [])
    pipeline.post_processor = tokenizers.processors.Sequence([pipeline.post_processor, template]) if keep else template
    return pipeline


@functools.lru_cache(maxsize=8)  # compiled once: chat data renders every conversation several times
def chat_template(source: str, where: str, fix: str):
    """The compiled jinja2 template of a chat template's `source` (in jinja2's sandbox, with transformers' options and
    its raise_exception); a syntax error is a one-line ValueError naming `where` (the file), the template's line and
    the `fix`: checked when a model is imported (txjax.convert) and when --chat renders a conversation."""
    require("jinja2", "a chat template (--chat)")
    import jinja2.sandbox  # installed: require checked

    def raise_exception(message):  # templates call it to refuse a conversation
        raise jinja2.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_extension(), "jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(
            f"{where}: the chat template does not compile (line {e.lineno} of the template: {e.message}): {fix}"
        ) from None


def _generation_extension():
    """transformers' {% generation %} ... {% endgeneration %} tag (its AssistantTracker): renders its body as it is,
    and while render_chat_spans renders, records the [start, stop) characters of that body in the output."""
    import jinja2.ext
    import jinja2.nodes

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_span"), [], [], body).set_lineno(lineno)

        def _span(self, caller):
            text = caller()
            if (tracking := _GENERATION_SPANS.get()) is not None:
                blocks, spans = tracking
                start = sum(map(len, blocks))
                spans.append((start, start + len(text)))
            return text

    return Generation
