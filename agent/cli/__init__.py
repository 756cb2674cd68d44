"""Console entry points: `edge-agent` (the daemon) and `agentctl` (the operator's tool)."""
