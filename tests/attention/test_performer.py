"""FAVOR+ against performer-pytorch (Performer's PyTorch port) with the same projection W,
and against its feature map written here in NumPy where that port has no equivalent
(padding keys):

  φ(x) = exp(W x̂ − ‖x̂‖²/2) / √m,  x̂ = x / d^{1/4}
  out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)

Also: the random features are orthogonal N(0, I) rows, and the error against exact
softmax attention falls as the number of features grows.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from random_draws import normal, random_params

from research.aot import targets
from research.attention.heads import module_key
from research.attention.performer import (
  PerformerSelfAttention,
  favor_attention,
  gram_schmidt,
  orthogonal_random_features,
)

# the test extra's reference; an image without it skips the module, naming the package
performer_pytorch = pytest.importorskip("performer_pytorch.performer_pytorch")
pytestmark = pytest.mark.usefixtures("highest_precision")

B, N, H, D, M = 2, 6, 2, 4, 16


@functools.cache
def drawn_features():
  """One draw of many orthogonal features (one compilation). Its slices W[a:a + m], a a
  multiple of D, are draws of m features: their rows are orthogonal in blocks of D too."""
  return np.asarray(orthogonal_random_features(jax.random.key(0), 2048 + 3, D))


def torch_favor(q, k, v, w, causal):
  """performer-pytorch's softmax kernel and linear attention, [b, n, H, d] in and out."""
  q, k, v = (torch.from_numpy(np.asarray(x)).permute(0, 2, 1, 3) for x in (q, k, v))
  w = torch.from_numpy(np.array(w))
  kernel = functools.partial(performer_pytorch.softmax_kernel, projection_matrix=w, eps=0.0)
  q, k = kernel(q, is_query=True), kernel(k, is_query=False)
  out = (performer_pytorch.causal_linear_attention_noncuda(q, k, v, eps=0.0) if causal
         else performer_pytorch.linear_attention(q, k, v))
  return out.permute(0, 2, 1, 3).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_favor_matches_performer_pytorch(causal):
  q, k, v = normal(0, (B, N, H, D)), normal(1, (B, N, H, D)), normal(2, (B, N, H, 3))
  w = drawn_features()[:M]
  out = jax.jit(functools.partial(favor_attention, is_causal=causal, chunk_size=4))(q, k, v, w)
  np.testing.assert_allclose(out, torch_favor(q, k, v, w, causal), rtol=2e-5, atol=2e-5)


def test_padding_keys_are_left_out():
  q, k, v = normal(3, (B, N, H, D)), normal(4, (B, N, H, D)), normal(5, (B, N, H, 3))
  w = drawn_features()[M:2 * M]
  lengths = [N, 3]
  out = jax.jit(favor_attention)(q, k, v, w, key_value_seq_lengths=jnp.array(lengths))

  def features(x):
    x = x / D ** 0.25
    return np.exp(np.einsum("nhd,md->nhm", x, w) - 0.5 * (x ** 2).sum(-1, keepdims=True)) / M ** 0.5

  for b, n in enumerate(lengths):
    scores = np.einsum("ihm,jhm->hij", features(q[b]), features(k[b, :n]))
    expected = np.einsum("hij,jhe->ihe", scores, v[b, :n]) / scores.sum(-1).T[..., None]
    np.testing.assert_allclose(out[b], expected, rtol=2e-5, atol=2e-5)


def test_random_features_are_orthogonal_gaussian_rows():
  W = drawn_features()
  assert W.shape == (2051, D)
  rows = W / np.linalg.norm(W, axis=1, keepdims=True)
  for block in (rows[:D], rows[D:2 * D], rows[-3:]):            # the last: a partial block
    np.testing.assert_allclose(block @ block.T, np.eye(len(block)), atol=1e-5)
  np.testing.assert_allclose(np.mean(np.sum(W ** 2, axis=1)), D, rtol=0.05)   # E‖w‖² = d
  assert np.abs(rows[:D] @ rows[D:2 * D].T).max() > 0.1       # blocks drawn independently


def test_error_against_softmax_falls_with_features():
  q, k, v = normal(6, (1, 16, 1, D), 0.6), normal(7, (1, 16, 1, D), 0.6), normal(8, (1, 16, 1, D))
  logits = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(D)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  exact = np.einsum("bhij,bjhd->bihd", weights / weights.sum(-1, keepdims=True), v)
  sizes, draws = (4, 16, 64, 256), 8

  @jax.jit
  def mean_errors(w):
    def error(w):
      return jnp.sqrt(jnp.mean((favor_attention(q, k, v, w) - exact) ** 2))
    return jnp.stack([jnp.mean(jax.vmap(error)(w[:, :m])) for m in sizes])

  features = drawn_features()[:draws * sizes[-1]].reshape(draws, sizes[-1], D)
  errors = list(np.asarray(mean_errors(features)))
  assert errors == sorted(errors, reverse=True), errors
  assert errors[-1] < errors[0] / 2, errors


