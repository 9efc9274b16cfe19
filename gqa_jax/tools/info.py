"""Model facts without weights: parameter counts, K/V heads, KV-cache bytes, and their report.

Parameters are counted from ``model.abstract`` (``nnx.eval_shape`` of the real ``T5``: shapes only,
nothing is allocated), so the numbers follow the model code rather than a formula kept beside it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from flax import nnx

from gqa_jax import kv_quant, sharding
from gqa_jax import model as model_lib
from gqa_jax.cache import cache_bytes_per_token, cache_layout, expected_cache_bytes
from gqa_jax.config import ATTENTION_KINDS, T5_1_1_PRESETS, ModelConfig, preset

# Exact parameter counts of the public T5.1.1 checkpoints google/t5-v1_1-{small,base,large,xl,xxl}
# (all MHA, vocab padded to 32128, untied lm_head). Measured with transformers 5.24.0 and torch
# 2.13.0+cpu, without allocating: under `with torch.device("meta"):` build
#   T5ForConditionalGeneration(T5Config(vocab_size=32128, d_model=D, d_ff=F, d_kv=64,
#       num_layers=L, num_decoder_layers=L, num_heads=N, feed_forward_proj="gated-gelu",
#       tie_word_embeddings=False))
# with the shapes in docs/paper.md, and sum `p.numel()` over `m.parameters()` (shared embedding once).
# transformers 5.x forces `T5Config.tie_word_embeddings = True` (it reads the flag only as "scale the
# decoder output"), so `m.lm_head.weight is m.shared.weight` and that sum lacks the untied lm_head
# of the real checkpoints: small 60,511,616, base 222,903,552, large 750,251,008,
# xl 2,783,959,040, xxl 11,003,736,064. Adding vocab_size * d_model gives the numbers below (for
# small, assigning a fresh `m.lm_head.weight = nn.Parameter(...)` and re-summing gives the same
# 76,961,152). They agree with the published sizes: ~77M, ~248M, ~783M, ~2.85B, ~11.1B.
PUBLIC_T5_1_1_PARAMS: dict[str, int] = {
    "small": 76_961_152,
    "base": 247_577_856,
    "large": 783_150_080,
    "xl": 2_849_757_184,
    "xxl": 11_135_332_352,
}

# param_counts keys, in report order, with their labels.
COMPONENTS: dict[str, str] = {
    "embedding": "embedding (shared)",
    "encoder_attention": "encoder self-attention",
    "encoder_mlp": "encoder MLP",
    "encoder_norms": "encoder norms",
    "encoder_relpos": "encoder relative position bias",
    "decoder_self_attention": "decoder self-attention",
    "decoder_cross_attention": "decoder cross-attention",
    "decoder_mlp": "decoder MLP",
    "decoder_norms": "decoder norms",
    "decoder_relpos": "decoder relative position bias",
    "lm_head": "lm_head (0 when tied)",
}

# Module names in model.py -> component suffix (norm modules end in "norm").
_SUBMODULES = {
    "attn": "attention",
    "self_attn": "self_attention",
    "cross_attn": "cross_attention",
    "mlp": "mlp",
}


def _component(path: tuple[Any, ...]) -> str:
    """The COMPONENTS key of one parameter path such as ``('decoder', 'layers', 3, 'mlp', 'wo')``."""
    head = path[0]
    if head == "shared":
        return "embedding"
    if head == "lm_head":
        return "lm_head"
    if head in ("encoder", "decoder"):
        if path[1] == "relpos":
            return f"{head}_relpos"
        module = path[3] if path[1] == "layers" else path[1]
        if isinstance(module, str) and module.endswith("norm"):
            return f"{head}_norms"
        key = f"{head}_{_SUBMODULES.get(module, '?')}"
        if key in COMPONENTS:
            return key
    raise ValueError(
        f"param_counts: parameter {'/'.join(map(str, path))} fits no component; update tools/info.py"
    )


@functools.lru_cache(maxsize=32)
def _param_counts(config: ModelConfig) -> tuple[tuple[str, int], ...]:
    # Cached: tracing a 24-layer T5 takes seconds (flax's per-parameter RNG-count update makes it
    # superlinear in the number of parameters), and reports ask for the same config more than once.
    abstract = model_lib.abstract(config)  # shapes only
    counts = dict.fromkeys(COMPONENTS, 0)
    for path, param in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
        counts[_component(path)] += int(param.get_value().size)
    counts["total"] = sum(counts.values())
    return tuple(counts.items())


def param_counts(config: ModelConfig) -> dict[str, int]:
    """Parameter counts: ``total`` and one entry per ``COMPONENTS`` key (nothing is allocated)."""
    return dict(_param_counts(config))


def kv_heads_by_attention(config: ModelConfig) -> dict[str, int]:
    """K/V heads of each attention kind (``num_kv_heads`` where grouped, else ``num_heads``)."""
    return {kind: config.kv_heads(kind) for kind in ATTENTION_KINDS}


def mha(config: ModelConfig) -> ModelConfig:
    """The same model with multi-head attention everywhere (K = N)."""
    return config.replace(num_kv_heads=config.num_heads)


# ------------------------------------------------------------------------------ formatting
def attention_name(kv_heads: int, num_heads: int) -> str:
    return "MHA" if kv_heads == num_heads else "MQA" if kv_heads == 1 else f"GQA-{kv_heads}"


def human_count(n: int) -> str:
    """``11135332352 -> '11.14B'``."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def human_bytes(n: int) -> str:
    """Binary units: ``25165824 -> '24.00 MiB'``."""
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if n >= 1024**power:
            return f"{n / 1024**power:.2f} {unit}"
    return f"{n} B"


