"""Position encodings added to token embeddings."""

import jax
import jax.numpy as jnp

Array = jax.Array


def sinusoidal_positions(length: int, features: int) -> Array:
  """Vaswani et al.'s encoding [length, features]: sin(p / 10000^(2i/F)) at feature 2i,
  cos(p / 10000^(2i/F)) at feature 2i + 1, for position p."""
  rates = 1.0 / 10000.0 ** (jnp.arange(0, features, 2) / features)     # [⌈F/2⌉]
  angles = jnp.arange(length)[:, None] * rates[None]                   # [length, ⌈F/2⌉]
  return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(length, -1)[:, :features]