@pytest.mark.slow
def test_module_causal_padded_fixed_or_redrawn():
  x = normal(9, (B, N, 8))
  module = PerformerSelfAttention(num_heads=H, num_features=M, redraw=True)
  params = random_params(module, x)
  lengths = jnp.array([N, 4])

  @functools.partial(jax.jit, static_argnames=("is_causal", "train"))
  def apply(x, rng, *, is_causal=False, train=False):
    return module.apply(params, x, is_causal=is_causal, train=train,
                        key_value_seq_lengths=lengths, rngs={"attention": rng})

  # causal: positions before 3 do not see a change at 3 and after
  moved = x.copy()
  moved[:, 3:] = normal(10, moved[:, 3:].shape)
  base, changed = (apply(y, jax.random.key(1), is_causal=True) for y in (x, moved))
  np.testing.assert_allclose(changed[:, :3], base[:, :3], rtol=1e-5, atol=1e-5)
  assert np.abs(changed[:, 3:] - base[:, 3:]).max() > 1e-2
  # W: one fixed draw in evaluation, a new one per key in training
  np.testing.assert_array_equal(apply(x, jax.random.key(2), is_causal=True), base)
  drawn = [apply(x, jax.random.key(s), train=True) for s in (1, 2, 1)]
  assert not np.allclose(drawn[0], drawn[1])
  np.testing.assert_array_equal(drawn[0], drawn[2])
  # padding keys never reach a real position
  padded = x.copy()
  padded[1, 4:] = 50.0
  np.testing.assert_allclose(apply(padded, jax.random.key(1), train=True)[1, :4],
                             drawn[0][1, :4], rtol=1e-5, atol=1e-5)


def test_each_layer_draws_its_own_fixed_projection():
  class TwoLayers(nn.Module):
    @nn.compact
    def __call__(self):
      return [jax.random.key_data(module_key(0, nn.Dense(1, name=f"layer{i}"))) for i in (0, 1)]

  first, second = TwoLayers().apply({})
  assert not np.array_equal(first, second)
  np.testing.assert_array_equal(TwoLayers().apply({})[0], first)


def test_bad_arguments_name_the_allowed_values():
  x = jnp.zeros((1, 4, H, D))
  with pytest.raises(ValueError, match=r"projection must be \[num_features, head_dim = 4\]"):
    favor_attention(x, x, x, jnp.zeros((8, 3)))
  with pytest.raises(ValueError, match="num_features must be a positive int"):
    orthogonal_random_features(jax.random.key(0), 0, D)
  with pytest.raises(ValueError, match=r"causal_form must be one of \('scan', 'chunked'\)"):
    PerformerSelfAttention(num_heads=1, causal_form="dense").init(jax.random.key(0),
                                                                  jnp.zeros((1, 4, 4)))


def test_gram_schmidt_is_lapacks_qr_with_a_positive_diagonal():
  g = np.asarray(normal(11, (16, 16)))
  q, r = np.linalg.qr(g)                                  # numpy's LAPACK
  np.testing.assert_allclose(jax.jit(gram_schmidt)(g), q * np.sign(np.diag(r)), atol=1e-5)


@pytest.mark.aot
def test_the_module_compiles_for_a_chip_this_machine_lacks():
  """Under a mesh of compile-only devices nothing can run eagerly: W is drawn in the step,
  with no LAPACK call (the step compiled for a TPU v5e chip, deviceless)."""
  try:
    devices = targets.devices_of(targets.get("tpu-v5e-1"))
  except targets.TargetUnavailable as error:
    pytest.skip(str(error))
  module = PerformerSelfAttention(num_heads=H, num_features=M)
  mesh = jax.sharding.Mesh(np.array(devices), ("data",))
  put = lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=jax.NamedSharding(
      mesh, jax.sharding.PartitionSpec()))
  x = put(jax.ShapeDtypeStruct((B, N, 8), jnp.float32))
  params = jax.tree.map(put, jax.eval_shape(module.init, jax.random.key(0), x))
  with jax.set_mesh(mesh):
    compiled = jax.jit(module.apply).trace(params, x).lower(
        lowering_platforms=("tpu",)).compile()
  assert "lapack" not in compiled.as_text().lower()
