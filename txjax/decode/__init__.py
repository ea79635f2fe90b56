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
- search.py: the loop written once, `begin` (the family's encode, the prompts' prefill, the first choice) and
  `run_steps` (one `lax.while_loop` of cached steps per cache length); `generate_ids` compiles them into one call
  (no host round trip per token, one compilation whatever the length), `stream_ids` runs them a chunk of steps a
  call for streaming;
- generate.py: the host side, one `generate` for both families (an encoder-decoder's inputs are sources: translation
  is generation with a source), `decode_all` (whole splits), `generate_windowed` (past the context), each with its
  streaming form (`generation_steps`, `windowed_steps`);
- speculative.py: self-speculative greedy decoding, the MTP modules' drafts verified by one cached call a round
  (`generate(..., speculative=True)`: greedy's tokens);
- workdir.py: generation from a training workdir (`run.py generate`);
- stream.py: one row's tokens as the loop produces them (`generate_stream`; `run.py generate`).

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
from txjax.decode.generate import (
    Generation,
    check_inputs,
    decode_all,
    generate,
    generate_windowed,
    generation_steps,
    pad_batch,
    windowed_steps,
)
from txjax.decode.sampling import (
    SampleState,
    choose_tokens,
    greedy_tokens,
    init_sample_state,
    sample_update,
    top_k_filter,
    top_p_filter,
)
from txjax.decode.search import begin, generate_ids, run_steps, stream_ids
from txjax.decode.strategy import Strategy
from txjax.decode.stream import generate_stream
from txjax.decode.workdir import generate_from_workdir, strategy_from_config

__all__ = [
    "BeamState",
    "Generation",
    "SampleState",
    "Strategy",
    "beam_update",
    "begin",
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
    "generation_steps",
    "greedy_tokens",
    "grow",
    "init_beam_state",
    "init_cache",
    "init_sample_state",
    "length_penalty",
    "pad_batch",
    "run_steps",
    "sample_update",
    "stream_ids",
    "strategy_from_config",
    "tile_rows",
    "top_k_filter",
    "top_p_filter",
    "windowed_steps",
]
