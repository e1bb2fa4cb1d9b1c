"""Pure functions over events: findings, roll-ups, comparisons. Never imports torch."""
