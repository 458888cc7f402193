"""Bad configurations and inputs raise errors that name the problem."""

import jax
import jax.numpy as jnp
import pytest
import torch
from torch_reference import B, D, H, P, T

from research.recurrent import GRU, LSTM, RNN, SimpleRNNCell, from_torch

X = jnp.zeros((B, T, D))
KEY = jax.random.key(0)


def init(layer, x=X, **kwargs):
  # shapes only: every check happens before any computation
  return jax.eval_shape(lambda: layer.init(KEY, x, **kwargs))


def test_valid_call_passes():
  """The baseline the other tests perturb."""
  init(LSTM(hidden_size=H, num_layers=2, bidirectional=True, proj_size=P),
       initial_state=(jnp.zeros((4, B, P)), jnp.zeros((4, B, H))), seq_lengths=jnp.array([1, 2, 3]))
  init(GRU(hidden_size=H, num_layers=2), initial_state=jnp.zeros((2, B, H)))


@pytest.mark.parametrize("shape", [(1, B, H + 1), (2, B, H), (1, B + 1, H), (B, H)])
def test_wrong_h0_shape(shape):
  with pytest.raises(ValueError, match=r"h0 must have shape .*\(1, 3, 4\)"):
    init(GRU(hidden_size=H), initial_state=jnp.zeros(shape))


def test_wrong_h0_shape_names_projection_size():
  with pytest.raises(ValueError, match=r"h0 must have shape .*\(2, 3, 2\)"):
    init(LSTM(hidden_size=H, bidirectional=True, proj_size=P),
         initial_state=(jnp.zeros((2, B, H)), jnp.zeros((2, B, H))))


def test_wrong_c0_shape():
  with pytest.raises(ValueError, match=r"c0 must have shape .*\(2, 3, 4\)"):
    init(LSTM(hidden_size=H, num_layers=2, proj_size=P),
         initial_state=(jnp.zeros((2, B, P)), jnp.zeros((2, B, P))))


@pytest.mark.parametrize("state", [jnp.zeros((1, B, H)), (jnp.zeros((1, B, H)),),
                                   (jnp.zeros((1, B, H)),) * 3, (jnp.zeros((1, B, H)), None)],
                         ids=["array", "1-tuple", "3-tuple", "c0-None"])
def test_lstm_initial_state_not_a_pair(state):
  with pytest.raises(ValueError, match="initial_state must be a pair"):
    init(LSTM(hidden_size=H), initial_state=state)


@pytest.mark.parametrize("lengths", [jnp.array([1, 2]), jnp.array([[1, 2, 3]]), jnp.array(3)],
                         ids=["too_short", "2d", "scalar"])
def test_seq_lengths_wrong_shape(lengths):
  with pytest.raises(ValueError, match=r"seq_lengths must have shape \(batch,\)"):
    init(GRU(hidden_size=H), seq_lengths=lengths)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bool_])
def test_seq_lengths_not_integer(dtype):
  with pytest.raises(ValueError, match="seq_lengths must be integers"):
    init(RNN(hidden_size=H), seq_lengths=jnp.array([1, 2, 3]).astype(dtype))


@pytest.mark.parametrize("proj_size", [H, H + 1, -1])
def test_proj_size_out_of_range(proj_size):
  with pytest.raises(ValueError, match="proj_size"):
    init(LSTM(hidden_size=H, proj_size=proj_size))


def test_nonlinearity():
  with pytest.raises(ValueError, match="nonlinearity must be 'tanh' or 'relu'"):
    init(RNN(hidden_size=H, nonlinearity="sigmoid"))
  with pytest.raises(ValueError, match="nonlinearity"):
    cell = SimpleRNNCell(features=H, nonlinearity="gelu")
    jax.eval_shape(lambda: cell.init(KEY, jnp.zeros((B, H)), jnp.zeros((B, D))))


@pytest.mark.parametrize("value", [0, -1, 2.0])
@pytest.mark.parametrize("key", ["hidden_size", "num_layers"])
def test_sizes_must_be_positive_ints(key, value):
  kwargs = {"hidden_size": H, key: value}
  with pytest.raises(ValueError, match=f"{key} must be a positive int"):
    init(GRU(**kwargs))


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 1.5])
def test_dropout_out_of_range(dropout):
  with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
    init(LSTM(hidden_size=H, num_layers=2, dropout=dropout))


@pytest.mark.parametrize("shape", [(2, B, T, D), (D,)], ids=["4d", "1d"])
def test_x_rank(shape):
  with pytest.raises(ValueError, match=r"x must be \[batch, time, features\]"):
    init(LSTM(hidden_size=H), x=jnp.zeros(shape))


@pytest.mark.parametrize("module", [torch.nn.Linear(3, 4), torch.nn.RNNCell(3, 4),
                                    torch.nn.LSTMCell(3, 4)], ids=["Linear", "RNNCell", "LSTMCell"])
def test_from_torch_rejects_other_modules(module):
  with pytest.raises(TypeError, match=f"from_torch takes a torch.nn.RNN, LSTM or GRU, got {type(module).__name__}"):
    from_torch(module)
