"""The portable attention strategies, registered in `registry` with what they can do.

Together with the accelerator kernels (`kernels/`, registered there), the registry reads:

  name        mask  bias  window    global  sparse  lengths  H_kv<H  dtypes        platforms  weights  auto rank
  dense       yes   yes   optional  yes     yes     yes      yes     f32 bf16 f16  all        yes      varies
  chunked     yes   yes   optional  yes     yes     yes      yes     f32 bf16 f16  all        no       3
  banded      yes   yes   required  yes     yes     yes      yes     f32 bf16 f16  all        no       varies
  cudnn       yes   yes   optional  no      no      yes      yes     bf16 f16      gpu        no       0
  pallas_gpu  yes   yes   optional  yes     yes     yes      yes     f32 bf16 f16  gpu cpu*   no       varies
  pallas_tpu  no    no    optional  yes     yes     yes      yes     f32 bf16      tpu cpu*   no       0

(`registry.capability_table()`; a test keeps this copy equal to it). "global" is
`global_tokens=`, "sparse" `sparsity=` (a block-sparse pattern: Sparse Transformer's fixed
or strided, BigBird; it stands for banded's required window), "lengths"
`key_value_seq_lengths`, "weights" `return_weights=True`;
cpu* is Pallas interpret mode (slow: for tests, taken by name only). Causal attention is
no capability: every implementation does it. cuDNN also refuses a two-sided window, a
window with a mask or bias, head dims it cannot take and odd lengths (one query aside)
(`kernels/cudnn.py`), and is skipped where the cuDNN library is not installed.

`implementation="auto"` picks, for each platform the call is lowered for, the first
implementation running natively there that can do the request, by auto rank:

  platform  tried in order
  gpu       pallas_gpu for a window at head dims up to 64 (faster there, measured),
            cudnn, pallas_gpu, then as on cpu
  tpu       pallas_tpu, then as on cpu
  cpu       dense if kv_len <= 256, banded, chunked, dense (banded after chunked for a
            block-sparse pattern whose query blocks visit over a quarter of the key blocks)

so a fused kernel runs wherever one can do the pattern; otherwise a sliding window or a
block-sparse pattern of few blocks per row (BigBird) goes to `banded` (O(n·w), or O(n)
times the blocks a query block visits), anything else (fixed, strided) to `chunked` (O(n)
memory), and the weights
(`return_weights=True`) to `dense`. Up to kv_len = 256 (one key block of `chunked`) dense
is the same memory in one step. "auto" never changes the mathematics: a request no
candidate can do raises the error of an explicit name.
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
