"""Record formats: what a trajectory looks like on disk and what may be done to one (SPEC §6-§8).

- `sharegpt`: agent messages to ShareGPT conversations (the `trajectories.jsonl` row).
- `filters`: the disposition of a finished sample (kept, or discarded and why).
- `hf_loading`: loading a JSONL file the way a Hugging Face `datasets` user will.
- `compression/`: the trajectory compressor (`hermes-compress`).

Converters work on records, not live agents: nothing here imports the agent, the batch engine, the
simulated endpoint or Dagster.
"""
