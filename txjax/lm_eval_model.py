"""txjax as an EleutherAI lm-evaluation-harness model (`lm-eval` 0.4, the lmeval extra), registered as "txjax":

    import txjax.lm_eval_model, lm_eval
    lm_eval.simple_evaluate(model="txjax", model_args="workdir=runs/smollm2", tasks=["hellaswag"])

`run.py lm-eval` (txjax.cli.lm_eval) runs it; `python -m txjax.lm_eval_model --model txjax --model_args workdir=W
--tasks ...` is the harness's own CLI with the model registered.

Tokenization is the harness's TemplateLM's, as its `hf` model does: the context/continuation split at the token
boundary of the encoded whole, an empty context replaced by the prefix token (BOS, else EOS); `tok_encode` puts the
tokenizer's prefix (BOS when the model expects one, as `run.py eval --text` and `generate`) first.

loglikelihood: each request is the `hf` model's window, the last max_length + 1 tokens of context + continuation
without the last, right-padded to the shortest bucket length (powers of two from 16, capped at max_length) that
holds it; requests sorted by length, `rows` per batch (a fixed shape per bucket, the last batch filled with
weight-0 rows), so a task compiles one program per bucket it uses. The continuation's tokens give

    logprob = sum_t (z_t[y_t] - logsumexp(z_t)),   is_greedy = all_t z_t[y_t] = max_v z_t[v]

loglikelihood_rolling (perplexity tasks): the windows of `run.py eval --text` (txjax.score_text): the text after the
tokenizer's prefix in non-overlapping windows of max_length tokens, every token after the prefix predicted once,
each window scored as a request above (its first token the context). A tokenizer without a prefix (no BOS) gets the
harness's prefix token instead, so that the text's first token is scored as by the `hf` model, whose windows
differ only in the last one of a text longer than the context (it sees a full context).

generate_until: txjax.decode.decode_all over the requests of one set of generation kwargs (greedy, or sampling at
the request's temperature), max_gen_toks new tokens, stopped at EOS, the text cut at the first stop string.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from txjax.config import ConfigError
from txjax.extras import require

require("lm_eval", "the lm-evaluation-harness model (run.py lm-eval)")
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs  # noqa: E402
from tqdm import tqdm  # noqa: E402

from txjax.decode import decode_all  # noqa: E402
from txjax.families import family_of  # noqa: E402
from txjax.objective import hits  # noqa: E402

AUTO_TOKENS = 2048  # batch_size=auto: rows * bucket length about this many tokens
MAX_GEN_TOKS = 256  # as the hf model's default


def bucket_length(n: int, max_length: int, first: int = 16) -> int:
    """The shortest of first, 2 first, 4 first, ... (capped at max_length) that holds n tokens."""
    length = first
    while length < n:
        length *= 2
    return min(length, max_length)


def make_score(model):
    """jit(params, tokens [B, L], targets [B, L], weights [B, L]) -> (sum of weighted target log-probs [B],
    every weighted target the argmax [B])."""

    def score(params, tokens_BxL, targets_BxL, weights_BxL):
        logits_BxLxV = model.apply({"params": params}, tokens_BxL).astype(jnp.float32)
        target_BxL = jnp.take_along_axis(logits_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
        logprob_BxL = target_BxL - jax.nn.logsumexp(logits_BxLxV, axis=-1)
        greedy_B = (hits(logits_BxLxV, targets_BxL) | (weights_BxL == 0)).all(-1)
        return (logprob_BxL * weights_BxL).sum(-1), greedy_B

    return jax.jit(score)


def token_windows(ids: list[int], length: int) -> list[tuple[list[int], list[int]]]:
    """`run.py eval --text`'s windows as (context, continuation) requests: non-overlapping windows of `length`
    inputs, every token of `ids` but the first predicted once."""
    return [(ids[start : start + 1], ids[start + 1 : start + length + 1]) for start in range(0, len(ids) - 1, length)]


@register_model("txjax")
class TxjaxLM(TemplateLM):
    """A txjax language model (a workdir of `run.py train` or `run.py import`) for the harness.

    model_args: workdir=DIR, or run= a loaded txjax.experiment.TrainedRun; batch_size=N rows per batch or
    "auto" (about AUTO_TOKENS tokens per batch); max_length: the context (default the model's max_len)."""

    def __init__(self, workdir=None, run=None, batch_size=1, max_length=None, max_batch_size=None, device=None):
        super().__init__()
        if run is None:
            if workdir is None:
                raise ConfigError("the txjax model needs model_args workdir=DIR (a run.py train or import workdir)")
            from txjax.experiment import load_workdir

            run = load_workdir(Path(workdir))
        if not family_of(run.model).continues_input:
            raise ConfigError(f"{workdir or 'the run'} is an encoder-decoder: lm-eval scores decoder-only LMs")
        self.run, self.model, self.params, self.tokenizer = run, run.model, run.params, run.tokenizer
        self.workdir = str(workdir or "")
        self.max_length = min(int(max_length or run.model.cfg.max_len), run.model.cfg.max_len)
        auto = str(batch_size).startswith("auto")
        self.rows = None if auto else int(batch_size)
        self.max_rows = int(max_batch_size or 64)
        self._score = make_score(run.model)
        self.stats = {"requests": 0, "tokens": 0, "seconds": 0.0, "programs": 0}

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_id
        return self.tokenizer.eos_id if bos is None else bos

    @property
    def tokenizer_name(self) -> str:
        return self.workdir

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        prefix = self.tokenizer.prefix() if add_special_tokens is not False else []
        return prefix + self.tokenizer.encode(string)

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.render_chat(chat_history, add_generation_prompt)

    def rows_for(self, length: int) -> int:
        return self.rows or max(1, min(self.max_rows, AUTO_TOKENS // length))

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """requests: ((context, continuation), context ids, continuation ids) -> (log-prob, is_greedy) each."""
        windows = []
        for _, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1) :]
            windows.append((whole[:-1], whole[1:], min(len(continuation), len(whole) - 1)))
        order = sorted(range(len(windows)), key=lambda i: -len(windows[i][0]))
        batches, start = [], 0
        while start < len(order):
            length = bucket_length(len(windows[order[start]][0]), self.max_length)
            rows = self.rows_for(length)
            batches.append((length, order[start : start + rows]))
            start += rows
        out = [None] * len(windows)
        began, shapes = time.perf_counter(), set()
        with tqdm(total=len(windows), desc="txjax loglikelihood", disable=disable_tqdm) as bar:
            pending = [(b, self._dispatch(windows, b)) for b in batches]
            for (length, rows), (logprob_B, greedy_B) in pending:
                shapes.add((length, len(logprob_B)))
                logprob_B, greedy_B = np.asarray(logprob_B), np.asarray(greedy_B)
                for j, i in enumerate(rows):
                    out[i] = (float(logprob_B[j]), bool(greedy_B[j]))
                bar.update(len(rows))
        self.stats["requests"] += len(windows)
        self.stats["tokens"] += sum(len(w[0]) for w in windows)
        self.stats["seconds"] += time.perf_counter() - began
        self.stats["programs"] = max(self.stats["programs"], len(shapes))
        for (pair, _, _), result in zip(requests, out):
            if pair is not None:
                self.cache_hook.add_partial("loglikelihood", pair, result)
        return out

    def _dispatch(self, windows, batch):
        """Start the scoring of one batch (bucket length, request indices): a fixed [rows, length] shape."""
        length, rows = batch
        shape = (self.rows_for(length), length)
        tokens, targets, weights = np.zeros(shape, np.int32), np.zeros(shape, np.int32), np.zeros(shape, np.float32)
        for j, i in enumerate(rows):
            inputs, outputs, scored = windows[i]
            tokens[j, : len(inputs)], targets[j, : len(outputs)] = inputs, outputs
            weights[j, len(inputs) - scored : len(inputs)] = 1.0
        return self._score(self.params, tokens, targets, weights)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        owners, windows = [], []
        for k, (string,) in enumerate(req.args for req in requests):
            ids = self.tokenizer.prefix() or [self.prefix_token_id]  # the harness's: the first token predicted
            for context, continuation in token_windows(ids + self.tokenizer.encode(string), self.max_length):
                owners.append(k)
                windows.append((None, context, continuation))
        totals = [0.0] * len(requests)
        for k, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm)):
            totals[k] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups = {}  # one decode_all per set of generation kwargs
        for i, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
        out = [None] * len(requests)
        with tqdm(total=len(requests), desc="txjax generate_until", disable=disable_tqdm) as bar:
            for indices in groups.values():
                kwargs = normalize_gen_kwargs(requests[indices[0]].args[1], MAX_GEN_TOKS)
                until = handle_stop_sequences(kwargs.pop("until", None), eos=None)  # EOS ends the ids
                new = min(int(kwargs["max_gen_toks"]), self.max_length - 1)
                prompts = [self.tok_encode(requests[i].args[0])[-(self.max_length - new + 1) :] for i in indices]
                sample = kwargs.get("do_sample") and kwargs.get("temperature", 0) > 0
                strategy = dict(method="sample", temperature=float(kwargs["temperature"])) if sample else {}
                generation = decode_all(
                    self.model,
                    self.params,
                    prompts,
                    batch_size=self.rows_for(max(map(len, prompts)) + new),
                    pad_id=self.tokenizer.pad_id,
                    max_new_tokens=new,
                    eos_id=self.tokenizer.eos_id,
                    **strategy,
                )
                for i, ids in zip(indices, generation.ids):
                    text = self.tokenizer.decode(ids)
                    for stop in until:
                        text = text.split(stop)[0]
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(indices))
        return out

    def speed(self) -> dict:
        """Scoring throughput so far: requests/s and tokens/s (the non-padding inputs) over the jitted batches,
        compilation included, and the number of [rows, length] programs compiled."""
        seconds = max(self.stats["seconds"], 1e-9)
        return {
            **self.stats,
            "requests_per_second": self.stats["requests"] / seconds,
            "tokens_per_second": self.stats["tokens"] / seconds,
        }


if __name__ == "__main__":  # the harness's CLI, with "txjax" registered
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
