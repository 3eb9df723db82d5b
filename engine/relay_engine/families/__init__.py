"""Model families: each a folder (pi05/, rtj/) over the shared core (relay_engine.core)."""
