"""The model wing: the network as its equations (attention, blocks, positions, precision); of the other wings it
imports only txjax.parallel (the logical-axis layout of activations on a mesh)."""
