"""Synchronizer service: run state, model versions, sync plan and the coordination of weight transfer.

Modules: `members` (status enum, members,
history events), `records` (settings and results), `rendezvous` (nccl group ranks and generations),
`weights` (memory method: validated pushes, the latest version's chunk bytes), `core` (the state
machine, no gRPC), `servicer` (proto <-> core), `service` + `__main__` (`python -m services.synchronizer`).
The sync plan (Trinity-RFT's sync cadence as pure functions) is `services.common.config.sync_plan.SyncPlan`;
the transfer itself lives in `services.weight_sync`; clients use `services.weight_sync.member.client`.
"""
