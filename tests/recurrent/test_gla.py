"""GLA: the recurrence against fla-core's `naive_recurrent_gla` (torch autograd for the
gradients), at mild, strong, extreme (log α = −30 a step) and mixed gates; the layer against
fla's GatedLinearAttention equations written out below in torch (nn.Linear projections
carrying our weights, the low-rank gate, logsigmoid / τ, the recurrence, the gated RMSNorm,
the output projection); the two forms, single steps, padding and causality against each
other; the options refused and the initialisation's distributions.

Slow (module-level, marked below; about 9 s): a 16 384-step sequence at the initialisation,
forward and backward in both forms."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from fla_reference import naive
from linear_checks import (
  FORWARD_TOL,
  GRAD_TOL,
  assert_causal,
  assert_padding_is_each_sequence_alone,
  assert_parallel_equals_stepwise,
  assert_steps_equal_sequence,
  compiled,
  key,
  outputs_and_grads,
  randn,
)
from linear_checks import init_layer as init
from linear_checks import run_layer as run
from linear_checks import step_layer as step

from research.recurrent.gla import GLA, gated_linear_attention

pytestmark = pytest.mark.usefixtures("highest_precision")
torch.set_num_threads(1)

B, T, F, N = 2, 7, 8, 4       # batch, time, width, state_size: M = 2 heads, d_v = 4, d_k = 2
M, DK, DV = F // N, N // 2, N
RANK = 3                      # gate_rank (16 by default; 3 makes a transposed W_α a shape error)
close = lambda a, b, tol: np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def make(**kwargs):
  """A GLA of chunks of 3 steps (T = 7: the last chunk padded) and random parameters of
  order one (the initialisation's are small: errors would hide in them)."""
  module = GLA(**{"state_size": N, "gate_rank": RANK, "chunk_size": 3, **kwargs})
  variables = init(module.clone(mode="parallel"), key(0), jnp.zeros((B, T, F)))
  variables = jax.tree.map(lambda p: 0.5 * randn(p.size, *p.shape), variables)
  return module, variables


# -- the recurrence against fla's naive_recurrent_gla ------------------------------------------

def gates(kind: str, shape) -> np.ndarray:
  """log α: at the initialisation's scale, strong, −30 everywhere (e^{−30} a step: any
  exp(−b_s) overflows float32 after 3 steps), and −30 for 4 steps then mild ones (a chunk's
  cumulative sums large, the later decays between its steps near 1)."""
  noise = randn(3, *shape)
  mild = np.log(1.0 / (1.0 + np.exp(-noise))) / 16.0
  return {"mild": mild, "strong": -3.0 * np.abs(noise), "extreme": np.full(shape, -30.0),
          "mixed": np.where(np.arange(shape[1])[:, None, None] < 4, -30.0, mild)
          }[kind].astype(np.float32)


@compiled
def core_and_grads(chunk_size, q, k, v, log_alpha, h0, d_o, d_h):
  def loss(*inputs):
    o, h = gated_linear_attention(*inputs, chunk_size)
    return jnp.vdot(o, d_o) + jnp.vdot(h, d_h), (o, h)
  (_, outputs), grads = jax.value_and_grad(loss, argnums=range(5), has_aux=True)(
      q, k, v, log_alpha, h0)
  return outputs, grads


@pytest.mark.parametrize("chunk_size", [3, 1, 16, None], ids=["chunks_of_3", "chunks_of_1",
                                                              "one_chunk", "stepwise"])
def test_recurrence_matches_fla_naive_recurrent_gla(chunk_size):
  """Outputs and final state within 1e-5, gradients of q, k, v, log α and S_0 within 1e-4,
  T = 10 (chunks of 3: the last one padded), d_k = 3 ≠ d_v = 4."""
  b, t, m, dk, dv = 2, 10, 2, 3, 4
  q, k, v = randn(0, b, t, m, dk), randn(1, b, t, m, dk), randn(2, b, t, m, dv)
  h0, d_o, d_h = randn(4, b, m, dk, dv), randn(5, b, t, m, dv), randn(6, b, m, dk, dv)
  reference = naive("gla").naive_recurrent_gla
  for kind in ("mild", "strong", "extreme", "mixed"):
    log_alpha = gates(kind, (b, t, m, dk))
    (o, h), grads = core_and_grads(chunk_size, q, k, v, log_alpha, h0, d_o, d_h)
    inputs = [torch.tensor(a, requires_grad=True) for a in (q, k, v, log_alpha, h0)]
    o_ref, h_ref = reference(*inputs[:4], initial_state=inputs[4], output_final_state=True)
    (torch.sum(o_ref * torch.tensor(d_o)) + torch.sum(h_ref * torch.tensor(d_h))).backward()
    close(o, o_ref.detach().numpy(), FORWARD_TOL)
    close(h, h_ref.detach().numpy(), FORWARD_TOL)
    for grad, tensor in zip(grads, inputs):
      close(grad, tensor.grad.numpy(), GRAD_TOL)


# -- the layer against fla's layer equations ---------------------------------------------------

def linear(weight: np.ndarray, inputs: int, bias: np.ndarray | None = None) -> torch.nn.Linear:
  """An nn.Linear holding our weight [inputs, ...] (torch keeps [outputs, inputs])."""
  layer = torch.nn.Linear(inputs, weight.size // inputs, bias=bias is not None)
  with torch.no_grad():
    layer.weight.copy_(torch.tensor(np.asarray(weight).reshape(inputs, -1).T))
    if bias is not None:
      layer.bias.copy_(torch.tensor(np.asarray(bias).reshape(-1)))
  return layer


class FlaGLA:
  """fla's GatedLinearAttention.forward (fla/layers/gla.py: mode fused_recurrent, no
  short convolution, output gate with swish, fuse_norm: FusedRMSNormGated over each head's
  d_v values, eps 1e-5) with our parameters, and its naive recurrence."""

  def __init__(self, params, temperature: float = 16.0, eps: float = 1e-5):
    width, heads, self.key_size = params["query"].shape
    self.value_size = params["value"].shape[-1]
    rank = params["gate_down"].shape[-1]
    self.q_proj, self.k_proj = linear(params["query"], width), linear(params["key"], width)
    self.v_proj, self.g_proj = linear(params["value"], width), linear(params["output_gate"], width)
    self.gk_proj = torch.nn.Sequential(linear(params["gate_down"], width),
                                       linear(params["gate_up"], rank, params["gate_bias"]))
    self.o_proj = linear(params["out"], heads * self.value_size)
    self.norm_weight = torch.nn.Parameter(torch.tensor(np.asarray(params["norm_scale"])))
    self.temperature, self.eps = temperature, eps

  def __call__(self, x: torch.Tensor, h0: torch.Tensor | None = None):
    heads = lambda a, d: a.reshape(*a.shape[:-1], -1, d)
    q, k = heads(self.q_proj(x), self.key_size), heads(self.k_proj(x), self.key_size)
    v = heads(self.v_proj(x), self.value_size)
    gk = torch.nn.functional.logsigmoid(heads(self.gk_proj(x), self.key_size)) / self.temperature
    o, h = naive("gla").naive_recurrent_gla(q, k, v, gk, initial_state=h0,
                                            output_final_state=True)
    g = heads(self.g_proj(x), self.value_size)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_weight
    o = o * torch.nn.functional.silu(g)
    return self.o_proj(o.reshape(*o.shape[:-2], -1)), h

  def grads(self) -> dict[str, np.ndarray]:
    """The parameters' gradients in our names and shapes."""
    ours = lambda layer: layer.weight.grad.numpy().T
    return {"query": ours(self.q_proj), "key": ours(self.k_proj), "value": ours(self.v_proj),
            "output_gate": ours(self.g_proj), "gate_down": ours(self.gk_proj[0]),
            "gate_up": ours(self.gk_proj[1]), "gate_bias": self.gk_proj[1].bias.grad.numpy(),
            "norm_scale": self.norm_weight.grad.numpy(), "out": ours(self.o_proj)}


@compiled
def layer_and_grads(module, variables, x, cotangent, h0):
  """y, S_T and the gradients of <y, cotangent> + Σ S_T with respect to (variables, x)."""
  def loss(variables, x):
    y, state = module.apply(variables, x, initial_state=h0)
    return jnp.vdot(y, cotangent) + jnp.sum(state), (y, state)
  return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(variables, x)


def extreme_gates(params):
  """W_α2 = 0 and b_α = −480: log α = logsigmoid(−480) / 16 = −30 at every step."""
  return {**params, "gate_up": 0.0 * params["gate_up"],
          "gate_bias": np.full_like(params["gate_bias"], -480.0)}


@pytest.mark.parametrize("kwargs, extreme", [
    (dict(), False), (dict(mode="stepwise", gate_temperature=1.0, norm_eps=1e-2), False),
    (dict(chunk_size=1), True)],
    ids=["chunks_of_3", "stepwise_temperature_1", "chunks_of_1_extreme_gates"])
def test_layer_matches_fla_equations(kwargs, extreme):
  """Outputs, final state and the gradients of <y, c> + Σ S_T with respect to every
  parameter and x, from an initial state."""
  module, variables = make(**kwargs)
  params = extreme_gates(variables["params"]) if extreme else variables["params"]
  variables = {"params": params}
  x, cotangent, h0 = randn(10, B, T, F), randn(11, B, T, F), randn(12, B, M, DK, DV)
  (_, (y, state)), (grads, d_x) = layer_and_grads(module, variables, x, cotangent, h0)

  reference = FlaGLA(params, module.gate_temperature, module.norm_eps)
  x_torch = torch.tensor(x, requires_grad=True)
  y_ref, h_ref = reference(x_torch, torch.tensor(h0))
  (torch.sum(y_ref * torch.tensor(cotangent)) + torch.sum(h_ref)).backward()
  close(y, y_ref.detach().numpy(), FORWARD_TOL)
  close(state, h_ref.detach().numpy(), FORWARD_TOL)
  close(d_x, x_torch.grad.numpy(), GRAD_TOL)
  expected = reference.grads()
  assert set(expected) == set(grads["params"])
  for name, grad in grads["params"].items():
    close(grad, expected[name].reshape(grad.shape), GRAD_TOL)


def test_bidirectional_adds_the_reverse_direction_over_each_sequence_flipped():
  """y = fla's layer with the forward parameters + (with the reverse ones over the
  sequence's valid steps reversed, reversed back); zeros past the length; the carry holds
  each direction's state after its last step."""
  module, variables = make(bidirectional=True)
  x, lengths = randn(10, B, T, F), [T, 4]
  y, state = run(module, variables, x, seq_lengths=jnp.asarray(lengths))
  params = variables["params"]
  for b, n in enumerate(lengths):
    valid = torch.tensor(x[b:b + 1, :n])
    directions = [FlaGLA({name: p[d] for name, p in params.items()}) for d in (0, 1)]
    forward, h_forward = directions[0](valid)
    backward, h_backward = directions[1](valid.flip(1))
    close(y[b, :n], (forward + backward.flip(1))[0].detach().numpy(), FORWARD_TOL)
    np.testing.assert_array_equal(y[b, n:], 0.0)
    close(state[:, b], torch.cat([h_forward, h_backward]).detach().numpy(), FORWARD_TOL)


# -- the forms, steps, padding and causality against each other --------------------------------

def test_parallel_equals_stepwise_with_lengths_and_initial_state():
  module, variables = make()
  assert_parallel_equals_stepwise(run, module, variables, randn(0, B, T, F),
                                  seq_lengths=jnp.array([T, 3]),
                                  initial_state=randn(5, B, M, DK, DV))


def test_steps_equal_the_sequence():
  module, variables = make()
  assert_steps_equal_sequence(run, step, module, variables, randn(0, B, T, F),
                              randn(5, B, M, DK, DV))


def test_padding_equals_each_sequence_alone():
  module, variables = make()
  assert_padding_is_each_sequence_alone(run, module, variables, randn(0, B, T, F), [T, 2])


def test_a_sequence_of_length_zero_keeps_its_initial_state():
  module, variables = make()
  h0 = randn(5, B, M, DK, DV)
  y, state = run(module, variables, randn(0, B, T, F), initial_state=h0,
                 seq_lengths=jnp.array([0, T]))
  np.testing.assert_array_equal(y[0], 0.0)
  np.testing.assert_array_equal(state[0], h0[0])


def test_causal():
  module, variables = make()
  assert_causal(run, module, variables, randn(0, B, T, F), t0=4)


def test_bfloat16_computation():
  """Projections in bfloat16 (8-bit mantissas: x and the weights rounded by up to 2⁻⁹ each,
  the outputs of order one by a few 10⁻³, the norm and gates compounding it): within 5e-2
  of float32; the carry stays float32."""
  module, variables = make()
  x = randn(0, B, T, F)
  y, state = run(module.clone(dtype=jnp.bfloat16), variables, x)
  y32, state32 = run(module, variables, x)
  assert y.dtype == jnp.bfloat16 and state.dtype == jnp.float32
  close(y.astype(jnp.float32), y32, 5e-2)
  close(state, state32, 5e-2)


@pytest.mark.slow
@pytest.mark.long
def test_a_long_sequence_at_the_initialisation_is_finite_and_the_forms_agree():
  """T = 16 384 at the paper's initialisation, chunks of 64 (the cumulative log-gate of a
  chunk is about −2.8; of the sequence, −700): outputs, carry and every gradient finite and
  the two forms equal."""
  module = GLA(state_size=N, chunk_size=64)
  x = randn(0, 1, 16384, F)
  variables = init(module, key(1), x[:, :8])
  cotangent = randn(1, *x.shape)
  (y_p, g_p), (y_s, g_s) = (outputs_and_grads(run, module.clone(mode=mode), variables, x,
                                              cotangent) for mode in ("parallel", "stepwise"))
  for leaf in jax.tree.leaves((y_p, g_p)):
    assert np.isfinite(leaf).all()
  close(y_p, y_s, FORWARD_TOL)
  jax.tree.map(lambda a, b: close(a, b, GRAD_TOL), g_p, g_s)


# -- options and initialisation ----------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(state_size=3), r"state_size=3 \(each head's value size\) must divide the width, 8"),
    (dict(expand_k=0.3), r"expand_k · state_size \(each head's key size\) must be a positive "
                         r"integer, got 0\.3 · 4 = 1\.2"),
    (dict(expand_k=0.0), "expand_k must be a positive number, got 0.0"),
    (dict(expand_k=True), "expand_k must be a positive number, got True"),
    (dict(gate_rank=0), "gate_rank must be a positive int, got 0"),
    (dict(gate_temperature=-1.0), "gate_temperature must be a positive number, got -1.0"),
    (dict(gate_temperature=math.inf), "gate_temperature must be a finite number, got inf"),
    (dict(norm_eps=0.0), "norm_eps must be a positive number, got 0.0"),
    (dict(mode="chunked"), r"mode must be one of \('parallel', 'stepwise'\), got 'chunked'"),
    (dict(chunk_size=0), "chunk_size must be a positive int, got 0"),
])
def test_bad_options_are_refused_in_one_line(kwargs, message):
  module = GLA(**{"state_size": N, **kwargs})
  with pytest.raises(ValueError, match=message) as error:
    jax.eval_shape(lambda: module.init(jax.random.key(0), jnp.zeros((B, T, F))))
  assert "\n" not in str(error.value)


