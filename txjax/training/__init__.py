"""The training wing: one run's loop and the R stacked runs that reuse it.

loop.py    train(config, workdir): the one loop (resume, checkpoints, evals, logs, time budget, signals)
run.py     Run: one run's workdir, checkpoints, logs, evaluations and program, as the loop drives it
stack.py   train_runs(configs, workdirs): R runs vmapped on one device, each with its own Run (the one place
           that knows R)
step.py    the pure train step, jitted on a mesh or vmapped over runs
config.py  TrainConfig: config.train as a frozen value, made once from the validated section
budget.py  WSD sized by a time budget
resume.py  what a resumed run may change
"""
