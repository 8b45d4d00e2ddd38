"""The OpenEnv server, the episode rules and the sandbox (built in later issues)."""
