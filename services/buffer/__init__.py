"""Buffer service: the stream of Experience batches from explorers to trainers, with leases and exactly-once delivery."""
