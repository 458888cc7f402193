"""Import a `torch.nn.MultiheadAttention` as a `MultiHeadAttention` with its weights.

    module, variables = from_torch(torch_mha)
    out = module.apply(variables, query, key, inputs_v=value, mask=mask)  # == torch_mha(...)[0]

torch is imported lazily: only this function needs it.
"""

from typing import Any

import jax.numpy as jnp
import numpy as np

from research.attention.multi_head import MultiHeadAttention


def _array(tensor) -> jnp.ndarray:
  return jnp.asarray(tensor.detach().cpu().numpy().astype(np.float32))


def from_torch(module) -> tuple[MultiHeadAttention, dict[str, Any]]:
  """Returns `(module, variables)` reproducing a torch.nn.MultiheadAttention.

  Carries over embed_dim (qkv and output features), num_heads, kdim / vdim, bias=False
  and dropout (attention dropout, active only with `train=True`). Parameters are float32.
  Raises ValueError for add_bias_kv=True or add_zero_attn=True (not supported).

  Layouts. Our module is batch-first: a torch module built with batch_first=False takes
  [L, B, E] tensors, and the caller transposes them to [B, L, E] (and the output back).
  torch splits E = H · d into heads as e = h · d + i, so with W [E_out, E_in] a torch
  projection matrix, our kernels are

    query/kernel [E_q, H, d] = W_qᵀ reshaped,   out/kernel [H, d, E] = W_oᵀ reshaped,

  with W_q, W_k, W_v the three row blocks of in_proj_weight [3E, E] (or q_proj_weight,
  k_proj_weight [E, kdim], v_proj_weight [E, vdim] when kdim or vdim differ from E).

  Masks. torch's conventions are the opposite of ours (True = may attend):
  key_padding_mask [B, S] True = ignore, so our mask = ~key_padding_mask[:, None, None, :];
  a boolean attn_mask [L, S] True = not allowed, so our mask = ~attn_mask; a float
  attn_mask is additive, so it is our `bias`. need_weights=True with
  average_attn_weights=False returns what we sow as intermediates/attention_weights (the
  module is built with implementation="dense", which computes them, as torch does).
  """
  import torch  # pylint: disable=import-outside-toplevel

  if not isinstance(module, torch.nn.MultiheadAttention):
    raise TypeError(f"from_torch takes a torch.nn.MultiheadAttention, got {type(module).__name__}")
  if module.bias_k is not None:
    raise ValueError("add_bias_kv=True is not supported by from_torch")
  if module.add_zero_attn:
    raise ValueError("add_zero_attn=True is not supported by from_torch")

  embed, heads, head_dim = module.embed_dim, module.num_heads, module.head_dim
  if module._qkv_same_embed_dim:  # pylint: disable=protected-access
    w_q, w_k, w_v = _array(module.in_proj_weight).reshape(3, embed, embed)
  else:
    w_q, w_k, w_v = (_array(module.q_proj_weight), _array(module.k_proj_weight),
                     _array(module.v_proj_weight))
  use_bias = module.in_proj_bias is not None
  b_q, b_k, b_v = _array(module.in_proj_bias).reshape(3, heads, head_dim) if use_bias else (None,) * 3

  def projection(w, b):
    """torch W [E, D_in] (and b [E]) -> kernel [D_in, H, d] (and bias [H, d])."""
    params = {"kernel": w.T.reshape(w.shape[1], heads, head_dim)}
    return params | ({"bias": b} if use_bias else {})

  out = {"kernel": _array(module.out_proj.weight).T.reshape(heads, head_dim, embed)}
  if use_bias:
    out["bias"] = _array(module.out_proj.bias)
  params = {"query": projection(w_q, b_q), "key": projection(w_k, b_k),
            "value": projection(w_v, b_v), "out": out}
  layer = MultiHeadAttention(num_heads=heads, qkv_features=embed, out_features=embed,
                             dropout_rate=float(module.dropout), use_bias=use_bias,
                             implementation="dense")   # torch returns the weights too
  return layer, {"params": params}
