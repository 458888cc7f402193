"""A restored run answers raw input: one module per experiment, each a pure function of the run
(`research.training.restore`) and the input, batched and jit-compiled. Input the run's model
cannot take is refused with one research.errors.InputError naming the offending part and what
the model takes, before anything compiles. research/predict/runs.py holds the rules every
predictor keeps; docs/trained_runs.md#your-own-input lists the functions. `compare_runs`
(compare.py) reads runs and sweeps into one table of their metrics, configs and provenance.
"""

from research.predict.char_lm import bits_per_byte, byte_bits, sample
from research.predict.compare import MixedRunsWarning, compare_runs
from research.predict.kernel_regression import Regression, regress
from research.predict.listops import Classifications, Encoded, classify, encode_expressions
from research.predict.lra import LRAClassifications, LRAInputs, classify_lra, encode_lra_inputs
from research.predict.mqar import Recalls, recall
from research.predict.nmt_dates import Translations, encode_texts, translate
from research.predict.sequence_tasks import SequencePredictions, predict_sequences

__all__ = ["Classifications", "Encoded", "LRAClassifications", "LRAInputs", "MixedRunsWarning",
           "Recalls", "Regression", "SequencePredictions", "Translations", "bits_per_byte",
           "byte_bits", "classify", "classify_lra", "compare_runs", "encode_expressions",
           "encode_lra_inputs", "encode_texts", "predict_sequences", "recall", "regress",
           "sample", "translate"]
