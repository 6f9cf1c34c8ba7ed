"""Training drafters: self-distillation data, features, losses and the training loop."""
