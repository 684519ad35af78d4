"""Neo's distributed runtime: execute a 4D sharding plan on torch.distributed.

- :mod:`.process_groups`: the explicit process-group object (world, intra-node, cross-node, dense);
- :mod:`.plan_view`: a typed, validated view of the planner's plan JSON;
- :mod:`.comms`: awaitable (and differentiable) collectives, quantized payloads;
- :mod:`.input_dist`: routing ids to shards in two AlltoAlls;
- :mod:`.sharding`: one output distribution per sharding type;
- :mod:`.sharded_embedding`: :class:`ShardedEmbeddingCollection`;
- :mod:`.parallelize`: apply the sharded collection and DDP to a model (the function
  :func:`parallelize` is exported here: ``from neo.distributed import parallelize``).

See docs/distributed.md.
"""

from neo.distributed.comms import Awaitable, CommConfig, CommPrecision  # noqa: F401
from neo.distributed.plan_view import PlanError, PlanView, ShardingType, even_plan  # noqa: F401
from neo.distributed.process_groups import ProcessGroups, end_process_groups  # noqa: F401
from neo.distributed.sharded_embedding import ShardedEmbeddingCollection  # noqa: F401
from neo.distributed.parallelize import parallelize  # noqa: F401  (the function; its name shadows the submodule)
