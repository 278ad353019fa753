"""The layer every other imports: errors, config fields and their validator, registries, file writing and
restricted reads, YAML, the run-directory names, events, limits. No torch and no numpy: the web server and the CLI start fast."""
