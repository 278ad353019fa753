"""Training: turning records into supervised sequences, and Trainer subclasses for each method."""
