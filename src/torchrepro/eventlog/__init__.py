"""The event log, the contract between capture and analysis: typed events, the JSONL writer and tolerant reader, the TORCH_TRACE translator, run directories, tail, provenance."""
