"""The Redis side of a worker: the service that wires it together, the job intake, the publisher
of events, reclaiming dead workers' jobs, heartbeats and metrics."""
