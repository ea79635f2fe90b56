"""A pretrained model's own tokenizer: any Hugging Face `tokenizers` pipeline (byte-level BPE with its pre-tokenizer,
special tokens), its BOS/EOS/pad ids and chat template, as txjax's Tokenizer protocol (txjax.data.tokenizers).

Built by the importers (txjax.convert: from a Hugging Face folder's tokenizer.json, or from a GGUF file's metadata);
saved as the pipeline's own `hf_tokenizer.json` next to txjax's tokenizer.json (kind "hf", the ids, the template).
`encode` gives the text's tokens only (no BOS: `add_bos` says whether the model expects one first, and scoring and
generation put it there); `decode` drops special tokens. `render_chat` applies the chat template with jinja2 as
transformers' apply_chat_template does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from txjax.data.tokenizer_base import Tokenizer
from txjax.extras import require


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
        add_bos: bool = False,
        chat_template: str | None = None,
    ):
        """pipeline: a tokenizers.Tokenizer."""
        self.tok = pipeline
        self.vocab_size = pipeline.get_vocab_size(with_added_tokens=True)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.add_bos, self.chat_template = add_bos, chat_template
        for name in ("bos_id", "eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"tokenizer: {name}={value} is outside the vocabulary [0, {self.vocab_size})")

    def token(self, i: int | None) -> str | None:
        return None if i is None else self.tok.id_to_token(i)

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        out = self.tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in out]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(self._check_ids(ids).tolist(), skip_special_tokens=True)

    def prefix(self) -> list[int]:
        """[BOS] when the model was trained with it before every text, else nothing."""
        return [self.bos_id] if self.add_bos and self.bos_id is not None else []

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The chat template applied to [{"role": ..., "content": ...}, ...] (jinja2, as transformers does)."""
        if not self.chat_template:
            raise ValueError("this model's tokenizer has no chat template: drop --chat")
        require("jinja2", "a chat template (--chat)")
        import jinja2.sandbox  # installed: require checked

        def raise_exception(message):  # templates call it to refuse a conversation
            raise jinja2.TemplateError(message)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.token(self.bos_id) or "",
            eos_token=self.token(self.eos_id) or "",
        )

    def _config(self, directory: Path) -> dict:
        self.tok.save(str(directory / self.FILE))
        return {
            "file": self.FILE,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "add_bos": self.add_bos,
            "chat_template": self.chat_template,
        }

    @classmethod
    def load(cls, directory: Path, config: dict) -> HFTokenizer:
        tokenizers = require("tokenizers", "a pretrained model's tokenizer (kind 'hf')")
        fields = {k: config[k] for k in ("bos_id", "eos_id", "pad_id", "add_bos", "chat_template")}
        return cls(tokenizers.Tokenizer.from_file(str(directory / config["file"])), **fields)
