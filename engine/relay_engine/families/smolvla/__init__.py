"""SmolVLA (lerobot's `smolvla`): its network and lerobot's files so far; not yet a registered
family (recipes, sessions, evaluation and serving take it once it is)."""
