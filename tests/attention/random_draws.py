"""Inputs and parameters drawn with NumPy for the attention tests (no compilation)."""

import jax
import numpy as np


def normal(seed, shape, scale=1.0):
  """scale · N(0, 1) draws of `shape`, float32, from `seed`."""
  return scale * np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def random_params(module, x, scale=0.5, first_seed=30):
  """Parameters of the shapes `module.init` gives, drawn here: leaf i is
  scale · N(0, 1) from seed first_seed + i. Returns {"params": ...}."""
  shapes = jax.eval_shape(module.init, jax.random.key(0), x)["params"]
  leaves, tree = jax.tree.flatten(shapes)
  return {"params": jax.tree.unflatten(tree, [scale * normal(first_seed + i, s.shape)
                                              for i, s in enumerate(leaves)])}
