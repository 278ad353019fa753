"""What every job kind is built from: the kinds registry, the config sections, the path and model
checks their fields' roles drive, the worker that runs a config, and resumable stages."""
