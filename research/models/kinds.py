"""`model.kind`: the sequence mixer of a model, a recurrent stack or a transformer.

  rnn | lstm | gru   research.recurrent's layers (Elman tanh RNN, LSTM, GRU), stepped
                     through time
  transformer        TransformerBlocks of self-attention and an MLP
"""

from research.recurrent import GRU, LSTM, RNN

RECURRENT = {"rnn": RNN, "lstm": LSTM, "gru": GRU}
KINDS = (*RECURRENT, "transformer")
