"""RFT Mesh: reinforcement fine-tuning as four gRPC services (explorer, buffer, trainer, synchronizer)."""
