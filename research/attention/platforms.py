"""Choosing per lowering platform: one traced call, a different program for each target.

JAX decides the platform late (`lower(lowering_platforms=("tpu",))` from a CPU machine,
`jax.export(f, platforms=("cpu", "cuda", "tpu"))` into one artifact): `per_platform` stages
a branch per platform with `jax.lax.platform_dependent`, `only_on` keeps a kernel to its own
platform's lowering and `refusal` fails only when lowered for a platform that cannot run.
"""

from collections.abc import Callable

import jax
from jax.extend import core as jex_core
from jax.interpreters import batching, mlir
from jax.sharding import PartitionSpec

from research.attention import registry

# Lowering platforms (as `lowering_platforms=` and `platform_dependent` name them) and the
# capability names of `registry.PLATFORMS`; ROCm GPUs take the default branch (the CPU's
# portable choice): no kernel here is built or tested for them.
LOWERING = {"cpu": "cpu", "cuda": "gpu", "tpu": "tpu"}

lowered_for_p = jex_core.Primitive("lowered_for")
lowered_for_p.multiple_results = True
refusal_p = jex_core.Primitive("attention_refusal")
refusal_p.multiple_results = True


def _lowered_for_abstract_eval(*avals, jaxpr, platform):
  del avals, platform
  return jaxpr.out_avals


def _lowered_for_lowering(ctx, *args, jaxpr, platform):
  """The body lowered for `platform` only (its kernels have no rule for the others)."""
  body = mlir.lower_fun(jex_core.jaxpr_as_fun(jaxpr), multiple_results=True)
  return body(ctx.replace(platforms=(platform,)), *args)


def _lowered_for_batching(args, dims, *, jaxpr, platform):
  in_axes = [None if d is batching.not_mapped else d for d in dims]
  batched = jax.vmap(jex_core.jaxpr_as_fun(jaxpr), in_axes=in_axes)
  out = _bind(platform, batched, args)
  return out, [0] * len(out)


lowered_for_p.def_abstract_eval(_lowered_for_abstract_eval)
lowered_for_p.def_impl(lambda *args, jaxpr, platform: jax.jit(
    lambda *a: lowered_for_p.bind(*a, jaxpr=jaxpr, platform=platform))(*args))
mlir.register_lowering(lowered_for_p, _lowered_for_lowering)
batching.primitive_batchers[lowered_for_p] = _lowered_for_batching


def _bind(platform: str, fn: Callable, flat_args) -> list:
  """fn(*flat_args) (flat lists of arrays) as one `lowered_for` equation."""
  closed = jax.make_jaxpr(fn)(*flat_args)
  return list(lowered_for_p.bind(*flat_args, jaxpr=closed, platform=platform))


def _call(platform: str, fn: Callable, *args):
  """fn(*args) for pytrees of arrays, as one `lowered_for` equation (fn traced once)."""
  flat, tree = jax.tree.flatten(args)
  out_trees = []

  def flat_fn(*leaves):
    out, out_tree = jax.tree.flatten(fn(*jax.tree.unflatten(tree, leaves)))
    out_trees.append(out_tree)
    return out

  out = _bind(platform, flat_fn, flat)
  return jax.tree.unflatten(out_trees[0], out)


def only_on(platform: str, fn: Callable) -> Callable:
  """fn(diff, rest) -> out, lowered for `platform` alone, differentiable in `diff` (a
  pytree of float arrays, e.g. (q, k, v, bias)); `rest` (masks, lengths) gets no cotangent.
  Forward and backward are fn's own (its VJP, residuals included), each lowered for
  `platform` only.

  A branch holding a platform's kernel (a Mosaic or Triton `pallas_call`, cuDNN's custom
  call) cannot be lowered for any other platform, yet a multi-platform lowering lowers every
  branch for every platform: the kernel is wrapped in a primitive (`lowered_for`) whose
  lowering rule lowers its body for `platform` alone, under `custom_vjp`, so it needs no
  derivative rules."""

  @jax.custom_vjp
  def run(diff, rest):
    return _call(platform, fn, diff, rest)

  def forward(diff, rest):
    def with_pullback(diff, rest):
      out, pullback = jax.vjp(lambda d: fn(d, rest), diff)
      return out, pullback                  # a pytree: residuals are its leaves
    out, pullback = _call(platform, with_pullback, diff, rest)
    return out, pullback

  def backward(pullback, cotangent):
    (d_diff,) = _call(platform, lambda p, c: p(c), pullback, cotangent)
    return d_diff, None

  run.defvjp(forward, backward)
  return run


