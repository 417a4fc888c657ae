"""Explorer service: rollouts with a rollout engine, workflows, rewards and evaluation."""
