"""Ray mode: components as Ray actors, one per rank of a DeviceGroup, driven from one script."""
