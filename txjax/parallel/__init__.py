"""The parallel wing: the mesh, the logical-axis rules that lay a model on it, and the processes of a multi-host run."""
