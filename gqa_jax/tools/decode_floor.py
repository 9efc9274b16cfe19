"""The floor of ``bench decode`` (table c): the least time a decode step and a prefill can take
on this machine, from the bytes and FLOPs counted on the model's parameters and the probes of
``measurement`` (read bandwidth, matmul rate).

- step floor = max(bytes / bandwidth, FLOPs / rate), with bytes (:func:`step_bytes`, also the
  ``time`` stage's bytes model) = the decoder-side weights a step reads (:func:`step_reads`) + the
  whole self-attention cache (all T allocated slots are read every step) + every layer's cross K/V;
- prefill floor = (encoder + cross K/V projection) FLOPs / rate (:func:`prefill_flops`);
- end-to-end floor = prefill floor + T x step floor;
- the step's roofline (:func:`step_ops`, :func:`roofline_s`): op by op, each weight product's and
  each layer's attention over the cache's bytes at the bandwidth or its FLOPs at the matmul rate,
  whichever takes longer, summed (at least the floor: an op bound by bytes cannot lend its
  compute time to one bound by FLOPs).
"""

from __future__ import annotations

from typing import Any

from gqa_jax import model as model_lib
from gqa_jax.config import ModelConfig
from gqa_jax.model import T5

PROJECTIONS = ("query", "key", "value", "out", "wi_0", "wi_1", "wo")  # [in, out]-style matrices


def step_reads(model: T5, config: ModelConfig, batch: int) -> dict[str, int]:
    """Bytes of parameters one decode step reads, counted from the parameters: decoder
    self-attention, cross-attention query / out (its K/V are in the cache), MLPs, norms, the
    decoder's relative position table, the output layer, and the B gathered embedding rows.
    Also the step's matmul FLOPs on those weights (``2 x B x elements``)."""
    weights, flops = 0, 0
    for path, value in model_lib.flat_params(model).items():
        size, nbytes = int(value.size), int(value.nbytes)
        if path[0] == "shared":
            if config.tie_word_embeddings:  # the embedding is also the output layer: all of it
                weights, flops = weights + nbytes, flops + 2 * batch * size
            else:
                weights += batch * nbytes // config.vocab_size  # B rows of [V, D]
        elif path[0] == "lm_head":
            weights, flops = weights + nbytes, flops + 2 * batch * size
        elif path[0] == "decoder" and not ("cross_attn" in path and path[-1] in ("key", "value")):
            weights += nbytes
            if path[-1] in PROJECTIONS:
                flops += 2 * batch * size
    return {"weight_bytes": weights, "weight_flops": flops}


def step_bytes(model: T5, config: ModelConfig, batch: int, cache_bytes: dict[str, int]) -> dict[str, int]:
    """The bytes one decode step of ``batch`` rows must read: the weights of :func:`step_reads`
    plus the whole allocated cache (all T slots of the self-attention K/V, masked or not; every
    layer's cross K/V); ``cache_bytes`` as ``cache.cache_bytes`` / ``cache.expected_cache_bytes``
    give them. The bytes side of the floor, and the time stage's bytes model."""
    weights = step_reads(model, config, batch)["weight_bytes"]
    total = weights + cache_bytes["self"] + cache_bytes["cross"]
    return {"weights": weights, "self_cache": cache_bytes["self"], "cross_cache": cache_bytes["cross"],
            "total": total}  # fmt: skip


def prefill_flops(model: T5, config: ModelConfig, batch: int, input_len: int) -> int:
    """Matmul FLOPs of prefill: the encoder (projections, MLPs, attention scores and values) and
    the decoder's one-time cross-attention K/V projections. Norms and biases are ignored."""
    B, S, N, H = batch, input_len, config.num_heads, config.head_dim
    flops = 4 * B * N * S * S * H * config.num_encoder_layers  # QK^T and PV
    for path, value in model_lib.flat_params(model).items():
        encoder = path[0] == "encoder" and path[-1] in PROJECTIONS
        cross_kv = path[0] == "decoder" and "cross_attn" in path and path[-1] in ("key", "value")
        if encoder or cross_kv:
            flops += 2 * B * S * int(value.size)
    return flops


