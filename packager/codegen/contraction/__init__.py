"""The register-blocked contraction kernels: matmul and conv2d (tagged by their legalizers, see
``ir.patterns``), with whatever elementwise epilogue fusion put after them.

- ``geometry.py``: pure Python (no llvmlite): thread thresholds, register tiles, vector widths,
  ``conv_geometry`` (plane layout, tile, loop order, chunks, tail); ``passes/layout.py`` reads
  it to pack weights in the tile's row blocks.
- ``match.py``: which primitive functions the kernels take (``match_contraction``).
- ``emitter.py``: the shared state and pieces, and the register-tile microkernel.
- ``epilogue.py``: the fused epilogue, a vector at a time or element by element.
- ``matmul.py``, ``conv.py``: the two static paths (a matmul's M, N, K may be run-time sizes).
- ``kernel.py``: ``ContractionEmitter``, composed of the above; ``emit_contraction``,
  ``emit_symbolic_matmul``.
- ``conv_symbolic.py``: the conv2d with run-time image sizes; ``conv_packed_symbolic.py`` its
  1x1 on packed input panels (``conv_packed.py``'s, the pixel count a run-time value).
- ``dot.py``: one-pixel convolutions and one-row linear layers, the reduction on the lanes.

Nothing is imported here, so that importing ``geometry`` never loads llvmlite.
"""
