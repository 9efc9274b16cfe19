"""``python -m gqa_jax bench train``: training throughput and model FLOPs utilization (MFU).

For each preset: one jitted ``train_step`` (Adafactor, z-loss, the real step of
``gqa_jax.training``) on a fixed random batch of ``B x S`` inputs and ``B x T`` targets (no
padding; the data pipeline is not timed), compiled once, then timed over ``--steps`` steps.

  tokens/s      (S + T) x B / median step time
  model FLOP/s  training FLOPs / median step time, with training FLOPs = 3 x the forward pass's
                matmul FLOPs (``train_flops``: projections, attention scores and values, MLP,
                output layer; attention counted over every (query, key) pair, causal or not,
                as MFU is usually reported; embeddings, norms and softmax not counted)
  MFU           model FLOP/s / the machine's matmul peak, measured in the same run as the best
                of several jitted [n, n] x [n, n] products in the same dtype (``measurement.matmul_rate``:
                2 n^3 / the median time of each size)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gqa_jax import model as model_lib
from gqa_jax import training
from gqa_jax.config import ModelConfig, preset
from gqa_jax.data.pipeline import shift_right
from gqa_jax.tools.measurement import machine_info, matmul_rate, md_table, measure, on_accelerator


def forward_flops(config: ModelConfig, batch: int, input_len: int, target_len: int) -> int:
    """Matmul FLOPs of one forward pass (``2 x`` multiply-adds), by the formulas in the docstring."""
    B, S, T = batch, input_len, target_len
    D, F, N, H, V = config.d_model, config.d_ff, config.num_heads, config.head_dim, config.vocab_size
    mlp_mats = 3 if config.mlp_activation.startswith("gated") else 2

    def attention(q_len: int, kv_len: int, kv_heads: int, kv_from_len: int) -> int:
        proj = 2 * q_len * D * N * H * 2 + 2 * kv_from_len * D * kv_heads * H * 2  # q, o; k, v
        scores = 2 * q_len * kv_len * N * H * 2  # QK^T and AV
        return proj + scores

    enc = config.num_encoder_layers * (
        attention(S, S, config.kv_heads("encoder_self"), S) + 2 * S * D * F * mlp_mats
    )
    dec = config.num_decoder_layers * (
        attention(T, T, config.kv_heads("decoder_self"), T)
        + attention(T, S, config.kv_heads("cross"), S)
        + 2 * T * D * F * mlp_mats
    )
    head = 2 * T * D * V
    return B * (enc + dec + head)


def train_flops(config: ModelConfig, batch: int, input_len: int, target_len: int) -> int:
    """Forward + backward: 3 x the forward matmul FLOPs."""
    return 3 * forward_flops(config, batch, input_len, target_len)


def matmul_peak(dtype: Any, sizes: Sequence[int] | None = None, runs: int = 5) -> dict[str, Any]:
    """The best GFLOP/s of jitted square matmuls (the MFU denominator), measured now
    (``measurement.matmul_rate``): sizes 1024, 2048, 3072, and on a GPU or TPU also 8192 (the small
    ones are over in microseconds there)."""
    if sizes is None:
        sizes = (1024, 2048, 3072, 8192) if on_accelerator() else (1024, 2048, 3072)
    return matmul_rate(dtype, sizes, runs)


def synthetic_batch(config: ModelConfig, batch: int, input_len: int, target_len: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    targets = rng.integers(2, config.vocab_size, (batch, target_len)).astype(np.int32)
    return {
        "encoder_input_tokens": rng.integers(2, config.vocab_size, (batch, input_len)).astype(np.int32),
        "decoder_target_tokens": targets,
        "decoder_input_tokens": shift_right(targets),
        "decoder_loss_weights": np.ones((batch, target_len), np.float32),
    }


def bench_preset(
    name: str,
    *,
    batch: int,
    input_len: int,
    target_len: int,
    steps: int,
    dtype: str,
    num_microbatches: int,
    peak_gflop_s: float,
    seed: int,
) -> dict[str, Any]:
    """Time ``steps`` train steps of preset ``name`` -> one result row."""
    config = preset(name, dtype=dtype)
    model = model_lib.build(config, seed=seed)
    graphdef, _ = training.split_model(model)
    optimizer = training.make_optimizer(training.OptimizerConfig("rsqrt"))
    state = training.init_state(model, optimizer, seed)
    del model
    step = training.make_train_step(graphdef, optimizer, num_microbatches=num_microbatches, dropout=False)
    batch_arrays = {
        k: jnp.asarray(v) for k, v in synthetic_batch(config, batch, input_len, target_len, seed).items()
    }

    carry = {"state": state}  # the donated state is replaced by the new one at every step

    def one_step() -> dict[str, Any]:
        carry["state"], carry["metrics"] = step(carry["state"], batch_arrays)
        return carry["metrics"]

    timing, _ = measure(one_step, steps)  # the first (compiling) step excluded
    state, metrics, median = carry["state"], carry["metrics"], timing["median_s"]
    flops = train_flops(config, batch, input_len, target_len)
    achieved = flops / median / 1e9
    return {
        "preset": name,
        "params": sum(x.size for x in jax.tree.leaves(state.params)),
        "batch": batch,
        "input_len": input_len,
        "target_len": target_len,
        "dtype": dtype,
        "num_microbatches": num_microbatches,
        "compile_s": timing["compile_s"],
        "step_s": median,
        "step_times_s": timing["times_s"],
        "tokens_per_s": batch * (input_len + target_len) / median,
        "train_gflop_per_step": flops / 1e9,
        "model_gflop_s": achieved,
        "mfu": achieved / peak_gflop_s,
        "final_loss": float(metrics["loss"]),
    }


def run_train_bench(
    presets: Sequence[str] = ("tiny", "small"),
    *,
    batch: int = 8,
    input_len: int = 512,
    target_len: int = 114,
    steps: int = 3,
    dtype: str = "float32",
    num_microbatches: int = 1,
    seed: int = 0,
    peak_sizes: Sequence[int] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """The benchmark: the matmul peak (over ``peak_sizes``, default :func:`matmul_peak`'s), then one
    row per preset."""
    log("measuring the matmul peak ...")
    peak = matmul_peak(jnp.dtype(dtype), peak_sizes)
    log(f"matmul peak {peak['gflop_s']:.1f} GFLOP/s ({peak['shape']}, {peak['dtype']})")
    rows = []
    for name in presets:
        log(f"{name}: compiling and timing {steps} train steps ...")
        row = bench_preset(
            name, batch=batch, input_len=input_len, target_len=target_len, steps=steps, dtype=dtype,
            num_microbatches=num_microbatches, peak_gflop_s=peak["gflop_s"], seed=seed,
        )  # fmt: skip
        log(f"{name}: {row['step_s']:.3f} s/step, {row['tokens_per_s']:.0f} tokens/s, MFU {row['mfu']:.1%}")
        rows.append(row)
    return {"machine": machine_info(), "peak": peak, "rows": rows}


def report(res: dict[str, Any]) -> str:
    peak, machine = res["peak"], res["machine"]
    cpus = machine.get("cpus_usable", machine["cpu_count"])
    shape = "x".join(map(str, peak["shape"]))
    lines = [
        f"Training throughput ({machine['processor']}, {machine['backend']}, {cpus} CPUs usable); "
        f"matmul peak {peak['gflop_s']:.1f} GFLOP/s ({shape}, {peak['dtype']}), measured now.",
        "",
    ]
    return "\n".join(
        lines
        + md_table(
            [
                ("preset", lambda r: r["preset"]),
                ("params", lambda r: f"{r['params'] / 1e6:.2f}M"),
                ("batch x (S + T)", lambda r: f"{r['batch']} x ({r['input_len']} + {r['target_len']})"),
                ("dtype", lambda r: r["dtype"]),
                ("compile s", lambda r: f"{r['compile_s']:.1f}"),
                ("s / step", lambda r: f"{r['step_s']:.3f}"),
                ("tokens / s", lambda r: f"{r['tokens_per_s']:.0f}"),
                ("model GFLOP / step", lambda r: f"{r['train_gflop_per_step']:.1f}"),
                ("model GFLOP/s", lambda r: f"{r['model_gflop_s']:.1f}"),
                ("MFU", lambda r: f"{r['mfu']:.1%}"),
            ],
            res["rows"],
        )
    )
