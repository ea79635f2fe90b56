"""The state wing: a train state made and sharded (train_state.py), optimized (optim.py), persisted (checkpoint.py)."""
