"""DeltaNet: the delta rule against fla-core's naive `delta_rule_recurrence` (outputs, final
state, torch autograd gradients of q, k, v, β and the initial state) and `delta_rule_chunkwise`,
at β spread over (0, 1), near 0 (some exactly 0), near 1 (some exactly 1) and in (0, 2), in
chunks of 1, 3, ≥ T and 64 steps (against the chunkwise form: 4 and 32); the layer against fla's DeltaNet layer
(fla/layers/delta_net.py) written out below in torch around `delta_rule_recurrence`, with our
weights (projections, the short convolutions with their cache, SiLU, L2 norm, sigmoid β, the
(gated) RMSNorm, the output projection); the two forms, single steps, padding, both
directions, bfloat16 and causality against each other; the options refused and the
initialisation's distributions.

Slow (module-level, marked below; one or two compilations of a second or more each, beside
the ~20 others): a 16 384-step sequence at the initialisation, forward and backward in both
forms (8 s); the layer against fla's with a conv of one tap (an edge beside the cases of 4, 9
and no conv); the delta rule in chunks of 1 and in one chunk longer than T (the layer's cases
against fla's run these too)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as tF
from fla_reference import naive
from linear_checks import (
  GRAD_TOL,
  assert_causal,
  assert_parallel_equals_stepwise,
  compiled,
  key,
  randn,
)
from linear_checks import init_layer as init
from linear_checks import step_layer as step

from research.recurrent.deltanet import DeltaNet, delta_rule_chunked, delta_rule_step

pytestmark = pytest.mark.usefixtures("highest_precision")
torch.set_num_threads(1)

B, T, F, N = 2, 7, 8, 4       # batch, time, width, state_size: M = 2 heads of d = 4
M, K = F // N, 4              # heads, conv_size (fla's default)
TOL = 1e-5                    # outputs against the references
close = lambda a, b, tol=TOL: np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def make(**kwargs):
  """A DeltaNet of chunks of 3 steps (T = 7: the last chunk padded) and random parameters
  of order one (the initialisation's are small: errors would hide in them)."""
  module = DeltaNet(**{"state_size": N, "chunk_size": 3, **kwargs})
  variables = init(module.clone(mode="parallel"), key(0), jnp.zeros((B, T, F)))
  variables = jax.tree.map(lambda p: 0.5 * randn(p.size, *p.shape), variables)
  return module, variables


def carry(seed: int, module: DeltaNet, batch: int = B):
  """A random carry of the module's form: (conv inputs, Ŝ)."""
  conv, s = module.zero_state(batch, F)
  return randn(seed, *conv.shape), randn(seed + 1, *s.shape)


def flat(state) -> jax.Array:
  """The carry's leaves side by side, [(2,) batch, ·]: the form linear_checks compares."""
  conv, s = state
  lead = conv.shape[:-2]
  return jnp.concatenate([jnp.reshape(conv, lead + (-1,)), jnp.reshape(s, lead + (-1,))], -1)


@compiled
def run(module, variables, x, **kwargs):
  """(y, the final carry flattened by `flat`)."""
  y, last = module.apply(variables, x, **kwargs)
  return y, flat(last)


# Most checks run this one call (one compilation): three sequences, of lengths T, 2 and 0,
# from a random initial carry.
X3, LENGTHS3 = randn(0, 3, T, F), jnp.array([T, 2, 0])


def run3(module, variables, x=X3, lengths=LENGTHS3, seed=3):
  return run(module, variables, x, seq_lengths=lengths, initial_state=carry(seed, module, 3))


@compiled
def outputs_and_grads(module, variables, x, cotangent, initial_state):
  """y, the final carry and the gradients of <y, cotangent> + Σ carry with respect to
  (variables, x, initial_state)."""
  def loss(variables, x, h0):
    y, last = module.apply(variables, x, initial_state=h0)
    return jnp.vdot(y, cotangent) + sum(jnp.sum(leaf) for leaf in last), (y, last)
  grad = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
  (_, (y, last)), grads = grad(variables, x, initial_state)
  return y, last, grads


# -- the delta rule against fla's naive recurrences ---------------------------------------------

def betas(kind: str, shape) -> np.ndarray:
  """β spread over (0, 1), near 0 (with exact zeros: padding's), near 1 (with exact ones),
  or over (0, 2) (allow_neg_eigval)."""
  u = np.random.default_rng(11).uniform(size=shape).astype(np.float32)
  if kind == "near0":
    return np.where(u < 0.2, 0.0, 1e-3 * u).astype(np.float32)
  if kind == "near1":
    return np.where(u < 0.2, 1.0, 1.0 - 1e-3 * u).astype(np.float32)
  return 2.0 * u if kind == "to2" else u


def unit(x: np.ndarray) -> np.ndarray:
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


@compiled
def delta_rule_both(chunk, q, k, v, beta, s0, cot_o, cot_s):
  """The chunked and the stepwise (`delta_rule_step` in a scan) delta rule: for each, o,
  the final Ŝ and the gradients of <o, cot_o> + <Ŝ, cot_s> w.r.t. (q, k, v, β, Ŝ₀)."""
  def stepwise(q, k, v, beta, s0):
    time_major = lambda a: jnp.swapaxes(a, 0, 1)
    last, o = jax.lax.scan(lambda s, a: delta_rule_step(s, *a), s0,
                           tuple(time_major(a) for a in (q, k, v, beta)))
    return time_major(o), last

  def chunked(q, k, v, beta, s0):
    return delta_rule_chunked(q, k, v, beta, s0, chunk)

  def with_grads(form):
    def loss(*args):
      o, s = form(*args)
      return jnp.vdot(o, cot_o) + jnp.vdot(s, cot_s), (o, s)
    (_, out), grads = jax.value_and_grad(loss, argnums=tuple(range(5)), has_aux=True)(
        q, k, v, beta, s0)
    return out, grads
  return with_grads(chunked), with_grads(stepwise)


@pytest.mark.parametrize("steps, chunk, kind", [
    pytest.param(7, 3, "uniform", id="chunks_of_3"),
    pytest.param(7, 3, "near0", id="beta_near_0"),
    pytest.param(7, 3, "near1", id="beta_near_1"),
    pytest.param(7, 3, "to2", id="beta_to_2"),
    pytest.param(64, 64, "uniform", id="long_chunk"),
    pytest.param(7, 1, "uniform", id="chunks_of_1", marks=[pytest.mark.slow, pytest.mark.long]),
    pytest.param(7, 16, "uniform", id="one_chunk_longer_than_T",
                 marks=[pytest.mark.slow, pytest.mark.long])])
def test_delta_rule_matches_fla_recurrence(steps, chunk, kind):
  """Both forms against fla's delta_rule_recurrence (q scaled by d_k^−1/2 inside, as ours),
  from a random initial state: outputs and final state within 1e-5, the gradients of q, k,
  v, β and the initial state within 1e-4 (torch autograd)."""
  d = 4
  q, v = randn(0, B, steps, M, d), randn(2, B, steps, M, d)
  k = unit(randn(1, B, steps, M, d))              # the layer L2-normalises its keys
  beta, s0 = betas(kind, (B, steps, M)), randn(3, B, M, d, d)
  cot_o, cot_s = randn(4, B, steps, M, d), randn(5, B, M, d, d)

  heads_first = lambda a: torch.tensor(np.ascontiguousarray(np.swapaxes(a, 1, 2)),
                                       requires_grad=True)
  tq, tk, tv, tb = (heads_first(a) for a in (q, k, v, beta))
  ts0 = torch.tensor(s0, requires_grad=True)
  o_ref, s_ref = naive("delta_rule").delta_rule_recurrence(tq, tk, tv, tb, initial_state=ts0)
  (torch.sum(o_ref * heads_first(cot_o)) + torch.sum(s_ref * torch.tensor(cot_s))).backward()
  time_second = lambda t: np.swapaxes(t.detach().numpy(), 1, 2)
  grads_ref = [time_second(t.grad) for t in (tq, tk, tv, tb)] + [ts0.grad.numpy()]

  for (o, s), grads in delta_rule_both(chunk, q, k, v, beta, s0, cot_o, cot_s):
    close(o, time_second(o_ref))
    close(s, s_ref.detach().numpy())
    for got, expected in zip(grads, grads_ref, strict=True):
      close(got, expected, GRAD_TOL)


@pytest.mark.parametrize("steps, chunk", [(8, 4), (64, 32)])
def test_chunked_matches_fla_chunkwise(steps, chunk):
  """fla's delta_rule_chunkwise (its WY form: T by forward substitution; T a multiple of the
  chunk, zero initial state)."""
  d = 4
  q, k, v = randn(0, B, steps, M, d), unit(randn(1, B, steps, M, d)), randn(2, B, steps, M, d)
  beta = betas("uniform", (B, steps, M))
  heads_first = lambda a: torch.tensor(np.ascontiguousarray(np.swapaxes(a, 1, 2)))
  o_ref, s_ref = naive("delta_rule").delta_rule_chunkwise(
      *(heads_first(a) for a in (q, k, v, beta)), chunk_size=chunk)
  o, s = jax.jit(delta_rule_chunked, static_argnums=5)(q, k, v, beta, np.zeros((B, M, d, d),
                                                                               np.float32), chunk)
  close(o, np.swapaxes(o_ref.numpy(), 1, 2))
  close(s, s_ref.numpy())


# -- the layer against fla's DeltaNet layer, written out in torch --------------------------------

def fla_layer(params, x, h0, conv_size, use_gate, allow_neg_eigval, norm_eps):
  """fla/layers/delta_net.py's DeltaNet.forward with fla's defaults for the rest
  (qk_activation="silu", qk_norm="l2", use_beta, no conv bias), on torch tensors: our
  kernels are [in, out] (nn.Linear's weight transposed), a conv kernel [K, F] is Conv1d's
  weight [F, 1, K] (depthwise); h0 = (conv cache [B, K − 1, 3F], Ŝ₀). ShortConvolution
  with a cache is the depthwise Conv1d over the cache followed by the inputs (no padding);
  l2norm is fla's use_qk_l2norm_in_kernel (x / √(Σx² + 1e-6)); RMSNorm / FusedRMSNormGated
  ("swish") written from fla.modules.norm. Returns (y, (conv cache after, Ŝ))."""
  batch, steps, width = x.shape
  silu = tF.silu
  conv0, s0 = h0
  features, caches = [], []
  for i, name in enumerate("qkv"):
    u = x @ params[f"{name}_proj"]
    if conv_size:
      inputs = torch.cat([conv0[:, :, i * width:(i + 1) * width], u], 1)   # [B, K − 1 + T, F]
      weight = params[f"{name}_conv1d"].T[:, None, :]                     # [F, 1, K]
      u = tF.conv1d(inputs.transpose(1, 2), weight, groups=width).transpose(1, 2)
      caches.append(inputs[:, steps:])
    features.append(silu(u))
  q, k, v = (a.reshape(batch, steps, M, -1) for a in features)
  l2norm = lambda a: a / torch.sqrt((a * a).sum(-1, keepdim=True) + 1e-6)
  q, k = l2norm(q), l2norm(k)
  beta = torch.sigmoid(x @ params["b_proj"])
  if allow_neg_eigval:
    beta = beta * 2.0
  heads_first = lambda a: a.transpose(1, 2)
  o, s = naive("delta_rule").delta_rule_recurrence(*map(heads_first, (q, k, v, beta)),
                                                   initial_state=s0)
  o = heads_first(o)                                                      # [B, T, M, d]
  o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + norm_eps) * params["o_norm"]
  if use_gate:
    o = o * silu(x @ params["g_proj"]).reshape(batch, steps, M, -1)
  y = o.reshape(batch, steps, width) @ params["o_proj"]
  return y, (torch.cat(caches, -1) if conv_size else conv0, s)


