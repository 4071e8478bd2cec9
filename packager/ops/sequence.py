"""Operator-table rows needed by attention, recurrent and quantization operators that the other
tables do not cover."""

from __future__ import annotations
