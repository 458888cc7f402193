"""Reformer's LSH attention against reformer-pytorch's `LSHAttention` with the same random
rotations (its draw replaced by ours): shared query-key, angular hashing, sorted chunks
that see themselves and the chunk before, no attention to self unless alone, rounds
combined by their log-sum-exp. A causal output has no gradient to later inputs.
"""

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from random_draws import normal, random_params

from research.attention.reformer import (
  LSHSelfAttention,
  check_lsh_sizes,
  lsh_attention,
  lsh_rotations,
)

# the test extra's reference; an image without it skips the module, naming the package
reformer_pytorch = pytest.importorskip("reformer_pytorch")
pytestmark = pytest.mark.usefixtures("highest_precision")

B, N, H, D, C = 2, 8, 2, 4, 2      # batch, length, heads, head size, chunk = bucket size


def torch_lsh(qk, v, rotations, *, causal, lengths):
  """reformer-pytorch on [b, n, H, d], heads folded into the batch, drawing our rotations.

  In float64: its self logit −5·10⁴ and its log-sum-exp over the rounds leave float32
  with a spacing of 4·10⁻³ there, which shows up as errors of 10⁻³ in float32.
  """
  attention = reformer_pytorch.LSHAttention(bucket_size=C, n_hashes=rotations.shape[0],
                                            causal=causal).eval()
  fold = lambda x: torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(
      -1, N, x.shape[-1]), np.float64))
  mask = torch.from_numpy(np.repeat(np.arange(N)[None] < np.asarray(lengths)[:, None], H, 0))
  ours = torch.from_numpy(np.array(rotations, np.float64)).permute(1, 0, 2)[None]  # [1, d, R, nb/2]
  with mock.patch.object(torch, "randn", lambda *args, **kwargs: ours):
    out, _, _ = attention(fold(qk), fold(v), input_mask=mask)
  return out.numpy().reshape(B, H, N, -1).transpose(0, 2, 1, 3)


