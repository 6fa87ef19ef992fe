"""Small helpers shared across twinkle."""
