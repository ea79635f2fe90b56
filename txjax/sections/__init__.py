"""The config's sections as frozen dataclasses whose fields carry their metadata (txjax.fields: `setting()`, a
field's default, range or choices, whether a resumed run may change it, what reads it): the one schema of every
setting.

data.py     DataConfig: config.data
train.py    TrainConfig: config.train (its optimizer's part: txjax.state.optim.OptimConfig)
mesh.py     MeshShape: config.mesh
schema.py   the sections together: base_config's values, the ranges, the choices, the resume policy and the
            settings a config leaves unread, all derived from the fields (a new setting is one field)
"""
