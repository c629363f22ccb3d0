"""Routing predictors fitted on a trace: token -> expert (Cp), token -> device (T, Tp), device n-grams (A, Ap)."""

from sempar.affinity.affinity_stats import device_states
from sempar.predict.accuracy import combine, prediction_accuracy
from sempar.predict.confidence import ExpertConfidence
from sempar.predict.ngram import DeviceNgram
from sempar.predict.oov import EmbeddingOOV, load_input_embedding
from sempar.predict.token_device import TokenDevice
from sempar.predict.token_table import TokenTable

__all__ = ["DeviceNgram", "EmbeddingOOV", "ExpertConfidence", "TokenDevice", "TokenTable", "combine",
           "device_states", "load_input_embedding", "prediction_accuracy"]
