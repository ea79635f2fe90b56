"""Sweeps: one base experiment, settings (a grid, zipped lists, seeds, a search), one run folder per setting, a
results table and plots. spec: the sweep file, checked and expanded into runs; search: sampled settings (Ray Tune's
and Optuna's samplers); local: the in-process sweep (vmapped groups one after another); ray_launcher: the same
runs as Ray Tune trials, with early stopping (needs the sweep extra); report: results.csv / .md / .png / .json."""
