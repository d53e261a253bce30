"""Training of learned drafters: self-distillation data, feature extraction, trainers, the drafter format."""
