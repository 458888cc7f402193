"""A JAX/Flax research codebase for attention mechanisms and recurrent networks."""