def floor_row(
    model: T5,
    config: ModelConfig,
    *,
    batch: int,
    input_len: int,
    new_tokens: int,
    cache_bytes: dict[str, int],
    bandwidth_gb_s: float,
    gflop_s: float,
) -> dict[str, Any]:
    """The floor of one model: per decode step max(bytes / bandwidth, FLOPs / rate), where the
    bytes are the weights above plus the whole allocated cache (all T slots of the
    self-attention K/V are read every step, masked or not; all layers' cross K/V); end to end
    the prefill FLOPs / rate plus T steps."""
    reads = step_reads(model, config, batch)
    N, H, L = config.num_heads, config.head_dim, config.num_decoder_layers
    attn_flops = 4 * batch * N * H * (new_tokens + input_len) * L  # scores + values, self and cross
    read = step_bytes(model, config, batch, cache_bytes)["total"]
    step_flops = reads["weight_flops"] + attn_flops
    step_floor = max(read / (bandwidth_gb_s * 1e9), step_flops / (gflop_s * 1e9))
    p_flops = prefill_flops(model, config, batch, input_len)
    prefill_floor = p_flops / (gflop_s * 1e9)
    return {
        "weight_bytes": reads["weight_bytes"],
        "self_cache_bytes": cache_bytes["self"],
        "cross_cache_bytes": cache_bytes["cross"],
        "step_bytes": read,
        "step_flops": step_flops,
        "step_floor_s": step_floor,
        "step_bound": "bandwidth" if read / bandwidth_gb_s >= step_flops / gflop_s else "compute",
        "prefill_flops": p_flops,
        "prefill_floor_s": prefill_floor,
        "e2e_floor_s": prefill_floor + new_tokens * step_floor,
    }


def step_ops(
    model: T5, config: ModelConfig, batch: int, lengths: tuple[int, int], cache_bytes: dict[str, int]
) -> list[dict[str, Any]]:
    """The ops of one decode step as the roofline counts them, ``{"op", "bytes", "flops"}`` each:
    every decoder weight product and the output layer (bytes: the weight; FLOPs: 2 B x its
    elements), the other weights a step reads (norms, position table, B embedding rows: bytes
    only), and each layer's self- and cross-attention over the cache (bytes: that layer's K/V of
    ``cache_bytes``; FLOPs: 4 B N H x the positions, scores and values; ``lengths``: the input and
    output lengths, the cross and self positions)."""
    B, N, H, L = batch, config.num_heads, config.head_dim, config.num_decoder_layers
    ops, other = [], 0
    for path, value in model_lib.flat_params(model).items():
        size, nbytes = int(value.size), int(value.nbytes)
        name = ".".join(map(str, path))
        if path[0] == "shared":
            if config.tie_word_embeddings:
                ops.append({"op": name, "bytes": nbytes, "flops": 2 * B * size})
            else:
                other += B * nbytes // config.vocab_size
        elif path[0] == "lm_head" or (path[0] == "decoder" and path[-1] in PROJECTIONS):
            if not ("cross_attn" in path and path[-1] in ("key", "value")):
                ops.append({"op": name, "bytes": nbytes, "flops": 2 * B * size})
        elif path[0] == "decoder":
            other += nbytes
    ops.append({"op": "other weights (norms, position table, embedding rows)", "bytes": other, "flops": 0})
    for kind, positions in (("cross", lengths[0]), ("self", lengths[1])):
        flops = 4 * B * N * H * positions
        ops += [
            {"op": f"attention.{kind}.{i}", "bytes": cache_bytes[kind] // L, "flops": flops} for i in range(L)
        ]
    return ops


def roofline_s(ops: list[dict[str, Any]], bandwidth_gb_s: float, gflop_s: float) -> float:
    """The step's roofline: each op's bytes at ``bandwidth_gb_s`` or FLOPs at ``gflop_s``, the slower,
    summed."""
    return sum(max(op["bytes"] / (bandwidth_gb_s * 1e9), op["flops"] / (gflop_s * 1e9)) for op in ops)
