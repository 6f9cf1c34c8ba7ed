"""Trained drafters (EAGLE-3, Medusa, LayerSkip, the distilled draft model): their modules and loading."""
