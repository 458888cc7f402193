"""`model.kind`: the sequence mixer of a model: a recurrent stack (RECURRENT) or blocks
(BLOCK_KINDS) of self-attention or a linear recurrence in its place.
"""

from research.models.recurrent_mixer import LINEAR_RECURRENT
from research.recurrent import GRU, LSTM, RNN

# rnn | lstm | gru   research.recurrent's layers (Elman tanh RNN, LSTM, GRU), stepped
#                    through time with a carried state
# transformer        blocks of self-attention and an MLP (TransformerBlock)
# lru | s5 |         the same blocks with a linear recurrence in the place of the
# linear_cell |      self-attention (recurrent_mixer.py), parallel over time: LTI (LRU,
# mamba | mamba2 |   S5), linear attention as a cell, or selective (Mamba, Mamba-2, GLA,
# gla | deltanet     DeltaNet)
RECURRENT = {"rnn": RNN, "lstm": LSTM, "gru": GRU}
BLOCK_KINDS = ("transformer", *LINEAR_RECURRENT)
KINDS = (*RECURRENT, *BLOCK_KINDS)
