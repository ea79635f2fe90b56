"""Generation from a training workdir (`run.py generate`): the config's decode strategy with command-line
overrides, a text made the family's input, and the texts generated from it."""

from __future__ import annotations

import dataclasses
import sys

from txjax.decode.generate import generate, generate_windowed
from txjax.decode.strategy import METHOD_OPTIONS, Strategy
from txjax.families import family_of

PREFILL_CHUNK = 512  # tokens a call for a long prompt when decode.prefill_chunk is 0 (the passkey eval's chunk)


def strategy_from_config(decode_config, eos_id: int | None, **overrides) -> dict:
    """Strategy fields from a config's `decode` section and the non-None `overrides` (e.g. command-line flags).

    The method is the overrides' `method`, else the one method the overridden options belong to (--beam_size: beam;
    --temperature, --top_k, --top_p, --num_samples: sample), else the config's. Only that method's options are
    taken from the config; an override of another method's option is the Strategy's one-line ValueError. The
    fields are the Strategy's (left None: dropped), so temperature 0 comes back as method greedy.
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    implied = {m for m, options in METHOD_OPTIONS.items() for name in given if name in options}
    if "method" not in given and len(implied) > 1:
        raise ValueError(f"options of several methods given ({', '.join(sorted(given))}): choose one with --method")
    method = given.pop("method", None) or (implied.pop() if implied else decode_config["method"])
    options = {name: decode_config[name] for name in METHOD_OPTIONS[method]} | given
    max_new_tokens = given.get("max_new_tokens", decode_config["max_new_tokens"])
    chunk = given.get("prefill_chunk", decode_config.get("prefill_chunk", 0)) or None  # 0 (or a config saved before
    # the field): the whole prompt in one call
    strategy = Strategy(
        **dict(options, method=method, max_new_tokens=max_new_tokens, eos_id=eos_id, prefill_chunk=chunk)
    )
    return {
        name: value for name, value in dataclasses.asdict(strategy).items() if value is not None or name == "eos_id"
    }


def workdir_prompt(run, text: str, *, chat: bool = False, **overrides) -> tuple[list[int], str, dict]:
    """(the family's input ids, the text its outputs continue, Strategy fields) of generate_from_workdir.

    The prompt of a generation that slides past the context (Family.slides: an LM's, greedy or sampled) is cut to
    its last max_len tokens with a note on stderr saying how many were kept (beam search and an encoder-decoder's
    source refuse a longer one: txjax.decode.check_inputs); such a prompt of more
    than 2 * PREFILL_CHUNK tokens is fed PREFILL_CHUNK tokens a call when decode.prefill_chunk is 0, so its prefill
    holds chunk x cache attention scores, not prompt x prompt (docs/long_context.md)."""
    tokenizer = run.tokenizer
    family = family_of(run.model)
    if chat:  # the template writes the conversation's own specials (its BOS): tokenized as apply_chat_template does
        ids, shown = tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": text}])), ""
    else:
        ids, shown = family.read_text(tokenizer, text, bos=run.prompt_bos)
    strategy = strategy_from_config(run.config.decode, tokenizer.eos_id, **overrides)
    if family.slides(strategy):
        max_len = run.model.cfg.max_len
        if len(ids) > max_len:
            print(
                f"note: the prompt has {len(ids)} tokens, more than the model's context (max_len={max_len}): its last"
                f" {max_len} are kept, the first {len(ids) - max_len} dropped",
                file=sys.stderr,
                flush=True,
            )
            ids = ids[-max_len:]
        if "prefill_chunk" not in strategy and len(ids) > 2 * PREFILL_CHUNK:
            strategy["prefill_chunk"] = PREFILL_CHUNK
    return ids, shown, strategy


def generate_from_workdir(
    run, text: str, *, seed: int = 0, chat: bool = False, speculative: bool = False, **overrides
) -> list[str]:
    """Generate from a loaded run (txjax.experiment.load_workdir): the LM continues `text` (the returned texts
    include it; sampling slides past the context, see generate_windowed), the encoder-decoder translates it.
    chat: `text` is a user message put into the tokenizer's chat template; the texts are the replies, each ending
    at the model's EOS. `overrides`: Strategy fields (None = the config's decode value). One text per sample.
    speculative: greedy drafted by the MTP modules (generate's), within the context (never sliding past it)."""
    tokenizer = run.tokenizer
    ids, shown, strategy = workdir_prompt(run, text, chat=chat, **overrides)
    if family_of(run.model).slides(strategy) and not speculative:
        rows = generate_windowed(run.model, run.params, ids, pad_id=tokenizer.pad_id, seed=seed, **strategy)
    else:
        out = generate(
            run.model, run.params, [ids], bos_id=tokenizer.bos_id, pad_id=tokenizer.pad_id, seed=seed,
            speculative=speculative, **strategy,
        )  # fmt: skip
        rows = out.ids
    return [shown + tokenizer.decode(row) for row in rows]