def over_the_batch(fn: Callable) -> Callable:
  """fn(diff, rest) under `jax.shard_map` over the batch axis when traced under a mesh of
  several devices (`jax.set_mesh`, as the train loop's mesh strategy does): a Mosaic or
  Triton kernel cannot be partitioned by XLA, so each device runs it on its own rows.
  Arrays whose batch axis is 1 (a broadcast mask or bias) go to every device whole."""

  def sharded(diff, rest):
    mesh = jax.sharding.get_abstract_mesh()
    batch = diff[0].shape[0]
    if mesh.empty or mesh.size == 1 or batch % mesh.size:
      return fn(diff, rest)
    rows = PartitionSpec(tuple(mesh.axis_names))
    spec = lambda x: rows if x.shape[0] == batch else PartitionSpec()
    specs = jax.tree.map(spec, (diff, rest))
    out_specs = jax.tree.map(lambda _: rows, jax.eval_shape(fn, diff, rest))
    return jax.shard_map(fn, in_specs=specs, out_specs=out_specs, check_vma=False)(diff, rest)

  return sharded


def _refusal_abstract_eval(*avals, message, out_avals):
  del avals, message
  return out_avals


def _refusal_lowering(ctx, *args, message, out_avals):
  del ctx
  _refusal_impl(*args, message=message, out_avals=out_avals)


def _refusal_impl(*args, message, out_avals):
  del args, out_avals
  raise registry.ImplementationError(message)


refusal_p.def_abstract_eval(_refusal_abstract_eval)
refusal_p.def_impl(_refusal_impl)
mlir.register_lowering(refusal_p, _refusal_lowering)
batching.primitive_batchers[refusal_p] = lambda args, dims, **params: (
    refusal_p.bind(*args, **params), [batching.not_mapped] * len(params["out_avals"]))


def refusal(message: str, out_shape) -> Callable:
  """A branch shaped like `out_shape` (a pytree of ShapeDtypeStructs) whose lowering raises
  ValueError(message) (an ImplementationError): a named implementation that cannot run on
  some platform takes it there, so the call traces, lowers for the platforms that can run
  it, and fails, naming why, only when lowered for one that cannot."""
  leaves, tree = jax.tree.flatten(out_shape)
  avals = tuple(jax.core.ShapedArray(x.shape, x.dtype) for x in leaves)

  def branch(*args):
    del args
    return jax.tree.unflatten(tree, refusal_p.bind(message=message, out_avals=avals))

  return branch


def per_platform(branches: dict[str, Callable], *args):
  """`branches[p](*args)` for the lowering platform p ("cpu", "cuda", "tpu"; others take
  the "cpu" branch). Identical branches are staged once; a single distinct branch is
  called directly."""
  if len({id(b) for b in branches.values()}) == 1:
    return next(iter(branches.values()))(*args)
  return jax.lax.platform_dependent(*args, default=branches["cpu"], **branches)


# Kernels whose custom calls `jax.export` does not promise to keep working across versions
# (Pallas TPU's `tpu_custom_call` it does). Exporting a program that holds them:
#   jax.export.export(jax.jit(f), platforms=("cpu", "cuda", "tpu"),
#                     disabled_checks=platforms.export_checks_to_disable())(...)
UNSTABLE_CUSTOM_CALLS = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward",
                         "__gpu$xla.gpu.triton")


def export_checks_to_disable() -> list:
  """`disabled_checks=` for `jax.export.export` of a program with our GPU kernels."""
  return [jax.export.DisabledSafetyCheck.custom_call(name) for name in UNSTABLE_CUSTOM_CALLS]


def host() -> str:
  """The capability name of the platform calls are traced for (a fallback for messages):
  a deviceless compile's (`registry.compiling_for`), else this machine's backend's."""
  target = registry.compile_target()
  if target is not None:
    return target.platform
  return {"gpu": "gpu", "cuda": "gpu", "tpu": "tpu"}.get(jax.default_backend(), "cpu")
