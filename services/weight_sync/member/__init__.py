"""A member's side of the synchronizer: its client, the away/backoff rule, the superseded-join guard,
the trainer's sync hook, the explorer's sync gate and the loop that follows each published version."""
