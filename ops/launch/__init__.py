"""Running the stack: `arbor up`, its supervisor, the embedded Redis, a Sentinel set."""
