"""Score functions against their formulas written out in NumPy; `attend` against a NumPy
masked softmax and `jax.nn.dot_product_attention`; dtypes and error messages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.attention.scores import (
  SCORE_FUNCTIONS,
  AdditiveScore,
  ConcatScore,
  DotScore,
  GeneralScore,
  LocationScore,
  ScaledDotScore,
  attend,
  make_score,
)

# Compared with NumPy formulas and jax.nn within 1e-5: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

A, S = 4, 6  # additive / concat attention size a; location source length S

MODULES = {
    "dot": lambda **kw: DotScore(**kw),
    "scaled_dot": lambda **kw: ScaledDotScore(**kw),
    "general": lambda **kw: GeneralScore(**kw),
    "additive": lambda **kw: AdditiveScore(features=A, **kw),
    "concat": lambda **kw: ConcatScore(features=A, **kw),
    "location": lambda **kw: LocationScore(source_length=S, **kw),
}
SAME_SIZE = ("dot", "scaled_dot")  # scores that need d_q == d_k
APPLY = {name: jax.jit(make().apply) for name, make in MODULES.items()}  # compiled per shape


def reference_logits(name: str, params: dict, q: np.ndarray, k: np.ndarray) -> np.ndarray:
  """The papers' formulas, one query-key pair at a time where that is clearer."""
  q, k = q.astype(np.float64), k.astype(np.float64)
  p = {n: np.asarray(w, np.float64) for n, w in params.items()}
  if name == "dot":
    return q @ np.swapaxes(k, -1, -2)
  if name == "scaled_dot":
    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
  if name == "general":
    return q @ p["w"] @ np.swapaxes(k, -1, -2)
  if name == "additive":  # vᵀ tanh(W_q q + W_k k), W_q q as q @ w_q
    hidden = np.tanh((q @ p["w_q"])[..., :, None, :] + (k @ p["w_k"])[..., None, :, :])
    return hidden @ p["v"]
  if name == "concat":  # vᵀ tanh(W [q; k]) with the pairs concatenated explicitly
    q_len, kv_len = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    pairs = np.concatenate([
        np.broadcast_to(q[..., :, None, :], batch + (q_len, kv_len, q.shape[-1])),
        np.broadcast_to(k[..., None, :, :], batch + (q_len, kv_len, k.shape[-1]))], axis=-1)
    return np.tanh(pairs @ p["w"]) @ p["v"]
  if name == "location":  # softmax argument W_a h_t over S positions, first kv_len kept
    return (q @ p["w_a"])[..., :k.shape[-2]]
  raise AssertionError(name)


def parameter_shapes(name: str, d_q: int, d_k: int) -> dict[str, tuple[int, ...]]:
  """The parameters each formula names, with the shapes their formulas give them."""
  return {
      "dot": {}, "scaled_dot": {},
      "general": {"w": (d_q, d_k)},
      "additive": {"w_q": (d_q, A), "w_k": (d_k, A), "v": (A,)},
      "concat": {"w": (d_q + d_k, A), "v": (A,)},
      "location": {"w_a": (d_q, S)},
  }[name]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_init_creates_the_formula_parameters(name):
  q, k = jnp.ones((2, 3, 4)), jnp.ones((2, 5, 2 if name not in SAME_SIZE else 4))
  shapes = jax.eval_shape(MODULES[name]().init, jax.random.key(0), q, k)
  got = {n: p.shape for n, p in shapes.get("params", {}).items()}
  assert got == parameter_shapes(name, 4, k.shape[-1])


def random_params(name: str, d_q: int, d_k: int, rng) -> dict[str, np.ndarray]:
  return {n: rng.standard_normal(shape).astype(np.float32)
          for n, shape in parameter_shapes(name, d_q, d_k).items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODULES))
@settings(max_examples=6, deadline=None)
@given(batch=st.lists(st.integers(1, 3), max_size=2), q_len=st.integers(1, 4),
       kv_len=st.integers(1, S), d_q=st.integers(1, 3), d_k=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_score_matches_formula(name, batch, q_len, kv_len, d_q, d_k, seed):
  if name in SAME_SIZE:
    d_k = d_q
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((*batch, q_len, d_q)).astype(np.float32)
  k = rng.standard_normal((*batch, kv_len, d_k)).astype(np.float32)
  params = random_params(name, d_q, d_k, rng)
  logits = APPLY[name]({"params": params}, q, k)
  assert logits.shape == (*batch, q_len, kv_len)
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, reference_logits(name, params, q, k), rtol=1e-5, atol=1e-5)


