"""The training wing: the loop that drives one run or R stacked runs.

Below it: the objective (txjax.families.objective); the optimizer, the train state and its checkpoints (txjax.state).

init_from.py   train.init_from=WORKDIR: another workdir's parameters with a fresh optimizer (fine-tuning)
step.py        the pure train step, jitted on a mesh or vmapped over runs
edge.py        RunSpec: a run's config resolved against its workdir once (tokenizer, data, model sizes), frozen
run.py         Run: one run's checkpoints, logs, evaluations and program from its RunSpec, as the loop drives it
loop.py        train(config, workdir): the one loop (resume, checkpoints, evals, logs, time budget, signals)
stack.py       train_runs(configs, workdirs): R runs vmapped on one device, each with its own Run (the one place
               that knows R)
budget.py      WSD sized by a time budget
resume.py      what a resumed run may change
"""
