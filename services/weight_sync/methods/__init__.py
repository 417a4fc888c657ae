"""The built-in weight-sync methods (`SyncMethod` strategies, see `services.weight_sync.method`):
`builtin` (nccl, memory, checkpoint), `bf16` (memory_bf16), `lora` (lora_adapter)."""