LAYER_CASES = {
    "defaults": dict(),
    "gate_neg_eigval_eps_conv_9_one_chunk": dict(use_gate=True, allow_neg_eigval=True,
                                                 norm_eps=1e-2, conv_size=9, chunk_size=16),
    "no_conv_chunks_of_1": dict(conv_size=0, chunk_size=1),
    "conv_1": dict(conv_size=1),
}
# An edge (a conv of one tap, no cache) beside the others: slow, and in the long tier.
SLOW_LAYER_CASES = ("conv_1",)


@pytest.mark.parametrize("mode", ["parallel", "stepwise"])
@pytest.mark.parametrize("case", [pytest.param(case, marks=[pytest.mark.slow, pytest.mark.long])
                                  if case in SLOW_LAYER_CASES else case for case in LAYER_CASES])
def test_layer_matches_fla_layer_equations(case, mode):
  """Outputs and the final carry within 1e-5, the gradients of x, every parameter and the
  initial carry within 1e-4 (torch autograd), from a random initial carry; conv_size 9 >
  T + 1: the cache after the sequence reaches into the initial one."""
  module, variables = make(mode=mode, **LAYER_CASES[case])
  x, cotangent = randn(0, B, T, F), randn(1, B, T, F)
  h0 = carry(2, module)
  y, last, (grads, grad_x, grad_h0) = outputs_and_grads(module, variables, x, cotangent, h0)

  leaf = lambda a: torch.tensor(np.asarray(a), requires_grad=True)
  params = {name: leaf(p) for name, p in variables["params"].items()}
  tx, th0 = leaf(x), tuple(leaf(a) for a in h0)
  options = {k: getattr(module, k) for k in ("conv_size", "use_gate", "allow_neg_eigval",
                                               "norm_eps")}
  y_ref, last_ref = fla_layer(params, tx, th0, **options)
  (torch.sum(y_ref * torch.tensor(cotangent)) + sum(a.sum() for a in last_ref)).backward()

  close(y, y_ref.detach().numpy())
  for got, expected in zip(last, last_ref, strict=True):
    close(got, expected.detach().numpy())
  assert set(grads["params"]) == set(params)
  for name, g in grads["params"].items():
    close(g, params[name].grad.numpy(), GRAD_TOL)
  close(grad_x, tx.grad.numpy(), GRAD_TOL)
  close(grad_h0[1], th0[1].grad.numpy(), GRAD_TOL)
  if module.conv_size > 1:
    close(grad_h0[0], th0[0].grad.numpy(), GRAD_TOL)


