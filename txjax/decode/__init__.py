"""Generation with a KV cache: prefill, one-token decode steps, sampling and beam search in one compiled loop.

The Flax wmt/lm1b split, one job per file:
- strategy.py: `Strategy`, how tokens are chosen: method greedy, sample or beam, each with its own options (static:
  part of the compiled program);
- sampling.py: greedy (temperature 0), temperature, top-k, top-p (nucleus, Holtzman et al. 2020) in one
  `choose_tokens`, and the per-step update of independent rows;
- beam.py: beam search (Wu et al. 2016) with the GNMT length penalty lp(L) = ((5 + L) / 6)^alpha, K alive and K
  finished hypotheses per row (the t5x / Flax wmt formulation);
- cache.py: the KV cache (`init_cache`, one cached call `extend`, row gathers for beams and samples, growth
  through bucketed lengths);
- search.py: `generate_ids`, the family's encode and the prompts' prefill, then one `lax.while_loop` per cache
  length around the one `tokens_to_logits` closure (no host round trip per token, one compilation whatever the
  length);
- generate.py: the host side, one `generate` for both families (an encoder-decoder's inputs are sources: translation
  is generation with a source), `decode_all` (whole splits), `generate_windowed` (past the context);
- workdir.py: generation from a training workdir (`run.py generate`);
- stream.py: the same loops' tokens as they are produced (`generate_stream`, `stream_steps`; `run.py generate`).

Prompts of different lengths are left-padded: pad slots get segment id 0 (no query attends to them, the cache stores
them as empty) and positions start at 0 at each row's first real token, so each row generates exactly what it
would alone. The encoder-decoder encodes the source once; its cross-attention keys/values are written into the
cache by the prefill call and reused at every step (families/encoder_decoder.py).

Lengths: a prompt of P tokens generating T tokens feeds positions 0 .. P+T-2 (the last token is never fed back), so
P + T - 1 <= model max_len is required; anything longer is a one-line ValueError, never a silent truncation.
"""

from txjax.decode.beam import BeamState, beam_update, init_beam_state, length_penalty
from txjax.decode.cache import (
    bucket_lengths,
    extend,
    for_decoding,
    gather_rows,
    grow,
    init_cache,
    tile_rows,
)
from txjax.decode.generate import Generation, check_inputs, decode_all, generate, generate_windowed, pad_batch
from txjax.decode.sampling import (
    SampleState,
    choose_tokens,
    greedy_tokens,
    init_sample_state,
    sample_update,
    top_k_filter,
    top_p_filter,
)
from txjax.decode.search import generate_ids, search
from txjax.decode.strategy import Strategy
from txjax.decode.stream import generate_stream, stream_steps
from txjax.decode.workdir import generate_from_workdir, strategy_from_config

__all__ = [
    "BeamState",
    "Generation",
    "SampleState",
    "Strategy",
    "beam_update",
    "bucket_lengths",
    "check_inputs",
    "choose_tokens",
    "decode_all",
    "extend",
    "for_decoding",
    "gather_rows",
    "generate",
    "generate_from_workdir",
    "generate_ids",
    "generate_stream",
    "generate_windowed",
    "greedy_tokens",
    "grow",
    "init_beam_state",
    "init_cache",
    "init_sample_state",
    "length_penalty",
    "pad_batch",
    "sample_update",
    "search",
    "stream_steps",
    "strategy_from_config",
    "tile_rows",
    "top_k_filter",
    "top_p_filter",
]
