"""Linear Transformer attention (Katharopoulos et al. 2020, "Transformers are RNNs").

Softmax's exp(q·k) becomes a kernel φ(q)·φ(k) with a non-negative feature map φ (here
elu + 1), so the sums over keys leave the query loop: O(n·m·d_v) instead of O(n²·d), and
causal attention is a recurrence over running sums. `performer.py` plugs FAVOR+'s random
features into the same `kernelized_attention`.
"""


import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from research.attention.heads import (
  HeadsSelfAttention,
  checked_qkv,
  key_validity,
)
from research.errors import check_choice, check_positive

Array = jax.Array
CAUSAL_FORMS = ("scan", "chunked")


def elu_feature_map(x: Array) -> Array:
  """φ(x) = elu(x) + 1 > 0, elementwise."""
  return jax.nn.elu(x) + 1.0


def check_causal_form(causal_form: str, chunk_size: int) -> None:
  check_choice("causal_form", causal_form, CAUSAL_FORMS)
  check_positive("chunk_size", chunk_size)


def kernelized_attention(phi_q: Array, phi_k: Array, v: Array, *, is_causal: bool = False,
                         causal_form: str = "chunked", chunk_size: int = 64,
                         key_valid: Array | None = None) -> Array:
  """Σ_j φq_i·φk_j v_j / Σ_j φq_i·φk_j over the visible keys j, linear in the length.

  With features φ of m numbers:

    out_i = φ(q_i)ᵀ S / φ(q_i)ᵀ z,   S = Σ_j φ(k_j) v_jᵀ  [m, d_v],   z = Σ_j φ(k_j)  [m]

  Causal attention (j ≤ i) keeps the running sums S_i = Σ_{j≤i} φ(k_j) v_jᵀ and
  z_i = Σ_{j≤i} φ(k_j), in one of two forms:

    "scan"     a `lax.scan` over positions, one (S, z) update per token (the RNN view);
    "chunked"  chunks of C positions: inside a chunk the quadratic form under a causal mask,
               (φ(Q_c) φ(K_c)ᵀ ⊙ M) V_c, in parallel, plus φ(Q_c) S from the earlier chunks,
               which a scan over the chunks carries.

  Both equal the quadratic form out_i = Σ_{j≤i} φ(q_i)·φ(k_j) v_j / Σ_{j≤i} φ(q_i)·φ(k_j).
  Padding keys (key_valid) get φ(k) = 0 and add nothing; a query with no visible key
  returns zeros. Sums run in float32.

  Args:
    phi_q: [b, q_len, H, m] features of the queries; phi_k: [b, kv_len, H, m] of the keys
      (both non-negative); v: [b, kv_len, H, d_v].
    is_causal: query i sees keys j ≤ i (q_len = kv_len).
    causal_form: "scan" or "chunked" (see above).
    chunk_size: C of the chunked form; the length need not be a multiple.
    key_valid: [b, kv_len] bool, False for padding keys.

  Returns:
    float32 [b, q_len, H, d_v].
  """
  check_causal_form(causal_form, chunk_size)
  phi_q, phi_k, v = (x.astype(jnp.float32) for x in (phi_q, phi_k, v))
  if key_valid is not None:
    phi_k = jnp.where(key_valid[:, :, None, None], phi_k, 0.0)
  if not is_causal:
    state = jnp.einsum("bjhm,bjhe->bhme", phi_k, v)
    num = jnp.einsum("bihm,bhme->bihe", phi_q, state)
    den = jnp.einsum("bihm,bhm->bih", phi_q, jnp.sum(phi_k, axis=1))
  elif causal_form == "scan":
    num, den = _causal_scan(phi_q, phi_k, v)
  else:
    num, den = _causal_chunked(phi_q, phi_k, v, chunk_size)
  # Non-negative features: a zero denominator has a zero numerator (no visible key).
  return num / jnp.where(den > 0, den, 1.0)[..., None]


def _causal_scan(phi_q: Array, phi_k: Array, v: Array) -> tuple[Array, Array]:
  """One step per position t: S += φk_t v_tᵀ, z += φk_t; num_t = φq_tᵀ S, den_t = φq_tᵀ z."""
  b, _, h, m = phi_q.shape

  def step(carry, inputs):
    state, norm = carry
    q_t, k_t, v_t = inputs                                 # [b, H, m], [b, H, m], [b, H, e]
    state = state + jnp.einsum("bhm,bhe->bhme", k_t, v_t)
    norm = norm + k_t
    return (state, norm), (jnp.einsum("bhm,bhme->bhe", q_t, state),
                           jnp.einsum("bhm,bhm->bh", q_t, norm))

  init = (jnp.zeros((b, h, m, v.shape[-1]), jnp.float32), jnp.zeros((b, h, m), jnp.float32))
  _, (num, den) = lax.scan(step, init, tuple(jnp.swapaxes(x, 0, 1) for x in (phi_q, phi_k, v)))
  return jnp.swapaxes(num, 0, 1), jnp.swapaxes(den, 0, 1)