# -- the forms, steps, padding and directions against each other --------------------------------

def test_parallel_equals_stepwise_bidirectional_with_lengths_and_initial_state():
  module, variables = make(bidirectional=True)
  h0 = tuple(np.stack(pair) for pair in zip(carry(3, module, 3), carry(5, module, 3)))
  assert_parallel_equals_stepwise(run, module, variables, X3, seq_lengths=LENGTHS3,
                                  initial_state=h0)


def test_steps_equal_the_sequence():
  """`step` token by token from a random carry gives the sequence's outputs and carry."""
  module, variables = make()
  y, final = run3(module, variables, lengths=jnp.full(3, T))
  state = carry(3, module, 3)
  for t in range(T):
    state, y_t = step(module, variables, state, X3[:, t])
    close(y_t, y[:, t])
  close(flat(state), final)


def test_padding_equals_each_sequence_alone():
  """Each padded row equals that sequence alone from its initial carry (outputs, and the
  final carry: the conv inputs of its last valid steps and Ŝ after them), its outputs past
  its length are zero; a sequence of length 0 keeps its initial carry."""
  module, variables = make()
  y, last = run3(module, variables)
  h0 = flat(carry(3, module, 3))
  for b, n in enumerate(np.asarray(LENGTHS3)):
    np.testing.assert_array_equal(y[b, n:], 0.0)
    if n == 0:
      np.testing.assert_array_equal(last[b], h0[b])
      continue
    y_alone, last_alone = run(module, variables, X3[b:b + 1, :n],
                              initial_state=tuple(a[b:b + 1] for a in carry(3, module, 3)))
    close(y[b:b + 1, :n], y_alone)
    close(last[b:b + 1], last_alone)


