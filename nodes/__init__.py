"""Node implementations, one module per node kind (registered in pyproject.toml: zmqrl.plugins)."""