def _causal_chunked(phi_q: Array, phi_k: Array, v: Array, chunk_size: int
                    ) -> tuple[Array, Array]:
  """Chunks of C positions: the masked quadratic form inside, the carried (S, z) before."""
  b, n, h, m = phi_q.shape
  c = min(chunk_size, n)
  pad = -n % c   # zero features: padded keys add nothing, padded queries are cut off

  def chunks(x):                                           # [b, n, H, f] -> [n/C, b, C, H, f]
    x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0)))
    return jnp.moveaxis(x.reshape(b, -1, c, h, x.shape[-1]), 1, 0)

  mask = jnp.tril(jnp.ones((c, c), jnp.float32))

  def step(carry, inputs):
    state, norm = carry
    q_c, k_c, v_c = inputs                                 # [b, C, H, m|e]
    scores = jnp.einsum("bihm,bjhm->bhij", q_c, k_c) * mask
    num = (jnp.einsum("bhij,bjhe->bihe", scores, v_c)
           + jnp.einsum("bihm,bhme->bihe", q_c, state))
    den = jnp.einsum("bhij->bih", scores) + jnp.einsum("bihm,bhm->bih", q_c, norm)
    state = state + jnp.einsum("bjhm,bjhe->bhme", k_c, v_c)
    norm = norm + jnp.sum(k_c, axis=1)
    return (state, norm), (num, den)

  init = (jnp.zeros((b, h, m, v.shape[-1]), jnp.float32), jnp.zeros((b, h, m), jnp.float32))
  _, (num, den) = lax.scan(step, init, (chunks(phi_q), chunks(phi_k), chunks(v)))
  num = jnp.moveaxis(num, 0, 1).reshape(b, -1, h, v.shape[-1])[:, :n]
  den = jnp.moveaxis(den, 0, 1).reshape(b, -1, h)[:, :n]
  return num, den


def linear_attention(q: Array, k: Array, v: Array, *, is_causal: bool = False,
                     causal_form: str = "chunked", chunk_size: int = 64,
                     key_value_seq_lengths: Array | None = None) -> Array:
  """Linear Transformer attention with φ(x) = elu(x) + 1.

    out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j),   j over the visible keys

  Args:
    q: [b, q_len, H, d]; k: [b, kv_len, H, d]; v: [b, kv_len, H, d_v].
    is_causal: query i sees keys j ≤ i (needs q_len = kv_len).
    causal_form: "scan" (a running sum per token) or "chunked" (parallel within chunks).
    chunk_size: C of the chunked form.
    key_value_seq_lengths: [b] ints; keys t ≥ length are padding.

  Returns:
    [b, q_len, H, d_v] in q's dtype.
  """
  q, k, v = checked_qkv(q, k, v, same_length=is_causal)
  valid = key_validity(k.shape[0], k.shape[1], key_value_seq_lengths)
  out = kernelized_attention(elu_feature_map(q.astype(jnp.float32)),
                             elu_feature_map(k.astype(jnp.float32)), v, is_causal=is_causal,
                             causal_form=causal_form, chunk_size=chunk_size, key_valid=valid)
  return out.astype(q.dtype)


class LinearSelfAttention(HeadsSelfAttention):
  """Multi-head self-attention with `linear_attention` (φ = elu + 1) in each head.

  Parameters: query / key / value / out as in `MultiHeadAttention`.
  `__call__(x [b, n, D], *, is_causal=False, key_value_seq_lengths=None, train=False)`
  -> [b, n, D]; train changes nothing (no randomness).
  """
  num_heads: int                   # H
  causal_form: str = "chunked"     # causal running sums: "scan" or "chunked"
  chunk_size: int = 64             # C of the chunked form

  @nn.compact
  def __call__(self, x: Array, *, is_causal: bool = False,
               key_value_seq_lengths: Array | None = None, train: bool = False) -> Array:
    del train  # deterministic
    check_causal_form(self.causal_form, self.chunk_size)
    q, k, v = self.project(x, ("query", "key", "value"))
    out = linear_attention(q, k, v, is_causal=is_causal, causal_form=self.causal_form,
                           chunk_size=self.chunk_size,
                           key_value_seq_lengths=key_value_seq_lengths)
    return self.merge(out, x.shape[-1])

