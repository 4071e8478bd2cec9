"""Converters for recurrent and control-flow ONNX operators (LSTM, GRU, RNN, If...) with a
sequence length and conditions fixed at export."""

from __future__ import annotations
