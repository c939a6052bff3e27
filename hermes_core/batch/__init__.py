"""The batch engine: a dataset in, one durable record per sample out, resumable by content key.

The path of one sample, by module:
`dataset` (a JSONL line -> a keyed `Sample`) -> `recipe` (the run's settings, fingerprinted) ->
`pipeline` (plan batches, skip what the ledger already holds) -> `runner` (one `AIAgent` session
per sample, concurrently) -> `records` (the finished conversation -> a ledger record and its ShareGPT
row) -> `ledger` / `object_ledger` (records appended durably, in the run folder or a bucket) ->
`pipeline` (`trajectories.jsonl`, `statistics.json` via `stats`).
`stopping` holds budgets and graceful stops, `progress` the console bar.

Drives the agent, tools, sandboxes and formats; never imports the simulated endpoint or Dagster.
"""
