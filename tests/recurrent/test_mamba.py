"""Mamba (Gu & Dao 2023): mambapy's `MambaBlock` (pure PyTorch, the reference code's
`mamba_simple.py` block) as the reference, its weights carried across by
`params_from_mambapy`: outputs (its parallel scan and its sequential one) and every
gradient (torch autograd) for each form, its `step` with its cache, each sequence of a
padded batch stepped from an initial cache and the cache after its last valid step, both
directions. `selective_scan` alone (outputs, last state, every gradient, the last state's
cotangent included) against the S6 recurrence written out step by step in torch. The
forms, single steps, causality and dtypes against each other; the initialisation against
its definition and mambapy's. (The two forms' gradients are each checked against torch's,
not against each other: that compiled two more programs, 4 s.)

The layer's carry is a pair (convolution inputs, state): the shared checks of
linear_checks (one array per carry) see it flattened to [B, (K − 1)·D + D·N] by `run`
and `step` here."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from linear_checks import (
  FORWARD_TOL,
  GRAD_TOL,
  QUICK_COMPILE,
  assert_causal,
  assert_parallel_equals_stepwise,
  assert_steps_equal_sequence,
  compiled,
  key,
  randn,
)

from research.recurrent.mamba import Mamba, params_from_mambapy
from research.recurrent.selective_scan import selective_scan

mambapy = pytest.importorskip("mambapy.mamba")
pytestmark = pytest.mark.usefixtures("highest_precision")
torch.set_num_threads(1)

B, T, F, N = 2, 7, 8, 4       # batch, time, width, states per channel (D = 2F = 16)


def flatten(state, lead: int):
  """The carry's arrays side by side, each [*lead axes, rest]."""
  return jnp.concatenate([s.reshape(s.shape[:lead] + (-1,)) for s in state], -1)


def unflatten(module, flat, batch: int, features: int):
  zero = module.zero_state(batch, features)
  lead = (2,) if module.bidirectional else ()
  bounds = np.cumsum([z[0].size for z in zero])[:-1]
  return tuple(part.reshape(lead + z.shape)
               for part, z in zip(jnp.split(flat, bounds, axis=-1), zero))


@compiled
def run(module, variables, x, initial_state=None, **kwargs):
  """The layer, its carry flattened (see the module docstring)."""
  if initial_state is not None:
    initial_state = unflatten(module, initial_state, x.shape[0], x.shape[-1])
  y, state = module.apply(variables, x, initial_state=initial_state, **kwargs)
  return y, flatten(state, 2 if module.bidirectional else 1)


@compiled
def run_pair(module, variables, x, **kwargs):
  """The layer with its carry as it is."""
  return module.apply(variables, x, **kwargs)


@compiled
def step(module, variables, state, x_t):
  state, y = module.apply(variables, unflatten(module, state, *x_t.shape), x_t, method="step")
  return flatten(state, 1), y


