"""zmqrl: distributed reinforcement learning as ZeroMQ nodes wired by YAML topologies."""

__version__ = "0.1.0"
