"""Background jobs: persistent queue, worker processes, events (built on ``lab``; knows nothing of the UI)."""
