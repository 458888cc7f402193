"""The adding problem (Hochreiter & Schmidhuber, 1997) with the recurrent library.

Each input is a sequence of T pairs (value ~ U[0, 1], marker ∈ {0, 1}) with exactly two
markers; the target is the sum of the two marked values. Predicting the mean (1.0)
scores an MSE of 1/6 ≈ 0.167, so a model that beats it has learned to carry the
marked values across the whole sequence. Trains an RNN, an LSTM and a GRU of the same
width and prints their test MSE:

    python3 tasks.py main                            # T=50, about 25 s on 2 CPU cores
    python examples/adding_problem.py --length 100   # a harder distance

Expected at T=50: LSTM and GRU below 0.001, the tanh RNN at or above the 0.167 baseline.
"""

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from research import recurrent


def adding_batch(key: jax.Array, batch: int, length: int) -> tuple[jax.Array, jax.Array]:
  """x [batch, length, 2] (value, marker), y [batch] = sum of the two marked values."""
  k_values, k_first, k_second = jax.random.split(key, 3)
  values = jax.random.uniform(k_values, (batch, length))
  first = jax.random.randint(k_first, (batch,), 0, length // 2)
  second = jax.random.randint(k_second, (batch,), length // 2, length)
  steps = jnp.arange(length)
  markers = (steps == first[:, None]) | (steps == second[:, None])
  x = jnp.stack([values, markers.astype(values.dtype)], axis=-1)
  return x, jnp.sum(values * markers, axis=1)


class Regressor(nn.Module):
  """A recurrent layer read out by a linear map from its last hidden state."""
  layer: nn.Module

  @nn.compact
  def __call__(self, x):
    outputs, _ = self.layer(x)
    return nn.Dense(1)(outputs[:, -1])[:, 0]


def train(name: str, layer: nn.Module, args) -> float:
  model = Regressor(layer)
  key = jax.random.key(args.seed)
  params = model.init(key, adding_batch(key, 2, args.length)[0])
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(args.learning_rate))
  opt_state = optimizer.init(params)

  def loss_fn(params, x, y):
    return jnp.mean((model.apply(params, x) - y) ** 2)

  @jax.jit
  def step(params, opt_state, key):
    x, y = adding_batch(key, args.batch_size, args.length)
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  start = time.perf_counter()
  for i in range(args.steps):
    params, opt_state, loss = step(params, opt_state, jax.random.fold_in(key, i))
    if (i + 1) % (args.steps // 4) == 0:
      print(f"  {name:5s} step {i + 1:4d}  train MSE {float(loss):.4f}", flush=True)
  x, y = adding_batch(jax.random.key(args.seed + 1), 1000, args.length)
  test_mse = float(loss_fn(params, x, y))
  print(f"  {name:5s} test MSE {test_mse:.4f}  ({time.perf_counter() - start:.0f} s)", flush=True)
  return test_mse


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--length", type=int, default=50)
  parser.add_argument("--hidden", type=int, default=64)
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--learning_rate", type=float, default=1e-2)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  print(f"Adding problem, T={args.length}; predicting the mean scores MSE 0.167")
  results = {name: train(name, layer(hidden_size=args.hidden), args)
             for name, layer in [("rnn", recurrent.RNN), ("lstm", recurrent.LSTM),
                                 ("gru", recurrent.GRU)]}
  print("\n| model | test MSE |\n|---|---|")
  for name, mse in results.items():
    print(f"| {name} | {mse:.4f} |")


if __name__ == "__main__":
  main()
