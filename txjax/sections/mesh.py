"""config.mesh's schema and frozen value: MeshShape, the sizes of a run's device mesh (txjax.parallel.sharding; the
sequence axis is ring attention's, checked by txjax.config.validate_sequence_axis)."""

from __future__ import annotations

import dataclasses

from txjax.fields import at_least, setting


@dataclasses.dataclass(frozen=True)
class MeshShape:
    """config.mesh: the sizes of the run's (data, fsdp, sequence, tensor, expert) mesh (distributed.run_mesh)."""

    data: int = setting(1, bounds=at_least(1))
    fsdp: int = setting(1, bounds=at_least(1))
    sequence: int = setting(1)  # ring attention (txjax.model.ring_attention)
    tensor: int = setting(1, bounds=at_least(1))
    # expert parallelism: the experts split over it, the batch rows too (model.num_experts)
    expert: int = setting(1, bounds=at_least(1))
