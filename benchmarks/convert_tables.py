"""The generated table of the checkpoint families (benchmarks/readme_tables.py registers it): what each converter
reads and writes and what txjax needs for it (written here), its equality figures (benchmarks/convert_equality.py's
result file). A new family is one FAMILIES entry here and one in convert_equality.py."""

from __future__ import annotations

import numpy as np
from table_format import bench, machine_label, n, table

# result-file family -> (label: config.json model_type, GGUF architecture; in / out; what txjax needs for it)
FAMILIES = {
    "gpt2": (
        "GPT-2 (`gpt2`)",
        "import, export",
        "learned positions, pre-LN LayerNorm, GELU (tanh), biases, tied head",
    ),
    "llama": (
        "Llama 2 (`llama`; GGUF `llama`)",
        "import, export, GGUF in",
        "RoPE (Q/K columns permuted to pairs), RMSNorm, SwiGLU, grouped-query attention",
    ),
    "llama3": (
        "Llama 3.x (`llama`, rope_type `llama3`; GGUF `llama` with `rope_freqs`)",
        "import, export, GGUF in",
        "`rope_scaling=llama3` with its factor, frequency bands and original context (from a .gguf: recovered "
        "from llama.cpp's per-frequency factors); `linear` and `yarn` from config.json too",
    ),
    "mistral": ("Mistral, full context (`mistral`; GGUF `llama`)", "import, export, GGUF in", "as Llama, `d_head`"),
    "mistral_window": (
        "Mistral with its window (`mistral`; GGUF `llama.attention.sliding_window`)",
        "import, export, GGUF in",
        "`attention_window` in every layer (a ring-buffer KV cache of the window)",
    ),
    "qwen2": ("Qwen2 (`qwen2`; GGUF `qwen2`)", "import, export, GGUF in", "as Llama, q/k/v biases (`qkv_bias`)"),
    "qwen3": ("Qwen3 (`qwen3`; GGUF `qwen3`)", "import, export, GGUF in", "as Llama, per-head q/k RMSNorm (`qk_norm`)"),
    "qwen3_yarn": ("Qwen3 with YaRN (`qwen3`, rope_type `yarn`)", "import, export", "`rope_scaling=yarn`, `qk_norm`"),
    "smollm3": (
        "SmolLM3 (`smollm3`)",
        "import, export",
        "as Llama, `rope_layers` from `no_rope_layers` (R: RoPE, N: a NoPE layer)",
    ),
    "marian": (
        "MarianMT (`marian`: the opus-mt models)",
        "import, export",
        "`positional=sinusoidal_halves`, `embed_scale`, `share_embeddings`, `final_logits_bias`, post-LN, "
        "swish or GELU; targets start from pad",
    ),
    "bart": (
        "BART (`bart`)",
        "import, export",
        "learned positions (rows from offset 2), `embed_norm`, post-LN, GELU, `final_logits_bias`, the two position "
        "tables as unshared embeddings (export: the token tables must still be equal); targets start from EOS",
    ),
    "t5": (
        "T5 (`t5`)",
        "import, export",
        "`positional=relative_buckets`, RMSNorm, pre-LN, `attention_scale=none`, no biases, ReLU, a tied head with "
        "its d_model^-0.5 folded into the decoder's final norm; targets start from pad",
    ),
    "t5v1_1": (
        "T5 v1.1, mT5 (`t5`, `mt5`)",
        "import, export",
        "as T5 with `activation=geglu` (gated GELU), a head without the rescaling (tied or untied)",
    ),
    "gemma2": (
        "Gemma 2 (`gemma2`; GGUF `gemma2`)",
        "import, export, GGUF in",
        "`norm_placement=sandwich` (pre- and post-norms), `norm_offset` ((1 + w) RMSNorm), `embed_scale`, GeGLU "
        "(tanh), `attention_softcap`, `logit_softcap`, `attention_scale_dim` (query_pre_attn_scalar), "
        "`window_pattern` alternating local and global (from a .gguf: llama.cpp's rules for which layers are local "
        "and the score scale, the norm gains stored as 1 + w)",
    ),
    "gemma3_text": (
        "Gemma 3 text (`gemma3_text`; GGUF `gemma3`)",
        "import, export, GGUF in",
        "as Gemma 2 without the soft caps, per-head q/k RMSNorm, its 5:1 `window_pattern`, `rope_local_base` for "
        "local layers (a .gguf: llama.cpp's 10,000 unless `rope.freq_base_swa`) and the global layers' rope scaling",
    ),
    "mixtral": (
        "Mixtral (`mixtral`)",
        "import, export",
        "Mistral's attention; `num_experts`, `router=topk_then_softmax`, SwiGLU experts of `intermediate_size`",
    ),
    "qwen2_moe": (
        "Qwen2-MoE (`qwen2_moe`)",
        "import, export",
        "Qwen2's attention; `router=softmax_then_topk`, `moe_norm_topk`, `moe_d_ff`, the shared expert as "
        "`num_shared_experts` with `shared_expert_gate`, `moe_every` = `decoder_sparse_step`",
    ),
    "qwen3_moe": (
        "Qwen3-MoE (`qwen3_moe`)",
        "import, export",
        "Qwen3's attention (per-head q/k norms); Qwen2-MoE's routing fields, no shared expert",
    ),
    "olmoe": (
        "OLMoE (`olmoe`)",
        "import, export",
        "q/k RMSNorm over the whole projection (`qk_norm_all_heads`); `router=softmax_then_topk`, `moe_norm_topk`",
    ),
    "gpt_oss": (
        "GPT-OSS (`gpt_oss`, the bfloat16 folders transformers saves)",
        "import, export",
        "`attention_sinks`, `attention_bias` (q, k, v, o), `window_pattern` from `layer_types` with "
        "`attention_window`, YaRN with `rope_truncate=false`; `router=topk_then_softmax` with `moe_bias` (router "
        "and expert biases), `activation=swiglu_clamped` (alpha 1.702, limit 7, up + 1)",
    ),
    "deepseek_v3": (
        "DeepSeek-V3, dense (`deepseek_v3`, first_k_dense_replace = the layers)",
        "import, export",
        "`attention=mla` (`q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`; "
        "heads' channels reordered, rotate_half's RoPE channels permuted to pairs unless `rope_interleave`), "
        "`rope_scaling=yarn` with `rope_mscale_all_dim`, Llama's norms and SwiGLU",
    ),
    "deepseek_v3_moe": (
        "DeepSeek-V3 with MoE layers (`deepseek_v3`)",
        "import, export",
        "as dense, `router=sigmoid` with its bias (e_score_correction_bias), `moe_groups` / `moe_topk_groups` "
        "(n_group, topk_group), `moe_routed_scale`, `moe_norm_topk`, shared experts; dense layers first "
        "(`moe_dense_first` = first_k_dense_replace)",
    ),
    "llama4_text": (
        "Llama 4 text (`llama4_text`)",
        "import, export",
        "NoPE layers (`rope_layers` from no_rope_layers) with their query temperature (`attention_temperature`, "
        "`attention_floor_scale`), chunked RoPE layers (`attention_chunk`), weightless q/k RMS norm (`qk_l2_norm`); "
        "top-1 `router=sigmoid` scaling the expert's input (`moe_gate_input`), one shared expert, dense and MoE "
        "layers alternating (`moe_every`, the dense `d_ff` intermediate_size_mlp)",
    ),
    "qwen3_next": (
        "Qwen3-Next (`qwen3_next`; its multi-token-prediction weights `mtp.*` left out)",
        "import, export",
        "Gated DeltaNet layers beside full ones (`layer_types` from its layer_types, `linear_heads`, `linear_v_heads`, "
        "`linear_head_dim`, `linear_v_head_dim`, `linear_conv`; in_proj_qkvz / in_proj_ba split per key head), "
        "gated attention (`attention_output_gate`: the query projection's second half), partial RoPE "
        "(`rope_fraction`), `qk_norm`, `norm_offset`; Qwen2-MoE's routing and gated shared expert, `moe_every`",
    ),
}
_NOT_MEASURED = "tests/test_gpt2_convert.py"  # families convert_equality.py does not build


