"""Models and kernels: resolving and loading a model spec, weights, row-wise attention, and the C row kernels."""
