"""A small third-party twinkle plugin, published the way any backend would be."""
