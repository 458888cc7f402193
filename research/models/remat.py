"""`model.remat`: rematerialisation, a block's activations recomputed in the backward pass
instead of kept from the forward pass (`jax.checkpoint`, as `flax.linen.remat` lifts it).

Less activation memory on GPUs and TPUs for more compute, with the same outputs, gradients
and parameter names whatever the choice (a checkpoint written with one restores under any
other); `remat` says what each of REMAT keeps.
"""

from collections.abc import Callable

import flax.linen as nn
import jax

from research.errors import check_choice

POLICIES = ("dots_saveable", "dots_with_no_batch_dims_saveable")
REMAT = ("none", "block", *POLICIES)


def check_remat(value: str) -> None:
  """ValueError naming the allowed values unless `value` is one of REMAT."""
  check_choice("remat", value, REMAT)


def remat(run: Callable, value: str) -> Callable:
  """`run` (a function of a bound module and its array arguments, e.g.
  `lambda block, x: block(x, train=train)`) recomputed in the backward pass as `value`
  says (one of REMAT): unchanged for "none", `nn.remat(run)` for "block",
  `nn.remat(run, policy=jax.checkpoint_policies.<value>)` for a named policy.

    none     every block keeps what its backward pass reads (the default): activation
             memory grows with the depth, num_layers × one block's
    block    each block keeps its inputs alone and runs its forward pass again in the
             backward pass (JAX's default policy: nothing saveable): one block's activations
             live at a time, the inputs of every block (x [B, L, F]) besides, for about one
             more forward pass of compute (≈ 4/3 of a step's flops without remat)
    dots_saveable                       the outputs of every matrix product are kept, the
                                        rest (softmax, gelu, norms, dropout masks) recomputed
    dots_with_no_batch_dims_saveable    only the products without batch dimensions are kept
                                        (x W of the projections and the MLP), not the
                                        batched ones of attention (q kᵀ [B, H, L, L], p v)

  The named policies are `jax.checkpoint_policies`' (MaxText's `remat_policy` names):
  between none and block in memory and compute. `nothing_saveable` is "block" and
  `everything_saveable` saves as much as "none", so neither is listed. The same outputs and
  gradients whatever the choice (the same operations, run again), and the same parameters
  under the same names.

  What a block is: a TransformerBlock of BlockStack (kinds transformer, lru, s5); for the
  recurrent kinds (rnn, lstm, gru), whose layers research.recurrent stacks in one module,
  each layer and direction of that stack (its fused loop's gate activations [B, T, G·H]
  recomputed, its input kept; `RecurrentLayer.remat_layer`), and so for Seq2Seq's encoder;
  not Seq2Seq's decoder, one cell stepped through time.

  Python arguments such as `train` are closed over by `run`, not traced, so no
  `static_argnums` are needed. `prevent_cse` stays on (JAX's default): the blocks run in a
  Python loop, not inside a `scan`, and without it XLA's common-subexpression elimination
  could merge the recomputation with the forward pass and keep the activations after all.
  The saving is the GPU's and TPU's: XLA's CPU backend drops the optimisation barriers that
  keep the recomputation late, and a CPU step's memory does not fall."""
  check_remat(value)
  if value == "none":
    return run
  policy = None if value == "block" else getattr(jax.checkpoint_policies, value)
  return nn.remat(run, policy=policy)