def flip_within(x: np.ndarray, lengths) -> np.ndarray:
  """Each row's first lengths[b] steps in reverse order, the padding after them in place."""
  out = np.array(x)
  for b, n in enumerate(np.asarray(lengths)):
    out[b, :n] = out[b, :n][::-1]
  return out


def test_bidirectional_adds_the_reverse_direction_on_each_sequence_flipped_within_its_length():
  """y = the forward direction's y + the reverse direction's (its own parameters and initial
  carry) run forwards on each sequence flipped within its length, flipped back; the final
  carries stacked."""
  module, variables = make(bidirectional=True)
  h0 = tuple(np.stack(pair) for pair in zip(carry(3, module, 3), carry(5, module, 3)))
  y, last = run(module, variables, X3, seq_lengths=LENGTHS3, initial_state=h0)
  one_way = module.clone(bidirectional=False)
  direction = lambda k: jax.tree.map(lambda p: p[k], variables)
  y_f, last_f = run3(one_way, direction(0))
  y_r, last_r = run3(one_way, direction(1), x=flip_within(X3, LENGTHS3), seed=5)
  close(y, y_f + flip_within(y_r, LENGTHS3))
  close(last, np.stack([last_f, last_r]))


def test_causal():
  module, variables = make()
  assert_causal(lambda *args: run3(*args, lengths=jnp.full(3, T)), module, variables, X3, t0=3)


def test_bfloat16_projections_stay_close_to_float32():
  """dtype bfloat16: the projections' inputs and weights rounded to 8 mantissa bits (relative
  error 2⁻⁹ each), through the L2 norms, the recurrence and the RMSNorm: outputs of order one
  within 0.05; the carry stays float32."""
  module, variables = make()
  y32, _ = run3(module, variables)
  for mode in ("parallel", "stepwise"):
    low = module.clone(dtype=jnp.bfloat16, mode=mode)
    y, last = run3(low, variables)
    conv, s = jax.eval_shape(lambda low=low: low.apply(variables, X3))[1]
    assert y.dtype == jnp.bfloat16 and conv.dtype == s.dtype == jnp.float32
    np.testing.assert_allclose(y.astype(jnp.float32), y32, rtol=5e-2, atol=5e-2)


