"""The implementation registry: every entry against jax.nn.dot_product_attention, the
capability table driving the errors, and implementations registered by a user (a TPU-only
one refused on CPU and called when the backend is mocked), in a registry copy per test."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.attention import (
    AttentionRequest,
    Implementation,
    MultiHeadAttention,
    dot_product_attention,
    implementation_names,
    register_implementation,
    registered_implementations,
)
from research.attention import registry as attention_registry
from research.attention.registry import FLOAT_DTYPES

# Compared with jax.nn within 2e-5: full float32 products, not TF32.
pytestmark = pytest.mark.usefixtures("highest_precision")

B, Q, K, H, D = 2, 9, 11, 4, 8     # batch, q_len, kv_len, heads, head_dim


@pytest.fixture
def registry(monkeypatch):
  """A copy of the registry for one test, so that its registrations do not leak."""
  monkeypatch.setattr(attention_registry, "_REGISTRY", dict(attention_registry._REGISTRY))


def _inputs(seed, kv_heads=H, dtype=jnp.float32, q_len=Q, kv_len=K):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((B, q_len, H, D))
  k, v = rng.standard_normal((2, B, kv_len, kv_heads, D))
  return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def _jax_nn(calls):
  """An implementation function wrapping jax.nn (no window), recording its arguments."""
  def function(q, k, v, *, scale, bias, mask, visibility, block_size, return_weights):
    calls.append(dict(visibility=visibility, block_size=block_size, return_weights=return_weights))
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale,
                                        is_causal=visibility.right == 0,
                                        key_value_seq_lengths=visibility.kv_lengths,
                                        implementation="xla")
  return function


def _visible(is_causal, window, lengths, mask, q_len=Q, kv_len=K):
  """[B, H|1, q_len, kv_len] in NumPy: which keys each query sees."""
  i, j = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
  visible = np.ones((q_len, kv_len), bool)
  if window is not None:
    visible &= (j >= i - window[0]) & (j <= i + window[1])
  if is_causal:
    visible &= j <= i
  visible = visible & (j[None] < np.asarray(lengths)[:, None, None])      # [B, Q, K]
  return visible[:, None] & np.asarray(mask)


# A GPU kernel's own rules that the case of every capability at once breaks (they run on
# their platform only; the CPU runs the portable strategies at Q × K with blocks of 4, which
# these leave as they were). cuDNN takes causal attention only with q_len = kv_len, even
# lengths, and a window only without a mask or bias (kernels/cudnn.py): two cases at 10 × 10,
# one without the window, one without the mask and bias. A kernel picks its own tiles
# (pallas_gpu's are powers of two >= 16): block_size=None.
LEFT_OUT = {"cudnn": (("window",), ("mask", "bias"))}
SIZES = {"cudnn": (10, 10)}
CASES = [(name, left) for name in registered_implementations()
         for left in LEFT_OUT.get(name, ((),))]


@pytest.mark.slow
@pytest.mark.parametrize("name, left_out", CASES,
                         ids=[name + "".join(f"-no_{x}" for x in left) for name, left in CASES])
def test_every_registered_implementation_matches_jax_nn(name, left_out):
  """A case built from the implementation's own capabilities: all of them at once (less
  what its shape rules exclude, `LEFT_OUT`)."""
  impl = attention_registry.get(name)
  if jax.default_backend() in impl.interpreted:
    pytest.skip(f"{name} is interpreted here: tests/kernels tests it at small shapes")
  if impl.platforms is not None and jax.default_backend() not in impl.platforms:
    pytest.skip(f"{name} runs on {sorted(impl.platforms)}")
  q_len, kv_len = SIZES.get(name, (Q, K))
  dtype = "float32" if "float32" in impl.dtypes else min(impl.dtypes)
  q, k, v = _inputs(0, kv_heads=2 if impl.gqa else H, dtype=dtype, q_len=q_len, kv_len=kv_len)
  rng = np.random.default_rng(1)
  ours, theirs = dict(is_causal=True), dict(is_causal=True)
  mask, lengths, window = np.ones((1, 1, q_len, kv_len), bool), [kv_len, kv_len], None
  if impl.mask and "mask" not in left_out:
    mask = rng.random((B, 1, q_len, kv_len)) > 0.3
    ours["mask"] = theirs["mask"] = jnp.asarray(mask)
  if impl.bias and "bias" not in left_out:
    ours["bias"] = theirs["bias"] = jnp.asarray(rng.standard_normal((1, H, q_len, kv_len)),
                                                jnp.float32)
  if impl.window != "unsupported" and "window" not in left_out:
    window = (3, 2)
    ours["window"], theirs["local_window_size"] = window, window
  if impl.key_value_seq_lengths:
    lengths = [kv_len, 6]
    ours["key_value_seq_lengths"] = theirs["key_value_seq_lengths"] = jnp.array(lengths)

  block_size = 4 if impl.platforms is None else None
  out = dot_product_attention(q, k, v, implementation=name, block_size=block_size, **ours)
  assert out.dtype == q.dtype
  out = np.asarray(out, np.float32)
  # jax.nn's XLA path on the same values in float32 (at full float32 products: the fixture)
  expected = jax.nn.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)),
                                          implementation="xla", **theirs)
  # float32 within 2e-5; bfloat16 (cuDNN takes no float32) within 2e-2: the probabilities
  # that weigh V and the output are rounded to bfloat16's 8 bits (each within 0.2%), on
  # outputs of magnitude up to about 2.5 (averages of N(0, 1) values)
  atol = 2e-5 if dtype == "float32" else 2e-2
  visible = _visible(True, window, lengths, mask, q_len, kv_len)
  seen = visible.any(-1).transpose(0, 2, 1)[..., None]              # [B, q_len, 1, 1]
  assert seen.mean() > 0.5
  np.testing.assert_allclose(np.where(seen, out, 0), np.where(seen, expected, 0), atol=atol)
  np.testing.assert_array_equal(np.where(seen, 0, out), 0)
  if impl.returns_weights:
    again, weights = dot_product_attention(q, k, v, implementation=name, return_weights=True,
                                           **ours)
    np.testing.assert_array_equal(again, out)
    assert weights.shape == (B, H, q_len, kv_len)
    np.testing.assert_array_equal(np.where(visible, 0, weights), 0)
    values = np.repeat(np.asarray(v), H // v.shape[2], axis=2)
    np.testing.assert_allclose(np.einsum("bhqk,bkhd->bqhd", weights, values), out, atol=atol)


def _able(message):
  return re.search(r"implementations that can: (.*)$", message).group(1)


# The alternatives an error names are those of the platform the call runs on: on a GPU our
# Triton kernel can do a bias without a window in float32 (cuDNN cannot: float32, and odd
# lengths), on a TPU splash cannot (no bias).
@pytest.mark.parametrize("implementation,kwargs,missing,able", [
    ("banded", dict(bias=jnp.zeros((Q, K))), ["no window (banded needs a window: pass window=w"],
     {"cpu": "'dense', 'chunked'", "gpu": "'dense', 'chunked', 'pallas_gpu'",
      "tpu": "'dense', 'chunked'"}),
    ("chunked", dict(return_weights=True), ["return_weights=True"], "'dense'"),
    ("banded", dict(window=2, return_weights=True), ["return_weights=True"], "'dense'"),
    ("banded", dict(is_causal=True, return_weights=True), ["no window", "return_weights=True"],
     "'dense'"),
    ("chunked", dict(dtype=jnp.int32), ["dtype int32 (it takes bfloat16, float16, float32)"], None),
], ids=["banded_bias_no_window", "chunked_weights", "banded_weights", "banded_causal_weights",
        "int32"])
def test_capabilities_drive_the_errors(implementation, kwargs, missing, able):
  dtype = kwargs.pop("dtype", jnp.float32)
  q, k, v = _inputs(2, kv_heads=2, dtype=dtype)
  with pytest.raises(ValueError, match=f"^implementation='{implementation}' cannot do this: ") as e:
    dot_product_attention(q, k, v, implementation=implementation, **kwargs)
  message = str(e.value)
  for words in missing:
    assert words in message
  if able is None:
    assert message.endswith("; no registered implementation can")
  else:
    assert _able(message) == (able[jax.default_backend()] if isinstance(able, dict) else able)


def test_a_request_is_described_in_the_capabilities_terms():
  q, k, v = _inputs(3, kv_heads=1, dtype=jnp.bfloat16)
  request = AttentionRequest.of(q, k, v, mask=jnp.ones((Q, K), bool), is_causal=True, window=4,
                                key_value_seq_lengths=jnp.array([3, 4]), return_weights=True)
  # platform: the default ("cpu") on every machine; `plan` asks for each platform in turn
  assert request == AttentionRequest(mask=True, bias=False, window=(4, 0), causal=True,
                                     key_value_seq_lengths=True, gqa=True, dtype="bfloat16",
                                     return_weights=True, head_dim=D, q_len=Q, kv_len=K)
  assert request.platform == "cpu"
  q, k, v = _inputs(3)
  assert AttentionRequest.of(q, k, v, window=(1, 2), global_tokens=[0]) == AttentionRequest(
      window=(1, 2), global_tokens=True, head_dim=D, q_len=Q, kv_len=K)


@pytest.mark.parametrize("capabilities,request_,missing", [
    (dict(), AttentionRequest(), []),
    (dict(), AttentionRequest(mask=True, bias=True, key_value_seq_lengths=True, gqa=True),
     ["a mask", "a bias", "key_value_seq_lengths", "fewer key/value heads than query heads"]),
    (dict(), AttentionRequest(window=(2, 0)), ["a window (2, 0)"]),
    (dict(window="optional"), AttentionRequest(window=(2, 0)), []),
    (dict(window="required"), AttentionRequest(), ["no window (custom needs a window: pass "
                                                   "window=w or (left, right))"]),
    (dict(dtypes={"bfloat16"}), AttentionRequest(), ["dtype float32 (it takes bfloat16)"]),
    (dict(platforms={"gpu", "tpu"}), AttentionRequest(platform="cpu"),
     ["platform 'cpu' (it runs on 'gpu', 'tpu')"]),
    (dict(platforms={"gpu"}), AttentionRequest(platform="gpu"), []),
    (dict(), AttentionRequest(return_weights=True),
     ["return_weights=True needs the weights, which it does not return"]),
], ids=["nothing", "flags", "window", "optional_window", "required_window", "dtype", "platform",
        "on_platform", "weights"])
def test_unsupported_names_what_is_missing(capabilities, request_, missing):
  """Capabilities not declared are not claimed (except platforms: every backend)."""
  impl = Implementation("custom", _jax_nn([]), **capabilities)
  assert impl.unsupported(request_) == missing


def test_a_tpu_only_implementation_is_refused_for_a_cpu_and_lowered_for_a_tpu(registry,
                                                                              monkeypatch):
  """Named, it is traced (it runs on some platform); lowering for a CPU (or a GPU) raises the
  refusal, lowering for a TPU holds it; the error's alternatives are those of the platform:
  run here, the call is refused in this machine's platform's words."""
  calls = []
  register_implementation(Implementation(
      "tpu_kernel", _jax_nn(calls), mask=True, bias=True, key_value_seq_lengths=True, gqa=True,
      dtypes=FLOAT_DTYPES, platforms=frozenset({"tpu"})))
  assert implementation_names()[0] == "auto"
  assert implementation_names()[1:] == registered_implementations()
  assert registered_implementations()[:3] == ("dense", "chunked", "banded")
  assert registered_implementations()[-1] == "tpu_kernel"
  q, k, v = _inputs(4, kv_heads=2)
  lengths = jnp.array([K, 7])
  attend = lambda q: dot_product_attention(q, k, v, is_causal=True, key_value_seq_lengths=lengths,
                                           implementation="tpu_kernel", block_size=5)
  here = jax.default_backend()
  if here == "tpu":
    attend(q)
  else:
    refusal = fr"cannot do this: platform '{here}' \(it runs on 'tpu'\)"
    with pytest.raises(ValueError, match=refusal) as e:
      attend(q)
    # on a GPU our Triton kernel too (cuDNN: no float32, and q_len != kv_len causal)
    able = {"gpu": "'dense', 'chunked', 'pallas_gpu'"}.get(here, "'dense', 'chunked'")
    assert _able(str(e.value)) == able
  traced = jax.jit(attend).trace(q)
  with pytest.raises(attention_registry.ImplementationError, match="platform 'gpu'"):
    traced.lower(lowering_platforms=("cuda",))
  text = traced.lower(lowering_platforms=("tpu",)).as_text()
  assert "stablehlo.dot_general" in text          # the kernel's (jax.nn's) program
  assert calls[-1]["visibility"].right == 0 and calls[-1]["visibility"].left is None
  assert calls[-1]["visibility"].kv_lengths is not None
  assert (calls[-1]["block_size"], calls[-1]["return_weights"]) == (5, False)
  # traced on a TPU, the custom kernel is among those that can do what banded cannot
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  with pytest.raises(ValueError, match="no window") as e:
    dot_product_attention(q, k, v, implementation="banded")
  assert _able(str(e.value)) == "'dense', 'chunked', 'tpu_kernel'"


def test_registrations_in_a_test_do_not_leak(monkeypatch):
  with monkeypatch.context() as patch:
    patch.setattr(attention_registry, "_REGISTRY", dict(attention_registry._REGISTRY))
    register_implementation(Implementation("leak", _jax_nn([])))
    assert "leak" in implementation_names()
  assert "leak" not in implementation_names()


def test_an_unknown_name_lists_every_registered_name(registry):
  register_implementation(Implementation("mine", _jax_nn([])))
  q, k, v = _inputs(5)
  with pytest.raises(ValueError, match="implementation must be one of") as e:
    dot_product_attention(q, k, v, implementation="flash")
  names = ("auto", *registered_implementations())
  assert names[-1] == "mine"
  assert str(e.value) == f"implementation must be one of {names}, got 'flash'"
  with pytest.raises(ValueError, match=re.escape(f"one of {names}")):
    MultiHeadAttention(num_heads=H, implementation="flash").init(jax.random.key(0), q[..., 0, :])


def test_register_refuses_duplicates_and_bad_capabilities(registry):
  with pytest.raises(ValueError, match="'dense' is already registered"):
    register_implementation(Implementation("dense", _jax_nn([])))
  replacement = Implementation("dense", _jax_nn([]), returns_weights=True)
  register_implementation(replacement, replace=True)
  assert attention_registry.get("dense") is replacement
  with pytest.raises(ValueError, match="window must be one of"):
    Implementation("x", _jax_nn([]), window="sometimes")
  with pytest.raises(ValueError, match="dtypes must be a collection of names"):
    Implementation("x", _jax_nn([]), dtypes="float32")
  with pytest.raises(ValueError, match="function must be callable"):
    Implementation("x", None)
  assert Implementation("x", _jax_nn([]), platforms=["gpu"]).platforms == frozenset({"gpu"})


@pytest.mark.slow
def test_multi_head_attention_sows_by_the_returns_weights_capability(registry):
  """A custom implementation that returns weights is sown like dense; one that does not
  gives the same output, sows nothing and refuses dropout, naming the implementations that can."""
  def with_weights(q, k, v, *, scale, bias, mask, visibility, block_size, return_weights):
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
    weights = jax.nn.softmax(jnp.where(visibility.dense(q.shape[1], k.shape[1])[:, None],
                                       logits, -jnp.inf), axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    return (out, weights) if return_weights else out

  register_implementation(Implementation("weights", with_weights, returns_weights=True))
  register_implementation(Implementation("no_weights", _jax_nn([])))
  x = jnp.asarray(np.random.default_rng(6).standard_normal((B, Q, 12)), jnp.float32)
  runs = {}
  for name in ("dense", "weights", "no_weights"):
    module = MultiHeadAttention(num_heads=H, implementation=name)
    params = module.init(jax.random.key(0), x)["params"]
    runs[name] = module.apply({"params": params}, x, is_causal=True, mutable=["intermediates"])
  for name in ("weights", "no_weights"):
    np.testing.assert_allclose(runs[name][0], runs["dense"][0], atol=2e-5)
  dense_weights = runs["dense"][1]["intermediates"]["attention_weights"][0]
  np.testing.assert_allclose(runs["weights"][1]["intermediates"]["attention_weights"][0],
                             dense_weights, atol=1e-6)
  assert "intermediates" not in runs["no_weights"][1]

  dropout = MultiHeadAttention(num_heads=H, implementation="no_weights", dropout_rate=0.5)
  with pytest.raises(ValueError, match="use implementation='dense' or implementation='weights'"):
    dropout.apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(1)})


def test_the_docs_table_is_the_registry():
  """docs/attention.md shows the table the registry renders (no stale copy)."""
  table = attention_registry.capability_table().splitlines()
  page = (pathlib.Path(__file__).parents[2] / "docs" / "attention.md").read_text()
  shown = page.split("<!-- capability-table -->\n```\n")[1].split("```\n<!-- /capability-table -->")[0]
  assert shown.splitlines() == table
