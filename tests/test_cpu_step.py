"""The CPU decode kernel's layouts: which weights a step reads out-major, the way back, and a
step program that reads them as they lie."""

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gqa_jax import cpu_step, decoding
from gqa_jax.config import preset
from gqa_jax.model import T5
from gqa_jax.tools import hlo_profile


def paths_and_shapes(params) -> dict[str, tuple[int, ...]]:
    return {
        "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)): a.shape
        for path, a in jax.tree_util.tree_leaves_with_path(params)
    }


def test_out_major_stores_the_step_products_as_out_in_matrices_and_in_major_undoes_it():
    """The products a decode step takes (decoder q / k / v / out, cross q / out, the MLP, lm_head)
    are stored as ``[out, in]`` matrices; the encoder, cross-attention's K/V projections (the
    prefill's), the embedding, norms and position tables stay as they are; ``in_major`` gives the
    parameters back."""
    config = preset("tiny", num_kv_heads=2)
    D, N, K, H, F, V = config.d_model, config.num_heads, 2, config.head_dim, config.d_ff, config.vocab_size
    _, params = nnx.split(T5(config, rngs=nnx.Rngs(0)))
    shape = paths_and_shapes(cpu_step.out_major(params))
    layer = "decoder/layers/0"
    assert shape[f"{layer}/self_attn/query"] == (N * H, D) and shape[f"{layer}/self_attn/key"] == (K * H, D)
    assert shape[f"{layer}/self_attn/out"] == (D, N * H) and shape[f"{layer}/cross_attn/query"] == (N * H, D)
    assert shape[f"{layer}/cross_attn/out"] == (D, N * H)
    assert shape[f"{layer}/mlp/wi_0"] == (F, D) and shape[f"{layer}/mlp/wo"] == (D, F)
    assert shape["lm_head"] == (V, D)
    assert shape[f"{layer}/cross_attn/key"] == (D, K, H) and shape["encoder/layers/0/attn/query"] == (D, N, H)
    assert shape["encoder/layers/0/mlp/wi_0"] == (D, F) and shape["shared/embedding"] == (V, D)
    back = cpu_step.in_major(cpu_step.out_major(params), cpu_step.shapes_of(params))
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_cpu_step_reads_every_weight_where_it_lies():
    """The compiled ``step`` under the "cpu" kernel: each laid-out weight goes straight into the
    fusion that takes its product (a dot), none is copied into another layout first."""
    config = preset("tiny", num_kv_heads=2)
    graphdef, params = nnx.split(T5(config, rngs=nnx.Rngs(0)))
    dc = decoding.decode_config(5)
    assert dc.kernel == "cpu"
    state = decoding.start(graphdef, params, jnp.ones((4, 6), jnp.int32), jax.random.key(0), config=dc)
    weights = decoding.step_weights(graphdef, params, dc)
    hlo = decoding.step.lower(graphdef, weights, state, jnp.float32(0), config=dc).compile().as_text()
    ops, _ = hlo_profile.parse_hlo(hlo)
    comps = hlo_profile.computations(ops)
    products = re.compile(r"weights_params.*(query|key|value|out|wi_\d|wo|lm_head)___value")
    users = [op for op in ops.values() if any(products.search(name) for name in op.operands)]
    assert len(users) == 2 * (4 + 2 + 3) + 1  # 2 layers: self q k v out, cross q out, wi_0 wi_1 wo; lm_head
    assert all("dot" in comps[op.calls][0] for op in users), [(op.name, op.opcode) for op in users]
