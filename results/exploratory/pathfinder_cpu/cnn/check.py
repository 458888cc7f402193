"""Exploratory: is the generated Pathfinder (easy, 32 × 32) learnable from the cpu preset's
16 000 training images? A small CNN (four 3 × 3 convolutions of 32–64 channels, global max
pooling, an MLP), Adam at 1e-3, batch 64; test accuracy on 1 000 test images every 500 steps.

  taskset -c 1 .venv/bin/python results/exploratory/pathfinder_cpu/cnn/check.py \
      data/pathfinder-n20000-seed0

(the images of `launch.py --config experiments/lra.py:task=pathfinder,preset=cpu`). Its
output, step / train loss / test accuracy / seconds, is log.txt (stopped after step 2 000).
"""

import sys
import time

import flax.linen as nn
import jax
import numpy as np
import optax

from research.data import pathfinder


class CNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    for features in (32, 32, 64, 64):
      x = nn.relu(nn.Conv(features, (3, 3))(x))
    return nn.Dense(2)(nn.relu(nn.Dense(64)(x.max((1, 2)))))


def main(root: str) -> None:
  splits = pathfinder.read_release(root, 32, "easy")
  x_train, y_train = splits["train"]["tokens"].reshape(-1, 32, 32, 1) / 255.0, splits["train"]["labels"]
  x_test, y_test = splits["test"]["tokens"].reshape(-1, 32, 32, 1) / 255.0, splits["test"]["labels"]
  model, optimizer = CNN(), optax.adam(1e-3)
  params = model.init(jax.random.PRNGKey(0), x_train[:1])
  state = optimizer.init(params)

  @jax.jit
  def step(params, state, x, y):
    def loss(params):
      return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y).mean()
    value, grads = jax.value_and_grad(loss)(params)
    updates, state = optimizer.update(grads, state)
    return optax.apply_updates(params, updates), state, value

  accuracy = jax.jit(lambda params, x, y: (model.apply(params, x).argmax(-1) == y).mean())
  rng, start = np.random.default_rng(0), time.time()
  for i in range(3001):
    batch = rng.integers(0, len(x_train), 64)
    params, state, value = step(params, state, x_train[batch], y_train[batch])
    if i % 500 == 0:
      print(i, float(value), float(accuracy(params, x_test[:1000], y_test[:1000])),
            time.time() - start, flush=True)


if __name__ == "__main__":
  main(sys.argv[1])
