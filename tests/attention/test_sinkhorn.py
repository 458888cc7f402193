"""Sparse Sinkhorn attention against the paper's equations written here as NumPy loops:

  R_ij = s_i · w_j + c_j,  s_i = Σ_{t ∈ block i} k_t  (causal: the block's first key)
  Sinkhorn: alternately normalise rows and columns of exp(R / τ) over the allowed blocks
            (causal: j < i, columns over the rows up to i)
  K̃_i = Σ_j P_ij K_j,  out_t = softmax over [own block's keys, K̃_i's keys] of q_t·k / √d

with who-sees-whom listed per query. Causal outputs must not move when later inputs do.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from random_draws import normal, random_params

from research.attention.sinkhorn import (
  SinkhornSelfAttention,
  sinkhorn_attention,
  sinkhorn_normalize,
)

pytestmark = pytest.mark.usefixtures("highest_precision")

B, H, D, C = 2, 2, 3, 2      # batch, heads, head size, block size


def logsumexp(x):
  return np.log(np.sum(np.exp(x - x.max()))) + x.max()


def numpy_sinkhorn(logits, allowed, iterations, causal):
  """logits, allowed [N, N] -> P, normalising only over allowed entries."""
  x = np.where(allowed, logits, 0.0).astype(np.float64)
  n = len(x)
  for _ in range(iterations):
    for i in range(n):
      if allowed[i].any():
        x[i, allowed[i]] -= logsumexp(x[i, allowed[i]])
    previous = x.copy()
    for j in range(n):
      for i in range(n):
        rows = [r for r in range(i + 1 if causal else n) if allowed[r, j]]
        if allowed[i, j]:
          x[i, j] -= logsumexp(previous[rows, j])
  return np.where(allowed, np.exp(x), 0.0)


def numpy_sinkhorn_attention(q, k, v, w, c, *, causal, lengths, iterations, temperature):
  b_size, n, heads, d = q.shape
  blocks = n // C
  out = np.zeros(q.shape[:3] + v.shape[-1:])
  perms = np.zeros((b_size, heads, blocks, blocks))
  for b in range(b_size):
    real = np.arange(n) < lengths[b]
    for h in range(heads):
      keys = np.where(real[:, None], k[b, :, h], 0.0)
      values = np.where(real[:, None], v[b, :, h], 0.0)
      summary = [keys[i * C] if causal else keys[i * C:(i + 1) * C].sum(0) for i in range(blocks)]
      logits = np.array([[summary[i] @ w[h, :, j] + c[h, j] for j in range(blocks)]
                         for i in range(blocks)])
      allowed = np.array([[real[j * C:(j + 1) * C].any() and (not causal or j < i)
                           for j in range(blocks)] for i in range(blocks)])
      p = numpy_sinkhorn(logits / temperature, allowed, iterations, causal)
      perms[b, h] = p
      for t in range(n):
        i = t // C
        own = [(keys[s], values[s]) for s in range(i * C, (i + 1) * C)
               if real[s] and (not causal or s <= t)]
        sorted_ = [(sum(p[i, j] * keys[j * C + s] for j in range(blocks)),
                    sum(p[i, j] * values[j * C + s] for j in range(blocks)))
                   for s in range(C) if sum(p[i, j] * real[j * C + s] for j in range(blocks)) > 0]
        seen = own + sorted_
        if not seen:
          continue
        scores = np.array([q[b, t, h] @ key for key, _ in seen]) / np.sqrt(d)
        weights = np.exp(scores - scores.max())
        out[b, t, h] = sum(wt * value for wt, (_, value) in zip(weights / weights.sum(), seen))
  return out, perms


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_sinkhorn_attention_matches_the_equations(causal):
  n = 8
  q, k, v = normal(0, (B, n, H, D)), normal(1, (B, n, H, D)), normal(2, (B, n, H, 2))
  w, c = normal(3, (H, D, 5)), normal(4, (H, 5))        # N_max = 5 > 4 blocks
  lengths = [n, 3]
  out, perm = jax.jit(functools.partial(
      sinkhorn_attention, block_size=C, is_causal=causal, iterations=3, temperature=0.75,
      return_permutation=True))(q, k, v, w, c, key_value_seq_lengths=jnp.array(lengths))
  expected, expected_perm = numpy_sinkhorn_attention(q, k, v, w, c, causal=causal,
                                                     lengths=lengths, iterations=3,
                                                     temperature=0.75)
  np.testing.assert_allclose(perm, expected_perm, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_sinkhorn_balancing_converges_to_doubly_stochastic():
  p = jax.jit(functools.partial(sinkhorn_normalize, iterations=200))(
      normal(5, (3, 6, 6)), jnp.ones((6, 6), bool))
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-4)
  np.testing.assert_allclose(p.sum(-2), 1.0, atol=1e-4)


@pytest.mark.slow
def test_module_causal_padding_and_gumbel_noise():
  x = normal(6, (B, 7, 8))                               # padded to 8 inside
  module = SinkhornSelfAttention(num_heads=H, max_len=8, block_size=C, gumbel_noise=True)
  params = random_params(module, x)

  @functools.partial(jax.jit, static_argnames=("is_causal", "train"))
  def apply(x, rng, *, is_causal=False, train=False):
    return module.apply(params, x, is_causal=is_causal, train=train,
                        key_value_seq_lengths=jnp.array([7, 4]), rngs={"attention": rng})

  moved = x.copy()
  moved[:, 5:] = normal(7, moved[:, 5:].shape)
  base, changed = (apply(y, jax.random.key(0), is_causal=True) for y in (x, moved))
  np.testing.assert_allclose(changed[:, :5], base[:, :5], rtol=1e-5, atol=1e-6)
  assert np.abs(changed[:, 5:] - base[:, 5:]).max() > 1e-3
  padded = x.copy()
  padded[1, 4:] = 30.0
  trained = apply(x, jax.random.key(1), train=True)
  np.testing.assert_allclose(apply(padded, jax.random.key(1), train=True)[1, :4],
                             trained[1, :4], rtol=1e-5, atol=1e-6)
  assert not np.allclose(apply(x, jax.random.key(2), train=True), trained)   # other noise


def test_bad_arguments_name_the_allowed_values():
  x, w, c = jnp.zeros((1, 6, H, D)), jnp.zeros((H, D, 2)), jnp.zeros((H, 2))
  with pytest.raises(ValueError, match=r"length 6 must be a multiple of block_size \(4\)"):
    sinkhorn_attention(x, x, x, w, c, block_size=4)
  with pytest.raises(ValueError, match=r"3 blocks of 2 exceed the sort network's N_max \(2\)"):
    sinkhorn_attention(x, x, x, w, c, block_size=2)
  with pytest.raises(ValueError, match="temperature must be > 0"):
    sinkhorn_attention(x, x, x, w, c, block_size=3, temperature=0.0)
  with pytest.raises(ValueError, match=r"input length 6 exceeds max_len \(5\)"):
    SinkhornSelfAttention(num_heads=H, max_len=5, block_size=2).init(jax.random.key(0),
                                                                      jnp.zeros((1, 6, 4)))
  # a block past the longest input would pad every input to it (2³¹ positions aborted XLA)
  with pytest.raises(ValueError, match=r"block_size=2147483647 must be at most the longest "
                                       r"input, max_len=256 \(a longer block is all padding\)"):
    jax.eval_shape(SinkhornSelfAttention(num_heads=H, max_len=256, block_size=2**31 - 1).init,
                   jax.random.key(0), jnp.zeros((1, 256, 4)))
