"""Mamba-2 (Dao & Gu 2024): the SSD core against flash-linear-attention's naive scalar-gated
linear attention (fla-core's `naive_recurrent_simple_gla` and `naive_chunk_simple_gla`: SSD
is that recurrence with q = C, k = B, v = Δ x, g = Δ A per head and no scale), the whole
block against its equations written here in float64 torch one step at a time (torch's
grouped conv1d, the recurrence, the gated RMSNorm, as in `mamba2_simple.py`), outputs and
the gradients of x and every parameter; the forms, steps, padding, directions, causality and
dtypes against each other; the initialisation against `mamba2_simple.py`'s.

The shared checks (linear_checks) compare one state array: the carry (the convolution's
last inputs, h) travels through them flattened to [B, ·] ([2, B, ·] bidirectional)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as tf
from fla_reference import naive
from linear_checks import (
  FORWARD_TOL,
  GRAD_TOL,
  QUICK_COMPILE,
  assert_causal,
  assert_padding_is_each_sequence_alone,
  assert_parallel_equals_stepwise,
  assert_steps_equal_sequence,
  compiled,
  key,
  randn,
)
from linear_checks import (
  init_layer as init,
)

from research.recurrent.mamba2 import Mamba2, segsum, ssd_chunked

# Marked slow: the block against its equations with chunks of 1 and of more than T (two more
# compilations of a forward and backward pass; both chunkings are also checked quickly, on
# the core against fla and by parallel == stepwise with chunks of 1), and T = 16 384 steps.
pytestmark = pytest.mark.usefixtures("highest_precision")
torch.set_num_threads(1)

B, T, F, N, P = 2, 7, 8, 4, 4      # batch, time, width, state, head size: D_in 16, H 4
EPS = 1e-5                         # the gated RMSNorm's ε (mamba2_simple.py)


def flat(state):
  """(conv carry, h) -> one array [..., B, ·]."""
  conv, h = state
  lead = h.ndim - 3
  return jnp.concatenate([s.reshape(s.shape[:lead] + (-1,)) for s in (conv, h)], -1)


def unflat(module, state, features):
  zero = module.zero_state(1, features)
  split = zero[0][0].size
  return tuple(s.reshape(state.shape[:-1] + z.shape[1:])
               for s, z in zip((state[..., :split], state[..., split:]), zero))


@compiled
def run(module, variables, x, initial_state=None, **kwargs):
  if initial_state is not None:
    initial_state = unflat(module, initial_state, x.shape[-1])
  y, state = module.apply(variables, x, initial_state=initial_state, **kwargs)
  return y, flat(state)


@compiled
def step(module, variables, state, x_t):
  state, y = module.apply(variables, unflat(module, state, x_t.shape[-1]), x_t, method="step")
  return flat(state), y


def make(**kwargs):
  """chunk_size 3: T = 7 is two chunks and a padded one. Every parameter moved off its
  initial value (D and the norm's weight start at ones, which would hide a dropped one)."""
  module = Mamba2(**{"state_size": N, "head_dim": P, "chunk_size": 3, **kwargs})
  variables = init(module.clone(mode="parallel"), key(0), jnp.zeros((B, T, F)))
  return module, jax.tree.map(lambda p: p + 0.1 * randn(p.size, *p.shape), variables)


def random_state(seed, *lead):
  """A carry [*lead, B, ·]: last inputs [B, K − 1, D_in + 2N] and h [B, H, P, N], flattened."""
  return randn(seed, *lead, B, 3 * (2 * F + 2 * N) + 2 * F * N)


# --- the SSD core against fla ---------------------------------------------------------------

def core_inputs(seed, heads=3):
  rng = np.random.default_rng(seed)
  f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  x, b, c = f32(B, T, heads, P), f32(B, T, N), f32(B, T, N)
  dt = np.log1p(np.exp(f32(B, T, heads) - 1.0)).astype(np.float32)       # softplus
  a = -np.exp(0.5 * f32(heads)).astype(np.float32)
  return x, dt, a, b, c, f32(B, heads, P, N)


def fla_ssd(x, dt, a, b, c, h0, chunk=None):
  """fla's simple GLA as SSD: q = C, k = B (each head the same), v = Δ x, g = Δ A, scale 1;
  fla's state is [K, V] = [N, P], h transposed. The recurrent form, or the chunked one."""
  heads = x.shape[2]
  q, k = (u[:, :, None].expand(-1, -1, heads, -1) for u in (c, b))
  v, g, s0 = dt[..., None] * x, dt * a, h0.transpose(-1, -2)
  ops = naive("simple_gla")
  if chunk is None:
    o, s = ops.naive_recurrent_simple_gla(q, k, v, g, scale=1.0, initial_state=s0,
                                          output_final_state=True)
  else:
    o, s = ops.naive_chunk_simple_gla(q, k, v, g, initial_state=s0, output_final_state=True,
                                      chunk_size=chunk, scale=1.0)
  return o, s.transpose(-1, -2)


@pytest.mark.parametrize("chunk", [3, 1, 8], ids=["chunks-of-3", "chunk-1", "chunk-over-T"])
def test_ssd_core_matches_fla_outputs_and_gradients(chunk):
  """`ssd_chunked` against fla's recurrent form (outputs, final state, gradients of x, Δ, A,
  B, C and h0 by torch autograd) and its chunked form with the same chunk size."""
  inputs = core_inputs(0)
  cot_y, cot_h = randn(1, B, T, 3, P), randn(2, B, 3, P, N)

  def loss(*args):
    y, h = ssd_chunked(*args, chunk)
    return jnp.vdot(y, cot_y) + jnp.vdot(h, cot_h), (y, h)

  (_, (y, h)), grads = jax.jit(jax.value_and_grad(loss, argnums=range(6), has_aux=True),
                                compiler_options=QUICK_COMPILE)(*inputs)
  tensors = [torch.tensor(u, requires_grad=True) for u in inputs]
  o, s = fla_ssd(*tensors)
  (torch.sum(o * torch.tensor(cot_y)) + torch.sum(s * torch.tensor(cot_h))).backward()
  close = lambda a, b, tol: np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
  close(y, o.detach().numpy(), FORWARD_TOL)
  close(h, s.detach().numpy(), FORWARD_TOL)
  for g, t in zip(grads, tensors):
    close(g, t.grad.numpy(), GRAD_TOL)
  o, s = fla_ssd(*map(torch.tensor, inputs), chunk=chunk)
  close(y, o.numpy(), FORWARD_TOL)
  close(h, s.numpy(), FORWARD_TOL)


def test_segsum_is_each_segment_summed_and_minus_infinity_above_the_diagonal():
  a = randn(0, 5)
  expected = np.full((5, 5), -np.inf)
  for i in range(5):
    for j in range(i + 1):
      expected[i, j] = a[j + 1:i + 1].sum()
  np.testing.assert_allclose(segsum(jnp.cumsum(jnp.asarray(a))), expected, rtol=1e-6, atol=1e-6)


# --- the block against its equations --------------------------------------------------------

def torch_block(p, x, last_inputs, h):
  """The Mamba-2 block (mamba2_simple.py's forward without the fused kernels), one step at a
  time, float64: p the parameters, x [B, T, F], the carry (last_inputs [B, K − 1, C], h
  [B, H, P, N]) -> (y [B, T, F], the carry after the last step)."""
  inner, heads = p["norm_weight"].shape[0], p["A_log"].shape[0]
  width, channels = p["conv_weight"].shape
  n = (channels - inner) // 2
  batch, steps = x.shape[:2]
  z, u, delta = torch.split(x @ p["in_proj"], [inner, channels, heads], -1)
  inputs = torch.cat([last_inputs, u], 1)                       # causal: K − 1 inputs before
  conv = tf.conv1d(inputs.transpose(1, 2), p["conv_weight"].T[:, None], p["conv_bias"],
                   groups=channels).transpose(1, 2)             # [B, T, C]
  xs, bs, cs = torch.split(tf.silu(conv), [inner, n, n], -1)
  xs = xs.reshape(batch, steps, heads, -1)
  dt, a = tf.softplus(delta + p["dt_bias"]), -torch.exp(p["A_log"])
  ys = []
  for t in range(steps):
    decay = torch.exp(dt[:, t] * a)[..., None, None]
    h = decay * h + dt[:, t, :, None, None] * xs[:, t, :, :, None] * bs[:, t, None, None, :]
    ys.append(torch.einsum("bhpn,bn->bhp", h, cs[:, t]) + p["D"][:, None] * xs[:, t])
  y = torch.stack(ys, 1).reshape(batch, steps, inner) * tf.silu(z)
  y = y * torch.rsqrt(torch.mean(y**2, -1, keepdim=True) + EPS) * p["norm_weight"]
  return y @ p["out_proj"], (inputs[:, steps:], h)


def torch_params(params, direction=None, grad=False):
  pick = lambda v: np.asarray(v if direction is None else v[direction], np.float64)
  return {name: torch.tensor(pick(v), requires_grad=grad) for name, v in params.items()}


@functools.partial(jax.jit, static_argnums=0, compiler_options=QUICK_COMPILE)
def outputs_carry_and_grads(module, variables, x, cotangent, **kwargs):
  """y, the final carry, and the gradients of <y, cotangent> + Σ carry for (variables, x)
  (linear_checks' `outputs_and_grads`, the carry kept)."""
  def loss(variables, x):
    y, carry = run.__wrapped__(module, variables, x, **kwargs)
    return jnp.vdot(y, cotangent) + jnp.sum(carry), (y, carry)
  (_, (y, carry)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(variables, x)
  return y, carry, grads


@pytest.mark.parametrize("mode, chunk", [
    ("parallel", 3), ("stepwise", 3),
    pytest.param("parallel", 1, marks=[pytest.mark.slow, pytest.mark.long]),
    pytest.param("parallel", 16, marks=[pytest.mark.slow, pytest.mark.long])])
def test_block_matches_its_equations_outputs_carry_and_gradients(mode, chunk):
  """From a random carry, with lengths T and 4: each sequence's outputs (zero past its
  length), its final carry, and the gradients of <y, cotangent> + Σ carry for x and every
  parameter, against torch's autograd of the equations over each sequence's valid steps."""
  module, variables = make(mode=mode, chunk_size=chunk)
  x, cotangent, state, lengths = randn(0, B, T, F), randn(1, B, T, F), random_state(2), [T, 4]
  y, carry, (grads, grad_x) = outputs_carry_and_grads(
      module, variables, x, cotangent, initial_state=state, seq_lengths=jnp.asarray(lengths))

  close = lambda a, b, tol: np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
  p = torch_params(variables["params"], grad=True)
  x_t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
  starts, carries = unflat(module, state, F), unflat(module, carry, F)
  loss = 0.0
  for b, n in enumerate(lengths):
    start = [torch.tensor(np.asarray(s[b:b + 1]), dtype=torch.float64) for s in starts]
    y_b, carry_b = torch_block(p, x_t[b:b + 1, :n], *start)
    close(y[b:b + 1, :n], y_b.detach().numpy(), FORWARD_TOL)
    np.testing.assert_array_equal(y[b, n:], 0.0)
    for ours, theirs in zip(carries, carry_b):
      close(ours[b:b + 1], theirs.detach().numpy(), FORWARD_TOL)
    loss = loss + torch.sum(y_b * torch.tensor(cotangent[b:b + 1, :n])) + sum(map(torch.sum, carry_b))
  loss.backward()
  close(grad_x, x_t.grad.numpy(), GRAD_TOL)
  assert set(grads["params"]) == set(p)
  for name, g in grads["params"].items():
    close(g, p[name].grad.numpy(), GRAD_TOL)


def test_bidirectional_adds_the_reverse_direction_over_each_sequence_within_its_length():
  """Each sequence's valid steps through the equations with the forward parameters and
  carry, plus with the reverse ones over the steps reversed (then reversed back); zeros past
  a length; each direction's final carry."""
  module, variables = make(bidirectional=True)
  x, lengths, state = randn(0, B, T, F), [T, 4], random_state(1, 2)
  y, carry = run(module, variables, x, seq_lengths=jnp.asarray(lengths), initial_state=state)
  starts, carries = unflat(module, state, F), unflat(module, carry, F)
  for b, n in enumerate(lengths):
    seq = torch.tensor(x[b:b + 1, :n], dtype=torch.float64)
    out = 0.0
    for k, inputs in enumerate((seq, seq.flip(1))):
      start = [torch.tensor(np.asarray(s[k, b:b + 1]), dtype=torch.float64) for s in starts]
      y_k, carry_k = torch_block(torch_params(variables["params"], k), inputs, *start)
      out = out + (y_k if k == 0 else y_k.flip(1))
      for ours, theirs in zip(carries, carry_k):
        np.testing.assert_allclose(ours[k, b:b + 1], theirs.numpy(), rtol=FORWARD_TOL,
                                   atol=FORWARD_TOL)
    np.testing.assert_allclose(y[b, :n], out[0].numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)
    np.testing.assert_array_equal(y[b, n:], 0.0)


# --- the forms, steps and padding against each other ----------------------------------------

def test_parallel_equals_stepwise_bidirectional_with_lengths_and_initial_state():
  """Chunks of 3 (the last one padded) and of 1."""
  module, variables = make(bidirectional=True)
  assert_parallel_equals_stepwise(run, module, variables, randn(0, B, T, F),
                                  seq_lengths=jnp.array([T, 4]), initial_state=random_state(1, 2))


def test_steps_equal_the_sequence():
  module, variables = make()
  assert_steps_equal_sequence(run, step, module, variables, randn(0, B, T, F), random_state(1))


def test_padding_equals_each_sequence_alone():
  """Outputs, zeros past each length, and the final carry (the convolution's last valid
  inputs, h after the last valid step): lengths T, 2 and 0."""
  module, variables = make()
  x = randn(0, 3, T, F)
  assert_padding_is_each_sequence_alone(run, module, variables, x, [T, 2, 0])


def test_causal():
  module, variables = make()
  assert_causal(run, module, variables, randn(0, B, T, F), t0=3)


def test_bfloat16_computation():
  """Projections in bfloat16 (8-bit mantissa: inputs and weights rounded by up to 2⁻⁹
  relative, through two projections and the norm), the rest in float32: within 5e-2."""
  module, variables = make()
  x = randn(0, B, T, F)
  y, carry = run(module.clone(dtype=jnp.bfloat16), variables, x)
  y32, carry32 = run(module, variables, x)
  assert y.dtype == jnp.bfloat16 and carry.dtype == jnp.float32
  np.testing.assert_allclose(y.astype(jnp.float32), y32, rtol=5e-2, atol=5e-2)
  np.testing.assert_allclose(carry, carry32, rtol=5e-2, atol=5e-2)


@pytest.mark.slow
@pytest.mark.long
def test_long_sequences_stay_finite_and_the_forms_agree():
  """T = 16 384 at the initialisation and with Δ ≈ 20 (ΔA down to −320 a step): the sums of
  ΔA over the sequence reach −10⁵, an overflow for any exp of them with the sign flipped."""
  module = Mamba2(state_size=N, head_dim=P)
  x = randn(0, 1, 16384, F)
  variables = init(module, key(0), x[:, :8])
  large = jax.tree.map(lambda p: p, variables)
  large["params"]["dt_bias"] = jnp.full_like(variables["params"]["dt_bias"], 20.0)
  for v in (variables, large):
    y_p, h_p = run(module, v, x)
    y_s, h_s = run(module.clone(mode="stepwise"), v, x)
    assert np.isfinite(y_p).all() and np.isfinite(h_p).all()
    np.testing.assert_allclose(y_p, y_s, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(h_p, h_s, rtol=1e-4, atol=1e-4)


# --- options and initialisation -------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(head_dim=3), r"head_dim must divide expand × features = 16: one of "
                       r"\(1, 2, 4, 8, 16\), got 3"),
    (dict(head_dim=64), r"head_dim must divide expand × features = 16: .*got 64"),
    (dict(expand=0), "expand must be a positive int, got 0"),
    (dict(head_dim=2.0), "head_dim must be a positive int, got 2.0"),
    (dict(conv_size=0), "conv_size must be a positive int, got 0"),
    (dict(dt_min=0.1, dt_max=0.01), "need 0 < dt_min <= dt_max, got dt_min=0.1, dt_max=0.01"),
    (dict(dt_min=0.0), "need 0 < dt_min <= dt_max"),
    (dict(dt_max=math.inf), "dt_max must be a finite number, got inf"),
    (dict(mode="scan"), "mode must be one of"),
    (dict(chunk_size=0), "chunk_size must be a positive int, got 0"),
    (dict(state_size=0), "state_size must be a positive int, got 0"),
])
def test_bad_config_is_refused(kwargs, message):
  module = Mamba2(**{"head_dim": P, **kwargs})
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros((B, T, F))))


