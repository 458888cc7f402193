"""Linear Transformer attention against its quadratic form written here in NumPy.

  φ(x) = elu(x) + 1,   out_i = Σ_{j visible} φ(q_i)·φ(k_j) v_j / Σ_{j visible} φ(q_i)·φ(k_j)

with "visible" a dense mask: j < length, and j ≤ i when causal. Both causal forms (scan,
chunked) must give it, and the causal output at t must not move when inputs after t do.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from random_draws import normal, random_params

from research.attention.linear import LinearSelfAttention, linear_attention

pytestmark = pytest.mark.usefixtures("highest_precision")

B, N, H, D = 2, 7, 2, 3


def phi(x):
  return np.where(x > 0, x + 1.0, np.exp(x))


def quadratic(q, k, v, *, causal, lengths):
  """The n × n form with a dense mask [b, q, k]."""
  n_q, n_k = q.shape[1], k.shape[1]
  visible = np.arange(n_k)[None, None, :] < np.asarray(lengths)[:, None, None]
  if causal:
    visible = visible & (np.arange(n_k)[None, :] <= np.arange(n_q)[:, None])[None]
  scores = np.einsum("bihd,bjhd->bhij", phi(q), phi(k)) * visible[:, None]
  return np.einsum("bhij,bjhe->bihe", scores, v) / scores.sum(-1).transpose(0, 2, 1)[..., None]


@pytest.mark.parametrize("causal,form,chunk", [(False, "chunked", 4), (True, "scan", 4),
                                               (True, "chunked", 3), (True, "chunked", 16)])
def test_linear_attention_equals_quadratic_form(causal, form, chunk):
  q, k, v = normal(0, (B, N, H, D)), normal(1, (B, N, H, D)), normal(2, (B, N, H, 4))
  lengths = [N, 4]
  attend = functools.partial(linear_attention, is_causal=causal, causal_form=form,
                             chunk_size=chunk)
  out = jax.jit(attend)(q, k, v, key_value_seq_lengths=jnp.array(lengths))
  np.testing.assert_allclose(out, quadratic(q, k, v, causal=causal, lengths=lengths),
                             rtol=1e-5, atol=1e-5)


def test_cross_attention_lengths_and_empty_rows():
  q, k, v = normal(3, (B, 3, H, D)), normal(4, (B, 5, H, D)), normal(5, (B, 5, H, 2))
  out = jax.jit(linear_attention)(q, k, v, key_value_seq_lengths=jnp.array([5, 0]))
  np.testing.assert_allclose(out[0], quadratic(q, k, v, causal=False, lengths=[5, 5])[0],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out[1], 0.0)       # no visible key: zeros, not NaN


@pytest.mark.parametrize("form", ["scan", "chunked"])
def test_causal_output_ignores_the_future(form):
  q, k, v = normal(6, (1, N, H, D)), normal(7, (1, N, H, D)), normal(8, (1, N, H, D))
  t = 4
  attend = jax.jit(lambda q, k, v: linear_attention(q, k, v, is_causal=True, causal_form=form,
                                                    chunk_size=3))
  base = attend(q, k, v)
  moved = attend(*(np.concatenate([x[:, :t], normal(9, x[:, t:].shape)], 1) for x in (q, k, v)))
  np.testing.assert_allclose(moved[:, :t], base[:, :t], rtol=1e-6, atol=1e-6)
  assert np.abs(moved[:, t:] - base[:, t:]).max() > 1e-2


def test_module_matches_projections_and_ignores_padding():
  x = normal(10, (B, N, 4))
  module = LinearSelfAttention(num_heads=H, qkv_features=H * D, causal_form="scan")
  params = random_params(module, x)["params"]
  lengths = jnp.array([N, 5])
  apply = jax.jit(lambda x: module.apply({"params": params}, x, is_causal=True,
                                         key_value_seq_lengths=lengths))
  out = apply(x)
  q, k, v = (np.einsum("btf,fhd->bthd", x, params[n]["kernel"]) + params[n]["bias"]
             for n in ("query", "key", "value"))
  heads = quadratic(q, k, v, causal=True, lengths=[N, 5])
  expected = np.einsum("bthd,hdo->bto", heads, params["out"]["kernel"]) + params["out"]["bias"]
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
  padded = x.copy()
  padded[1, 5:] = 100.0                             # padding content never reaches a real row
  np.testing.assert_allclose(apply(padded)[1, :5], out[1, :5], rtol=1e-6, atol=1e-6)


def test_bad_arguments_name_the_allowed_values():
  x = jnp.zeros((1, 4, H, D))
  with pytest.raises(ValueError, match=r"causal_form must be one of \('scan', 'chunked'\)"):
    linear_attention(x, x, x, is_causal=True, causal_form="cumsum")
  with pytest.raises(ValueError, match="chunk_size must be a positive int"):
    linear_attention(x, x, x, chunk_size=0)
  with pytest.raises(ValueError, match="same length"):
    linear_attention(x, jnp.zeros((1, 5, H, D)), jnp.zeros((1, 5, H, D)), is_causal=True)
  with pytest.raises(ValueError, match="same number of heads"):
    linear_attention(x, jnp.zeros((1, 4, 1, D)), jnp.zeros((1, 4, 1, D)))
