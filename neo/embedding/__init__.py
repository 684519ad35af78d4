"""Table-batched embeddings with fused sparse optimizers, and their backends."""

from neo.embedding.checks import EmbeddingInputError  # noqa: F401
from neo.embedding.ddp_guard import ReplicatedTablesError  # noqa: F401
from neo.embedding.module import TableBatchedEmbedding  # noqa: F401
from neo.embedding.sequence import SequenceEmbedding  # noqa: F401
from neo.embedding.position_weights import PositionWeights  # noqa: F401
