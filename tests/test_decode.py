"""Tests of txjax.decode: cache == full forward, no recompilation, padding, strategies, beam search, bad input."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txjax import decode
from txjax.decode import init_cache
from txjax.families import family_of
from txjax.model.config import ModelConfig
from txjax.model.masks import NEG_INF
from txjax.model.models import DecoderLM, EncoderDecoder
from txjax.model.positional import POSITIONAL_KINDS

VOCAB, EOS, BOS, PAD = 13, 1, 2, 0


def tiny(positional="rope", **overrides):
    """2 layers, GQA (4 query heads on 2 KV heads)."""
    fields = dict(vocab_size=VOCAB, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64, num_layers=2, max_len=24)
    fields["positional"] = positional
    return ModelConfig(**{**fields, **overrides})


def random_params(model, *init_args):
    """Every parameter ~ N(0, 0.5^2), drawn on the host (compiling model.init costs seconds per config): peaked
    next-token distributions, so argmax never hinges on float rounding."""
    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), *init_args)["params"])
    rng = np.random.default_rng(0)
    return jax.tree_util.tree_map(lambda s: jnp.asarray(rng.normal(0.0, 0.5, s.shape), s.dtype), shapes)


@functools.cache
def lm(positional="rope", **overrides):
    model = DecoderLM(tiny(positional, **overrides))
    return model, random_params(model, jnp.zeros((1, 4), jnp.int32))


@functools.cache
def seq2seq(positional="rope", **overrides):
    model = EncoderDecoder(tiny(positional, **overrides))
    return model, random_params(model, jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32))


def random_ids(seed, shape, low=3):
    return np.random.default_rng(seed).integers(low, VOCAB, size=shape).astype(np.int32)


# ---------------------------------------------------------------- the cache equals the full forward pass


def teacher_forced_steps(model, params, cache, tokens_BxL, first, context=None):
    """Logits [L - first, B, V] of decode steps feeding tokens first..L-1 one at a time (a lax.scan of `extend`)."""

    def step(cache, t):
        token_Bx1 = jax.lax.dynamic_slice_in_dim(tokens_BxL, t, 1, axis=1)
        logits_BxV, cache = decode.extend(
            model, params, cache, token_Bx1, jnp.full(token_Bx1.shape, t), context=context
        )
        return cache, logits_BxV

    return jax.lax.scan(step, cache, jnp.arange(first, tokens_BxL.shape[1]))[1]


@pytest.mark.gpu
@pytest.mark.parametrize("positional", POSITIONAL_KINDS)
def test_lm_prefill_then_steps_equal_full_forward(positional):
    model, params = lm(positional)
    tokens_BxL, p = random_ids(0, (2, 12)), 5

    @jax.jit
    def run(params, tokens_BxL):  # one compilation: the full forward, the prefill and the steps
        full_BxLxV = model.apply({"params": params}, tokens_BxL)
        cache = init_cache(model, 2, 12)
        prefill_BxV, cache = decode.extend(model, params, cache, tokens_BxL[:, :p], jnp.arange(p)[None].repeat(2, 0))
        return full_BxLxV, prefill_BxV, teacher_forced_steps(model, params, cache, tokens_BxL, p)

    full_BxLxV, prefill_BxV, steps_LxBxV = run(params, tokens_BxL)
    np.testing.assert_allclose(prefill_BxV, full_BxLxV[:, p - 1], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(steps_LxBxV, full_BxLxV[:, p:].transpose(1, 0, 2), atol=2e-5, rtol=1e-5)


def test_bfloat16_grouped_query_decoding_follows_the_full_forward_pass():
    """Decoding's cache layout in bfloat16 with grouped-query heads (its products take bfloat16 q and cache on
    XLA:CPU, no float32 copy of the cache): the steps' logits are the full forward pass's within bfloat16 rounding,
    and far from those of another prefix (so a cache read at the wrong slot or head would fail)."""
    model, params = decode.for_decoding(*lm("rope", dtype="bfloat16"), 2)
    tokens_BxL, p = random_ids(0, (2, 12)), 5
    other_BxL = tokens_BxL.copy()
    other_BxL[:, 1:p] = random_ids(1, (2, p - 1))

    @jax.jit
    def run(params, tokens_BxL):
        cache = init_cache(model, 2, 12)
        _, cache = decode.extend(model, params, cache, tokens_BxL[:, :p], jnp.arange(p)[None].repeat(2, 0))
        return teacher_forced_steps(model, params, cache, tokens_BxL, p)

    # the full pass on the decoding layout's parameters, traced under the kernels; jitted: op by op, each primitive
    # would compile alone
    with decode.kernels.installed():
        full_BxLxV = jax.jit(lambda params: model.apply({"params": params}, tokens_BxL))(params)
    full_BxLxV = full_BxLxV[:, p:].transpose(1, 0, 2)
    steps_LxBxV, other_LxBxV = run(params, tokens_BxL), run(params, other_BxL)
    scale = float(jnp.abs(full_BxLxV).max())
    assert float(jnp.abs(steps_LxBxV - full_BxLxV).max()) < 0.03 * scale
    assert float(jnp.abs(other_LxBxV - full_BxLxV).max()) > 0.1 * scale


@pytest.mark.gpu
@pytest.mark.parametrize("positional", POSITIONAL_KINDS)
def test_seq2seq_cached_steps_equal_full_forward(positional):
    model, params = seq2seq(positional)
    src_BxS, tgt_BxT = random_ids(2, (2, 7)), random_ids(3, (2, 6))
    src_seg_BxS = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)  # row 1: a padded source

    @jax.jit
    def run(params, src_BxS, tgt_BxT):
        full_BxTxV = model.apply({"params": params}, src_BxS, tgt_BxT, src_segment_ids=src_seg_BxS)
        context = family_of(model).encode(model, params, (src_BxS, src_seg_BxS.sum(1)))
        cache = init_cache(model, 2, 6, 7)
        prefill_BxV, cache = decode.extend(
            model, params, cache, tgt_BxT[:, :1], jnp.zeros((2, 1), jnp.int32), context=context, prefill=True
        )
        # the steps reuse the cross-attention keys/values cached by the prefill
        return full_BxTxV, prefill_BxV, teacher_forced_steps(model, params, cache, tgt_BxT, 1, context)

    full_BxTxV, prefill_BxV, steps_TxBxV = run(params, src_BxS, tgt_BxT)
    np.testing.assert_allclose(prefill_BxV, full_BxTxV[:, 0], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(steps_TxBxV, full_BxTxV[:, 1:].transpose(1, 0, 2), atol=2e-5, rtol=1e-5)


def test_100_decode_steps_run_in_one_compiled_call_whatever_the_prompt():
    """generate_ids: 100 steps inside one compiled loop (a cache of the whole capacity: one loop body), compiled once
    for two prompts of one shape."""
    model, params = decode.for_decoding(*lm("alibi", max_len=128))
    s = decode.Strategy(max_new_tokens=100)
    run = lambda seed: decode.generate_ids(
        model, params, s, PAD, random_ids(seed, (1, 4)), jnp.full((1,), 4), None, jax.random.key(0), first_bucket=128
    )
    before = decode.generate_ids._cache_size()
    (first_1xT, _, steps), (second_1xT, _, _) = run(4), run(5)
    assert decode.generate_ids._cache_size() == before + 1
    assert int(steps) == 100 and first_1xT.shape == second_1xT.shape == (1, 100)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_gather_rows_reorders_every_per_row_cache_leaf(scan_layers):
    cfg = tiny(scan_layers=scan_layers)
    cache = init_cache(EncoderDecoder(cfg), 3, 6, 5)  # 3 rows, gathered into 4

    def per_row(name, rows):
        """The row held by each slot of a leaf, broadcastable to it: positions [.., B, S] hold row b on axis -2;
        keys [.., B*KV, K, S] and values [.., B*KV, S, K] (decode.kernels.cache_layout) on axis -3, the KV heads of
        row b side by side."""
        return rows[:, None] if name == "cached_pos" else np.repeat(rows, cfg.kv_heads)[:, None, None]

    def mark(path, leaf):  # every per-row leaf holds its row number
        name = path[-1].key
        return leaf if name == "cache_index" else jnp.broadcast_to(per_row(name, np.arange(3)), leaf.shape)

    rows = np.array([2, 2, 0, 1])
    marked = jax.tree_util.tree_map_with_path(mark, cache)
    gathered = jax.jit(decode.gather_rows)(marked, jnp.asarray(rows))  # op by op, each leaf's ops compiled alone
    for path, leaf in jax.tree_util.tree_leaves_with_path(gathered):
        if path[-1].key != "cache_index":
            expected = np.broadcast_to(per_row(path[-1].key, rows), leaf.shape)
            np.testing.assert_array_equal(leaf, expected, err_msg=str(path))


# ---------------------------------------------------------------- batches, padding, reference implementations

LM_PROMPTS = ((5, 7), (3, 4, 8, 9, 6, 10), (11,))  # of different lengths: left-padded in one batch
SOURCES = tuple(tuple(random_ids(s, 3 + s % 3).tolist()) for s in range(8))


@functools.cache
def lm_greedy():
    model, params = lm("rope")
    return decode.generate(model, params, LM_PROMPTS, max_new_tokens=10, eos_id=EOS)


@functools.cache
def seq2seq_greedy():
    model, params = seq2seq("rope")
    return decode.generate(model, params, SOURCES, bos_id=BOS, pad_id=PAD, max_new_tokens=8, eos_id=EOS)


def greedy_by_recomputing(apply_fn, prefix, n, total):
    """Greedy reference without a cache: each step runs the full model on the whole sequence so far (padded to a
    fixed length `total`; causal attention makes the padding irrelevant) and takes the argmax at the last token."""
    seq_1xT = np.zeros((1, total), np.int32)
    seq_1xT[0, : len(prefix)] = prefix
    for t in range(len(prefix), len(prefix) + n):
        token = int(jnp.argmax(apply_fn(seq_1xT)[0, t - 1]))
        seq_1xT[0, t] = token
        if token == EOS:
            return seq_1xT[0, len(prefix) : t].tolist()
    return seq_1xT[0, len(prefix) : len(prefix) + n].tolist()


def test_left_padded_batch_rows_equal_generating_alone():
    model, params = lm("rope")
    batch = lm_greedy()
    assert len({len(ids) for ids in batch.ids}) > 1 or not all(batch.stopped)  # rows that differ in what they do
    for i in (0, 2):
        alone = decode.generate(model, params, [LM_PROMPTS[i]], max_new_tokens=10, eos_id=EOS)
        assert batch.ids[i] == alone.ids[0]
        np.testing.assert_allclose(batch.scores[i], alone.scores[0], rtol=1e-4)


@pytest.mark.gpu
def test_lm_greedy_with_cache_equals_recomputing_the_prefix():
    model, params = lm("rope")
    forward = jax.jit(lambda x: model.apply({"params": params}, x))
    for prompt, ids in zip(LM_PROMPTS, lm_greedy().ids):
        assert ids == greedy_by_recomputing(forward, prompt, 10, 16)


@pytest.mark.gpu
def test_seq2seq_greedy_with_cache_equals_recomputing_the_prefix():
    model, params = seq2seq("rope")
    forward = jax.jit(lambda src, src_seg, tgt: model.apply({"params": params}, src, tgt, src_segment_ids=src_seg))
    src_BxS, lengths_B = decode.pad_batch(SOURCES, PAD)
    src_seg_BxS = (np.arange(src_BxS.shape[1]) < lengths_B[:, None]).astype(np.int32)
    for src_S, seg_S, ids in zip(src_BxS, src_seg_BxS, seq2seq_greedy().ids):
        assert ids == greedy_by_recomputing(functools.partial(forward, src_S[None], seg_S[None]), [BOS], 8, 9)


def test_stop_token_ends_rows_and_exits_early():
    model, params = lm("rope")
    first = lm_greedy().ids[0][0]
    out = decode.generate(model, params, LM_PROMPTS[:1], max_new_tokens=10, eos_id=first)
    assert out.ids == [[]] and out.stopped == [True] and out.steps == 1


# ---------------------------------------------------------------- strategies


def test_greedy_tokens_are_numpy_argmax_first_index_on_ties():
    logits_CxV = np.random.default_rng(0).normal(size=(6, 50)).astype(np.float32)
    logits_CxV[1, [3, 40]] = logits_CxV[1].max() + 1  # a tie for first place: the first index wins
    logits_CxV[2] = NEG_INF  # all equal
    logits_CxV[3, -1] = 9.0  # the last index
    strategy = decode.Strategy(max_new_tokens=1, method="greedy")
    tokens_C = decode.choose_tokens(strategy, jnp.asarray(logits_CxV), jax.random.key(0))
    assert tokens_C.dtype == jnp.int32
    assert np.asarray(tokens_C).tolist() == np.argmax(logits_CxV, axis=-1).tolist()
    assert np.asarray(tokens_C)[[1, 2, 3]].tolist() == [3, 0, 49]


def test_top_k_filter_keeps_k_largest():
    logits = jnp.log(jnp.array([[0.1, 0.4, 0.2, 0.3]]))
    kept = decode.top_k_filter(logits, 2) > NEG_INF
    assert kept.tolist() == [[False, True, False, True]]
    np.testing.assert_array_equal(decode.top_k_filter(logits, 1_000_000), logits)  # beyond the vocabulary: all kept


@pytest.mark.parametrize(
    "p, expected", [(0.3, {2}), (0.65, {2, 4}), (0.8, {2, 4, 0}), (0.99, {0, 1, 2, 3, 4}), (1.0, {0, 1, 2, 3, 4})]
)
def test_top_p_keeps_smallest_set_reaching_p(p, expected):
    probs = jnp.array([[0.15, 0.05, 0.5, 0.1, 0.2]])  # sorted: 0.5 (id 2), 0.2 (4), 0.15 (0), 0.1 (3), 0.05 (1)
    kept = decode.top_p_filter(jnp.log(probs), p) > NEG_INF
    assert set(np.flatnonzero(kept[0]).tolist()) == expected


def test_top_p_sampling_stays_in_the_nucleus():
    logits_CxV = jnp.log(jnp.tile(jnp.array([[0.15, 0.05, 0.5, 0.1, 0.2]]), (400, 1)))
    strategy = decode.Strategy(max_new_tokens=1, method="sample", temperature=1.0, top_p=0.6)
    tokens = decode.choose_tokens(strategy, logits_CxV, jax.random.key(0))
    assert set(np.asarray(tokens).tolist()) == {2, 4}


def test_top_k_one_equals_greedy():
    model, params = lm("rope")
    top1 = decode.generate(model, params, LM_PROMPTS, max_new_tokens=10, eos_id=EOS, method="sample", top_k=1, seed=3)
    assert top1.ids == lm_greedy().ids


def test_sampling_same_seed_same_text():
    model, params = lm("rope")
    sample = functools.partial(
        decode.generate,
        model,
        params,
        LM_PROMPTS[:1],
        max_new_tokens=12,
        method="sample",
        temperature=1.5,
        top_p=0.95,
        num_samples=3,
    )
    a, b, c = sample(seed=0), sample(seed=0), sample(seed=1)
    assert a.ids == b.ids and len(a.ids) == 3
    assert a.ids != c.ids and len({tuple(ids) for ids in a.ids}) > 1


# ---------------------------------------------------------------- the cache grows through bucketed lengths


def test_bucket_lengths_double_from_the_first_that_holds_the_prefill_up_to_the_capacity():
    assert decode.bucket_lengths(1, 256) == (64, 128, 256)
    assert decode.bucket_lengths(100, 300) == (128, 256, 300)
    assert decode.bucket_lengths(5, 40) == (40,)
    assert decode.bucket_lengths(64, 64) == (64,)


@pytest.mark.parametrize("family, strategy", [("lm", {}), ("seq2seq", {"method": "beam", "beam_size": 3})])
def test_a_growing_cache_generates_what_a_cache_of_the_whole_capacity_does(family, strategy):
    """16 new tokens from a cache that starts at 4 slots (8 for the LM's 6-token prompt) and grows through the
    doubling lengths to the capacity (LM: 8 -> 16 -> 21; seq2seq: 4 -> 8 -> 16), against one cache of the whole
    capacity: the grown slots must be empty (position -1), never attended to."""
    model, params = decode.for_decoding(*(lm if family == "lm" else seq2seq)("rope"))
    prompts, sources = family_of(model).prompts(LM_PROMPTS if family == "lm" else SOURCES, BOS)
    prompt_BxP, lengths_B = decode.pad_batch(prompts, PAD, left=True)
    source = None if sources is None else decode.pad_batch(sources, PAD)
    s = decode.Strategy(max_new_tokens=16, **strategy)
    run = lambda first: decode.generate_ids(
        model, params, s, PAD, prompt_BxP, lengths_B, source, jax.random.key(0), first_bucket=first
    )
    (grown_CxT, grown_C, _), (whole_CxT, whole_C, _) = run(4), run(1024)
    np.testing.assert_array_equal(grown_CxT, whole_CxT)
    np.testing.assert_allclose(grown_C, whole_C, rtol=1e-5)


# ---------------------------------------------------------------- beam search


def test_beam_size_one_equals_greedy():
    """One beam with length penalty 0 (with alpha > 0 a longer hypothesis may outscore the first EOS): greedy."""
    model, params = seq2seq("rope")
    beam = decode.generate(
        model, params, SOURCES, bos_id=BOS, pad_id=PAD, max_new_tokens=8, eos_id=EOS, method="beam", beam_size=1,
        length_penalty=0.0,
    )  # fmt: skip
    assert beam.ids == seq2seq_greedy().ids


def test_lm_beam_size_one_equals_greedy():
    model, params = lm("rope")
    one_beam = dict(method="beam", beam_size=1, length_penalty=0.0)  # as test_beam_size_one_equals_greedy
    beam = decode.generate(model, params, LM_PROMPTS, max_new_tokens=10, eos_id=EOS, **one_beam)
    assert beam.ids == lm_greedy().ids


ALPHA = 0.6  # the length penalty of the beam tests


@functools.cache
def seq2seq_beam():
    model, params = seq2seq("rope")
    return decode.generate(
        model, params, SOURCES, bos_id=BOS, pad_id=PAD, max_new_tokens=8, eos_id=EOS, method="beam",
        beam_size=4, length_penalty=ALPHA,
    )  # fmt: skip


def test_beam_search_scores_at_least_greedy():
    alpha = ALPHA
    greedy, beam = seq2seq_greedy(), seq2seq_beam()
    for logp, ids, stopped, beam_score in zip(greedy.scores, greedy.ids, greedy.stopped, beam.scores):
        greedy_score = logp / decode.length_penalty(len(ids) + stopped, alpha)  # EOS counts in the length
        assert beam_score >= greedy_score - 1e-5
    assert any(b > g for b, g in zip(beam.scores, greedy.scores))  # and beam search does find better ones


def test_beam_scores_equal_the_full_forward_pass_of_their_hypotheses():
    """Each source's best hypothesis, re-scored without a cache by the full model on that source alone: its
    log-prob / lp equals the beam's score (the cache reordered by parent beam, each row's cross K/V its own)."""
    alpha = ALPHA
    model, params = seq2seq("rope")
    forward = jax.jit(lambda src, tgt: model.apply({"params": params}, src, tgt))
    beam = seq2seq_beam()
    for src, ids, stopped, score in zip(SOURCES, beam.ids, beam.stopped, beam.scores):
        targets = ids + [EOS] * stopped
        logp_TxV = jax.nn.log_softmax(forward(np.array([src]), np.array([[BOS] + targets[:-1]]))[0])
        logp = float(sum(logp_TxV[t, token] for t, token in enumerate(targets)))
        np.testing.assert_allclose(score, logp / decode.length_penalty(len(targets), alpha), rtol=1e-4, atol=1e-4)
