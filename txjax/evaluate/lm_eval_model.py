"""txjax as an EleutherAI lm-evaluation-harness model (`lm-eval` 0.4, the lmeval extra), registered as "txjax":

    import txjax.evaluate.lm_eval_model, lm_eval
    lm_eval.simple_evaluate(model="txjax", model_args="workdir=runs/smollm2", tasks=["hellaswag"])

`run.py lm-eval` (txjax.cli.lm_eval) runs it; `python -m txjax.evaluate.lm_eval_model --model txjax
--model_args workdir=W --tasks ...` is the harness's own CLI with the model registered.

Tokenization is the harness's TemplateLM's, as its `hf` model does: the context/continuation split at the token
boundary of the encoded whole, an empty context replaced by the prefix token (BOS, else EOS); `tok_encode` puts the
tokenizer's prefix (BOS when the model expects one, as `run.py eval --text` and `generate`) first.

loglikelihood: each request is the `hf` model's window, the last max_length + 1 tokens of context + continuation
without the last. Requests sorted by length are packed into rows of PACK tokens, one segment each (its own
positions from 0, attending only within itself: no padding between them); a longer request starts a row of the
shortest bucket length (powers of two from 16, capped at max_length) that holds it, shorter ones filling it up.
Rows of one length go in batches of a fixed number of rows (the last: those left), so a task
compiles a handful of programs, not one per length. The continuation's tokens give

    logprob = sum_t (z_t[y_t] - logsumexp(z_t)),   is_greedy = all_t z_t[y_t] = max_v z_t[v]

loglikelihood_rolling (perplexity tasks): the windows of `run.py eval --text` (txjax.evaluate.score_text): the text
after the tokenizer's prefix in non-overlapping windows of max_length tokens, every token after the prefix predicted
once, each window scored as a request above (its first token the context). A tokenizer without a prefix (no BOS) gets
the harness's prefix token instead, so that the text's first token is scored as by the `hf` model, whose windows differ
only in the last one of a text longer than the context (it sees a full context).

generate_until: txjax.decode.decode_all over the requests of one set of generation kwargs (greedy, or sampling at
the request's temperature), max_gen_toks new tokens, stopped at EOS, the text cut at the first stop string.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from txjax.errors import ConfigError
from txjax.extras import require

require("lm_eval", "the lm-evaluation-harness model (run.py lm-eval)")
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs  # noqa: E402
from tqdm import tqdm  # noqa: E402

from txjax.decode import decode_all  # noqa: E402
from txjax.families import family_of  # noqa: E402
from txjax.families.objective import hits  # noqa: E402
from txjax.model.masks import segment_mask  # noqa: E402

AUTO_TOKENS = 2048  # batch_size=auto: rows * row length about this many tokens
PACK = 256  # tokens per row that short requests share (one segment each)
MAX_GEN_TOKS = 256  # as the hf model's default


def bucket_length(n: int, max_length: int, first: int = 16) -> int:
    """The shortest of first, 2 first, 4 first, ... (capped at max_length) that holds n tokens."""
    length = first
    while length < n:
        length *= 2
    return min(length, max_length)


def pack(lengths: list[int], max_length: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """Rows (row length, [(request, offset), ...]) holding every request once, longest first: a request goes into
    the last row if it fits there (next fit), else starts a row of PACK tokens, or of its bucket length if longer."""
    rows, used = [], 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        if rows and rows[-1][0] - used >= n:
            rows[-1][1].append((i, used))
            used += n
        else:
            rows.append((bucket_length(max(n, min(PACK, max_length)), max_length), [(i, 0)]))
            used = n
    return rows


def trees(windows: list, max_length: int) -> list[tuple[list[int], list[int]]]:
    """Requests that share their inputs up to their first scored position (the choices of one question) as trees
    (prefix, [request, ...]): the prefix once, then each request's other scored inputs (its continuation but the
    last token) as a branch that attends to the prefix and itself; a tree holds at most max_length tokens."""
    groups = {}
    for i, (inputs, _, count) in enumerate(windows):
        groups.setdefault(tuple(inputs[: len(inputs) - count + 1]), []).append(i)
    out = []
    for prefix, members in groups.items():
        used = max_length + 1
        for i in members:
            branch = max(windows[i][2] - 1, 0)
            if used + branch > max_length:
                out.append((list(prefix), []))
                used = len(prefix)
            out[-1][1].append(i)
            used += branch
    return out


def make_score(model):
    """jit(params, tokens, positions, segment ids, branch ids [B, L], scored positions, targets, weights [B, C]) ->
    (the log-prob of each weighted target, 0 elsewhere [B, C]; whether each target is the argmax [B, C]). A token
    attends within its segment (a tree) to the prefix (branch 0) and its own branch, in the order of the positions;
    the LM head runs on the C scored positions only (the family's scored_logits)."""
    family = family_of(model)

    def score(params, tokens_BxL, positions_BxL, segments_BxL, branches_BxL, scored_BxC, targets_BxC, weights_BxC):
        branch_q, branch_k = branches_BxL[:, None, :, None], branches_BxL[:, None, None, :]
        mask_Bx1xLxL = segment_mask(segments_BxL, segments_BxL) & ((branch_k == 0) | (branch_k == branch_q))
        logits_BxCxV = family.scored_logits(model, params, tokens_BxL, positions_BxL, mask_Bx1xLxL, scored_BxC)
        logits_BxCxV = logits_BxCxV.astype(jnp.float32)
        target_BxC = jnp.take_along_axis(logits_BxCxV, targets_BxC[..., None], axis=-1)[..., 0]
        logprob_BxC = target_BxC - jax.nn.logsumexp(logits_BxCxV, axis=-1)
        return jnp.where(weights_BxC > 0, logprob_BxC, 0.0), hits(logits_BxCxV, targets_BxC)

    return jax.jit(score)


def token_windows(ids: list[int], length: int) -> list[tuple[list[int], list[int]]]:
    """`run.py eval --text`'s windows as (context, continuation) requests: non-overlapping windows of `length`
    inputs, every token of `ids` but the first predicted once."""
    return [(ids[start : start + 1], ids[start + 1 : start + length + 1]) for start in range(0, len(ids) - 1, length)]


@register_model("txjax")
class TxjaxLM(TemplateLM):
    """A txjax language model (a workdir of `run.py train` or `run.py import`) for the harness.

    model_args: workdir=DIR, or run= a loaded txjax.experiment.TrainedRun; batch_size=N rows (of PACK tokens of
    packed requests, or one longer request) per batch, or "auto" (about AUTO_TOKENS tokens per batch); max_length:
    the context (default the model's max_len)."""

    def __init__(self, workdir=None, run=None, batch_size=1, max_length=None, max_batch_size=None, device=None):
        super().__init__()
        if run is None:
            if workdir is None:
                raise ConfigError("the txjax model needs model_args workdir=DIR (a run.py train or import workdir)")
            from txjax.experiment import load_workdir

            run = load_workdir(Path(workdir))
        family_of(run.model).check_scores_text(workdir or "the run", "lm-eval")
        if "L" in run.model.cfg.layer_types:  # a linear layer reads runs of segments, not make_score's tree mask
            raise ConfigError(
                f"{workdir or 'the run'}: lm-eval scores requests that share a prefix under one tree mask, which "
                "model.layer_types' linear (Gated DeltaNet) layers cannot read: score its text with run.py eval --text"
            )
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

    def batches(self, rows: list) -> list[tuple[int, list]]:
        """Packed rows (of non-increasing length) in batches (rows in the batch, row length, its rows): rows_for
        rows of one length, the last batch of a length what is left (one more program, no empty rows)."""
        out, start = [], 0
        while start < len(rows):
            length = rows[start][0]
            same = sum(1 for row in rows[start:] if row[0] == length)
            take = min(self.rows_for(length), same)
            out.append((take, length, rows[start : start + take]))
            start += take
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """requests: ((context, continuation), context ids, continuation ids) -> (log-prob, is_greedy) each."""
        windows = []
        for _, context, continuation in requests:
            whole = (context + continuation)[-(self.max_length + 1) :]
            windows.append((whole[:-1], whole[1:], min(len(continuation), len(whole) - 1)))
        forest = trees(windows, self.max_length)
        sizes = [len(prefix) + sum(max(windows[i][2] - 1, 0) for i in members) for prefix, members in forest]
        batches = self.batches(pack(sizes, self.max_length))
        out, shapes = [None] * len(windows), set()
        began = time.perf_counter()
        with tqdm(total=len(windows), desc="txjax loglikelihood", disable=disable_tqdm) as bar:
            pending = [self._dispatch(windows, forest, *batch) for batch in batches]  # all dispatched, then read
            for where, shape, arrays in pending:
                logprob_BxC, hit_BxC = np.asarray(arrays[0], np.float64), np.asarray(arrays[1])
                for i, (r, start, count) in where.items():
                    scored = slice(start, start + count)
                    out[i] = (float(logprob_BxC[r, scored].sum()), bool(hit_BxC[r, scored].all()))
                shapes.add(shape)
                bar.update(len(where))
        self.stats["requests"] += len(windows)
        self.stats["tokens"] += sum(len(w[0]) for w in windows)
        self.stats["seconds"] += time.perf_counter() - began
        self.stats["programs"] = max(self.stats["programs"], len(shapes))
        for (pair, _, _), result in zip(requests, out):
            if pair is not None:
                self.cache_hook.add_partial("loglikelihood", pair, result)
        return out

    def _dispatch(self, windows, forest, shape_rows: int, length: int, rows: list):
        """Start the scoring of one batch: its packed rows of trees in [shape_rows, length] arrays, the positions
        each request scores in [shape_rows, C] (C: the bucket length of the most in a row). Returns {request: (row,
        first scored entry, count)}, the program's shape and the (not yet computed) results."""
        tokens, positions, segments, branches = (np.zeros((shape_rows, length), np.int32) for _ in range(4))
        scored, where = [[] for _ in range(shape_rows)], {}
        for r, (_, members) in enumerate(rows):
            for k, (t, offset) in enumerate(members):
                prefix, requests = forest[t]
                end = offset + len(prefix)
                tokens[r, offset:end], positions[r, offset:end] = prefix, np.arange(len(prefix))
                segments[r, offset:end] = k + 1
                for b, i in enumerate(requests, 1):
                    inputs, _, count = windows[i]
                    rest = inputs[len(inputs) - count + 1 :] if count else []
                    span = slice(end, end + len(rest))
                    tokens[r, span], positions[r, span] = rest, np.arange(len(prefix), len(prefix) + len(rest))
                    segments[r, span], branches[r, span] = k + 1, b
                    where[i] = (r, len(scored[r]), count)
                    scored[r] += ([offset + len(prefix) - 1] if count else []) + list(range(span.start, span.stop))
                    end = span.stop
        width = bucket_length(max(map(len, scored)), 1 << 30)  # shared inputs: may exceed the row length
        index, targets = (np.zeros((shape_rows, width), np.int32) for _ in range(2))
        weights = np.zeros((shape_rows, width), np.float32)
        for i, (r, start, count) in where.items():
            outputs = windows[i][1]
            index[r, start : start + count] = scored[r][start : start + count]
            targets[r, start : start + count] = outputs[len(outputs) - count :]
            weights[r, start : start + count] = 1.0
        arrays = self._score(self.params, tokens, positions, segments, branches, index, targets, weights)
        return where, (shape_rows, length, width), arrays

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


def main(argv: list[str]) -> int:
    """The harness's CLI (its flags, `argv`), with "txjax" registered; the --tasks' datasets are read first, as
    `run.py lm-eval` reads them, so that one that cannot be read (a hub task offline) is its one line and status 2."""
    from lm_eval.__main__ import cli_evaluate

    from txjax.evaluate.lm_eval_tasks import load_tasks, task_manager

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--tasks", "-t")
    parser.add_argument("--include_path")
    given, _ = parser.parse_known_args(argv)
    names = [name for name in (given.tasks or "").split(",") if name and not name.startswith("list")]
    try:
        load_tasks(task_manager(names, given.include_path), names)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.argv[1:] = argv
    cli_evaluate()
    return 0


if __name__ == "__main__":  # the harness's CLI, with "txjax" registered
    sys.exit(main(sys.argv[1:]))