def test_initialisation_follows_mamba2_simple():
  """W_in, W_out, the convolution's weight and bias uniform in ±1/√fan_in; Δ = softplus(b_dt)
  log-uniform in [dt_min, dt_max]; −A = exp(A_log) uniform in [1, 16]; D and the norm's
  weight ones. Many heads (head_dim 1) so that the distributions show."""
  features = 256
  module = Mamba2(state_size=16, head_dim=1)
  p = init(module, key(3), jnp.zeros((1, 1, features)))["params"]
  inner = 2 * features
  assert p["in_proj"].shape == (features, 2 * inner + 32 + inner)
  assert p["out_proj"].shape == (inner, features) and p["conv_weight"].shape == (4, inner + 32)
  for name, bound in (("in_proj", features**-0.5), ("out_proj", inner**-0.5),
                      ("conv_weight", 0.5), ("conv_bias", 0.5)):
    w = np.asarray(p[name])
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.98 * bound, name
    assert abs(w.std() - bound / math.sqrt(3)) < 0.05 * bound, name
  log_dt = np.log(np.log1p(np.exp(np.asarray(p["dt_bias"], np.float64))))
  lo, hi = math.log(0.001), math.log(0.1)
  assert lo - 1e-5 <= log_dt.min() and log_dt.max() <= hi + 1e-5
  assert abs(log_dt.mean() - (lo + hi) / 2) < 0.2 and abs(log_dt.std() - (hi - lo) / 12**0.5) < 0.2
  minus_a = np.exp(np.asarray(p["A_log"]))
  assert 1.0 <= minus_a.min() and minus_a.max() <= 16.0
  assert abs(minus_a.mean() - 8.5) < 0.7 and abs(minus_a.std() - 15 / 12**0.5) < 0.5
  np.testing.assert_array_equal(p["D"], 1.0)
  np.testing.assert_array_equal(p["norm_weight"], 1.0)
  assert module.parameter_count(features) == sum(w.size for w in jax.tree.leaves(p))


def test_initial_steps_below_the_floor_are_raised_to_it():
  p = init(Mamba2(state_size=N, head_dim=1, dt_min=1e-6, dt_max=1e-5), key(0),
           jnp.zeros((1, 1, F)))["params"]
  np.testing.assert_allclose(jax.nn.softplus(p["dt_bias"]), 1e-4, rtol=1e-4)
