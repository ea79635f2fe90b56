"""The train state's wing: how a state is made, sharded, optimized (optim.py) and persisted (checkpoint.py)."""
