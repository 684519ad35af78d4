"""Output distribution per sharding type (Neo paper, Sec. 4, "4D parallelism").

Each output distribution takes the local pooled embeddings of a rank's slots for all
``W * B`` samples of the global batch (source-major) and returns an awaitable of this
rank's ``(B, columns)`` share as :data:`Pieces` (a flat tensor holding back-to-back
``(B, w)`` matrices, and their widths: no copy to concatenate them), plus the global
output column of each of its columns (``global_columns``). The sharded collection moves
every piece into table order in one copy. Their backward is the reverse communication.

- :mod:`.table_wise`: AlltoAll (table_wise; column_wise shares it);
- :mod:`.column_wise`: AlltoAll of column slices, concatenated back;
- :mod:`.row_wise`: a reduce-scatter of partial sums (NCCL's ReduceScatter; on gloo an
  AlltoAll of the partial sums and a local fp32 sum, neo/distributed/comms.py);
- :mod:`.hierarchical`: table_row_wise (intra-node reduce-scatter, then cross-node AlltoAll)
  and table_column_wise (intra-node AlltoAll, then cross-node AlltoAll);
- :mod:`.data_parallel`: each rank keeps its rows; backward AllGathers the gradient;
- :mod:`.one_host`: with every rank on one host, all of the above in one AlltoAll per
  direction (the sharded collection's default there, where a plan uses several).
"""

from typing import List, Tuple

import torch

Pieces = Tuple[torch.Tensor, List[int]]
"""(flat, widths): ``flat`` holds ``len(widths)`` row-major ``(B, w)`` matrices back to back."""


def as_pieces(y: torch.Tensor) -> Pieces:
    """One (B, D) matrix as pieces."""
    return y.reshape(-1), [y.shape[1]]
