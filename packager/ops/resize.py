"""Operator-table rows for resampling (resize and friends)."""

from __future__ import annotations
