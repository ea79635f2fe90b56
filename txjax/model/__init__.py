"""The model wing: the network as its equations (attention, blocks, positions, precision); it imports no other wing."""
