"""TransformerBlock against torch.nn.TransformerEncoderLayer with the same weights: pre- and
post-norm, causal or not, with padded keys (flax's nn.gelu is the tanh approximation;
LayerNorm eps 1e-6); without an MLP, against the layer's attention sub-block alone, and
with the S5 and LRU papers' gates after it, written out in NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models.self_attention import SELF_ATTENTIONS, self_attention
from research.models.transformer_block import TransformerBlock

pytestmark = pytest.mark.usefixtures("highest_precision")

B, L, F, HEADS, MLP = 2, 9, 16, 2, 64


def torch_layer(norm_first: bool):
  torch = pytest.importorskip("torch")
  torch.manual_seed(0)
  layer = torch.nn.TransformerEncoderLayer(
      F, HEADS, dim_feedforward=MLP, dropout=0.0, batch_first=True, norm_first=norm_first,
      layer_norm_eps=1e-6, activation=lambda x: torch.nn.functional.gelu(x, approximate="tanh"))
  for norm in (layer.norm1, layer.norm2):                          # not the default 1 and 0
    torch.nn.init.normal_(norm.weight, 1.0, 0.2)
    torch.nn.init.normal_(norm.bias, 0.0, 0.2)
  return torch, layer


def params_of(layer):
  from research.attention.torch_import import from_torch
  dense = lambda linear: {"kernel": jnp.asarray(linear.weight.detach().numpy().T),
                          "bias": jnp.asarray(linear.bias.detach().numpy())}
  norm = lambda n: {"scale": jnp.asarray(n.weight.detach().numpy()),
                    "bias": jnp.asarray(n.bias.detach().numpy())}
  return {"attention": from_torch(layer.self_attn)[1]["params"],
          "attention_norm": norm(layer.norm1), "mlp_norm": norm(layer.norm2),
          "mlp_in": dense(layer.linear1), "mlp_out": dense(layer.linear2)}


@pytest.mark.slow
@pytest.mark.parametrize("norm, is_causal, padded", [
    pytest.param("pre", True, False, marks=pytest.mark.long), ("post", False, True),
    ("pre", False, True), pytest.param("post", True, False, marks=pytest.mark.long)])
def test_the_block_equals_torchs_transformer_encoder_layer(norm, is_causal, padded):
  torch, layer = torch_layer(norm_first=norm == "pre")
  x = np.random.default_rng(0).normal(size=(B, L, F)).astype(np.float32)
  lengths = np.array([L, 5]) if padded else None
  kwargs = {}
  if is_causal:
    kwargs = dict(src_mask=torch.nn.Transformer.generate_square_subsequent_mask(L),
                  is_causal=True)
  if padded:
    kwargs["src_key_padding_mask"] = torch.from_numpy(np.arange(L)[None] >= lengths[:, None])
  layer.eval()
  with torch.no_grad():
    expected = layer(torch.from_numpy(x), **kwargs).numpy()
  block = TransformerBlock(self_attention("full", num_heads=HEADS, features=F), MLP, norm=norm,
                           is_causal=is_causal)
  ours = block.apply({"params": params_of(layer)}, jnp.asarray(x),
                     None if lengths is None else jnp.asarray(lengths))
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_without_an_mlp_the_block_is_torchs_attention_sub_block_alone(norm):
  """mlp_size 0 (Zoology's blocks): pre x + SA(norm1(x)), post norm1(x + SA(x)), with no MLP
  parameters at all."""
  torch, layer = torch_layer(norm_first=norm == "pre")
  x = np.random.default_rng(1).normal(size=(B, L, F)).astype(np.float32)
  mask = torch.nn.Transformer.generate_square_subsequent_mask(L)
  attend = lambda y: layer.self_attn(y, y, y, attn_mask=mask, need_weights=False)[0]
  with torch.no_grad():
    t = torch.from_numpy(x)
    expected = (t + attend(layer.norm1(t)) if norm == "pre" else layer.norm1(t + attend(t)))
  block = TransformerBlock(self_attention("full", num_heads=HEADS, features=F), 0, norm=norm,
                           is_causal=True)
  params = {name: part for name, part in params_of(layer).items()
            if name in ("attention", "attention_norm")}
  assert set(jax.eval_shape(block.init, jax.random.key(0), jnp.asarray(x))["params"]) == set(params)
  ours = block.apply({"params": params}, jnp.asarray(x))
  np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gate", ["glu", "half_glu"])
def test_the_gate_after_the_mixer_is_the_papers_glu(gate):
  """pre-norm, no MLP: x + W₁ gelu(y) ⊙ σ(W₂ gelu(y)) ("glu", the LRU paper's layer) or
  x + y ⊙ σ(W₂ gelu(y)) ("half_glu", S5's half_glu2), y = SA(norm1(x)); gelu the tanh form."""
  torch, layer = torch_layer(norm_first=True)
  x = np.random.default_rng(2).normal(size=(B, L, F)).astype(np.float32)
  with torch.no_grad():
    t = torch.from_numpy(x)
    normed = layer.norm1(t)
    y = layer.self_attn(normed, normed, normed, need_weights=False)[0].numpy().astype(np.float64)
  block = TransformerBlock(self_attention("full", num_heads=HEADS, features=F), 0,
                           mixer_gate=gate)
  params = {name: part for name, part in params_of(layer).items()
            if name in ("attention", "attention_norm")}
  rng = np.random.default_rng(3)
  dense = lambda: {"kernel": rng.normal(size=(F, F)).astype(np.float32) / 4,
                   "bias": rng.normal(size=F).astype(np.float32)}
  params["gate"] = dense()
  if gate == "glu":
    params["gate_value"] = dense()
  shapes = jax.eval_shape(block.init, jax.random.key(0), jnp.asarray(x))["params"]
  assert set(shapes) == set(params)
  gelu = lambda u: 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))
  affine = lambda p, u: u @ p["kernel"] + p["bias"]
  sigmoid = lambda u: 1 / (1 + np.exp(-u))
  value = affine(params["gate_value"], gelu(y)) if gate == "glu" else y
  expected = x + value * sigmoid(affine(params["gate"], gelu(y)))
  ours = block.apply({"params": params}, jnp.asarray(x))
  np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_dropout_acts_on_both_branches_and_the_hidden_units_in_training_only():
  """With train=True the output changes and depends on the dropout key; train=False equals
  rate 0; the activation dropout alone changes the output too."""
  x = jnp.asarray(np.random.default_rng(1).normal(size=(B, L, F)), jnp.float32)
  attention = self_attention("full", num_heads=HEADS, features=F)
  plain = TransformerBlock(attention, MLP)
  params = jax.jit(plain.init)(jax.random.key(0), x)["params"]
  reference = jax.jit(plain.apply)({"params": params}, x)
  for rates in ((0.5, 0.0), (0.0, 0.5)):
    block = TransformerBlock(attention, MLP, dropout_rate=rates[0],
                             activation_dropout_rate=rates[1])
    apply = jax.jit(block.apply, static_argnames="train")   # one compilation per mode
    np.testing.assert_array_equal(apply({"params": params}, x), reference)
    drawn = [apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(s)})
             for s in (0, 1)]
    assert not np.allclose(drawn[0], reference) and not np.allclose(drawn[0], drawn[1])