@compiled
def outputs_and_grads(module, params, x, cotangent):
  """y and the gradients of <y, cotangent> for (params, x)."""
  def loss(params, x):
    y, _ = module.apply({"params": params}, x)
    return jnp.vdot(y, cotangent), y
  (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
  return y, grads


def reference(features=F, state_size=N, expand=2, conv_size=4, dt_rank="auto", pscan=False,
              seed=0) -> torch.nn.Module:
  """A mambapy MambaBlock, the paper's (no projection biases, a convolution bias, no inner
  norms, no CUDA), with Δ initialised larger than the paper's (dt in [0.05, 0.5]) and A_log,
  D moved off their constant initial values, so that the recurrence and every term count."""
  torch.manual_seed(seed)
  config = mambapy.MambaConfig(d_model=features, n_layers=1, d_state=state_size,
                               expand_factor=expand, d_conv=conv_size, dt_rank=dt_rank,
                               dt_min=0.05, dt_max=0.5, bias=False, conv_bias=True,
                               inner_layernorms=False, pscan=pscan, use_cuda=False)
  block = mambapy.MambaBlock(config)
  with torch.no_grad():
    block.A_log.add_(0.3 * torch.randn_like(block.A_log))
    block.D.add_(0.5 * torch.randn_like(block.D))
  return block


def carried(block: torch.nn.Module) -> dict:
  return params_from_mambapy({k: v.detach().numpy() for k, v in block.state_dict().items()})


def twin(block: torch.nn.Module) -> torch.nn.Module:
  """The same block with the other selective scan (parallel <-> sequential)."""
  other = mambapy.MambaBlock(dataclasses.replace(block.config, pscan=not block.config.pscan))
  other.load_state_dict(block.state_dict())
  return other


def make(**kwargs):
  """The layer with mambapy's (moved) parameters."""
  params = carried(reference())
  if kwargs.get("bidirectional"):
    params = jax.tree.map(lambda p: np.stack([p, p + 0.1 * randn(p.size, *p.shape)]), params)
  return Mamba(state_size=N, chunk_size=4, **kwargs), {"params": params}


def random_state(module, seed: int, batch: int = B):
  zero = module.zero_state(batch, F)
  lead = (2,) if module.bidirectional else ()
  return flatten(tuple(randn(seed + i, *lead, *z.shape) for i, z in enumerate(zero)),
                 len(lead) + 1)


CASES = {   # (batch, time, width, states, expand, conv taps, dt_rank, layer options)
    "chunks-of-3-last-one-short": (2, 7, 8, 4, 2, 4, "auto", dict(chunk_size=3)),
    "chunk-1-no-convolution-carry": (1, 5, 6, 3, 3, 1, 2, dict(chunk_size=1)),
    "chunk-longer-than-the-sequence": (2, 6, 4, 2, 2, 3, 3, dict(chunk_size=8)),
    "stepwise": (2, 7, 8, 4, 2, 4, "auto", dict(mode="stepwise")),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_matches_mambapy_outputs_and_gradients(case):
  """Outputs against both of mambapy's scans; the gradients for x and every parameter
  against torch autograd through its sequential scan."""
  batch, steps, features, n, expand, taps, rank, options = case
  block = reference(features, n, expand, taps, rank)
  module = Mamba(state_size=n, expand=expand, conv_size=taps, dt_rank=rank, **options)
  x, cotangent = randn(0, batch, steps, features), randn(1, batch, steps, features)
  x_torch = torch.tensor(x, requires_grad=True)
  y_torch = block(x_torch)
  torch.sum(y_torch * torch.tensor(cotangent)).backward()
  y, (grads, d_x) = outputs_and_grads(module, carried(block), x, cotangent)
  for expected in (y_torch.detach().numpy(), twin(block)(torch.tensor(x)).detach().numpy()):
    np.testing.assert_allclose(y, expected, rtol=FORWARD_TOL, atol=FORWARD_TOL)
  expected = params_from_mambapy({k: p.grad.numpy() for k, p in block.named_parameters()})
  assert set(grads) == set(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(grads[name], value, rtol=GRAD_TOL, atol=GRAD_TOL, err_msg=name)
  np.testing.assert_allclose(d_x, x_torch.grad.numpy(), rtol=GRAD_TOL, atol=GRAD_TOL)


def mambapy_cache(state) -> tuple[torch.Tensor, torch.Tensor]:
  """Our carry (inputs [B, K − 1, D], h [B, D, N]) as mambapy's cache (h, inputs
  [B, D, K − 1])."""
  inputs, h = state
  return torch.tensor(np.asarray(h)), torch.tensor(np.asarray(inputs).transpose(0, 2, 1))


def assert_carry_is_the_cache(state, cache):
  """Our carry (inputs [B, K − 1, D], h) against mambapy's cache (h, inputs [B, D, K − 1])."""
  h, inputs = cache
  np.testing.assert_allclose(state[0], inputs.numpy().transpose(0, 2, 1), rtol=FORWARD_TOL,
                             atol=FORWARD_TOL)
  np.testing.assert_allclose(state[1], h.numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)


@torch.no_grad()
def test_step_matches_mambapy_step_from_a_carried_cache():
  """Token by token from a random carry, which is mambapy's cache (h, inputs) transposed."""
  block = reference()
  module, variables = make()
  state = random_state(module, 5)
  cache = mambapy_cache(unflatten(module, state, B, F))
  x = randn(0, B, T, F)
  for t in range(T):
    y_torch, cache = block.step(torch.tensor(x[:, t]), cache)
    state, y = step(module, variables, state, x[:, t])
    np.testing.assert_allclose(y, y_torch.numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)
    assert_carry_is_the_cache(unflatten(module, state, B, F), cache)


@torch.no_grad()
def test_padding_each_sequence_is_mambapy_stepping_through_it_from_the_initial_state():
  """seq_lengths [7, 3, 1, 0] and an initial carry: each row's valid steps are mambapy's
  steps through that sequence alone from the same cache, the rest exactly zero, and the
  final carry is mambapy's cache after the row's last valid step (the initial one for
  length 0)."""
  lengths = [T, 3, 1, 0]
  block = reference()
  module, variables = make()
  state = random_state(module, 5, batch=len(lengths))
  x = randn(0, len(lengths), T, F)
  y, final = run(module, variables, x, initial_state=state, seq_lengths=jnp.asarray(lengths))
  final = unflatten(module, final, len(lengths), F)
  for b, length in enumerate(lengths):
    cache = mambapy_cache([s[b:b + 1] for s in unflatten(module, state, len(lengths), F)])
    for t in range(length):
      y_t, cache = block.step(torch.tensor(x[b:b + 1, t]), cache)
      np.testing.assert_allclose(y[b:b + 1, t], y_t.numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)
    np.testing.assert_array_equal(y[b, length:], 0.0)
    assert_carry_is_the_cache([s[b:b + 1] for s in final], cache)


def test_bidirectional_is_mambapy_forwards_plus_mambapy_on_each_sequence_reversed():
  """The reverse direction (its own parameters, [1] of each) reads each sequence backwards
  from its last valid step."""
  lengths = [T, 3]
  blocks = reference(seed=0), reference(seed=1)
  params = jax.tree.map(lambda *p: np.stack(p), *map(carried, blocks))
  module = Mamba(state_size=N, chunk_size=4, bidirectional=True)
  x = randn(0, B, T, F)
  y, _ = run(module, {"params": params}, x, seq_lengths=jnp.asarray(lengths),
             initial_state=jnp.zeros_like(random_state(module, 0)))
  for b, length in enumerate(lengths):
    valid = torch.tensor(x[b:b + 1, :length])
    expected = blocks[0](valid) + blocks[1](valid.flip(1)).flip(1)
    np.testing.assert_allclose(y[b:b + 1, :length], expected.detach().numpy(),
                               rtol=FORWARD_TOL, atol=FORWARD_TOL)
    np.testing.assert_array_equal(y[b, length:], 0.0)


def test_parallel_equals_stepwise_bidirectional_with_lengths_and_initial_state():
  module, variables = make(bidirectional=True)
  assert_parallel_equals_stepwise(run, module, variables, randn(0, B, T, F),
                                  seq_lengths=jnp.array([T, 3]),
                                  initial_state=random_state(module, 5))


def test_step_by_step_equals_the_sequence_from_an_initial_state():
  module, variables = make()
  assert_steps_equal_sequence(run, step, module, variables, randn(0, B, T, F),
                              random_state(module, 5))


def test_causal():
  module, variables = make()
  assert_causal(run, module, variables, randn(0, B, T, F), t0=3)


def test_bfloat16_computation():
  """The projections in bfloat16 (8-bit mantissa: each rounding of x and the weights is
  off by up to 2⁻⁹ relatively, and four projections compound it), the carry float32."""
  module, variables = make()
  x = randn(0, B, T, F)
  y, (conv, h) = run_pair(module.clone(dtype=jnp.bfloat16), variables, x)
  y32, _ = run(module, variables, x)
  assert y.dtype == jnp.bfloat16 and conv.dtype == h.dtype == jnp.float32
  np.testing.assert_allclose(y.astype(jnp.float32), y32, rtol=5e-2, atol=5e-2)


@functools.partial(jax.jit, static_argnums=(0, 1), compiler_options=QUICK_COMPILE)
def scan_and_grads(parallel, chunk, inputs, d_y, d_h):
  """selective_scan's (y, h_last) and the gradients of <y, d_y> + <h_last, d_h> for its
  six inputs."""
  def loss(inputs):
    y, h_last = selective_scan(*inputs, parallel=parallel, chunk=chunk)
    return jnp.vdot(y, d_y) + jnp.vdot(h_last, d_h), (y, h_last)
  return jax.grad(loss, has_aux=True)(inputs)[::-1]


def test_selective_scan_is_the_s6_recurrence_written_out():
  """selective_scan's y, h_last and gradients (for Δ, u, B, C, A, h0) against the paper's
  recurrence in torch, one step at a time: parallel with chunks of 3 (two stretches of 2
  steps, the second padded; the last chunk short) and of 7 (three stretches of 3, the last
  chunk 4 steps), and stepwise (also the parallel form's path for a chunk ≥ T)."""
  steps, inner = 11, 3
  delta = np.abs(randn(0, B, steps, inner))
  inputs = (delta, randn(1, B, steps, inner), randn(2, B, steps, N), randn(3, B, steps, N),
            -np.exp(randn(4, inner, N)), randn(5, B, inner, N))
  d_y, d_h = randn(6, B, steps, inner), randn(7, B, inner, N)
  delta_t, u_t, b_t, c_t, a_t, h = leaves = [torch.tensor(v, requires_grad=True) for v in inputs]
  ys = []
  for t in range(steps):
    h = torch.exp(delta_t[:, t, :, None] * a_t) * h \
        + (delta_t[:, t] * u_t[:, t])[:, :, None] * b_t[:, t, None, :]
    ys.append(torch.einsum("bdn,bn->bd", h, c_t[:, t]))
  y_torch = torch.stack(ys, 1)
  (torch.sum(y_torch * torch.tensor(d_y)) + torch.sum(h * torch.tensor(d_h))).backward()
  for parallel, chunk in ((True, 3), (True, 7), (False, 3)):
    (y, h_last), grads = scan_and_grads(parallel, chunk, inputs, d_y, d_h)
    np.testing.assert_allclose(y, y_torch.detach().numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)
    np.testing.assert_allclose(h_last, h.detach().numpy(), rtol=FORWARD_TOL, atol=FORWARD_TOL)
    for got, leaf in zip(grads, leaves):
      np.testing.assert_allclose(got, leaf.grad.numpy(), rtol=GRAD_TOL, atol=GRAD_TOL)


@pytest.mark.slow   # 16 384 steps, three programs compiled: 3 to 6 s
@pytest.mark.long
def test_long_sequences_stay_finite_and_the_forms_agree():
  """T = 16 384 at the paper's initialisation: the chunks' decays exp(A Σ Δ) underflow at
  worst; outputs of the two forms agree and the gradients are finite."""
  module = Mamba(state_size=16, chunk_size=256)
  x = randn(0, 1, 16384, 4)
  variables = jax.jit(module.init)(key(0), x[:, :8])
  y_p, h_p = run(module, variables, x)
  y_s, h_s = run(module.clone(mode="stepwise"), variables, x)
  np.testing.assert_allclose(y_p, y_s, rtol=FORWARD_TOL, atol=FORWARD_TOL)
  np.testing.assert_allclose(h_p, h_s, rtol=FORWARD_TOL, atol=FORWARD_TOL)
  grads = outputs_and_grads(module, variables["params"], x, randn(1, 1, 16384, 4))[1]
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_initialisation_is_the_reference_blocks():
  """A_log = log(n + 1) and D = 1 exactly; Δ's bias softplus⁻¹ of a log-uniform dt in
  [dt_min, dt_max] floored at dt_init_floor; the weights uniform on ±1/√fan_in (W_dt on
  ±dt_scale/√R), each bound and spread as mambapy's block draws them."""
  features, dt_min, dt_max, floor = 64, 1e-5, 0.1, 1e-3
  module = Mamba(dt_min=dt_min, dt_max=dt_max, dt_init_floor=floor, dt_scale=2.0)
  params = jax.jit(module.init)(key(3), jnp.zeros((1, 1, features)))["params"]
  config = mambapy.MambaConfig(d_model=features, n_layers=1, dt_min=dt_min, dt_max=dt_max,
                               dt_scale=2.0)
  config.dt_init_floor = floor        # a class attribute in mambapy's config, not a field
  torch.manual_seed(0)
  theirs = carried(mambapy.MambaBlock(config))
  inner, rank = 2 * features, 4
  np.testing.assert_allclose(params["A_log"], np.log(np.tile(np.arange(1, 17), (inner, 1))),
                             rtol=1e-6)
  np.testing.assert_array_equal(params["D"], 1.0)
  np.testing.assert_allclose(theirs["A_log"], params["A_log"], rtol=1e-6)
  dt = np.asarray(jax.nn.softplus(params["dt_bias"]))
  assert dt.min() == pytest.approx(floor, rel=1e-4) and dt.max() <= dt_max * (1 + 1e-5)
  assert np.mean(dt == dt.min()) == pytest.approx(0.5, abs=0.15)   # P(dt < floor) = 1/2
  bounds = {"in_proj": 1 / 8, "conv_kernel": 1 / 2, "conv_bias": 1 / 2, "x_proj": 1 / math.sqrt(inner),
            "dt_proj": 2.0 / math.sqrt(rank), "out_proj": 1 / math.sqrt(inner)}
  for name, bound in bounds.items():
    for value in (params[name], theirs[name]):
      assert np.abs(value).max() <= bound and np.abs(value).max() > 0.9 * bound, name
      assert np.std(value) == pytest.approx(bound / math.sqrt(3), rel=0.2), name
    assert np.shape(params[name]) == np.shape(theirs[name]), name
  assert module.parameter_count(features) == sum(np.size(v) for v in theirs.values())


@pytest.mark.parametrize("kwargs, message", [
    (dict(expand=0), "expand must be a positive int, got 0"),
    (dict(expand=1.5), "expand must be a positive int, got 1.5"),
    (dict(conv_size=0), "conv_size must be a positive int, got 0"),
    (dict(dt_rank=0), "dt_rank must be 'auto' or a positive int, got 0"),
    (dict(dt_rank="full"), "dt_rank must be 'auto' or a positive int, got 'full'"),
    (dict(dt_min=0.0), r"need 0 < dt_min <= dt_max, got dt_min=0\.0, dt_max=0\.1"),
    (dict(dt_min=0.2), r"need 0 < dt_min <= dt_max, got dt_min=0\.2, dt_max=0\.1"),
    (dict(dt_max=math.inf), "dt_max must be a finite number, got inf"),
    (dict(dt_init_floor=-1.0), "dt_init_floor must be >= 0, got -1.0"),
    (dict(dt_scale=-1.0), "dt_scale must be >= 0, got -1.0"),
    (dict(state_size=0), "state_size must be a positive int, got 0"),
    (dict(mode="scan"), r"mode must be one of \('parallel', 'stepwise'\), got 'scan'"),
    (dict(chunk_size=0), "chunk_size must be a positive int, got 0"),
])
def test_bad_config_is_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(lambda: Mamba(**kwargs).init(jax.random.key(0), jnp.zeros((B, T, F))))
