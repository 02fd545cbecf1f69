"""Running the probe: sweep, map and candidate drivers, the probe process, sharding."""