@pytest.mark.slow
@pytest.mark.parametrize("name", SELF_ATTENTIONS)
def test_every_attention_is_a_block_and_ignores_padded_keys(name):
  """Changing the inputs at padded positions leaves the real positions' outputs unchanged."""
  x = np.random.default_rng(2).normal(size=(B, 8, F)).astype(np.float32)
  lengths = jnp.asarray([8, 5])
  attention = self_attention(name, num_heads=HEADS, features=F, window=2, max_length=8,
                             proj_len=4, compression=2, block_size=2, num_features=8)
  block = TransformerBlock(attention, MLP, norm="post")
  params = jax.jit(block.init)(jax.random.key(0), jnp.asarray(x), lengths)["params"]
  y = x.copy()
  y[1, 5:] += 3.0
  apply = jax.jit(block.apply)    # one compilation, not one per operation
  out_x, out_y = (apply({"params": params}, jnp.asarray(v), lengths) for v in (x, y))
  np.testing.assert_allclose(out_x[0], out_y[0], atol=1e-6)
  np.testing.assert_allclose(out_x[1, :5], out_y[1, :5], atol=1e-5)
  assert not np.allclose(out_x[1, 5:], out_y[1, 5:])


def test_bad_names_are_refused():
  with pytest.raises(ValueError, match="attention must be one of"):
    self_attention("sparse_typo", num_heads=2, features=8)
  with pytest.raises(ValueError, match="needs a window"):
    self_attention("local", num_heads=2, features=8)
  x = jnp.zeros((1, 4, 8))
  with pytest.raises(ValueError, match="norm must be one of"):
    TransformerBlock(self_attention("full", num_heads=2, features=8), 16, norm="mid").init(
        jax.random.key(0), x)
