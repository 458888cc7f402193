"""`from_torch(torch.nn.MultiheadAttention)` against torch's own forward and autograd.

Forward (within 1e-5), per-head weights (need_weights=True, average_attn_weights=False,
vs our sown intermediates) and gradients (w.r.t. the inputs and every torch parameter,
within 1e-4) for self-attention, cross-attention with kdim / vdim ≠ embed_dim and
bias=False, each without a mask, with a key padding mask, with torch's float causal mask
and with a boolean attn_mask. torch's masks are converted here (True = ignore there,
True = may attend here).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from research.attention.torch_import import from_torch

# Compared with torch's forward and autograd within 1e-5 / 1e-4: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

E, H = 8, 2            # embed_dim, num_heads
B, L, S = 2, 5, 5      # batch, query length, key length (S = L so a causal mask is square)
CONFIGS = {            # name: (kdim, vdim, bias)
    "self": (None, None, True),
    "cross_kdim_vdim": (6, 3, True),
    "no_bias": (None, None, False),
}
MASKS = ["none", "key_padding", "causal_float", "bool_attn_mask"]


def make_torch(kdim=None, vdim=None, bias=True, batch_first=True, **kwargs):
  torch.manual_seed(0)
  module = torch.nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim, bias=bias,
                                       batch_first=batch_first, **kwargs)
  with torch.no_grad():  # torch starts the biases at zero; make every parameter matter
    for p in module.parameters():
      p.copy_(torch.randn_like(p) * 0.5)
  return module


def torch_masks(kind: str) -> dict:
  """torch's keyword arguments for a mask kind (torch conventions)."""
  if kind == "key_padding":
    lengths = torch.tensor([S, 2])
    return {"key_padding_mask": torch.arange(S)[None, :] >= lengths[:, None]}   # True = ignore
  if kind == "causal_float":
    return {"attn_mask": torch.nn.Transformer.generate_square_subsequent_mask(L)}
  if kind == "bool_attn_mask":
    not_allowed = torch.from_numpy(np.random.default_rng(1).random((L, S)) < 0.4)
    not_allowed[:, 0] = False                                                     # no empty row
    return {"attn_mask": not_allowed}                                             # True = not allowed
  return {}


def our_masks(kind: str, torch_kwargs: dict) -> dict:
  """The same mask in our conventions (True = may attend)."""
  if kind == "key_padding":
    return {"mask": jnp.asarray(~torch_kwargs["key_padding_mask"].numpy())[:, None, None, :]}
  if kind == "causal_float":
    return {"is_causal": True}
  if kind == "bool_attn_mask":
    return {"mask": jnp.asarray(~torch_kwargs["attn_mask"].numpy())}
  return {}


def torch_layout(params: dict, same_embed_dim: bool, bias: bool) -> dict[str, np.ndarray]:
  """Our parameter tree (or its gradient) in torch's named_parameters layout."""
  def matrix(p):  # kernel [D_in, H, d] -> torch W [E, D_in]
    return np.asarray(p["kernel"]).reshape(p["kernel"].shape[0], -1).T
  q, k, v, out = (params[name] for name in ("query", "key", "value", "out"))
  if same_embed_dim:
    layout = {"in_proj_weight": np.concatenate([matrix(q), matrix(k), matrix(v)])}
  else:
    layout = {"q_proj_weight": matrix(q), "k_proj_weight": matrix(k), "v_proj_weight": matrix(v)}
  layout["out_proj.weight"] = np.asarray(out["kernel"]).reshape(E, E).T
  if bias:
    layout["in_proj_bias"] = np.concatenate([np.asarray(p["bias"]).ravel() for p in (q, k, v)])
    layout["out_proj.bias"] = np.asarray(out["bias"])
  return layout


@pytest.mark.slow
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_forward_weights_and_gradients_match_torch(config, mask_kind):
  kdim, vdim, bias = CONFIGS[config]
  module = make_torch(kdim, vdim, bias)
  rng = np.random.default_rng(0)
  query = rng.standard_normal((B, L, E)).astype(np.float32)
  key = rng.standard_normal((B, S, kdim or E)).astype(np.float32)
  value = rng.standard_normal((B, S, vdim or E)).astype(np.float32)
  is_self = config != "cross_kdim_vdim"
  if is_self:
    key = value = query
  cotangent = rng.standard_normal((B, L, E)).astype(np.float32)
  t_kwargs = torch_masks(mask_kind)

  # torch
  tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (query, key, value))
  if is_self:
    tk = tv = tq
  t_out, t_weights = module(tq, tk, tv, need_weights=True, average_attn_weights=False, **t_kwargs)
  (t_out * torch.from_numpy(cotangent)).sum().backward()

  # ours
  layer, variables = from_torch(module)
  kwargs = our_masks(mask_kind, t_kwargs)

  def loss(params, q, k, v):
    if is_self:
      out, state = layer.apply({"params": params}, q, mutable=["intermediates"], **kwargs)
    else:
      out, state = layer.apply({"params": params}, q, k, inputs_v=v, mutable=["intermediates"],
                               **kwargs)
    return jnp.sum(out * cotangent), (out, state["intermediates"]["attention_weights"][0])

  grads, (out, weights) = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
      variables["params"], query, key, value)

  np.testing.assert_allclose(out, t_out.detach().numpy(), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(weights, t_weights.detach().numpy(), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(grads[1], tq.grad.numpy(), atol=1e-4, rtol=1e-4)
  if not is_self:
    np.testing.assert_allclose(grads[2], tk.grad.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(grads[3], tv.grad.numpy(), atol=1e-4, rtol=1e-4)
  ours = torch_layout(grads[0], same_embed_dim=kdim is None, bias=bias)
  theirs = {name: p.grad.numpy() for name, p in module.named_parameters()}
  assert ours.keys() == theirs.keys()
  for name, grad in theirs.items():
    np.testing.assert_allclose(ours[name], grad, atol=1e-4, rtol=1e-4, err_msg=name)


def test_time_major_module_after_transposing():
  """batch_first=False torch modules take [L, B, E]; our module takes the transpose."""
  module = make_torch(batch_first=False, dropout=0.25).eval()
  x = np.random.default_rng(2).standard_normal((L, B, E)).astype(np.float32)
  with torch.no_grad():
    expected = module(*(torch.from_numpy(x),) * 3, need_weights=False)[0].numpy()
  layer, variables = from_torch(module)
  assert layer.dropout_rate == 0.25
  out = layer.apply(variables, jnp.asarray(x).transpose(1, 0, 2))   # eval: no dropout
  np.testing.assert_allclose(np.asarray(out).transpose(1, 0, 2), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("option", ["add_bias_kv", "add_zero_attn"])
def test_unsupported_options_raise(option):
  module = torch.nn.MultiheadAttention(E, H, **{option: True})
  with pytest.raises(ValueError, match=option):
    from_torch(module)


def test_other_modules_raise():
  with pytest.raises(TypeError, match="MultiheadAttention"):
    from_torch(torch.nn.Linear(E, E))
