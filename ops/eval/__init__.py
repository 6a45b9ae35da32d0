"""`arbor eval`: lm-eval against a running stack, offline, on task files made on this machine."""
