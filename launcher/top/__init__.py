"""`rft top`: a live terminal view of a running job, read from the services' own endpoints.

targets.py  where the services listen: a job folder of `rft run` (its run/*.port files), a run config
            (its `services.*` addresses, as in a compose stack), or `--buffer/--trainer/...` flags
collect.py  one `Snapshot` over gRPC (short deadlines; a service that does not answer is shown so)
            plus the job folder's metrics and sync events when there is one
render.py   a snapshot as a rich renderable (tables and a reward sparkline)
view.py     the loop: `--once` prints one frame, otherwise a `rich.live.Live` refreshed every interval
"""
