"""The reference's plugin and kwargs classes: one module per backend or feature, loaded on first use."""
