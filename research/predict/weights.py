"""The attention weights a restored run's blocks sow, layer by layer, for the predictors."""

import jax

from research.attention import registry


def apply_with_weights(model, variables, *args, **kwargs):
  """(model.apply(variables, *args, **kwargs), each block's attention weights in layer
  order, or None where a block computes none). Where the model's implementation does not
  give its weights, a second pass with implementation "dense" sows them."""
  if registry.gives_weights(model.implementation):
    outputs, state = model.apply(variables, *args, **kwargs, mutable=["intermediates"])
  else:
    outputs = model.apply(variables, *args, **kwargs)
    _, state = model.clone(implementation="dense").apply(variables, *args, **kwargs,
                                                         mutable=["intermediates"])
  return outputs, layer_weights(state.get("intermediates", {}), model.num_layers)


def layer_weights(intermediates, num_layers: int) -> tuple[jax.Array, ...] | None:
  """The attention weights each block sowed ("stack"/"block<i>"/…/"attention_weights"),
  in layer order; None where a block sowed none."""
  blocks = intermediates.get("stack", {})
  weights = []
  for layer in range(num_layers):
    sown = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(
        blocks.get(f"block{layer}", {}))[0]
            if any(getattr(key, "key", None) == "attention_weights" for key in path)]
    if not sown:
      return None
    weights.append(sown[0])
  return tuple(weights)
