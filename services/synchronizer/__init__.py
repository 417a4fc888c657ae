"""Synchronizer service: run state, model versions, sync plan and weight transfer."""
