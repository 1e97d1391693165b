"""Target responses, the fixed texts probe collection and the closed loop teacher-force on.

- ``generate``: sample or greedily decode them with the target model (batched, plain full KV cache);
- ``files``: the targets Parquet file (rows, provenance, validation against a dataset);
- ``store``: resumable, sharded generation into that file (one part per response, merged when complete).

Import from the submodules: this package imports nothing itself, so reading a targets file loads no model code.
"""
