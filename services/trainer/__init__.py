"""Trainer service: PPO/GRPO-family policy updates on FSDP2, checkpoints and resume."""
