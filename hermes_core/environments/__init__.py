"""RL environments: tasks, verifiers, rollouts, tokens and masks for trainers (atroposlib only in its adapter)."""
