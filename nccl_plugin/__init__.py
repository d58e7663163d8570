"""NCCL profiler plugin (C) and its Python decoder/ingest. Lands with the NCCL plugin issue."""