def test_scores_broadcast_leading_dims():
  """One query set against per-head keys: q [1, q, d], k [h, kv, d]."""
  rng = np.random.default_rng(1)
  q = rng.standard_normal((1, 3, 2)).astype(np.float32)
  k = rng.standard_normal((4, 5, 2)).astype(np.float32)
  for name in ("general", "concat"):
    params = random_params(name, 2, 2, rng)
    logits = MODULES[name]().apply({"params": params}, q, k)
    np.testing.assert_allclose(logits, reference_logits(name, params, q, k), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_bfloat16_inputs_give_float32_logits(name):
  rng = np.random.default_rng(2)
  q = rng.standard_normal((2, 3, 4)).astype(np.float32)
  k = rng.standard_normal((2, 5, 4)).astype(np.float32)
  params = random_params(name, 4, 4, rng)
  logits32 = MODULES[name]().apply({"params": params}, q, k)
  for dtype in (None, jnp.bfloat16):  # promoted to float32 / computed in bfloat16
    logits16 = MODULES[name](dtype=dtype).apply({"params": params}, jnp.asarray(q, jnp.bfloat16),
                                                jnp.asarray(k, jnp.bfloat16))
    assert logits16.dtype == jnp.float32
    np.testing.assert_allclose(logits16, logits32, rtol=3e-2, atol=6e-2)


def numpy_masked_softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
  weights = np.zeros_like(logits, np.float64)
  for row in np.ndindex(logits.shape[:-1]):
    seen = np.flatnonzero(mask[row])
    if seen.size:
      z = np.exp(logits[row][seen] - logits[row][seen].max())
      weights[row + (seen,)] = z / z.sum()
  return weights


def test_attend_matches_numpy_masked_softmax():
  rng = np.random.default_rng(3)
  logits = 3 * rng.standard_normal((2, 4, 5)).astype(np.float32)
  values = rng.standard_normal((2, 5, 3)).astype(np.float32)
  mask = rng.random((2, 4, 5)) < 0.6
  mask[0, 1] = False  # a query that sees nothing
  mask[1, 2] = True
  context, weights = attend(jnp.asarray(logits), jnp.asarray(values), jnp.asarray(mask))
  expected = numpy_masked_softmax(logits, mask)
  np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(context, expected @ values, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(context[0, 1], 0.0)

  context, weights = attend(jnp.asarray(logits), jnp.asarray(values))  # no mask: jax.nn
  np.testing.assert_allclose(weights, jax.nn.softmax(logits), rtol=1e-6)


def test_attend_fully_masked_row_has_finite_gradients():
  rng = np.random.default_rng(4)
  logits = jnp.asarray(rng.standard_normal((3, 4)), jnp.float32)
  values = jnp.asarray(rng.standard_normal((4, 2)), jnp.float32)
  mask = jnp.array([[True, False, True, True], [False] * 4, [False, False, False, True]])

  def loss(logits, values):
    context, weights = attend(logits, values, mask)
    return jnp.sum(context ** 2) + jnp.sum(weights ** 2)

  grad_logits, grad_values = jax.jit(jax.grad(loss, argnums=(0, 1)))(logits, values)
  assert np.all(np.isfinite(grad_logits)) and np.all(np.isfinite(grad_values))
  np.testing.assert_array_equal(grad_logits[1], 0.0)
  np.testing.assert_array_equal(grad_logits[0, 1], 0.0)  # a masked key gets no gradient
  assert np.any(grad_logits[0] != 0)


def test_attend_with_scaled_dot_matches_jax_nn():
  rng = np.random.default_rng(5)
  q, k, v = (jnp.asarray(rng.standard_normal((2, t, 4)), jnp.float32) for t in (3, 5, 5))
  mask = jnp.asarray(rng.random((2, 3, 5)) < 0.7).at[:, :, 0].set(True)
  context, _ = attend(ScaledDotScore().apply({}, q, k), v, mask)
  expected = jax.jit(jax.nn.dot_product_attention)(q[:, :, None], k[:, :, None], v[:, :, None],
                                                   mask=mask[:, None])[:, :, 0]
  np.testing.assert_allclose(context, expected, rtol=1e-5, atol=1e-6)


def test_location_rejects_longer_sources():
  q, k = jnp.ones((1, 2, 3)), jnp.ones((1, S + 1, 3))
  with pytest.raises(ValueError, match=f"source_length = {S}"):
    jax.eval_shape(LocationScore(source_length=S).init, jax.random.key(0), q, k)


def test_dot_rejects_different_sizes():
  with pytest.raises(ValueError, match="d_q = 3, d_k = 2"):
    DotScore().apply({}, jnp.ones((2, 3)), jnp.ones((4, 2)))


def test_registry_and_unknown_name():
  assert set(SCORE_FUNCTIONS) == {"dot", "scaled_dot", "general", "additive", "concat", "location"}
  assert isinstance(make_score("additive", features=2), AdditiveScore)
  with pytest.raises(ValueError, match="one of .*'additive'.*'scaled_dot'.*got 'bilinear'"):
    make_score("bilinear")
