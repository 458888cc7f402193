"""Dense and Random Synthesizer against the paper's equations written here in NumPy:

  dense    B_h = relu(x W_1^h + b_1^h) W_2^h + b_2^h
  random   B_h = R_h, or A_h C_hᵀ (factorised)
  out      = Σ_h softmax(B_h[:n, :n] over the visible keys) (x W_v^h + b_v^h) W_o^h + b_o

with the visible keys a dense mask (j < length; j ≤ i when causal).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from random_draws import normal, random_params

from research.attention.synthesizer import SynthesizerSelfAttention, synthesizer_attention

pytestmark = pytest.mark.usefixtures("highest_precision")

B, N, F, H, MAX_LEN = 2, 5, 6, 2, 8


def project(x, p):
  return np.einsum("btf,fhd->bthd", x, p["kernel"]) + p["bias"]


def numpy_synthesizer(logits, v, out, *, causal, lengths):
  """logits [b|1, H, n, n], v [b, n, H, d] -> module output [b, n, F] and weights."""
  n = v.shape[1]
  visible = np.arange(n)[None, None, None, :] < np.asarray(lengths)[:, None, None, None]
  if causal:
    visible = visible & (np.arange(n)[None, :] <= np.arange(n)[:, None])
  logits = np.where(visible, logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  heads = np.einsum("bhij,bjhd->bihd", weights, v)
  return np.einsum("bthd,hdo->bto", heads, out["kernel"]) + out["bias"], weights


@pytest.mark.parametrize("mode,rank,causal", [("dense", None, True), ("random", None, False),
                                              ("random", 3, True)])
def test_module_matches_the_papers_equations(mode, rank, causal):
  x = normal(0, (B, N, F))
  module = SynthesizerSelfAttention(num_heads=H, max_len=MAX_LEN, mode=mode, rank=rank)
  params = random_params(module, x, 0.7, 20)["params"]
  lengths = [N, 3]
  out, state = jax.jit(lambda p, x: module.apply(
      {"params": p}, x, is_causal=causal, key_value_seq_lengths=jnp.array(lengths),
      mutable=["intermediates"]))(params, x)
  if mode == "dense":
    hidden = np.maximum(project(x, params["query"]), 0.0)
    logits = (np.einsum("bihe,hej->bhij", hidden, params["synthesizer_kernel"][:, :, :N])
              + params["synthesizer_bias"][None, :, None, :N])
  elif rank is None:
    logits = params["random"][None, :, :N, :N]
  else:
    logits = np.einsum("hik,hjk->hij", params["random_left"][:, :N],
                       params["random_right"][:, :N])[None]
  expected, weights = numpy_synthesizer(logits, project(x, params["value"]), params["out"],
                                        causal=causal, lengths=lengths)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(state["intermediates"]["attention_weights"][0], weights, atol=1e-6)
  blocked = module.clone(query_block=2)            # 3 blocks of 2 queries for 5
  out = jax.jit(lambda p, x: blocked.apply(
      {"params": p}, x, is_causal=causal, key_value_seq_lengths=jnp.array(lengths)))(params, x)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_no_visible_key_gives_zeros():
  out = jax.jit(synthesizer_attention)(jnp.ones((1, H, 3, 3)), jnp.ones((2, 3, H, 4)),
                                       key_value_seq_lengths=jnp.array([3, 0]))
  np.testing.assert_array_equal(out[1], 0.0)
  np.testing.assert_allclose(out[0], 1.0)


def test_bad_arguments_name_the_allowed_values():
  x = jnp.zeros((1, 4, F))
  with pytest.raises(ValueError, match=r"mode must be one of \('dense', 'random'\)"):
    SynthesizerSelfAttention(num_heads=H, max_len=8, mode="mixture").init(jax.random.key(0), x)
  with pytest.raises(ValueError, match=r"input length 4 exceeds max_len \(3\)"):
    SynthesizerSelfAttention(num_heads=H, max_len=3).init(jax.random.key(0), x)
  with pytest.raises(ValueError, match="query_block must be a positive int"):
    SynthesizerSelfAttention(num_heads=H, max_len=8, query_block=0).init(jax.random.key(0), x)
  with pytest.raises(ValueError, match="rank must be a positive int"):
    SynthesizerSelfAttention(num_heads=H, max_len=8, mode="random", rank=0).init(
        jax.random.key(0), x)
