"""The portable attention strategies, registered in `registry` with what they can do.

`dense` (returns the weights), `chunked` (exact, O(n) memory) and `banded` (a window or a
block-sparse pattern in O(n·w)) run on every platform; with the accelerator kernels of
`kernels/` they make the registry that `registry.capability_table()` renders and "auto"
chooses from (docs/attention.md shows the table and each platform's order).
"""

import math

from research.attention.banded import DEFAULT_BLOCK, banded_attention, gathered_blocks
from research.attention.chunked import chunked_attention
from research.attention.dense import dense_attention
from research.attention.masks import Visibility
from research.attention.registry import FLOAT_DTYPES, Implementation, Request, register

# Up to one key block of `chunked` (256), dense attention is the same memory in one step.
DENSE_MAX_KV_LEN = 256
BANDED_RANK, CHUNKED_RANK = 2, 3   # after the fused kernels (0); dense: 1 when short, else 4


def _dense_rank(request: Request) -> int:
  return 1 if request.kv_len <= DENSE_MAX_KV_LEN else 4


def _banded_rank(request: Request) -> int:
  """Before chunked for a window, and for a block-sparse pattern whose query blocks visit
  at most a quarter of the key blocks (BigBird's w + g + r at length 32·B or more); after
  it where they visit more (fixed's summaries and strided's strides lie in every key
  block): banded computes every query block's tile as wide as the widest."""
  if request.sparsity is None:
    return BANDED_RANK
  visibility = Visibility.make(request.causal, None, sparsity=request.sparsity)
  visits, _ = gathered_blocks(visibility, request.q_len, request.kv_len)
  quarter = math.ceil(request.kv_len / DEFAULT_BLOCK) / 4
  return BANDED_RANK if visits.shape[1] <= quarter else CHUNKED_RANK + 1


# The three strategies of this package, behind the uniform signature.

def _dense(q, k, v, *, scale, bias, mask, visibility: Visibility, block_size, return_weights):
  del block_size  # no blocks: the weights are materialised whole
  visible = None
  if not visibility.sees_everything:
    visible = visibility.dense(q.shape[1], k.shape[1])[:, None]
  if mask is not None:
    visible = mask if visible is None else visible & mask
  out, weights = dense_attention(q, k, v, scale=scale, bias=bias, visible=visible)
  return (out, weights) if return_weights else out


def _chunked(q, k, v, *, scale, bias, mask, visibility, block_size, return_weights):
  del return_weights  # never asked for: returns_weights=False
  blocks = {} if block_size is None else dict(q_block=block_size, k_block=block_size)
  return chunked_attention(q, k, v, scale=scale, bias=bias, mask=mask, visibility=visibility,
                           **blocks)


def _banded(q, k, v, *, scale, bias, mask, visibility, block_size, return_weights):
  del return_weights  # never asked for: returns_weights=False
  blocks = {} if block_size is None else dict(block=block_size)
  return banded_attention(q, k, v, scale=scale, bias=bias, mask=mask, visibility=visibility,
                          **blocks)


_EXACT = dict(mask=True, bias=True, window="optional", global_tokens=True, block_sparse=True,
              key_value_seq_lengths=True, gqa=True, dtypes=FLOAT_DTYPES)
register(Implementation("dense", _dense, returns_weights=True, auto_rank=_dense_rank, **_EXACT))
register(Implementation("chunked", _chunked, auto_rank=CHUNKED_RANK, **_EXACT))
register(Implementation("banded", _banded, auto_rank=_banded_rank,
                        **(_EXACT | dict(window="required"))))