def _table(rows: list[list[str]], indent: str = "  ", align: str = "") -> list[str]:
    """Columns aligned by ``align`` ("l"/"r" per column); by default the first left, the rest right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    align = align or "l" + "r" * (len(widths) - 1)
    out = []
    for row in rows:
        cells = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align, strict=True)]
        out.append((indent + "   ".join(cells)).rstrip())
    return out


def info_report(
    config: ModelConfig,
    *,
    name: str,
    batch: int,
    input_len: int,
    output_len: int,
    dtype: str,
    mesh: str | None = None,
) -> str:
    """The ``python -m gqa_jax info --preset NAME`` report of one model (with ``mesh``, DATAxMODEL,
    also how its cache lies on that mesh's devices)."""
    variant = attention_name(config.num_kv_heads, config.num_heads) if config.grouped_attentions else "MHA"
    grouped = ", ".join(config.grouped_attentions) or "none"
    # Validate the lengths first: a bad one should fail before the (slower) parameter count.
    cache = expected_cache_bytes(config, batch, input_len, output_len, dtype)
    cache_mha = expected_cache_bytes(mha(config), batch, input_len, output_len, dtype)
    lines = [f"{name} with {variant} (num_kv_heads={config.num_kv_heads}, grouped: {grouped})", ""]
    lines.append("Config")
    lines += _table([[k, str(v)] for k, v in config.to_dict().items()], align="ll")
    lines += ["", *_parameter_lines(config, name, variant)]
    lines += ["", *_head_lines(config)]
    lines += ["", *_per_token_lines(config, dtype)]
    lines += ["", f"KV cache (batch {batch}, input {input_len}, output {output_len}, {dtype})"]
    rows = [["", "bytes", "", "MHA bytes", f"{variant} / MHA"]]
    for part in ("self", "cross", "total"):
        ratio = f"{cache[part] / cache_mha[part]:.4f}"
        rows.append([part, f"{cache[part]:,}", human_bytes(cache[part]), f"{cache_mha[part]:,}", ratio])
    lines += _table(rows)
    if mesh is not None:
        lines += ["", *_mesh_lines(config, mesh, batch, input_len, output_len, dtype)]
    return "\n".join(lines)


def _parameter_lines(config: ModelConfig, name: str, variant: str) -> list[str]:
    """The parameter counts by component, beside MHA's and the public checkpoint's."""
    counts = param_counts(config)
    total_mha = param_counts(mha(config))["total"]
    lines = ["Parameters (counted with nnx.eval_shape; nothing allocated)"]
    rows = [[COMPONENTS[k], f"{counts[k]:,}", human_count(counts[k])] for k in COMPONENTS]
    rows.append(["total", f"{counts['total']:,}", human_count(counts["total"])])
    if total_mha != counts["total"]:
        rows.append(["total with MHA (K = N)", f"{total_mha:,}", human_count(total_mha)])
        saved = total_mha - counts["total"]
        rows.append([f"saved by {variant} (K/V projections)", f"{saved:,}", human_count(saved)])
    public = PUBLIC_T5_1_1_PARAMS.get(name)
    if public is not None:
        rows.append([f"public google/t5-v1_1-{name} (MHA)", f"{public:,}", human_count(public)])
    lines += _table(rows)
    if public is not None:
        same = "equals" if public == total_mha else f"DIFFERS by {total_mha - public:+,} from"
        lines.append(f"  (our MHA total {same} the public checkpoint's count)")
    return lines


def _head_lines(config: ModelConfig) -> list[str]:
    """The K/V heads of each attention and their groups."""
    N, H = config.num_heads, config.head_dim
    rows = []
    for kind, k in kv_heads_by_attention(config).items():
        note = attention_name(k, N) + (f", G = {N // k} query heads per K/V head" if k != N else "")
        rows.append([kind, str(k), note])
    return [f"K/V heads (N = {N} query heads, head_dim {H})", *_table(rows, align="lrl")]


def _per_token_lines(config: ModelConfig, dtype: str) -> list[str]:
    """The KV cache's bytes per output (self) and input (cross) token, beside MHA's."""
    ours, theirs = cache_bytes_per_token(config, dtype), cache_bytes_per_token(mha(config), dtype)
    scales = " + a 4-byte scale per token and head" if kv_quant.is_quantized(str(dtype)) else ""
    L = config.num_decoder_layers
    rows = [["", "bytes", "", "MHA bytes"]]
    parts = (("self", "self-attention, per output token"), ("cross", "cross-attention, per input token"))
    for part, per in parts:
        rows.append([per, f"{ours[part]:,}", human_bytes(ours[part]), f"{theirs[part]:,}"])
    return [f"KV cache per token (batch 1, {dtype}{scales}, {L} decoder layers, K and V)", *_table(rows)]


def _mesh_lines(
    config: ModelConfig, mesh: str, batch: int, input_len: int, output_len: int, dtype: str
) -> list[str]:
    """How the decode cache lies on an abstract ``DATAxMODEL`` mesh (``cache.cache_layout``)."""
    data, model = sharding.parse_mesh_shape(mesh)
    abstract = jax.sharding.AbstractMesh((data, model), sharding.MESH_AXES)
    layout, replicated = cache_layout(config, abstract, batch, input_len, output_len, dtype)
    devices = data * model
    lines = [f"KV cache on mesh {data}x{model} ({devices} devices; the decode layout, docs/sharding.md)"]
    rows = [["", "spec [B, K, length, H]", "shards", "bytes per device", "total / devices"]]
    for kind in ("self", "cross"):
        k = layout[kind]
        rows.append(
            [
                kind,
                str(k["spec"]),
                str(k["shards"]),
                f"{k['bytes_per_device']:,}",
                f"{k['total_bytes'] // devices:,}",
            ]
        )
    lines += _table(rows, align="llrrr")
    lines.append("  " + (sharding.replication_report(replicated) if replicated else "no cache is replicated"))
    return lines


def presets_report(
    *,
    num_kv_heads: int | None,
    grouped_attentions: tuple[str, ...] | None,
    batch: int,
    input_len: int,
    output_len: int,
    dtype: str,
) -> str:
    """The ``python -m gqa_jax info --preset all`` table: every T5.1.1 preset, ours vs public.

    With ``num_kv_heads``, adds the GQA-K parameter count and cache for each preset whose
    ``num_heads`` it divides ("-" elsewhere).
    """
    overrides: dict[str, Any] = {}
    if grouped_attentions is not None:
        overrides["grouped_attentions"] = grouped_attentions
    header = ["preset", "d_model", "d_ff", "layers", "heads", "params (ours, MHA)", "public HF", "match"]
    header += ["KV cache MHA"]
    if num_kv_heads is not None:
        header += [f"params K={num_kv_heads}", f"KV cache K={num_kv_heads}", "cache ratio"]
    rows = [header]
    for name in T5_1_1_PRESETS:
        config = preset(name, **overrides)
        cache = expected_cache_bytes(config, batch, input_len, output_len, dtype)["total"]
        total = param_counts(config)["total"]
        public = PUBLIC_T5_1_1_PARAMS[name]
        layers = f"{config.num_encoder_layers}+{config.num_decoder_layers}"
        row = [name, str(config.d_model), str(config.d_ff), layers, str(config.num_heads)]
        row += [f"{total:,} ({human_count(total)})", f"{public:,}"]
        row += ["yes" if total == public else "NO", human_bytes(cache)]
        if num_kv_heads is not None:
            if config.num_heads % num_kv_heads == 0 and num_kv_heads <= config.num_heads:
                grouped = config.replace(num_kv_heads=num_kv_heads)
                g_total = param_counts(grouped)["total"]
                g_cache = expected_cache_bytes(grouped, batch, input_len, output_len, dtype)["total"]
                row += [
                    f"{g_total:,} ({human_count(g_total)})",
                    human_bytes(g_cache),
                    f"{g_cache / cache:.4f}",
                ]
            else:
                row += [f"- ({num_kv_heads} does not divide {config.num_heads})", "-", "-"]
        rows.append(row)
    title = (
        "T5.1.1 presets: our parameter counts (nnx.eval_shape) vs the public google/t5-v1_1-* checkpoints;"
        f"\nKV cache (self + cross) at batch {batch}, input {input_len}, output {output_len}, {dtype}"
    )
    return "\n".join([title, ""] + _table(rows, indent=""))
