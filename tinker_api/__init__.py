"""`rft serve tinker`: a Tinker-compatible HTTP API (the routes the official `tinker` SDK calls).

A front end of its own beside the launcher and the services (nothing there imports it), so it may use
both sides' code in-process: the trainer's policy losses and AdamW (`services/trainer/algorithms`,
`optim.py`, `lora.py`) for the training clients, and the explorer's `hf` engine for the sampling clients. docs/tinker.md describes
the routes, the loss mapping and what a checkpoint is.
"""