@pytest.mark.slow
@pytest.mark.parametrize("rounds,causal", [(3, False), (2, True)])
def test_lsh_attention_matches_reformer_pytorch(rounds, causal):
  qk, v = normal(0, (B, N, H, D)), normal(1, (B, N, H, D))
  rotations = lsh_rotations(jax.random.key(rounds), D, N // C, rounds)
  out = jax.jit(functools.partial(lsh_attention, chunk_size=C, is_causal=causal))(qk, v, rotations)
  np.testing.assert_allclose(out, torch_lsh(qk, v, rotations, causal=causal, lengths=[N, N]),
                             rtol=1e-5, atol=1e-5)
  if causal:   # position 0 has only itself to see
    np.testing.assert_allclose(out[:, 0], v[:, 0], rtol=1e-6, atol=1e-6)


def numpy_lsh(qk, v, rotations, *, causal, lengths):
  """The algorithm spelt out: explicit buckets (padding: bucket nb), one sorted list of
  (round, bucket, position), and for each occurrence the list of occurrences it sees."""
  rounds, _, half = rotations.shape
  out = np.zeros(v.shape)
  for b in range(qk.shape[0]):
    real = np.arange(N) < lengths[b]
    for h in range(H):
      x, values = qk[b, :, h].astype(np.float64), v[b, :, h]
      unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
      occurrences = []
      for r in range(rounds):
        rotated = x @ rotations[r]
        bucket = np.where(real, np.argmax(np.concatenate([rotated, -rotated], 1), 1), 2 * half)
        occurrences += sorted((r, bucket[t], t) for t in range(N))
      chunks = len(occurrences) // C
      per_round = {}
      for i, (r, _, t) in enumerate(occurrences):
        near = {i // C, (i // C - 1) % chunks}
        seen = [u for j, (_, _, u) in enumerate(occurrences)
                if j // C in near and real[u] and (not causal or u <= t)]
        if seen:
          logits = np.array([-1e5 if u == t else x[t] @ unit[u] / np.sqrt(D) for u in seen])
          weights = np.exp(logits - logits.max())
          per_round[t, r] = (weights @ values[seen] / weights.sum(),
                             logits.max() + np.log(weights.sum()))
      for t in range(N):
        found = [per_round[t, r] for r in range(rounds) if (t, r) in per_round]
        z = np.array([lse for _, lse in found])
        weights = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        out[b, t, h] = sum(w * o for w, (o, _) in zip(weights, found))
  return out


def test_padding_matches_the_algorithm_spelt_out():
  qk, v = normal(4, (B, N, H, D)), normal(5, (B, N, H, D))
  qk[1, 5:] = 0.0     # zero padding rows: their unit key is 0, with a finite gradient
  rotations = np.asarray(lsh_rotations(jax.random.key(5), D, 4, 2))
  lengths = [N, 5]

  @jax.jit
  def attend_and_gradient(qk, v):
    attend = functools.partial(lsh_attention, rotations=rotations, chunk_size=C, is_causal=True,
                               key_value_seq_lengths=jnp.array(lengths))
    out, pullback = jax.vjp(attend, qk, v)
    return out, pullback(out)

  out, gradients = attend_and_gradient(qk, v)
  expected = numpy_lsh(qk, v, rotations, causal=True, lengths=lengths)
  np.testing.assert_allclose(out[0], expected[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out[1, :5], expected[1, :5], rtol=1e-5, atol=1e-5)
  assert all(np.all(np.isfinite(g)) for g in gradients)


@pytest.mark.slow
def test_module_causal_padding_and_rotations():
  x = normal(2, (B, 7, 8))                                 # padded to 8 inside
  module = LSHSelfAttention(num_heads=H, chunk_size=C, num_hashes=2, redraw=True)
  params = random_params(module, x)

  @functools.partial(jax.jit, static_argnames=("is_causal", "train"))
  def apply(x, rng, *, is_causal=False, train=False):
    return module.apply(params, x, is_causal=is_causal, train=train,
                        key_value_seq_lengths=jnp.array([7, 4]), rngs={"attention": rng})

  # causal: no gradient from a position to later inputs (which earlier keys share a
  # chunk does depend on later hashes, a discrete choice without gradient)
  @jax.jit
  def causal_and_gradient(x, rng):                     # d Σ_{t<4} probe_t·out_t / d x
    out, pullback = jax.vjp(lambda x: apply(x, rng, is_causal=True), x)
    return out, pullback(jnp.zeros_like(out).at[:, :4].set(normal(3, (B, 4, 8))))[0]

  base, grads = causal_and_gradient(x, jax.random.key(0))
  np.testing.assert_array_equal(grads[:, 4:], 0.0)
  assert np.abs(grads[:, :4]).min() > 0
  np.testing.assert_array_equal(causal_and_gradient(x, jax.random.key(1))[0], base)   # fixed
  padded = x.copy()
  padded[1, 4:] = 30.0
  trained = apply(x, jax.random.key(1), train=True)
  np.testing.assert_allclose(apply(padded, jax.random.key(1), train=True)[1, :4],
                             trained[1, :4], rtol=1e-5, atol=1e-6)
  redrawn = [apply(x, jax.random.key(s), train=True) for s in (2, 3, 4)]
  assert any(not np.allclose(r, trained) for r in redrawn)   # other rotations, other buckets


def test_bad_arguments_name_the_allowed_values():
  x = jnp.zeros((1, 6, H, D))
  with pytest.raises(ValueError, match=r"length 6 must be a multiple of chunk_size \(4\)"):
    lsh_attention(x, x, jnp.zeros((1, D, 2)), chunk_size=4)
  with pytest.raises(ValueError, match=r"rotations must be \[num_hashes, head_dim = 4"):
    lsh_attention(x, x, jnp.zeros((1, 3, 2)), chunk_size=2)
  with pytest.raises(ValueError, match="num_buckets must be an even int"):
    lsh_rotations(jax.random.key(0), D, 3, 1)


@pytest.mark.parametrize("chunk_size, num_hashes, message", [
    (16, 100_000_000, r"num_hashes=100000000 rounds of 16 buckets over 256 positions need sort "
                      r"keys up to num_hashes · \(buckets \+ 1\) · length = 435,200,000,000, "
                      r"beyond int32; at most 493,447 rounds there"),
    (2**31 - 1, 2, r"255 positions \(padded to 4294967294, chunk_size=2147483647\) in 2 "
                   r"buckets need sort keys up to \(buckets \+ 1\) · length = 12,884,901,882 "
                   r"in a single round, beyond int32"),
])
def test_sizes_whose_sort_keys_overflow_int32_are_refused(chunk_size, num_hashes, message):
  """The sort key (round · (nb + 1) + bucket) · n + t of R rounds reaches R (nb + 1) n − 1:
  R = 2³¹ / ((nb + 1) n) rounds are the most int32 holds, and the module refuses more (while
  tracing: nothing is drawn) instead of overflowing (an OverflowError before)."""
  most = 2**31 // (17 * 256)             # nb = 256 / 16 buckets of the 255 positions padded
  check_lsh_sizes(255, 16, most)
  assert most * 17 * 256 - 1 <= 2**31 - 1 < (most + 1) * 17 * 256 - 1
  module = LSHSelfAttention(num_heads=1, chunk_size=chunk_size, num_hashes=num_hashes)
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((1, 255, 4)))
