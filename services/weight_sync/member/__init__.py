"""A member's side of the synchronizer: its client, the away/backoff rule, the superseded-join guard,
the trainer's sync hook and the explorer's sync gate."""