def test_initialisation_is_xavier_uniform_with_gain_2_to_the_minus_2_5():
  """Every projection U(±2^{−2.5} √(6 / (fan_in + fan_out))) over the whole matrix (its
  largest entries near the bound, its variance bound² / 3); b_α = 0, γ = 1; the two
  directions drawn apart; the parameter count."""
  width, size = 64, 16                                           # M = 4, d_k = 8, d_v = 16
  module = GLA(state_size=size, bidirectional=True)
  params = init(module, key(2), jnp.zeros((1, 2, width)))["params"]
  keys, values, rank = width // 2, width, module.gate_rank
  fans = {"query": (width, keys), "key": (width, keys), "value": (width, values),
          "output_gate": (width, values), "gate_down": (width, rank), "gate_up": (rank, keys),
          "out": (values, width)}
  for name, (fan_in, fan_out) in fans.items():
    w = np.asarray(params[name])
    assert w.shape[0] == 2 and w[0].size == fan_in * fan_out
    bound = 2.0**-2.5 * math.sqrt(6.0 / (fan_in + fan_out))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound, name
    assert np.var(w) == pytest.approx(bound**2 / 3, rel=0.15), name
    assert not np.allclose(w[0], w[1]), name
  np.testing.assert_array_equal(params["gate_bias"], 0.0)
  np.testing.assert_array_equal(params["norm_scale"], 1.0)
  assert params["gate_bias"].shape == (2, 4, 8) and params["norm_scale"].shape == (2, size)
  count = sum(np.size(p) for p in jax.tree.leaves(params))
  assert count == module.parameter_count(width)