# -- options and the initialisation ---------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(conv_size=-1), r"conv_size must be an int >= 0 \(0: no conv\), got -1"),
    (dict(conv_size=4.0), r"conv_size must be an int >= 0 \(0: no conv\), got 4\.0"),
    (dict(use_gate="yes"), "use_gate must be True or False, got 'yes'"),
    (dict(allow_neg_eigval=1), "allow_neg_eigval must be True or False, got 1"),
    (dict(norm_eps=0.0), "norm_eps must be a positive number, got 0.0"),
    (dict(norm_eps=math.inf), "norm_eps must be a finite number, got inf"),
    (dict(mode="chunked"), r"mode must be one of \('parallel', 'stepwise'\), got 'chunked'"),
    (dict(chunk_size=0), "chunk_size must be a positive int, got 0"),
    (dict(state_size=3), r"state_size=3 \(the heads' size\) must divide the width, 8"),
])
def test_bad_config_is_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    jax.eval_shape(lambda: DeltaNet(**kwargs).init(jax.random.key(0), jnp.zeros((B, T, F))))


def test_wrong_initial_state_is_refused():
  module, variables = make()
  with pytest.raises(ValueError, match=r"initial_state must have the shapes \[\(2, 3, 24\), "
                                       r"\(2, 2, 4, 4\)\]"):
    jax.eval_shape(lambda: module.apply(variables, jnp.zeros((B, T, F)), initial_state=(
        jnp.zeros((B, 3, 24)), jnp.zeros((B, 4, 4)))))


def test_initialisation_is_pytorchs_default_as_in_fla_layer():
  """nn.Linear's and the depthwise Conv1d's kaiming_uniform(a=√5): U(±1/√fan_in), fan_in F
  for every projection, K for a conv kernel; the RMSNorm weight 1. The parameter count is
  the parameters'."""
  width, size = 256, 64
  module = DeltaNet(state_size=size, use_gate=True, bidirectional=True)
  params = init(module, key(3), jnp.zeros((1, 1, width)))["params"]
  heads = width // size
  shapes = {"q_proj": (width, width), "k_proj": (width, width), "v_proj": (width, width),
            "b_proj": (width, heads), "o_proj": (width, width), "q_conv1d": (K, width),
            "k_conv1d": (K, width), "v_conv1d": (K, width), "o_norm": (size,),
            "g_proj": (width, width)}
  assert {name: p.shape[1:] for name, p in params.items()} == shapes
  for name, p in params.items():
    if name == "o_norm":
      np.testing.assert_array_equal(p, 1.0)
      continue
    bound = 1 / math.sqrt(K if name.endswith("conv1d") else width)
    assert np.abs(p).max() <= bound and np.abs(p).max() > 0.98 * bound
    assert np.std(p) == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert abs(np.mean(p)) < 0.05 * bound
  np.testing.assert_raises(AssertionError, np.testing.assert_array_equal,
                           params["q_proj"][0], params["q_proj"][1])   # each direction its own
  assert module.parameter_count(width) == sum(p.size for p in params.values())
  assert module.clone(use_gate=False, bidirectional=False).parameter_count(width) \
      == sum(p[0].size for name, p in params.items() if name != "g_proj")


# A 16 384-step sequence: several seconds of compilation and running.
@pytest.mark.slow
@pytest.mark.long
def test_a_long_sequence_at_the_initialisation_stays_finite_and_the_forms_agree():
  """T = 16 384 at fla's layer initialisation (β = σ(·) up to 1, the keys unit vectors):
  the state stays bounded (each step a contraction), the two forms agree, the gradients are
  finite."""
  module = DeltaNet(state_size=8, chunk_size=64)
  x = jnp.asarray(randn(0, 1, 16384, 16))
  variables = init(module, key(0), x)
  cotangent = randn(1, 1, 16384, 16)
  h0 = module.zero_state(1, 16)
  results = [outputs_and_grads(module.clone(mode=mode), variables, x, cotangent, h0)
             for mode in ("parallel", "stepwise")]
  (y_p, last_p, grads_p), (y_s, last_s, grads_s) = results
  assert np.abs(last_p[1]).max() < 10.0
  np.testing.assert_allclose(y_p, y_s, rtol=1e-4, atol=1e-4)
  for leaf in jax.tree.leaves((y_p, grads_p, grads_s)):
    assert np.isfinite(leaf).all()
