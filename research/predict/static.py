"""A restored run's model as a static argument of jax.jit.

jax.jit compiles once per static argument (and input shape) when that argument hashes;
a flax Module hashes its fields, and the stack's config.model.recurrence is an
ml_collections.ConfigDict, which does not. `ByIdentity(run.model)` hashes the Module by
identity instead: every call on the same restored run reuses the compiled function.
"""

from typing import Any


class ByIdentity:
  """`value`, equal only to another ByIdentity of the very same object."""

  def __init__(self, value: Any):
    self.value = value

  def __hash__(self) -> int:
    return id(self.value)

  def __eq__(self, other) -> bool:
    return isinstance(other, ByIdentity) and other.value is self.value
