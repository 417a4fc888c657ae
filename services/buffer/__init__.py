"""The buffer service: explorers stream experience batches in, trainers lease whole groups out and ack
them after their optimizer step. Stores (`memory`, `redis`) sit behind one `Store` protocol; the core
(`BufferCore`) does validation, waiting, capacity and metrics; the servicer adapts it to gRPC."""