def families() -> list[str]:
    """Each family: what it reads and writes, what txjax needs, and benchmarks/convert_equality.py's figures."""
    result = bench("convert_equality") or {"rows": [], "machine": {}}
    measured, machine = {r["family"]: r for r in result["rows"]}, result["machine"]
    rows = []
    for family, (label, formats, needs) in FAMILIES.items():
        r = measured.get(family)
        if r is None:
            rows.append([label, formats, needs, f"not measured here: {_NOT_MEASURED}", "", "", "", ""])
            continue
        gguf = r.get("gguf_max_abs_logit_difference")
        rows.append([
            label, formats, needs,
            f"{r['max_abs_logit_difference']:.1e} (logits to {n(r['max_abs_logit'])})",
            f"{' / '.join(map(str, np.atleast_1d(r['greedy_tokens_equal'])))} of {r['greedy_tokens']}",
            "" if "export_max_abs_logit_difference" not in r else f"{r['export_max_abs_logit_difference']:.1e}",
            "" if gguf is None else f"{gguf:.1e}",
            f"transformers {r['transformers']}, {machine_label(machine)}",
        ])  # fmt: skip
    header = [
        "family (config.json `model_type`; GGUF)",
        "in / out",
        "what txjax needs (ModelConfig)",
        "import: max abs logit difference",
        "greedy tokens equal",
        "export: max abs logit difference",
        "GGUF: max abs difference from the folder import",
        "measured",
    ]
    return table(header, rows)
